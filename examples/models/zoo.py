"""The model zoo on the simulated device: seven models written in this repository, each trained
for a few steps eager and compiled (``torch.compile(..., backend="tilescope")``) -- forward,
loss, backward, AdamW -- with every value checked against the same steps on CPU, and one
table of what the device model says about a warm training step.

Run from the repository root::

    python -m examples.models.zoo                    # the small configs (what CI runs)
    python -m examples.models.zoo --size large       # bigger shapes, closer to the real models
    python -m examples.models.zoo --models gpt2,resnet18 --modes eager --json

Columns (every time is *modeled*, on the virtual clock: host dispatch and the runtime's cost per
execution are the preset's assumed figures):

* step: one warm training step, from the host starting it to the device finishing it;
* MFU: the model's FLOPs (``torch.utils.flop_counter`` on the CPU step: matmuls, convolutions,
  attention, forward and backward) over step time x the TensorE peak for the model's dtype;
* generic: the share of modeled kernel time in ops modeled by the generic lowering (one GpSimd
  routine at an assumed cycle per element: an estimate, not the engines the hardware would use);
* top ops: the five ops with the most modeled kernel time, each with its share of it and its
  roofline bound over its time -- max(its useful FLOPs at TensorE's peak, its operands' bytes
  moved once: through the DMA both ways when an engine computes on them, HBM to HBM for a copy)
  -- as "% of bound" (100% is at the bound; never above).

Useful FLOPs are an op's own math, not what its kernel executes: attention counts 2(E + Ev) per
scored (query, key) pair forward and 2(3E + 2Ev) backward (causal: the lower triangle only),
without the fused kernel's second scoring pass, mask and stabiliser matmuls
(:func:`tilescope.lower._attention.useful_flops`); a matmul's or convolution's are its TensorE
FLOPs. ``tensor_efficiency`` (convolution / attention / matmul) is useful FLOPs over modeled
time x TensorE peak.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from .bert import Bert, BertConfig
from .gpt2 import GPT2, GPT2Config
from .llama import Llama, LlamaConfig
from .lstm import LSTMConfig, LSTMModel
from .nanogpt import GPT as NanoGPT
from .resnet import ResNet18, ResNetConfig
from .vit import ViT, ViTConfig

__all__ = ["ZooModel", "MODELS", "SIZES", "ZooRun", "OpRow", "run_model", "run_zoo", "print_table"]


@dataclass(frozen=True)
class ZooModel:
    """One model of the zoo: how to build it at a size, make a batch for it, and score it."""

    name: str
    build: Callable[[object], nn.Module]  # config -> model
    batch: Callable[[object, int, torch.Generator], tuple[tuple, torch.Tensor]]  # (config, batch, gen) -> (inputs, target)
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _tokens(cfg, b, g):
    ids = torch.randint(0, cfg.vocab, (b, cfg.seq + 1), generator=g)
    return (ids[:, :-1],), ids[:, 1:]  # next-token prediction


def _lm_loss(logits, target):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def _bert_batch(cfg, b, g):
    ids = torch.randint(0, cfg.vocab, (b, cfg.seq), generator=g)
    mask = torch.ones(b, cfg.seq, dtype=torch.long)
    for i in range(1, b):  # every sequence after the first is padded: lengths seq * (1 - i / (2b))
        mask[i, cfg.seq - cfg.seq * i // (2 * b):] = 0
    return (ids, mask), torch.randint(0, cfg.classes, (b,), generator=g)


def _images(cfg, b, g, size):
    x = torch.randn(b, cfg.channels, size, size, generator=g)
    return (x,), torch.randint(0, cfg.classes, (b,), generator=g)


@dataclass(frozen=True)
class _LSTMData(LSTMConfig):
    seq: int = 35


@dataclass(frozen=True)
class _ResNetData(ResNetConfig):
    image: int = 224


@dataclass(frozen=True)
class _NanoConfig:
    """nanoGPT (``examples/models/nanogpt.py``): untied embeddings, learned positions."""

    vocab: int = 512
    d: int = 384
    layers: int = 6
    heads: int = 6
    seq: int = 256


MODELS: dict[str, ZooModel] = {m.name: m for m in (
    ZooModel("gpt2", GPT2, _tokens, _lm_loss),
    ZooModel("llama", Llama, _tokens, _lm_loss),
    ZooModel("bert", Bert, _bert_batch, F.cross_entropy),
    ZooModel("vit", ViT, lambda c, b, g: _images(c, b, g, c.image), F.cross_entropy),
    ZooModel("resnet18", lambda c: ResNet18(c), lambda c, b, g: _images(c, b, g, c.image), F.cross_entropy),
    ZooModel("lstm", lambda c: LSTMModel(c), _tokens, _lm_loss),
    ZooModel("nanogpt", lambda c: NanoGPT(c.vocab, c.d, c.layers, c.heads, c.seq), _tokens, _lm_loss),
)}

# (config, batch) per size: "small" runs in CI within minutes; "large" is nearer the real shapes
SIZES: dict[str, dict[str, tuple[object, int]]] = {
    "small": {
        "gpt2": (GPT2Config(vocab=256, seq=32, d=64, layers=2, heads=4), 2),
        "llama": (LlamaConfig(vocab=256, seq=32, d=64, layers=2, heads=4, kv_heads=2, hidden=128), 2),
        "bert": (BertConfig(vocab=256, seq=32, d=64, layers=2, heads=4, ffn=128, classes=4), 2),
        "vit": (ViTConfig(image=16, patch=4, d=64, layers=2, heads=4, mlp=128, classes=10), 2),
        # (batch norm needs a few values per channel at the last stage: 4 images of 64x64 give 2x2 each)
        "resnet18": (_ResNetData(widths=(8, 16, 32, 64), classes=10, image=64), 4),
        "lstm": (_LSTMData(vocab=256, d=32, hidden=64, layers=2, seq=16), 2),
        "nanogpt": (_NanoConfig(vocab=256, d=64, layers=2, heads=4, seq=32), 2),
    },
    "large": {
        "gpt2": (GPT2Config(vocab=8192, seq=512, d=768, layers=2, heads=12), 2),
        "llama": (LlamaConfig(vocab=8192, seq=512, d=768, layers=2, heads=12, kv_heads=4, hidden=2048), 2),
        "bert": (BertConfig(vocab=8192, seq=512, d=768, layers=2, heads=12, ffn=3072, classes=4), 2),
        "vit": (ViTConfig(image=224, patch=16, d=192, layers=2, heads=3, mlp=768, classes=1000), 4),
        # the shape ResNet-18 is trained at (ImageNet, 224 px). At 8 images every conv's FLOPs outweigh
        # its weight bytes (fp32, trn1: the 512->512 3x3 crosses at ~4), so its % of peak means something
        "resnet18": (_ResNetData(classes=1000, image=224), 8),
        "lstm": (_LSTMData(vocab=8192, d=512, hidden=1024, layers=2, seq=35), 4),
        "nanogpt": (_NanoConfig(), 2),  # the classic character-level size
    },
}

# vs CPU, max |sim - CPU| over max |CPU| per quantity: the loss at every step, the first step's
# gradients, the parameters after the last step. float32 rounding differs where the device's op
# sequence does (attention's math form, a compiled graph's fusion); AdamW divides each gradient
# by its own magnitude, so rounding in a near-zero gradient moves its parameter by up to a
# learning rate -- hence the parameters' looser bound. Larger shapes sum longer: more rounding.
TOLERANCE = {
    "small": {"loss": 1e-5, "grads": 1e-5, "params": 5e-3},
    "large": {"loss": 1e-4, "grads": 1e-3, "params": 5e-3},
}

LR = 1e-3
WARMUP = 2  # steps before the measured one: the first builds every Program and the optimizer's state
TOP = 5


@dataclass
class OpRow:
    op: str
    executions: int
    modeled_ns: float
    share: float  # of the step's modeled kernel time
    bound_ns: float  # roofline bound of those executions (modeled work at the spec's peaks)
    lowering: str  # the rule(s) that modeled it
    tensor_flops: float = 0.0  # TensorE FLOPs of those executions (modeled: what the kernels execute)
    # the ops' own math: a lowering's stated useful FLOPs (attention: per scored (query, key) pair,
    # without its second scoring pass, mask and stabiliser matmuls), else its TensorE FLOPs
    useful_flops: float = 0.0

    @property
    def pct_of_bound(self) -> float:
        return self.bound_ns / self.modeled_ns if self.modeled_ns else 0.0


@dataclass
class ZooRun:
    model: str
    mode: str  # eager | compiled
    size: str
    step_ns: float  # modeled, virtual clock
    kernel_ns: float  # modeled kernel time in the step
    executions: int
    flops: float  # model FLOPs of one step (forward + backward)
    peak_flops: float
    generic_share: float
    ops: list[OpRow] = field(default_factory=list)
    generic_ops: list[OpRow] = field(default_factory=list)  # the ops the generic lowering modeled
    # convolution / attention / matmul: useful FLOPs (see OpRow) over modeled time x TensorE peak
    tensor_efficiency: dict = field(default_factory=dict)
    lowerings: dict = field(default_factory=dict)  # kernel executions per lowering rule
    max_rel_diff: dict = field(default_factory=dict)  # loss / grads / params vs CPU
    parameters: tuple[int, int] = (0, 0)  # Parameters on CPU, on the device
    # the same categories at their roofline bounds: the share of TensorE peak these shapes allow at
    # best (below 100% where an op is bound by its bytes, e.g. weights read for a small batch)
    tensor_ceiling: dict = field(default_factory=dict)

    @property
    def matches_cpu(self) -> bool:
        """Same Parameters as on CPU, and every difference within :data:`TOLERANCE`."""
        tol = TOLERANCE[self.size]
        return self.parameters[0] == self.parameters[1] and all(self.max_rel_diff[k] <= tol[k] for k in tol)

    @property
    def mfu(self) -> float:
        return self.flops / (self.step_ns * 1e-9 * self.peak_flops) if self.step_ns else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["mfu"] = self.mfu
        d["matches_cpu"] = self.matches_cpu
        for rows in (d["ops"], d["generic_ops"]):
            for r, o in zip(rows, self.ops if rows is d["ops"] else self.generic_ops):
                r["pct_of_bound"] = o.pct_of_bound
        return d


def _train_step(model, opt, inputs, target, loss_fn, grads: list | None = None):
    loss = loss_fn(model(*inputs), target)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if grads is not None:  # by name: a tied weight is one Parameter under its first name
        grads.update({n: p.grad.detach().cpu().clone() for n, p in _module(model).named_parameters()
                      if p.grad is not None})
    opt.step()
    return loss.detach()


def _module(fn) -> nn.Module:
    return getattr(fn, "_orig_mod", fn)  # (torch.compile's wrapper holds the module)


def _matched(a: dict, b: dict) -> tuple[list, list]:
    names = [n for n in b if n in a]
    return [a[n] for n in names], [b[n] for n in names]


def _rel(a, b) -> float:
    """max |a - b| over max |b| -- the reference's scale -- across tensors ``a`` and ``b`` (lists
    of tensors, or one each): a gradient that is zero in exact arithmetic (a key bias under
    softmax) and 1e-12 in floating point does not count as a 100% difference."""
    a, b = ([a], [b]) if isinstance(b, torch.Tensor) else (a, b)
    pairs = [(x, y) for x, y in zip(a, b) if y is not None and y.numel()]
    if not pairs:
        return 0.0
    scale = max(y.abs().max().item() for _, y in pairs)
    diff = max((x.detach().cpu().float() - y.float()).abs().max().item() for x, y in pairs)
    return diff / scale if scale else diff


def _model_flops(model, inputs, target, loss_fn) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    m = copy.deepcopy(model)
    with FlopCounterMode(display=False) as counter:
        loss_fn(m(*inputs), target).backward()
    return float(counter.get_total_flops())


def _operand_bytes(program) -> int:
    """Bytes of the Program's HBM operands, each counted once: per input / output buffer, what
    its DMAs move, capped at the buffer's size (a re-read costs time, not a higher bound; a
    view reads only its part of the memory it spans)."""
    from tilescope.isa import DmaCopy

    moved: dict[str, int] = {}
    for ins in program.instructions:
        if isinstance(ins, DmaCopy):
            for ap in (ins.src, ins.dst):
                buf = program.buffers.get(ap.buffer)
                if buf is not None and buf.memory == "hbm" and buf.role in ("input", "output"):
                    moved[ap.buffer] = moved.get(ap.buffer, 0) + ap.nbytes
    return sum(min(n, program.buffers[b].nbytes) for b, n in moved.items())


def _useful_flops(program, summary) -> float:
    """The Program's useful FLOPs: what its lowering states (``meta["useful_flops"]``: attention
    counts its scored pairs), else every FLOP TensorE executes (a matmul's or convolution's)."""
    return float(program.meta.get("useful_flops", summary.tensor_flops))


def _bound_ns(program, spec) -> float:
    """Roofline bound of one execution: its useful FLOPs at TensorE's peak for their dtype, or
    its operands' bytes moved once, whichever is longer. Bytes an engine computes on pass the DMA
    twice (HBM to SBUF, SBUF to HBM); a pure copy moves each byte once, HBM to HBM, while HBM
    reads and writes it."""
    from tilescope.isa import DmaCopy
    from tilescope.sim import simulate

    s = simulate(program, spec).summary
    # the peak of the dtype the useful FLOPs are in, where the lowering states it (fp32 attention
    # scores its stabiliser in bf16: the summary's peak is its first matmul's dtype's)
    peak = spec.peak_flops(program.meta["flops_dtype"]) if "flops_dtype" in program.meta else s.peak_flops
    flops_ns = _useful_flops(program, s) / peak * 1e9 if peak else 0.0
    io = _operand_bytes(program)
    if all(isinstance(i, DmaCopy) for i in program.instructions):
        bytes_ns = max(io / 2 / spec.dma.bytes_per_ns, io / spec.hbm_bytes_per_ns)
    else:
        bytes_ns = io / spec.dma_bytes_per_ns
    return max(flops_ns, bytes_ns)


def _op_label(op: str) -> str:
    if op.startswith("tilescope::fused["):
        nodes = op[len("tilescope::fused["):-1].split(", ")
        return f"fused[{len(nodes)} ops: {', '.join(nodes[:3])}{', ...' if len(nodes) > 3 else ''}]"
    return op


def _op_rows(runs, spec, *, only: str | None = None) -> list[OpRow]:
    """Every op of ``runs`` (kernel executions), most modeled time first."""
    from tilescope.sim import simulate

    total = sum(r.modeled_ns for r in runs)
    acc: dict[str, list] = {}
    per_program: dict[str, tuple[float, float, float]] = {}  # hash -> (bound ns, TensorE FLOPs, useful)
    for r in runs:
        if only is not None and r.lowering != only:
            continue
        if r.program_hash not in per_program:
            s = simulate(r.program, spec).summary
            per_program[r.program_hash] = (_bound_ns(r.program, spec), s.tensor_flops, _useful_flops(r.program, s))
        bound, flops, useful = per_program[r.program_hash]
        a = acc.setdefault(_op_label(r.op), [0, 0.0, 0.0, set(), 0.0, 0.0])
        a[0] += 1
        a[1] += r.modeled_ns
        a[2] += bound
        a[3].add(r.lowering)
        a[4] += flops
        a[5] += useful
    rows = [OpRow(op, n, ns, ns / total if total else 0.0, b, "/".join(sorted(rules)), fl, uf)
            for op, (n, ns, b, rules, fl, uf) in acc.items()]
    return sorted(rows, key=lambda o: (-o.modeled_ns, o.op))


# ops whose TensorE efficiency the zoo reports: (category, substring of the op's name)
EFFICIENCY = (("convolution", "convolution"), ("attention", "attention"), ("matmul", "mm"))


def _efficiency(rows: list[OpRow], peak: float, at_bound: bool = False) -> dict[str, float]:
    """Per category of EFFICIENCY present: its useful FLOPs (attention: scored pairs only) over
    (its modeled time x peak), or ``at_bound``, over (its roofline bound x peak): the most these
    shapes allow."""
    out = {}
    for cat, part in EFFICIENCY:
        sel = [o for o in rows if part in o.op.split("::")[-1] and not o.op.startswith("fused[")]
        ns = sum(o.bound_ns if at_bound else o.modeled_ns for o in sel)
        if ns:
            out[cat] = sum(o.useful_flops for o in sel) / (ns * 1e-9 * peak)
    return out


def run_model(name: str, mode: str, size: str = "small", *, steps: int = WARMUP + 1) -> ZooRun:
    """Train ``name`` for ``steps`` steps on CPU and on the simulated device (``mode``: eager or
    compiled), compare every value, and model the last step."""
    import tilescope.device as td
    from tilescope.spec import preset

    entry = MODELS[name]
    cfg, batch = SIZES[size][name]
    td.register()
    td.configure(clock="virtual")
    torch.manual_seed(0)
    cpu = entry.build(cfg)
    sim = copy.deepcopy(cpu).to("sim")
    g = torch.Generator().manual_seed(1)
    inputs, target = entry.batch(cfg, batch, g)
    sim_inputs, sim_target = tuple(x.to("sim") for x in inputs), target.to("sim")
    flops = _model_flops(cpu, inputs, target, entry.loss)
    fn = sim if mode == "eager" else torch.compile(sim, backend="tilescope")
    opt_cpu = torch.optim.AdamW(cpu.parameters(), lr=LR)
    opt_sim = torch.optim.AdamW(sim.parameters(), lr=LR)
    # vs CPU: the loss at every step, the first step's gradients (before AdamW's normalisation
    # amplifies rounding in near-zero gradients) and the parameters after the last step
    diffs = {"loss": 0.0, "grads": 0.0, "params": 0.0}
    for step in range(steps):
        measured = step == steps - 1
        g_cpu, g_sim = {}, {}
        loss_cpu = _train_step(cpu, opt_cpu, inputs, target, entry.loss, g_cpu)
        td.synchronize()
        t0 = td.now_ns()
        with td.recording() as runs:
            loss_sim = _train_step(fn, opt_sim, sim_inputs, sim_target, entry.loss, g_sim)
            td.synchronize()
        step_ns = td.now_ns() - t0
        diffs["loss"] = max(diffs["loss"], _rel(loss_sim.cpu(), loss_cpu))
        if step == 0:
            diffs["grads"] = _rel(*_matched(g_sim, g_cpu))
        if measured:
            kernels = [r for r in runs if r.kind != "memcpy"]
    diffs["params"] = _rel(*_matched(dict(sim.named_parameters()), {n: p.detach() for n, p in cpu.named_parameters()}))
    spec = preset(None)
    dtype = str(next(cpu.parameters()).dtype).replace("torch.", "")
    kernel_ns = sum(r.modeled_ns for r in kernels)
    generic_ns = sum(r.modeled_ns for r in kernels if r.lowering == "generic")
    peak = spec.peak_flops(dtype)
    rows = _op_rows(kernels, spec)
    return ZooRun(name, mode, size, step_ns, kernel_ns, len(kernels), flops, peak,
                  generic_ns / kernel_ns if kernel_ns else 0.0, rows[:TOP],
                  _op_rows(kernels, spec, only="generic")[:TOP], _efficiency(rows, peak),
                  dict(Counter(r.lowering for r in kernels)), diffs,
                  (len(list(cpu.parameters())), len(list(sim.parameters()))), _efficiency(rows, peak, at_bound=True))


def run_zoo(names=None, modes=("eager", "compiled"), size: str = "small", progress=None) -> list[ZooRun]:
    out = []
    for name in names or MODELS:
        for mode in modes:
            if progress:
                progress(f"{name} {mode} ({size})")
            out.append(run_model(name, mode, size))
            torch._dynamo.reset()
    return out


def _ms(ns: float) -> str:
    return f"{ns / 1e6:,.3f} ms" if ns >= 1e6 else f"{ns / 1e3:,.1f} us"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def print_table(runs: list[ZooRun], console=None) -> None:
    """One rich table: a row per model, eager and compiled side by side (all figures modeled)."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console(width=None if sys.stdout.isatty() else 200)
    by = {(r.model, r.mode): r for r in runs}
    size = runs[0].size if runs else "small"
    t = Table(title=f"model zoo, one warm training step ({size} configs) -- modeled on the simulated device "
                    f"(virtual clock; MFU against the {runs[0].peak_flops / 1e12:.0f} TFLOP/s TensorE peak)"
              if runs else "model zoo", show_lines=True)
    for c in ("model", "step eager", "step compiled", "MFU eager / compiled", "generic eager / compiled",
              "vs CPU (max rel. diff)", "top ops, eager (share of kernel time, % of roofline bound)"):
        t.add_column(c, justify="right" if c.startswith(("step", "MFU", "generic")) else "left")
    for name in dict.fromkeys(r.model for r in runs):
        e, c = by.get((name, "eager")), by.get((name, "compiled"))
        cell = lambda r, f: f(r) if r else "-"  # noqa: E731
        worst = max((max(r.max_rel_diff.values()) for r in (e, c) if r), default=0.0)
        ok = all(r.matches_cpu for r in (e, c) if r)
        tied = "" if all(r.parameters[0] == r.parameters[1] for r in (e, c) if r) else ", Parameters untied"
        first = e or c
        ops = "\n".join(f"{o.op} {_pct(o.share)}, {_pct(o.pct_of_bound)} of bound [{o.lowering}]" for o in first.ops)
        fused = lambda r: _ms(r.step_ns) + ("" if r.lowerings.get("compiled") else " (nothing fused)")  # noqa: E731
        t.add_row(name, cell(e, lambda r: _ms(r.step_ns)), cell(c, fused),
                  f"{cell(e, lambda r: _pct(r.mfu))} / {cell(c, lambda r: _pct(r.mfu))}",
                  f"{cell(e, lambda r: _pct(r.generic_share))} / {cell(c, lambda r: _pct(r.generic_share))}",
                  f"{'ok' if ok else 'MISMATCH'} ({worst:.1e}{tied})", ops)
    console.print(t)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=sorted(SIZES), default="small")
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    p.add_argument("--modes", default="eager,compiled")
    p.add_argument("--json", action="store_true", help="print the runs as JSON instead of the table")
    args = p.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        p.error(f"unknown model(s) {unknown}: choose from {', '.join(MODELS)}")
    runs = run_zoo(names, tuple(args.modes.split(",")), args.size,
                   progress=None if args.json else lambda s: print(f"running {s} ...", file=sys.stderr, flush=True))
    if args.json:
        print(json.dumps([r.to_dict() for r in runs], indent=1))
    else:
        print_table(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
