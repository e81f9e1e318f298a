"""The ``torch.compile`` backend: ``torch.compile(fn, backend="tilescope")``.

Dynamo hands the backend an FX graph; AOT autograd turns it into functional aten
graphs (forward and, for training, backward) with the decompositions in
``_graph.DECOMPOSITIONS``. Each graph becomes a :class:`CompiledGraph`: a plan of
segments per concrete input signature, where consecutive fused segments form one
Program (one device execution per call) and unfusable ops run as their own
executions, in graph order.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.fx as fx

from ._emit import EmitStats, _Unfusable, emit_segments
from ._graph import DECOMPOSITIONS, propagate_shapes
from ._foreach import cluster, expand_foreach
from ._inplace import hoist_input_updates, plan_writebacks, reinplace
from ._fusion_table import is_reduction, packet_name
from ._plan import Segment, plan_graph

__all__ = ["tilescope_backend", "CompiledGraph", "Step", "cache_dir", "STATS"]

# compile statistics (tests and benchmarks read them)
STATS = {"graphs": 0, "plans": 0, "programs_built": 0, "programs_from_disk": 0, "backend_s": 0.0,
         # matmuls with row reductions (a projection's log-softmax): plans where the fused
         # form was kept, and where the plain one modeled shorter (the fusion declined)
         "reduction_fusions": 0, "reduction_fusions_declined": 0}


def cache_dir() -> Path:
    """Where compiled Programs are cached on disk (``$TILESCOPE_CACHE_DIR`` or ~/.cache/tilescope)."""
    root = os.environ.get("TILESCOPE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tilescope")
    return Path(root) / "programs"


@dataclass
class Step:
    """One step of a compiled call: a fused Program or one op run as its own execution."""

    kind: str  # "program" | "eager" | "view" | "writeback" (a copy_ its producing Program does)
    nodes: list[fx.Node]
    inputs: list[fx.Node] = field(default_factory=list)
    outputs: list[fx.Node] = field(default_factory=list)
    program: object = None
    stats: EmitStats | None = None
    reason: str | None = None
    segments: list[Segment] = field(default_factory=list)
    aliases: dict = field(default_factory=dict)  # program: output node -> graph input it is written into
    cache_path: Path | None = None  # program: where it is cached on disk


def _signature(args) -> tuple:
    sig = []
    for a in args:
        if isinstance(a, torch.Tensor):
            sig.append((tuple(a.shape), a.dtype))
        else:
            sig.append(a)
    return tuple(sig)


_CODE_FINGERPRINT: list[str] = []


def _code_fingerprint() -> str:
    """A hash of the compiler's and the Program layer's own source, so a cached Program never
    outlives a change to the code that built it."""
    if not _CODE_FINGERPRINT:
        root = Path(__file__).resolve().parent.parent
        h = hashlib.sha256()
        for sub in ("compile", "program", "isa"):
            for f in sorted((root / sub).glob("*.py")):
                h.update(f.read_bytes())
        _CODE_FINGERPRINT.append(h.hexdigest()[:16])
    return _CODE_FINGERPRINT[0]


def _graph_key(gm: fx.GraphModule, sig: tuple, spec) -> str:
    from .. import __version__

    h = hashlib.sha256()
    h.update(_code_fingerprint().encode())
    h.update(_graph_text(gm).encode())
    h.update(repr([(tuple(s[0]), str(s[1])) if isinstance(s, tuple) else s for s in sig]).encode())
    h.update(spec.fingerprint.encode())
    h.update(__version__.encode())
    return h.hexdigest()[:24]


def _graph_text(gm: fx.GraphModule) -> str:
    """The graph's nodes with every value's shape, strides and dtype (what its Programs depend
    on), without generating its Python code (a lazy graph module's recompile: most of a cached
    compile's time)."""
    lines = []
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        lay = (tuple(v.shape), tuple(v.stride()), v.dtype) if isinstance(v, torch.Tensor) else None
        lines.append(f"{n.op} {n.name} {n.target} {n.args} {n.kwargs} {lay}")
    return "\n".join(lines)


def build_steps(gm: fx.GraphModule, sig: tuple, spec, name: str, *, propagate: bool = True) -> list[Step]:
    """Plan ``gm`` for one input signature and build its Programs (disk-cached).

    ``propagate=False`` when the graph's ``val`` metadata already has these shapes (the
    example inputs AOT autograd traced with)."""
    if expand_foreach(gm):
        cluster(gm)
    reinplace(gm)
    hoist_input_updates(gm)
    if propagate:
        propagate_shapes(gm, [s if isinstance(s, tuple) else s for s in sig])
    if any(seg.kind == "matmul" and any(is_reduction(packet_name(n.target)) for n in seg.nodes)
           for seg in plan_graph(gm, reductions=True)):
        steps, writebacks = _reduction_fusion(gm, sig, spec, name)
    else:
        steps, writebacks = _plan_and_build(gm, sig, spec, name)
    for copy, (st, src, dst) in writebacks.items():
        # a group that streamed its rows in several passes may read the input again after
        # writing it: then the copy stays a copy
        if st.stats.passes > 1 and dst in st.inputs:
            next(s for s in steps if s.nodes == [copy]).kind = "eager"
        else:
            st.aliases[src] = dst
    return steps


def _reduction_fusion(gm, sig, spec, name):
    """The plan of a graph with a matmul whose rows are reduced next (a projection's
    log-softmax): fused, its later passes reading the logits the first stored, or making the
    product again, or plain -- whichever the simulator times shortest. The choice is stored
    beside the Programs, so a cached compile builds the chosen plan only; it is counted, and
    kept in ``gm.meta`` for explain (each form's modeled time)."""
    path = cache_dir() / f"{_graph_key(gm, sig, spec)}.fusion.json"
    try:
        choice = json.loads(path.read_text())
        built = _plan_and_build(gm, sig, spec, name, reductions=_FORMS[choice["chosen"]])
    except (OSError, ValueError, KeyError, TypeError):
        built = _plan_and_build(gm, sig, spec, name)
        choice = {"chosen": "plain", "modeled_ns": {"plain": _modeled_ns(built[0], spec)}}
        for form in ("keep", "remake"):
            fused = _plan_and_build(gm, sig, spec, name, reductions=form)
            choice["modeled_ns"][form] = _modeled_ns(fused[0], spec)
            if choice["modeled_ns"][form] < choice["modeled_ns"][choice["chosen"]]:
                built, choice["chosen"] = fused, form
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(choice))
        except OSError:
            pass  # a read-only cache only costs choosing again
    STATS["reduction_fusions_declined" if choice["chosen"] == "plain" else "reduction_fusions"] += 1
    gm.meta["tilescope_reduction_fusion"] = choice
    return built


# how a matmul's row reductions are fused: not at all (""), the logits kept in HBM for the
# later passes, or the product made again per pass -- and the Programs' cache-name suffix
_FUSED_REDUCTIONS = {"": "", "keep": "k", "remake": "r"}
_FORMS = {"plain": "", "keep": "keep", "remake": "remake"}  # a stored choice -> its plan


def _plan_and_build(gm, sig, spec, name, *, reductions: str = ""):
    forced: dict = {}
    while True:
        segments = plan_graph(gm, forced, reductions=bool(reductions))
        for seg in segments:
            seg.keep_product = reductions == "keep"
        steps = _group(segments)
        writebacks = plan_writebacks(gm, steps)
        for copy in writebacks:
            st = next(s for s in steps if s.nodes == [copy])
            st.kind, st.reason = "writeback", "written in place by the Program that computes the value"
        try:
            _build_programs(gm, steps, sig, spec, name, variant=_FUSED_REDUCTIONS[reductions])
            return steps, writebacks
        except _UnfusableNode as e:
            forced[e.node] = e.reason


def _modeled_ns(steps: list[Step], spec) -> float:
    """Modeled time of a plan's Programs (kept in their meta, so a cached one is not simulated
    again), each with the runtime's cost per execution."""
    from ..sim import simulate

    total = 0.0
    for st in steps:
        if st.kind != "program":
            continue
        if "modeled_ns" not in st.program.meta:
            st.program.meta["modeled_ns"] = simulate(st.program, spec).summary.total_ns
            if st.cache_path is not None:
                try:
                    _store_cached(st.cache_path, st.program)
                except OSError:
                    pass
        total += st.program.meta["modeled_ns"] + spec.runtime_exec_us * 1e3
    return total


class _UnfusableNode(Exception):
    def __init__(self, node, reason: str):
        self.node = node
        self.reason = reason


def _group(segments: list[Segment]) -> list[Step]:
    """Consecutive fused segments share one Program; other segments are steps of their own."""
    steps: list[Step] = []
    for seg in segments:
        if seg.kind in ("rowgroup", "matmul"):
            if steps and steps[-1].kind == "program":
                steps[-1].segments.append(seg)
                steps[-1].nodes.extend(seg.nodes)
                continue
            steps.append(Step("program", list(seg.nodes), segments=[seg]))
        else:
            steps.append(Step(seg.kind, list(seg.nodes), reason=seg.reason, segments=[seg]))
    for st in steps:
        inside = set(st.nodes)
        st.inputs = []
        for seg in st.segments:
            st.inputs.extend(i for i in seg.inputs if i not in inside and i not in st.inputs)
        st.outputs = []
        for seg in st.segments:
            st.outputs.extend(o for o in seg.outputs if o not in st.outputs)
    return steps


_CACHE_FORMAT = 4  # (also when what a Program reads changes: its runtime meta)
# the object forms a columnar Program makes on demand: not stored, rebuilt when something reads them
_MADE_ON_DEMAND = ("instructions", "buffers", "slots", "placement", "instr_prov", "_dumped")


def _load_cached(path: Path):
    """A Program stored by :func:`_store_cached`, or None if absent, stale or damaged.

    The file keeps the Program's columns and precomputed arrays (signatures, dependencies,
    hash), so a cache hit costs no analysis and makes no instruction objects until something
    reads them (an executable written by the profiler); a sha256 of the payload guards against
    torn files.
    """
    import pickle

    from .. import __version__
    from ..program import Program

    try:
        blob = path.read_bytes()
    except OSError:
        return None
    header, _, payload = blob.partition(b"\n")
    try:
        fmt, version, digest, program_hash = header.decode().split(" ")
        if int(fmt) != _CACHE_FORMAT or version != __version__:
            return None
        if hashlib.sha256(payload).hexdigest() != digest:
            return None
        prog = Program.__new__(Program)
        prog.__dict__.update(pickle.loads(payload))
    except Exception:  # noqa: BLE001 - any damage means: rebuild
        return None
    return prog if prog.hash == program_hash else None


def _store_cached(path: Path, prog) -> None:
    import pickle

    from .. import __version__

    prog.static, prog.dependencies, prog.hash, prog.runtime_scalars  # computed once, kept in the file
    state = dict(prog.__dict__)
    if state.get("_instr_prov") is not None and "columns" in state:  # columnar: objects on demand
        state = {k: v for k, v in state.items() if k not in _MADE_ON_DEMAND}
    state.pop("_dumped", None)
    payload = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    header = f"{_CACHE_FORMAT} {__version__} {hashlib.sha256(payload).hexdigest()} {prog.hash}\n".encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(header + payload)
    os.replace(tmp, path)


def _build_programs(gm, steps, sig, spec, name, variant: str = "") -> None:
    key = _graph_key(gm, sig, spec)
    cdir = cache_dir()
    for k, st in enumerate(steps):
        if st.kind != "program":
            continue
        path = st.cache_path = cdir / f"{key}.{k}{variant}.pkl"
        cached = _load_cached(path)
        if cached is not None:
            st.program = cached
            st.stats = EmitStats(**json.loads(cached.meta.get("emit_stats", "{}")))
            STATS["programs_from_disk"] += 1
            continue
        fused_names = "+".join(n.name for n in st.nodes[:4]) + ("+..." if len(st.nodes) > 4 else "")
        try:
            prog, stats = emit_segments(st.segments, f"{name}[{fused_names}]", spec)
        except _Unfusable as e:
            node = getattr(e, "node", None) or st.nodes[0]
            raise _UnfusableNode(node, str(e)) from e
        prog.meta["emit_stats"] = json.dumps(stats.__dict__)
        prog.meta["fx_nodes"] = [n.name for n in st.nodes]
        st.program, st.stats = prog, stats
        STATS["programs_built"] += 1
        try:
            _store_cached(path, prog)
        except OSError:
            pass  # a read-only cache only costs rebuilds


class CompiledGraph:
    """A compiled aten graph: call it with the graph's flat inputs."""

    def __init__(self, gm: fx.GraphModule, example_inputs, name: str):
        from ..spec import preset

        self.gm = gm
        self.name = name
        self.spec = preset(None)
        self._plans: dict[tuple, list[Step]] = {}
        self._lock = threading.Lock()
        self.placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        # tensors the graph holds (``torch.tensor(...)`` in the traced code, lifted as constants)
        self.constants = {n: _attribute(gm, n.target) for n in gm.graph.nodes if n.op == "get_attr"}
        self.output_node = next(n for n in gm.graph.nodes if n.op == "output")
        STATS["graphs"] += 1
        if all(not isinstance(a, torch.SymInt) for a in example_inputs) and not _has_symbolic(gm):
            sig = _signature(example_inputs)
            with self._lock:  # the graph's metadata already has these shapes
                STATS["plans"] += 1
                self._plans[sig] = build_steps(gm, sig, self.spec, name, propagate=False)

    def steps_for(self, sig: tuple) -> list[Step]:
        steps = self._plans.get(sig)
        if steps is None:
            with self._lock:
                steps = self._plans.get(sig)
                if steps is None:
                    STATS["plans"] += 1
                    steps = self._plans[sig] = build_steps(self.gm, sig, self.spec, self.name)
        return steps

    def __call__(self, *args):
        steps = self.steps_for(_signature(args))
        env = {**self.constants, **{ph: a for ph, a in zip(self.placeholders, args)}}
        from ._execute_plan import run_steps

        run_steps(steps, env, self)
        out = self.output_node.args[0]
        return [env[o] if isinstance(o, fx.Node) else o for o in out]


def _attribute(gm, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _has_symbolic(gm) -> bool:
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        if isinstance(v, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in v.shape):
            return True
    return False


_counter = {"n": 0}


def _compiler(gm: fx.GraphModule, example_inputs):
    from functorch.compile import make_boxed_func

    t0 = time.perf_counter()
    _counter["n"] += 1
    compiled = CompiledGraph(gm, example_inputs, f"compiled_{_counter['n']}")
    STATS["backend_s"] += time.perf_counter() - t0
    fn = make_boxed_func(compiled)
    fn._tilescope_compiled = compiled
    return fn


def tilescope_backend(gm: fx.GraphModule, example_inputs, **kwargs):
    """The backend registered as ``"tilescope"`` (entry point ``torch_dynamo_backends``)."""
    from torch._dynamo.backends.common import aot_autograd

    _ensure_device_registered()
    skip_internals()
    # keep_inference_input_mutations: a graph's updates of its inputs (running statistics, an
    # optimizer's state) stay in the graph as copy_ nodes, which the plan then does in place
    return aot_autograd(fw_compiler=_compiler, bw_compiler=_compiler, decompositions=DECOMPOSITIONS,
                        keep_inference_input_mutations=True)(gm, example_inputs, **kwargs)


# the device's runtime (not tilescope.device._kernels: tile kernels called in a compiled
# function are traced into the graph through it)
_INTERNALS = ("tilescope.device._dispatch", "tilescope.device._runtime", "tilescope.device._worker",
              "tilescope.device._special", "tilescope.device._native_runtime", "tilescope.device._composite_ops",
              "tilescope.device._registration", "tilescope.sim", "tilescope.lower", "tilescope.program",
              "tilescope.isa", "tilescope.compile", "tilescope.spec")
_SKIPPED: list = []


def skip_internals() -> None:
    """Keep Dynamo out of the device's own Python code.

    Code around a graph break (``loss.backward()`` inside a compiled training step) runs with
    Dynamo's frame hook active, and every Python frame it reaches is compiled unless Dynamo skips
    its file: the device's dispatch, the simulator and the lowerings would be traced as user code.
    """
    if _SKIPPED:
        return
    from torch._dynamo import trace_rules

    for name in _INTERNALS:
        trace_rules.add(name)
    _SKIPPED.append(True)


def _ensure_device_registered() -> None:
    try:
        from .. import device
    except ImportError:
        return
    register = getattr(device, "register", None)
    if register is not None:
        register()
