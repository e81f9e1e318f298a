"""``tilescope.compile.explain(fn, *args)``: what the compiler fused, and what it could not.

>>> import torch
>>> from tilescope.compile import explain
>>> e = explain(lambda x: (x * 2).exp().sum(0), torch.randn(256, 64))
>>> e.executions_per_call
2
>>> e.unfused[0].op, "cross-partition" in e.unfused[0].reason
('sum', True)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

import torch

from ..dtypes import itemsize
from ._backend import _signature, build_steps, skip_internals
from ._emit import _dt
from ._fusion_table import packet_name
from ._plan import node_dtype, node_shape

__all__ = ["explain", "Explanation", "UnfusedOp", "FusedExecution", "ModeledExecution"]


@dataclass(frozen=True)
class UnfusedOp:
    graph: int
    node: str
    op: str
    reason: str
    bytes_saved_if_fused: int  # HBM traffic of its intermediate inputs/outputs (modeled estimate)


@dataclass(frozen=True)
class FusedExecution:
    graph: int
    program: str
    program_hash: str
    fx_nodes: tuple[str, ...]
    spilled: tuple[str, ...]
    spill_bytes: int
    # values a matmul's first pass writes for its later passes (a projection's logits)
    kept: tuple[str, ...] = ()
    kept_bytes: int = 0


@dataclass(frozen=True)
class ModeledExecution:
    """One device execution of the compiled call (inputs on the simulated device): what ran,
    the lowering rule that modeled it (``compiled`` for a fused Program) and its modeled time."""

    op: str
    lowering: str
    modeled_ns: float


@dataclass
class Explanation:
    graphs: int = 0
    fused: list[FusedExecution] = field(default_factory=list)
    unfused: list[UnfusedOp] = field(default_factory=list)
    views: list[str] = field(default_factory=list)
    # copy_ of a value into a graph input that the Program computing it writes in place
    in_place: list[str] = field(default_factory=list)
    # inputs the code changes in place (BatchNorm's running statistics, an optimizer's state):
    # torch copies each new value back after the graph, one device execution each
    input_writebacks: int = 0
    # the device executions of one call, when its inputs are on the simulated device (kernels
    # only: host <-> device copies are not part of the compiled code)
    executions: list[ModeledExecution] = field(default_factory=list)
    # per matmul with row reductions (a projection's log-softmax): the form kept ("keep":
    # fused, logits written once; "remake": fused, product made per pass; "plain": not fused)
    # and each form's modeled ns
    reduction_fusion: list[dict] = field(default_factory=list)

    @property
    def generic_share(self) -> float | None:
        """Share of the call's modeled device time in ops modeled by the generic lowering
        (one GpSimd routine, an estimate); None when the call did not run on the device."""
        total = sum(e.modeled_ns for e in self.executions)
        if not total:
            return None
        return sum(e.modeled_ns for e in self.executions if e.lowering == "generic") / total

    @property
    def executions_per_call(self) -> int:
        """One per fused Program, per op left apart and per write-back: a lower bound, since an
        op left apart may run as more than one (a functional op copying its inputs first)."""
        return len(self.fused) + len(self.unfused) + self.input_writebacks

    def to_dict(self) -> dict:
        return {
            "graphs": self.graphs,
            "executions_per_call": self.executions_per_call,
            "fused": [f.__dict__ | {"fx_nodes": list(f.fx_nodes), "spilled": list(f.spilled)} for f in self.fused],
            "unfused": [u.__dict__ for u in self.unfused],
            "views": self.views,
            "in_place": self.in_place,
            "input_writebacks": self.input_writebacks,
            "executions": [e.__dict__ for e in self.executions],
            "reduction_fusion": self.reduction_fusion,
            "generic_share": self.generic_share,
        }

    def __str__(self) -> str:
        lines = [f"{self.graphs} graph(s), at least {self.executions_per_call} device execution(s) per call "
                 f"(an op left apart may run as more than one)"]
        for f in self.fused:
            spill = f"; spills {', '.join(f.spilled)} ({f.spill_bytes / 1e6:.3f} MB to HBM)" if f.spilled else ""
            if f.kept:
                spill += (f"; writes {', '.join(f.kept)} once for its later passes ({f.kept_bytes / 1e6:.3f} MB "
                          f"to HBM, read back)")
            n = len(f.fx_nodes)
            lines.append(f"  fused  [{f.program_hash}] {n} op{'s' if n != 1 else ''}: {', '.join(f.fx_nodes)}{spill}")
        for u in self.unfused:
            lines.append(f"  apart  {u.node} (aten.{u.op}): {u.reason}; fusing it would save "
                         f"~{u.bytes_saved_if_fused / 1e6:.3f} MB of HBM traffic (modeled estimate)")
        for r in self.reduction_fusion:
            times = ", ".join(f"{k} {ns / 1e3:,.1f} us" for k, ns in r["modeled_ns"].items())
            lines.append(f"  chose  {r['chosen']} for a matmul with its row reductions (modeled: {times})")
        if self.in_place:
            lines.append(f"  in place  {len(self.in_place)} input update(s) written by the Program that computes "
                         f"them: {', '.join(self.in_place)}")
        if self.input_writebacks:
            lines.append(f"  after  {self.input_writebacks} copy_ of inputs changed in place (e.g. running "
                         f"statistics): torch writes each back after the graph")
        if self.executions:
            total = sum(e.modeled_ns for e in self.executions)
            generic: dict[str, float] = {}
            for e in self.executions:
                if e.lowering == "generic":
                    generic[e.op] = generic.get(e.op, 0.0) + e.modeled_ns
            top = ", ".join(f"{op} {ns / total:.1%}" for op, ns in sorted(generic.items(), key=lambda kv: -kv[1])[:5])
            lines.append(f"  ran    {len(self.executions)} device execution(s), {total / 1e3:,.2f} us modeled; generic "
                         f"lowering {self.generic_share:.1%} of it" + (f" ({top}: one GpSimd routine each, an "
                                                                       f"estimate)" if top else ""))
        return "\n".join(lines)


def _nbytes(node) -> int:
    shape = node_shape(node)
    dt = node_dtype(node)
    if shape is None or dt is None:
        return 0
    return prod(shape) * itemsize(_dt(dt))


def _mutated_inputs() -> int:
    """How many of the graph being compiled's inputs it changes in place (AOT autograd's
    metadata; 0 where this torch does not say)."""
    try:
        from torch._functorch._aot_autograd.schemas import MutationType

        meta = torch._guards.TracingContext.try_get().fw_metadata
        # mutations kept in the graph are its copy_ nodes, planned with the rest
        return sum(1 for info in meta.input_info
                   if info.mutates_data and info.mutation_type != MutationType.MUTATED_IN_GRAPH)
    except (AttributeError, ImportError):
        return 0


def _on_device(fn, args, kwargs) -> bool:
    """Whether the call's tensors (its arguments, a module's parameters) are on the simulated device."""
    tensors = [t for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    if isinstance(fn, torch.nn.Module):
        tensors += list(fn.parameters())
    return any(t.device.type not in ("cpu", "cuda", "meta") for t in tensors)


def explain(fn, *args, **kwargs) -> Explanation:
    """Compile ``fn`` for ``args`` and report every fused execution and every op left apart.

    With inputs on the simulated device, the call also runs as the tilescope backend runs it:
    :attr:`Explanation.executions` holds its device executions (op, lowering rule, modeled
    time) and :attr:`Explanation.generic_share` the share the generic lowering models."""
    from torch._dynamo.backends.common import aot_autograd
    from ._graph import DECOMPOSITIONS

    captured = []
    writebacks = [0]
    on_device = _on_device(fn, args, kwargs)

    def capture(gm, example_inputs):
        captured.append((gm, list(example_inputs)))
        if on_device:  # run what the tilescope backend runs, to record its executions
            from ._backend import _compiler

            return _compiler(gm, example_inputs)
        return gm.forward

    def capture_forward(gm, example_inputs):
        writebacks[0] += _mutated_inputs()
        return capture(gm, example_inputs)

    skip_internals()
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=aot_autograd(fw_compiler=capture_forward, bw_compiler=capture,
                                                      decompositions=DECOMPOSITIONS,
                                                      keep_inference_input_mutations=True))
    if on_device:
        from ..device import recording, synchronize

        with recording() as runs:
            compiled(*args, **kwargs)
        synchronize()
        executions = [ModeledExecution(r.op, r.lowering, r.modeled_ns) for r in runs if r.kind != "memcpy"]
    else:
        compiled(*args, **kwargs)
        executions = []
    torch._dynamo.reset()
    from ..spec import preset

    spec = preset(None)
    report = Explanation(graphs=len(captured), input_writebacks=writebacks[0], executions=executions)
    for g, (gm, example) in enumerate(captured):
        # the graph's metadata already has these shapes (as the backend, which never re-propagates them)
        steps = build_steps(gm, _signature(example), spec, f"explain_{g}", propagate=False)
        if "tilescope_reduction_fusion" in gm.meta:
            report.reduction_fusion.append(gm.meta["tilescope_reduction_fusion"])
        graph_inputs = {n for n in gm.graph.nodes if n.op == "placeholder"}
        outputs = set()
        for n in gm.graph.nodes:
            if n.op == "output":
                outputs.update(a for a in n.args[0] if isinstance(a, torch.fx.Node))
        for st in steps:
            if st.kind == "program":
                report.fused.append(FusedExecution(
                    g, st.program.name, st.program.hash, tuple(n.name for n in st.nodes),
                    tuple(st.stats.spilled_values), st.stats.spill_bytes,
                    tuple(st.stats.kept_values), st.stats.kept_bytes))
            elif st.kind == "view":
                report.views.extend(n.name for n in st.nodes)
            elif st.kind == "writeback":
                report.in_place.extend(n.name for n in st.nodes)
            else:
                for node in st.nodes:
                    saved = sum(_nbytes(i) for i in st.inputs if i not in graph_inputs)
                    saved += sum(_nbytes(o) for o in st.outputs if o not in outputs)
                    report.unfused.append(UnfusedOp(g, node.name, packet_name(node.target),
                                                    st.reason or "not fused", saved))
    return report
