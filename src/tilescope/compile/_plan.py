"""Fusion planning: cut a post-AOT aten graph into segments.

A *row group* is a run of pointwise ops, broadcasts and last-dim reductions that
all live in one ``[rows, D]`` space: every tensor they touch is a full row block
(``[rows, D]``), a per-row value (``[rows, 1]``), a row-broadcast vector (``[D]``) or
a scalar. A *matmul* segment is one ``mm``/``addmm``/``bmm`` plus the pointwise
epilogue on its output. Everything else is an *eager* segment: one op, run as its
own device execution, with the reason recorded for ``explain()``.

Segments follow the graph's topological order, so running them in order respects
every data dependency. The plan is found from the graph alone -- never by
recognising a known pattern.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from math import prod

import torch
import torch.fx as fx

from ._fusion_table import CONSTANTS, MATMULS, VIEWS, is_reduction, named_args, packet_name, row_of

__all__ = ["Segment", "plan_graph", "value_class", "operand_class", "period", "node_shape"]


@dataclass
class Segment:
    kind: str  # "rowgroup" | "matmul" | "eager" | "view"
    nodes: list[fx.Node] = field(default_factory=list)
    space: tuple[int, int] | None = None  # (rows, D)
    reason: str | None = None  # why an eager segment was not fused
    a_transposed: bool = False  # matmul: A arrives as the transpose of a contiguous [K, M]
    b_transposed: bool = False  # matmul: B arrives as the transpose of a contiguous W[N, K]
    inputs: list[fx.Node] = field(default_factory=list)
    outputs: list[fx.Node] = field(default_factory=list)
    # matmul with row reductions: later passes read the first pass's values (the logits), stored
    # once, instead of making the product again
    keep_product: bool = False

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]


def node_shape(node) -> tuple[int, ...] | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    if val is None and isinstance(node, fx.Node):
        tm = node.meta.get("tensor_meta")
        if tm is not None:
            return tuple(int(s) for s in tm.shape)
    if isinstance(val, torch.Tensor):
        return tuple(int(s) for s in val.shape)
    return None


def node_dtype(node):
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return val.dtype
    tm = node.meta.get("tensor_meta")
    return tm.dtype if tm is not None else None


def value_class(shape: tuple[int, ...] | None, rows: int, d: int, *, into_rows: bool = False) -> str | None:
    """How a tensor of ``shape`` sits in the ``[rows, d]`` space, or None if it does not.

    The order follows torch's broadcasting: a 1-d tensor of length ``d`` lines up with the
    last dim (a row-broadcast vector), even when ``rows == d``. ``into_rows``: the tensor is an
    operand broadcast into a row block's result, where torch aligns trailing dims: ``rows``
    values are one per row only when the last dim is 1, and a tensor that repeats along the
    rows (``pos`` [T, D] added to ``tok`` [B, T, D]) is ``"periodic"`` (see :func:`period`).
    """
    if shape is None:
        return None
    n = prod(shape)
    if len(shape) >= 1 and shape[-1] == d and n == rows * d:
        return "row"
    if n == d and len(shape) >= 1 and shape[-1] == d and rows > 1:
        return "colvec"
    if n == rows and (not into_rows or len(shape) == 0 or shape[-1] == 1 or d == 1):
        return "rowvec" if rows > 1 or n == 1 else "scalar"
    if n == 1:
        return "scalar"
    if into_rows and period(shape, rows, d):
        return "periodic"
    return None


def period(shape, rows: int, d: int) -> int | None:
    """The rows after which a tensor broadcast into a ``[rows, d]`` row block repeats: ``T`` for
    a ``[T, d]`` (or ``[1, T, d]``) one in ``[B, T, d]``, row ``r`` reading its row ``r % T``;
    None if it is not such a tensor (a size-1 dim inside it repeats rows, not periods)."""
    dims = list(shape or ())
    while dims and dims[0] == 1:
        dims.pop(0)
    if not dims or dims[-1] != d or 1 in dims:
        return None
    t = prod(dims) // d
    return t if 1 < t < rows and rows % t == 0 else None


def operand_class(node: fx.Node, operand, rows: int, d: int) -> str | None:
    """How ``operand`` sits in the ``[rows, d]`` space as an operand of ``node``: broadcast
    into a row block when ``node`` is a pointwise op with a row result."""
    into = (not is_reduction(packet_name(node.target))
            and value_class(node_shape(node), rows, d) == "row")
    return value_class(node_shape(operand), rows, d, into_rows=into)


def _space_of(node: fx.Node) -> tuple[int, int] | None:
    """The ``[rows, D]`` space an op works in: its output's, or its input's for a reduction."""
    name = packet_name(node.target)
    if is_reduction(name):
        shape = node_shape(node.args[0])
    else:
        shape = node_shape(node)
    if shape is None:
        return None
    if not shape:
        return (1, 1)  # a 0-d tensor (a step counter): one row of one element
    d = shape[-1]
    return (prod(shape) // d if d else 0, d)


def _tensor_args(node: fx.Node) -> list[fx.Node]:
    out = []
    for a in list(node.args) + list(node.kwargs.values()):
        if isinstance(a, fx.Node):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(x for x in a if isinstance(x, fx.Node))
    return out


def _reduction_ok(node: fx.Node) -> str | None:
    """None if the reduction is over the last dim only, else the reason it is not."""
    shape = node_shape(node.args[0])
    named = named_args(node)
    dims = named.get("dim", named.get("dims"))  # aten spells it dim, prims dims
    if isinstance(named.get("ord"), fx.Node):
        return "a norm whose order is a tensor"
    if dims is None or (isinstance(dims, (list, tuple)) and not dims):
        return "reduces over every dim (a cross-partition reduction)"
    if isinstance(dims, int):
        dims = [dims]
    nd = len(shape)
    if nd == 0:
        return "reduces a 0-d tensor"
    dims = sorted({d % nd for d in dims})
    if dims != [nd - 1]:
        return f"reduces over dims {dims} of a {nd}-d tensor, not only the last (a cross-partition reduction)"
    return None


def _moves_device(node: fx.Node) -> bool:
    """A copy to another device (``.cpu()`` inside the graph) is not device work."""
    val = node.meta.get("val")
    src = node.args[0].meta.get("val") if node.args and isinstance(node.args[0], fx.Node) else None
    return (isinstance(val, torch.Tensor) and isinstance(src, torch.Tensor)
            and val.device.type != src.device.type)


def fusible_op(node: fx.Node) -> tuple[str | None, str | None]:
    """(role, reason): role in elementwise/reduction/view/matmul, or a reason it is not fusible."""
    if node.op != "call_function":
        return None, f"{node.op} nodes are not fused"
    name = packet_name(node.target)
    shape = node_shape(node)
    if shape is None:
        return None, f"returns several tensors: runs as the device's own aten.{name} lowering (one execution)"
    if prod(shape) == 0:
        return None, "makes a tensor of no elements (nothing to compute)"
    if name in MATMULS:
        operands = node.args[1:3] if name == "addmm" else node.args[:2]
        ok = all(isinstance(a, fx.Node) and len(node_shape(a) or ()) in (2, 3) for a in operands)
        return ("matmul", None) if ok else (None, f"{name} with operands of rank other than 2 or 3")
    if name in _TRANSPOSES:
        return None, "a transpose changes the [rows, D] layout (metadata only on the device)"
    if is_reduction(name):
        why = _reduction_ok(node)
        return ("reduction", None) if why is None else (None, why)
    if _moves_device(node):
        return None, "copies to another device"
    if name in VIEWS:
        return "view", None
    if row_of(name) is not None or name in CONSTANTS:
        return "elementwise", None
    return None, f"no fusion rule for aten.{name}"


def _joins(seg: Segment, node: fx.Node, produced: set) -> bool:
    """Can ``node`` run inside ``seg``: its output and every tensor it reads fit the space
    (a per-row value such as a mean joins the group of the rows it summarises; a periodic
    input joins a row group, read row by row from its period)."""
    rows, d = seg.space
    if value_class(node_shape(node), rows, d) is None:
        return False
    name = packet_name(node.target)
    if is_reduction(name) and value_class(node_shape(node.args[0]), rows, d) != "row":
        return False
    return not _misfits(node, seg.space, produced, periodic=seg.kind == "rowgroup")


def _misfits(node: fx.Node, space, produced: set, *, periodic: bool = True) -> list:
    """The operands of ``node`` that do not fit ``space`` (periodic ones only where the group
    reads them from HBM: ``periodic`` and not computed in the group, ``produced``)."""
    rows, d = space
    out = []
    for a in _tensor_args(node):
        cls = operand_class(node, a, rows, d)
        if cls is None or (cls == "periodic" and (a in produced or not periodic)):
            out.append(a)
    return out


def plan_graph(gm: fx.GraphModule, forced: dict | None = None, *, reductions: bool = False) -> list[Segment]:
    """Cut ``gm`` (shapes in ``node.meta``) into fused and eager segments.

    ``forced`` maps nodes that emission could not handle to the reason: they run eagerly.
    ``reductions``: reductions over a matmul's output rows join its segment (the product is
    then made again, or kept, for each pass over the rows; the backend keeps this plan only
    where the simulator times it shorter)."""
    forced = forced or {}
    segments: list[Segment] = []
    current: Segment | None = None
    produced: set = set()

    def close():
        nonlocal current, produced
        if current is not None and current.nodes:
            segments.append(current)
        current, produced = None, set()

    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        if node in forced:
            close()
            segments.append(Segment("eager", [node], reason=forced[node]))
            continue
        role, reason = fusible_op(node)
        if role == "matmul":
            close()
            current = Segment("matmul", [node], space=_space_of(node))
            produced = {node}
            continue
        if role in ("elementwise", "reduction", "view"):
            space = _space_of(node)
            if current is not None and current.kind == "matmul":
                # epilogue: pointwise work on the matmul's output, in its space, and (where
                # ``reductions``) reductions over its rows -- a projection's log-softmax -- kept
                # per output block as the blocks leave PSUM
                if (role in ("elementwise", "view") or (role == "reduction" and reductions)) \
                        and _joins(current, node, produced) and any(a in produced for a in _tensor_args(node)):
                    current.nodes.append(node)
                    produced.add(node)
                    continue
                close()
            if current is not None and _joins(current, node, produced):
                current.nodes.append(node)
                produced.add(node)
                continue
            if role == "view" and packet_name(node.target) not in _COPIES:
                # a view that changes the row layout is free on the device: run it as a view
                close()
                segments.append(Segment("view", [node], reason="changes the [rows, D] layout (metadata only)"))
                continue
            close()
            if space is None or value_class(node_shape(node), *space) is None:
                segments.append(Segment("eager", [node], reason="output does not fit a [rows, D] row group"))
                continue
            misfit = _misfits(node, space, set())
            if misfit:
                shapes = ", ".join(str(node_shape(a)) for a in misfit)
                segments.append(Segment("eager", [node], reason=(
                    f"operand of shape {shapes} is neither a row block, a per-row value, a row-broadcast "
                    f"vector, a periodic block nor a scalar of the [{space[0]}, {space[1]}] space")))
                continue
            current = Segment("rowgroup", [node], space=space)
            produced = {node}
            continue
        close()
        if node.target is operator.getitem or packet_name(node.target) in _METADATA:
            segments.append(Segment("view", [node], reason="metadata only (a view or a tuple element)"))
            continue
        segments.append(Segment("eager", [node], reason=reason))
    close()
    _mark_transposed_operands(segments)
    _wire(gm, segments)
    return segments


_TRANSPOSES = {"t", "transpose", "permute", "numpy_T"}
# "views" that copy when they stand alone (inside a group they are the value they copy)
_COPIES = {"clone", "contiguous", "lift_fresh_copy"}
# ops that only make views (or pick from a tuple): free on the device when not fused
_METADATA = _TRANSPOSES | {"getitem", "split", "split_with_sizes", "unbind", "chunk", "slice", "select",
                           "as_strided", "unfold", "diagonal"}


def is_transposed_2d(node) -> bool:
    """A 2-d value laid out as the transpose of a contiguous matrix (e.g. ``w.t()``)."""
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    if not isinstance(val, torch.Tensor) or val.dim() != 2:
        return False
    rows, cols = val.shape
    return rows > 1 and cols > 1 and tuple(val.stride()) == (1, rows)


def _mark_transposed_operands(segments: list[Segment]) -> None:
    """Matmul operands laid out transposed (every nn.Linear's ``w.t()``, backward's saved
    views) are read as stored: no copy to make them contiguous first."""
    for seg in segments:
        if seg.kind != "matmul":
            continue
        mm = seg.nodes[0]
        name = packet_name(mm.target)
        if name not in ("mm", "addmm"):
            continue
        a, bmat = (mm.args[1], mm.args[2]) if name == "addmm" else (mm.args[0], mm.args[1])
        seg.a_transposed = is_transposed_2d(a)
        seg.b_transposed = is_transposed_2d(bmat)


def _wire(gm: fx.GraphModule, segments: list[Segment]) -> None:
    """Fill each segment's external inputs and the outputs used after it."""
    owner = {}
    for k, seg in enumerate(segments):
        for n in seg.nodes:
            owner[n] = k
    graph_outputs = set()
    for node in gm.graph.nodes:
        if node.op == "output":
            graph_outputs.update(_tensor_args(node))
    for k, seg in enumerate(segments):
        inside = set(seg.nodes)
        seen = []
        for n in seg.nodes:
            for a in _tensor_args(n):
                if a not in inside and a not in seen:
                    seen.append(a)
        seg.inputs = seen
        seg.outputs = [
            n for n in seg.nodes
            if n in graph_outputs or any(owner.get(u, -1) != k for u in n.users)
        ]
