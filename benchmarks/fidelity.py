"""Fidelity: the device model against every published real-hardware figure.

``python benchmarks/fidelity.py`` runs each case for which AWS Neuron documentation publishes
a figure measured on real hardware, re-written as tile kernels or ops here, and prints the
published value beside the *modeled* one, the error, and the ratio between consecutive
optimisation steps -- each case with its source and shape. Targets (no per-case constant,
only preset-level parameters, each cited or marked *assumed*): every absolute figure within
+-25%, every step-to-step ratio within a factor of 1.3, the RMSNorm naive/fused ratio within
5.84 +- 20%. A row outside its target names the effect its trace shows is missing. Then one
sensitivity line per assumed preset parameter: how the errors move when it changes.

``--quick`` runs scaled shapes with the same bound (the matmul tutorial's DMA-bound steps at
1/64 of its work and the optimized step at 1/16, extrapolated by work; RMSNorm at 1/4, its
compiled step built by the compile backend from the aten graph without Dynamo): what
``tests/test_fidelity.py`` pins, in a few seconds.

Sources (AWS Neuron documentation, repository ``aws-neuron/aws-neuron-sdk``):
  [mm]      nki/tutorials/matrix_multiplication.rst (2025 releases), the benchmark table
            (trn1.32xlarge, bf16 [4096,8192] @ [8192,8192])
  [rms]     the RMSNorm profile quoted in /work/shared/reference/neuroncore.md (native PyTorch
            backend on trn1, one profiler run; input shape not published)
  [dmaintro] nki/get-started/about/nki-dma-overview.rst: Fig. "DMA Throughput varying Bytes
            per Partition for p_dim = 128" (values read off the figure: no axis labels, so
            relative to its 32 KiB point) and Example 1 (A[4, 4096] bf16 on trn2)
  [perf]    nki/deep-dives/nki_perf_guide.rst, Opt #5a, #5b, #6, #7
  [arch]    nki/guides/architecture/trainium_inferentia2_arch.rst (TensorE peak)
  [dmabw]   nki/deep-dives/nki-dma-bandwidth-guide.rst (aggregate DMA bandwidth)
  [ln]      the NKI LayerNorm tutorial (general/nki/tutorials/layernorm), quoted in neuroncore.md
  [mamba]   nki/guides/tutorials/fused_mamba.rst: latencies in its text and its seq_len table
            (hardware not named; the NKI tutorials of that release ran on trn1)
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

import tilescope
import tilescope.isa as nisa
import tilescope.lang as tl
from tilescope.isa import DmaCopy, dma_cost, dma_engines
from tilescope.sim import simulate
from tilescope.spec import CoreSpec, preset

ROOT = Path(__file__).resolve().parent.parent
ABS_TOL, RATIO_TOL, RMSNORM_TOL = 0.25, 1.3, 0.20


# ---------------------------------------------------------------------------------------------
# what the harness reports


@dataclass
class Row:
    """One published figure beside its modeled value."""

    label: str
    published: float
    modeled: float
    unit: str
    target: str = "abs"  # "abs" (+-25%), "rmsnorm" (+-20%), "ratio" (x1.3), or "info: <why not a target>"
    why: str = ""  # the missing effect, named from the trace, when outside target

    @property
    def error(self) -> float:
        return self.modeled / self.published - 1.0

    @property
    def met(self) -> bool | None:
        if self.target.startswith("info"):
            return None
        if self.target == "ratio":
            f = self.modeled / self.published
            return bool(max(f, 1 / f) <= RATIO_TOL)
        tol = RMSNORM_TOL if self.target == "rmsnorm" else ABS_TOL
        return bool(abs(self.error) <= tol)


@dataclass
class Group:
    """A case: its figures (in step order where they are optimisation steps) and its source."""

    title: str
    source: str
    shape: str
    preset: str
    rows: list[Row]
    steps: bool = False  # consecutive rows are optimisation steps: compare their ratios
    notes: list[str] = field(default_factory=list)

    def step_rows(self) -> list[Row]:
        if not self.steps:
            return []
        out = []
        for a, b in zip(self.rows, self.rows[1:]):
            out.append(Row(f"{a.label} -> {b.label}", a.published / b.published, a.modeled / b.modeled, "x",
                           target="ratio"))
        return out


# ---------------------------------------------------------------------------------------------
# trace digests: what bounds a modeled run (used to name missing effects)


def dma_digest(program, spec: CoreSpec) -> dict:
    """Per DMA site (source line): transfers, issue time (fixed cost x count) and each
    engine's data time, so a row can say whether its queue was issue- or data-bound."""
    sites: dict[str, dict] = {}
    for i, ins in enumerate(program.instructions):
        if not isinstance(ins, DmaCopy):
            continue
        mem = lambda ap: program.buffers[ap.buffer].memory  # noqa: E731
        c = dma_cost(ins, spec, mem(ins.src), mem(ins.dst))
        piece = float(dma_engines(c.partitions, c.descriptors, c.nbytes, 0, spec)[2])
        key = program.prov_of(i).describe()
        s = sites.setdefault(key, {"n": 0, "issue_ns": 0.0, "data_ns": 0.0, "bytes": 0})
        s["n"] += 1
        s["issue_ns"] += c.fixed_ns
        s["data_ns"] += piece
        s["bytes"] += c.nbytes
    return sites


def busiest_site(program, spec: CoreSpec) -> str:
    sites = dma_digest(program, spec)
    if not sites:
        return "no DMA"
    key, s = max(sites.items(), key=lambda kv: max(kv[1]["issue_ns"], kv[1]["data_ns"]))
    bound = "issue" if s["issue_ns"] >= s["data_ns"] else "data"
    short = key.split("/")[-1]
    return (f"{short}: {s['n']:,} DMAs, {s['issue_ns'] / 1e6:.2f} ms of queue issue "
            f"({spec.dma.fixed_ns:.0f} ns each) vs {s['data_ns'] / 1e6:.2f} ms of engine data ({bound}-bound)")


# ---------------------------------------------------------------------------------------------
# case 1: the NKI matmul tutorial, every step at its own size


def _load_example(rel: str):
    path = ROOT / "examples" / rel
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(path.stem, module)
    spec.loader.exec_module(module)
    return module


MATMUL_FULL = (8192, 4096, 8192)  # K, M, N: [4096, 8192] @ [8192, 8192]
# --quick: each step at the smallest shape with its full-size bound and tile structure. The
# first three are bound by DMA issue per (m, n, k) tile iteration: 16 K steps per output tile
# show it as 64 do (1/64 of the work). The optimized kernel keeps one [2048, 1024] output block
# and the tutorial's whole K (8 sequential 1024-deep blocks, 1/16 of the work): fewer K blocks
# would let its pipeline fill and drain weigh more than at full size.
MATMUL_QUICK = {"matmul_naive": (2048, 2048, 1024), "matmul_hoist_load": (2048, 2048, 1024),
                "matmul_block_free_dimension": (2048, 2048, 1024), "matmul_optimized": (8192, 2048, 1024)}
MATMUL_STEPS = (("tiled", "matmul_naive", 51.80, 10.98), ("hoisted loads", "matmul_hoist_load", 42.96, 13.24),
                ("blocked free dims", "matmul_block_free_dimension", 22.07, 26.51),
                ("fully optimized", "matmul_optimized", 6.97, 85.24))


def build_matmul(quick: bool) -> dict:
    mk = _load_example("matmul/matmul_kernels.py")
    shape = MATMUL_QUICK if quick else dict.fromkeys(MATMUL_QUICK, MATMUL_FULL)
    return {fn: tilescope.simulate(getattr(mk, fn), *mk.inputs(*shape[fn], data=False), numerics=False).program
            for _, fn, _, _ in MATMUL_STEPS}


def eval_matmul(programs: dict, spec: CoreSpec, quick: bool) -> Group:
    rows, notes = [], []
    for label, fn, pub_ms, pub_hfu in MATMUL_STEPS:
        r = simulate(programs[fn], spec)
        scale = np.prod(MATMUL_FULL) / np.prod(MATMUL_QUICK[fn]) if quick else 1.0
        ms = r.summary.total_ns * scale / 1e6
        row = Row(label, pub_ms, ms, "ms")
        if not row.met or label == "tiled":
            row.why = busiest_site(programs[fn], spec)
        rows.append(row)
        notes.append(f"{label}: TensorE {r.summary.mfu:.1%} of peak (published {pub_hfu}% HFU)")
    tiled, hoisted = rows[0], rows[1]
    # the tutorial's tiled -> hoisted step: what the trace says the model does per iteration
    tiled.why = (f"{tiled.why}; its lhsT and rhs loads run on two queues in parallel, so removing the "
                 f"redundant lhsT loads (hoisting) saves nothing modeled ({tiled.modeled / hoisted.modeled:.2f}x) "
                 f"while hardware gains {tiled.published / hoisted.published:.2f}x: on hardware the two loads "
                 f"interfere beyond their queues' issue cost (an effect the model does not have)")
    shape = "bf16 [4096, 8192] @ [8192, 8192]" + (
        " (modeled at [2048, 2048] @ [2048, 1024], x64; fully optimized at [2048, 8192] @ [8192, 1024], x16)"
        if quick else "")
    return Group("NKI matmul tutorial", "[mm]", shape, spec.name, rows, steps=True, notes=notes)


# ---------------------------------------------------------------------------------------------
# case 2: RMSNorm, eager composition vs fused vs compiled


RMS_PUBLISHED_US = {"naive": 2355.0, "fused": 403.3, "compiled": 375.5}
RMS_FULL, RMS_QUICK = (8, 1024, 2048), (2, 1024, 2048)


def build_rmsnorm(quick: bool) -> dict:
    """The device Programs of each implementation (recorded from the sim device, values off)."""
    import torch

    import tilescope.device as dev
    from tilescope.studies import rmsnorm as study

    dev.register()
    old = dev.settings()
    dev.configure(clock="virtual", numerics=False, preset="trn1")
    shape = RMS_QUICK if quick else RMS_FULL
    try:
        x = torch.empty(shape, device="sim")
        w = torch.empty(shape[-1], device="sim")

        def fused(x, w):
            return torch.rms_norm(x, (shape[-1],), w, study.EPS)

        if quick:  # the compile backend's own plan and Programs for the aten graph, without Dynamo's capture
            from tilescope.compile import CompiledGraph, trace_aten

            # a tuple of outputs, as AOT autograd hands the backend its graphs
            gm = trace_aten(lambda x, w: (study.naive_rmsnorm(x, w),), x, w)
            compiled = CompiledGraph(gm, (x, w), "compiled_rmsnorm")
        else:
            compiled = torch.compile(study.naive_rmsnorm, backend="tilescope")
        impls = {"naive": study.naive_rmsnorm, "fused": fused, "compiled": compiled}
        out = {}
        for name, fn in impls.items():
            fn(x, w)
            torch.sim.synchronize()
            with dev.recording() as execs:
                fn(x, w)
            torch.sim.synchronize()
            out[name] = [(e.op, e.program) for e in execs if e.kind == "kernel"]
        return out
    finally:
        dev.configure(clock=old.clock, numerics=old.numerics, preset=old.preset)


def eval_rmsnorm(recorded: dict, spec: CoreSpec, quick: bool) -> Group:
    scale = np.prod(RMS_FULL) / np.prod(RMS_QUICK if quick else RMS_FULL)
    us = {k: sum(simulate(p, spec).summary.total_ns for _, p in v) * scale / 1e3 for k, v in recorded.items()}
    hbm = {k: sum(simulate(p, spec).summary.hbm_bytes for _, p in v) for k, v in recorded.items()}
    rows = [Row(k, RMS_PUBLISHED_US[k], us[k], "us", target="info: input shape not published (the study's "
                "shape is assumed)") for k in ("naive", "fused", "compiled")]
    ratio = Row("naive / fused", RMS_PUBLISHED_US["naive"] / RMS_PUBLISHED_US["fused"], us["naive"] / us["fused"],
                "x", target="rmsnorm")
    traffic = hbm["naive"] / hbm["fused"]
    if not ratio.met:
        ratio.why = (f"the modeled ratio follows the HBM traffic ratio ({traffic:.2f}x: every op moves its bytes "
                     f"at the DMA engines' rate, {len(recorded['naive'])} executions vs 1); the published "
                     f"{ratio.published:.2f}x implies the eager ops ran at {traffic / ratio.published:.0%} of the "
                     f"fused kernel's bytes per second on hardware -- a per-op inefficiency of the eager kernels "
                     f"that no public source describes")
    compiled = Row("compiled / fused", RMS_PUBLISHED_US["compiled"] / RMS_PUBLISHED_US["fused"],
                   us["compiled"] / us["fused"], "x", target="ratio")
    shape = f"fp32 x {RMS_FULL} (assumed), w [{RMS_FULL[-1]}]" + (f"; modeled at {RMS_QUICK}, x4" if quick else "")
    return Group("RMSNorm: eager vs fused vs compiled", "[rms]", shape, spec.name, rows + [ratio, compiled],
                 notes=[f"HBM traffic naive / fused: {traffic:.2f}x (modeled)"])


# ---------------------------------------------------------------------------------------------
# case 3: DMA throughput by bytes per partition (a stream of [128, b] loads of one tensor)


DMA_CURVE = {32: 1.4, 64: 2.6, 128: 5.0, 256: 10.3, 512: 20.9, 1024: 42.4, 2048: 81.3, 4096: 96.6,
             8192: 98.3, 16384: 99.0, 32768: 100.0}  # % of the 32 KiB point, read off [dmaintro] Fig. 1
DMA_STREAM_LOADS = 16


@tilescope.kernel
def dma_stream(x):
    """``n`` loads of [128, F] of one tensor: its queue's transfers back to back."""
    n, P, F = x.shape
    for i in tl.affine_range(n):
        t = tl.ndarray((P, F), x.dtype, buffer=tl.sbuf)
        t[...] = tl.load(x[i])


def build_dma_curve(quick: bool) -> dict:
    return {b: tilescope.simulate(dma_stream, tl.TensorSpec((DMA_STREAM_LOADS, 128, b // 2), "bfloat16"),
                                  numerics=False).program for b in DMA_CURVE}


def eval_dma_curve(programs: dict, spec: CoreSpec, quick: bool) -> Group:
    gbps = {b: DMA_STREAM_LOADS * 128 * b / simulate(p, spec).summary.total_ns for b, p in programs.items()}
    top = gbps[max(gbps)]
    rows = []
    for b, pub in DMA_CURVE.items():
        row = Row(f"{b} B", pub, 100 * gbps[b] / top, "%")
        if not row.met:
            c = dma_cost(next(i for i in programs[b].instructions if isinstance(i, DmaCopy)), spec)
            piece = float(dma_engines(c.partitions, c.descriptors, c.nbytes, 0, spec)[2])
            row.why = (f"modeled {'issue' if c.fixed_ns > piece else 'data'}-bound: {c.fixed_ns:.0f} ns issue vs "
                       f"{piece:.0f} ns of data per engine per DMA; the figure's knee is sharper/softer than "
                       f"a fixed per-DMA cost pipelined with the data")
        rows.append(row)
    return Group("DMA throughput vs bytes per partition (p_dim 128)", "[dmaintro] Fig. 1",
                 f"{DMA_STREAM_LOADS} loads of [128, b/2] bf16 of one tensor; hardware not stated",
                 spec.name, rows, steps=True, notes=[f"32 KiB point: {top:.0f} GB/s modeled (no published scale)"])


# ---------------------------------------------------------------------------------------------
# case 4: one DMA engine's transfer ([dmaintro] Example 1, trn2)


def build_one_engine(quick: bool) -> dict:
    @tilescope.kernel
    def load_4x4096(a):
        t = tl.ndarray((4, 4096), a.dtype, buffer=tl.sbuf)
        t[...] = tl.load(a)

    return {"p": tilescope.simulate(load_4x4096, tl.TensorSpec((4, 4096), "bfloat16"), numerics=False,
                                    preset="trn2").program}


def eval_one_engine(programs: dict, spec: CoreSpec, quick: bool) -> Group:
    ins = next(i for i in programs["p"].instructions if isinstance(i, DmaCopy))
    c = dma_cost(ins, spec)
    first, count, piece = dma_engines(c.partitions, c.descriptors, c.nbytes, 0, spec)
    rows = [Row("engines active", 1, float(count), "", target="abs"),
            Row("engine time of the 32 KiB transfer", 1416, float(piece), "ns")]
    return Group("One DMA engine's transfer", "[dmaintro] Example 1", "A[4, 4096] bf16 HBM -> SBUF", spec.name, rows,
                 notes=["the modeled fixed ~1.3 us issue cost per DMA precedes the engine's data time"])


# ---------------------------------------------------------------------------------------------
# case 5: engine instruction costs from the performance guide


@tilescope.kernel
def scalar_chain(x, n=64):
    """[perf] Opt #5a: back-to-back ScalarE instructions on one element per partition, each
    reading the previous one's output."""
    t = tl.load(x)
    for _ in tl.sequential_range(n):
        t = nisa.activation("identity", t, scale=1.0001)
    tl.store(x, t)


@tilescope.kernel
def three_instructions(data, scale, bias, out):
    """[perf] Opt #6, impl 1: multiply, add, exp as three instructions."""
    s = tl.load(scale)
    b = tl.load(bias)
    d = tl.load(data)
    scaled = tl.multiply(d, s)
    shifted = tl.add(scaled, b)
    tl.store(out, tl.exp(shifted))


@tilescope.kernel
def one_instruction(data, scale, bias, out):
    """[perf] Opt #6, impl 2: one activation does scale, bias and exp in its pipeline."""
    s = tl.load(scale)
    b = tl.load(bias)
    d = tl.load(data)
    tl.store(out, nisa.activation(np.exp, d, bias=b, scale=s))


@tilescope.kernel
def reduce_two_halves(a, b, out):
    """[perf] Opt #5b, option 1: two 64-partition reductions."""
    x = tl.load(a)
    y = tl.load(b)
    tl.store(out[0:64], nisa.tensor_reduce(np.add, x, axis=1, keepdims=True))
    tl.store(out[64:128], nisa.tensor_reduce(np.add, y, axis=1, keepdims=True))


@tilescope.kernel
def reduce_vectorized(ab, out):
    """[perf] Opt #5b, option 2: one 128-partition reduction."""
    x = tl.load(ab)
    tl.store(out, nisa.tensor_reduce(np.add, x, axis=1, keepdims=True))


@tilescope.kernel
def matvec(weights, vec, short_moving=True):
    """[perf] Opt #7: back-to-back matmuls of a [128, 1] vector with [128, 128] weight tiles,
    the vector as the moving (short moving) or the stationary (short stationary) operand."""
    n = weights.shape[1] // 128
    v = tl.load(vec)  # [128, 1]
    wt = tl.load(weights)  # [128, 128 * n]
    acc = tl.zeros((128, 1) if short_moving else (1, 128), tl.float32, buffer=tl.psum)
    for j in tl.affine_range(n):
        w = wt[:, j * 128:(j + 1) * 128]
        if short_moving:
            acc[...] += nisa.nc_matmul(w, v)  # stationary: a weight tile; moving: one column
        else:
            acc[...] += nisa.nc_matmul(v, w)  # stationary: the vector


def _compute_ns(result) -> float:
    """Sum of the compute instructions' durations (DMA waits and LoadStationary excluded):
    the latency of a dependent chain, the engine time of independent work."""
    t = result.timeline
    sel = np.array([not t.lanes[int(k)].startswith("DMA") and t.lanes[int(k)] != "TensorE.LoadStationary"
                    for k in t.lane])
    return float((t.end_ns[sel] - t.start_ns[sel]).sum())


def _lane_ii(result, lane: str) -> float:
    t = result.timeline
    sel = np.array([t.lanes[int(k)] == lane for k in t.lane])
    return float(np.median(np.diff(np.sort(t.start_ns[sel]))))


def build_engines(quick: bool) -> dict:
    f32 = lambda *s: tl.TensorSpec(s, "float32")  # noqa: E731
    bf = lambda *s: tl.TensorSpec(s, "bfloat16")  # noqa: E731
    sim = lambda k, *a, **kw: tilescope.simulate(k, *a, numerics=False, **kw).program  # noqa: E731
    return {
        "chain": sim(scalar_chain, f32(128, 1)),
        "three": sim(three_instructions, f32(128, 512), f32(128, 1), f32(128, 1), f32(128, 512)),
        "one": sim(one_instruction, f32(128, 512), f32(128, 1), f32(128, 1), f32(128, 512)),
        "halves": sim(reduce_two_halves, f32(64, 2048), f32(64, 2048), f32(128, 1)),
        "vector": sim(reduce_vectorized, f32(128, 2048), f32(128, 1)),
        "short_moving": sim(matvec, bf(128, 128 * 64), bf(128, 1), short_moving=True),
        "short_stationary": sim(matvec, bf(128, 128 * 64), bf(128, 1), short_moving=False),
    }


def eval_engines(p: dict, spec: CoreSpec, quick: bool) -> list[Group]:
    r = {k: simulate(v, spec) for k, v in p.items()}
    chain = Row("initiation interval", 189, _lane_ii(r["chain"], "ScalarE"), "ns")
    if not chain.met:
        chain.why = "dependent-instruction overhead (EngineSpec.dependent_cycles) too small or too large"
    combine = Row("impl 1 / impl 2 latency", 3.0, _compute_ns(r["three"]) / _compute_ns(r["one"]), "x",
                  target="ratio")
    if not combine.met:
        combine.why = ("modeled impl 1 puts multiply and add on VectorE (1.12 GHz) and exp on ScalarE; "
                       "the guide's 3x implies three equal-cost passes on one engine")
    vec = Row("two 64-partition / one 128-partition", 2.0,
              _compute_ns(r["halves"]) / _compute_ns(r["vector"]), "x", target="ratio")
    mm_moving = _lane_ii(r["short_moving"], "TensorE") * spec.tensor.clock_ghz
    mm_stat = _lane_ii(r["short_stationary"], "TensorE") * spec.tensor.clock_ghz
    return [
        Group("Dependent ScalarE instructions, 1 element/partition", "[perf] Opt #5a",
              "activation(identity, scale) chain on [128, 1] fp32", spec.name, [chain],
              notes=["published: 189 ns = 264 ScalarE cycles on NC-v2"]),
        Group("Combining three instructions into one", "[perf] Opt #6",
              "multiply, add, exp on [128, 512] fp32 vs one activation", spec.name, [combine]),
        Group("Partition vectorization", "[perf] Opt #5b", "tensor_reduce over [64, 2048] x 2 vs [128, 2048]",
              spec.name, [vec]),
        Group("Fast LoadStationary: matrix-vector", "[perf] Opt #7", "[1, 128] x [128, 128] bf16, 64 tiles",
              spec.name, [Row("short moving: cycles per matmul", 64, mm_moving, "cycles"),
                           Row("short stationary: cycles per matmul", 128, mm_stat, "cycles")], steps=False,
              notes=[f"ratio {mm_stat / mm_moving:.2f}x modeled, 2.00x published"]),
    ]


# ---------------------------------------------------------------------------------------------
# case 6: published peaks (architecture pages)


@tilescope.kernel
def matmul_stream(a, b, n=256):
    """Back-to-back [128, 128] x [128, 512] matmuls accumulating in PSUM (operands in SBUF)."""
    lhsT = tl.load(a)
    rhs = tl.load(b)
    acc = tl.zeros((128, 512), tl.float32, buffer=tl.psum)
    for _ in tl.affine_range(n):
        acc[...] += nisa.nc_matmul(lhsT, rhs)


def build_peaks(quick: bool) -> dict:
    return {dt: tilescope.simulate(matmul_stream, tl.TensorSpec((128, 128), dt), tl.TensorSpec((128, 512), dt),
                                   numerics=False).program for dt in ("bfloat16", "float32")} | {
        "dma": tilescope.simulate(dma_stream, tl.TensorSpec((8, 128, 16384), "bfloat16"), numerics=False).program}


def eval_peaks(p: dict, spec: CoreSpec, quick: bool) -> Group:
    rows = []
    for dt, pub in (("bfloat16", 92.0), ("float32", 23.0)):
        t = simulate(p[dt], spec)
        tensor = t.timeline.lane == t.timeline.lanes.index("TensorE")
        span = t.timeline.end_ns[tensor].max() - t.timeline.start_ns[tensor].min()
        rows.append(Row(f"TensorE {dt} TFLOPS (matmul stream)", pub, t.summary.tensor_flops / span / 1e3, "TFLOPS"))
    d = simulate(p["dma"], spec)
    rows.append(Row("DMA GB/s (stream of 4 MiB loads)", 272.0, 8 * 128 * 32768 / d.summary.total_ns, "GB/s"))
    return Group("Published peaks", "[arch], [dmabw]", "back-to-back matmuls; [128, 16384] bf16 loads", spec.name,
                 rows)


# ---------------------------------------------------------------------------------------------
# case 7: the NKI LayerNorm tutorial (published times include host transfers)


def build_layernorm(quick: bool) -> dict:
    ln = _load_example("layernorm/layernorm_kernel.py")
    f32 = lambda *s: tl.TensorSpec(s, "float32")  # noqa: E731
    return {k: tilescope.simulate(getattr(ln, k), f32(300, 1000), f32(1000), f32(1000), numerics=False).program
            for k in ("layernorm_two_pass", "layernorm_bn_stats")}


def eval_layernorm(p: dict, spec: CoreSpec, quick: bool) -> Group:
    a, b = (simulate(p[k], spec).summary.total_ns / 1e3 for k in ("layernorm_two_pass", "layernorm_bn_stats"))
    why = "published latencies include the benchmark tool's host transfers; the model gives device time only"
    rows = [Row("two passes (v1)", 2311, a, "us", target="info: " + why),
            Row("bn_stats / bn_aggr (v2)", 1969, b, "us", target="info: " + why)]
    return Group("NKI LayerNorm tutorial", "[ln]", "fp32 [300, 1000]", spec.name, rows,
                 notes=[f"v1 / v2: {a / b:.2f}x modeled, {2311 / 1969:.2f}x published (host time included)"])


# ---------------------------------------------------------------------------------------------
# case 8: the NKI fused Mamba tutorial (selective scan), three kernel versions


# (kernel, channels, seq_len, published ms): batch 1, 16 states, fp32 ([mamba] text and table)
MAMBA = (("v1, 256 channels", "mamba_v1", 256, 512, 0.17293), ("v1, 4K channels", "mamba_v1", 4096, 512, 2.34),
         ("v2, 4K channels", "mamba_v2", 4096, 512, 1.61), ("v2, seq 2048", "mamba_v2", 4096, 2048, 8.9),
         ("v3, seq 2048", "mamba_v3", 4096, 2048, 6.6), ("v2, seq 8192", "mamba_v2", 4096, 8192, 52.2),
         ("v3, seq 8192", "mamba_v3", 4096, 8192, 27.8))
MAMBA_QUICK_CHANNELS = 128  # one channel tile: the tiles are independent, each VectorE-bound alike


def build_mamba(quick: bool) -> dict:
    mk = _load_example("mamba/mamba_kernels.py")
    out = {}
    for label, fn, ch, seq, _ in MAMBA:
        c = min(ch, MAMBA_QUICK_CHANNELS) if quick else ch
        out[label] = (tilescope.simulate(getattr(mk, fn), *mk.inputs(1, c, seq, 16, data=False),
                                         numerics=False).program, ch / c)
    return out


def eval_mamba(built: dict, spec: CoreSpec, quick: bool) -> Group:
    rows, res = [], {}
    for label, _fn, _ch, _seq, pub in MAMBA:
        program, scale = built[label]
        r = res[label] = simulate(program, spec)
        rows.append(Row(label, pub, r.summary.total_ns * scale / 1e6, "ms"))
    for a, b in (("v1, 4K channels", "v2, 4K channels"), ("v2, seq 2048", "v3, seq 2048"),
                 ("v2, seq 8192", "v3, seq 8192")):
        ra, rb = (next(x for x in rows if x.label == k) for k in (a, b))
        rows.append(Row(f"{a} -> {b}", ra.published / rb.published, ra.modeled / rb.modeled, "x", target="ratio"))
    toy = rows[0]
    for row in rows:
        program = built[row.label][0] if row.label in built else None
        if row.met is not False:
            continue
        if program is None:  # a ratio between two versions
            row.why = ("the model runs both versions at VectorE's pace (five passes per state), so what the "
                       "later version saves on hardware -- reloads, spills, passes -- barely shows; see the rows")
            continue
        s = res[row.label].summary
        vec = s.engine_busy_ns.get("VectorE", 0.0) / s.total_ns
        spills = len((program.meta or {}).get("spills") or [])
        row.why = (f"VectorE busy {vec:.0%} of the modeled time: five [128, F] fp32 passes per state at the cost "
                   f"note's 2N cycles (+ the dependent-instruction overhead)"
                   + (f", {spills} spill/reload DMAs" if spills else "")
                   + f". The toy shape ({toy.error:+.0%}, VectorE 98.71% active on hardware) agrees with 2N per "
                   f"pass; here hardware takes {row.published / row.modeled:.0%} of the modeled time, so the "
                   f"compiled kernel runs fewer or cheaper VectorE passes at this shape (e.g. neuronx-cc hoisting "
                   f"the loop-invariant delta*u out of the state loop) -- an effect the model does not have")
    return Group("NKI fused Mamba tutorial", "[mamba]", "fp32, batch 1, 16 states" + (
        f"; modeled on {MAMBA_QUICK_CHANNELS} channels, scaled" if quick else ""), spec.name, rows,
        notes=["published: 172.93 us (toy), 2.34 ms (4K channels), 1.61 ms (v2); seq_len table (ms) for v2/v3"])


# ---------------------------------------------------------------------------------------------
# the table of cases, the run, the sensitivity lines


@dataclass(frozen=True)
class Case:
    name: str
    preset: str
    build: Callable[[bool], dict]
    evaluate: Callable  # (built, spec, quick) -> Group | list[Group]


CASES = (
    Case("matmul", "trn1", build_matmul, eval_matmul),
    Case("rmsnorm", "trn1", build_rmsnorm, eval_rmsnorm),
    Case("dma_curve", "trn1", build_dma_curve, eval_dma_curve),
    Case("one_engine", "trn2", build_one_engine, eval_one_engine),
    Case("engines", "trn1", build_engines, eval_engines),
    Case("peaks", "trn1", build_peaks, eval_peaks),
    Case("layernorm", "trn1", build_layernorm, eval_layernorm),
    Case("mamba", "trn1", build_mamba, eval_mamba),
)

# every assumed preset parameter (see the presets), and the values a sensitivity line tries
SENSITIVITY = (
    ("dma.descriptor_ns", "12 ns (assumed)", (("6 ns", dict(dma={"descriptor_ns": 6.0})),
                                              ("24 ns", dict(dma={"descriptor_ns": 24.0})))),
    ("dma.queue_policy", "site (assumed)", (("free", dict(dma={"queue_policy": "free"})),)),
    ("gpsimd.dependent_cycles", "100 (assumed)", (("0", dict(gpsimd={"dependent_cycles": 0})),)),
    ("runtime_exec_us", "10 us (assumed)", (("50 us", dict(runtime_exec_us=50.0)),)),
    ("host_dispatch_us", "10 us (assumed)", (("50 us", dict(host_dispatch_us=50.0)),)),
)


def build_all(quick: bool, names=None, log=print) -> dict:
    built = {}
    for case in CASES:
        if names and case.name not in names:
            continue
        t0 = time.perf_counter()
        built[case.name] = case.build(quick)
        log(f"  built {case.name} ({time.perf_counter() - t0:.1f} s)")
    return built


def evaluate(built: dict, quick: bool, changes: dict | None = None) -> list[Group]:
    groups: list[Group] = []
    for case in CASES:
        if case.name not in built:
            continue
        spec = preset(case.preset)
        if changes:
            spec = spec.replace(**{k: (dict(v) if isinstance(v, dict) else v) for k, v in changes.items()})
        out = case.evaluate(built[case.name], spec, quick)
        groups.extend(out if isinstance(out, list) else [out])
    return groups


def all_rows(groups: list[Group]) -> list[tuple[Group, Row]]:
    return [(g, r) for g in groups for r in g.rows + g.step_rows()]


def print_report(groups: list[Group], quick: bool) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(width=160)
    t = Table(title="Published real-hardware figures vs tilescope's device model (modeled)"
              + (" -- quick: scaled shapes" if quick else ""), show_lines=False)
    for col in ("case / figure", "published", "modeled", "error", "target", "met"):
        t.add_column(col, justify="left" if col in ("case / figure", "target") else "right")
    for g in groups:
        t.add_row(f"[bold]{escape(g.title)}[/bold] {escape(g.source)}, {escape(g.shape)} ({g.preset})", "", "", "", "", "")
        for r in g.rows + g.step_rows():
            err = f"{r.error:+.0%}" if r.unit != "x" else f"{r.modeled / r.published:.2f}x"
            tgt = {"abs": "+-25%", "rmsnorm": "+-20%", "ratio": "x1.3"}.get(r.target, r.target.split(":")[0])
            met = {True: "yes", False: "NO", None: "-"}[r.met]
            t.add_row(f"  {escape(r.label)}", _fmt(r.published, r.unit), _fmt(r.modeled, r.unit), err, tgt, met)
    console.print(t)
    for g in groups:
        for r in g.rows + g.step_rows():
            if r.met is False or (r.why and r.met is None):
                console.print(f"[bold]{escape(g.title)} / {escape(r.label)}[/bold] outside its target: "
                              f"{escape(r.why or '(no diagnosis)')}")
            elif r.target.startswith("info"):
                console.print(escape(f"{g.title} / {r.label}: not a target -- {r.target[5:].strip()}"))
        for n in g.notes:
            console.print(escape(f"  {g.title}: {n}"))
    rows = [r for _, r in all_rows(groups) if r.met is not None]
    console.print(f"\ntargets met: {sum(r.met for r in rows)} of {len(rows)}")


def _fmt(v: float, unit: str) -> str:
    if unit == "x":
        return f"{v:.2f}x"
    if unit == "%":
        return f"{v:.1f}%"
    return f"{v:,.2f} {unit}".strip() if abs(v) < 100 else f"{v:,.0f} {unit}".strip()


def print_sensitivity(built: dict, quick: bool, base: list[Group]) -> None:
    from rich.console import Console
    from rich.table import Table

    key = [(g.title, r.label) for g, r in all_rows(base) if r.met is not None]
    base_err = {(g.title, r.label): r for g, r in all_rows(base)}
    t = Table(title="Sensitivity to each assumed preset parameter (modeled; error moves vs the preset)")
    for col in ("parameter", "preset", "variant", "targets met",
                "largest move per case (figure: error at the preset -> with the variant)"):
        t.add_column(col)
    met0 = sum(base_err[k].met for k in key)
    t.add_row("(preset)", "", "", f"{met0}/{len(key)}", "")
    for param, now, variants in SENSITIVITY:
        for label, changes in variants:
            groups = evaluate(built, quick, changes)
            rows = {(g.title, r.label): r for g, r in all_rows(groups)}
            met = sum(rows[k].met for k in key)
            # the figure that moves most in each case, the four cases that move most
            best: dict[str, tuple[float, tuple]] = {}
            for k in rows:
                d = abs(rows[k].modeled / base_err[k].modeled - 1)
                if d > best.get(k[0], (-1.0, None))[0]:
                    best[k[0]] = (d, k)
            moves = sorted(best.values(), reverse=True)
            moved = [f"{k[1]}: {_err(base_err[k])} -> {_err(rows[k])}" for d, k in moves[:4] if d > 0.005]
            t.add_row(param, now, label, f"{met}/{len(key)}", "; ".join(moved) or "no figure moves (device time)")
    Console(width=160).print(t)


def _err(r: Row) -> str:
    return f"{r.modeled / r.published:.2f}x" if r.unit == "x" else f"{r.error:+.0%}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="scaled shapes with the same bound (what the test pins)")
    ap.add_argument("--no-sensitivity", action="store_true")
    ap.add_argument("--case", action="append", help="run only these cases (%s)" % ", ".join(c.name for c in CASES))
    a = ap.parse_args(argv)
    print("building the cases (tracing kernels, recording device executions)...")
    built = build_all(a.quick, a.case)
    groups = evaluate(built, a.quick)
    print_report(groups, a.quick)
    if not a.no_sensitivity:
        if not a.quick and "matmul" in built:
            print("sensitivity at the quick shapes (the tutorial's size takes minutes per variant)")
            built.update(build_all(True, ["matmul", "rmsnorm"], log=lambda *_: None))
            base = evaluate(built, True)
        else:
            base = groups
        print_sensitivity(built, True if not a.quick else a.quick, base)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
