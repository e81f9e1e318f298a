"""Turning planned segments into Programs, through the one tile builder.

Row groups become one loop over 128-row tiles: each input tile is loaded once,
every op of the group runs on SBUF tiles, each output is stored once. Values that
do not fit in the SBUF budget are spilled to an HBM scratch tensor and reloaded
(visibly: ``spill`` provenance labels, counted by ``explain``). Matmul segments
run TensorE over K tiles into PSUM and apply their epilogue while evacuating PSUM.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

import numpy as np
import torch
import torch.fx as fx

from ..dtypes import canonical, itemsize
from ..isa import ACTIVATIONS, ALU_OPS
from ..errors import CapacityError
from ..program import TileBuilder
from ._ops import BINARY, CASTS, REDUCTIONS, UNARY, VIEWS, packet_name, pow_scalar_rule
from ._plan import Segment, _tensor_args, node_dtype, node_shape, value_class

__all__ = ["emit_segments", "EmitStats"]

P = 128
_ACT_ALU = {"multiply", "add", "subtract"}  # ALU ops ScalarE can do as scale / bias


@dataclass
class EmitStats:
    spilled_values: list[str] = field(default_factory=list)
    spill_bytes: int = 0
    bufs: int = 2


def _dt(torch_dtype) -> str:
    return canonical(torch_dtype if torch_dtype != torch.bool else "uint8")


@dataclass
class _Val:
    kind: str  # row | rowvec | colvec | const
    dtype: str
    tile: object = None  # a Handle (row tiles: [n, D]; rowvec: [n, 1]; colvec: [P, D])
    const: float | None = None
    once: bool = False  # loaded before the loop (colvec, scalar tensors)
    spill: object = None  # HBM scratch holding it when spilled
    width: int = 0
    act: int | None = None  # index of the ScalarE activation that produced it (reduce fusion)


class _RowGroupEmitter:
    def __init__(self, b: TileBuilder, seg: Segment, budget: int, stats: EmitStats):
        self.b = b
        self.seg = seg
        # shapes are classified in the segment's space; tiles follow its layout (a pointwise-only
        # group may be re-laid out as wider rows), or a matmul block's width
        self.crows, self.cd = seg.space
        self.rows, self.d = seg.layout or seg.space
        self.budget = budget
        self.stats = stats
        self.engine_time = {"act": 0.0, "dve": 0.0}
        order = {n: k for k, n in enumerate(seg.nodes)}
        self.uses: dict = {}
        for n in seg.nodes:
            for a in _tensor_args(n):
                self.uses.setdefault(a, []).append(order[n])
        for n in seg.outputs:
            self.uses.setdefault(n, []).append(len(seg.nodes))
        self.pos = 0

    # ---- memory accounting and spills ---------------------------------------
    def _live_bytes(self, env) -> int:
        return sum(v.width * itemsize(v.dtype) for v in env.values()
                   if v.tile is not None and not v.once and v.kind != "const")

    def _next_use(self, node) -> int:
        later = [u for u in self.uses.get(node, []) if u >= self.pos]
        return later[0] if later else 10**9

    def _make_room(self, env, need: int, r0: int, n: int) -> None:
        while self._live_bytes(env) + need > self.budget:
            victims = [(self._next_use(k), k) for k, v in env.items()
                       if v.tile is not None and not v.once and v.kind != "const" and self._next_use(k) > self.pos]
            if not victims:
                return
            _, node = max(victims, key=lambda t: (t[0], t[1].name))
            v = env[node]
            if self._next_use(node) >= 10**9:
                v.tile = None  # dead: nothing to save
                continue
            if v.spill is None:
                v.spill = self.b.scratch((self.rows, v.width), v.dtype, name=f"spill_{node.name}")
                self.stats.spilled_values.append(node.name)
            with self.b.provenance(label="spill"):
                self.b.dma_copy(v.spill[r0:r0 + n], v.tile[:n])
            self.stats.spill_bytes += n * v.width * itemsize(v.dtype)
            v.tile = None

    def _ensure(self, env, node, r0: int, n: int) -> _Val:
        v = env[node]
        if v.tile is None and v.kind != "const":
            self._make_room(env, v.width * itemsize(v.dtype), r0, n)
            t = self.b.sbuf((n, v.width), v.dtype, site=f"reload:{node.name}")
            with self.b.provenance(label="spill reload", fx_node=node.name):
                self.b.dma_copy(t, v.spill[r0:r0 + n])
            v.tile = t
        return v

    def _new_tile(self, env, node, n: int, width: int, dtype: str):
        self._make_room(env, width * itemsize(dtype), self._r0, n)
        return self.b.sbuf((n, width), dtype, site=f"n:{node.name}")

    # ---- emission --------------------------------------------------------------
    def emit(self, hbm: dict) -> None:
        b = self.b
        once: dict = {}
        for inp in self.seg.inputs:
            cls = value_class(node_shape(inp), self.crows, self.cd)
            dt = _dt(node_dtype(inp))
            if cls in ("colvec", "scalar"):
                width = self.d if cls == "colvec" else 1
                t = b.sbuf((P, width), dt, site=f"in:{inp.name}", bufs=1)
                src = hbm[inp]
                with b.provenance(label="load (broadcast)", fx_node=inp.name):
                    b.dma_copy(t, _broadcast_rows(src, width))
                once[inp] = _Val("colvec" if cls == "colvec" else "rowvec", dt, t, once=True, width=width)
        for r0, n in b.tiles(self.rows, P):
            self._r0 = r0
            env: dict = dict(once)
            self.pos = 0
            for inp in self.seg.inputs:
                if inp in env:
                    continue
                cls = value_class(node_shape(inp), self.crows, self.cd)
                dt = _dt(node_dtype(inp))
                width = self.d if cls == "row" else 1
                self._make_room(env, width * itemsize(dt), r0, n)
                t = b.sbuf((n, width), dt, site=f"in:{inp.name}")
                with b.provenance(label="load", fx_node=inp.name):
                    b.dma_copy(t, hbm[inp][r0:r0 + n])
                env[inp] = _Val(cls, dt, t, width=width)
            for k, node in enumerate(self.seg.nodes):
                self.pos = k
                with b.provenance(op=f"aten::{packet_name(node.target)}", fx_node=node.name):
                    try:
                        env[node] = self._emit_node(env, node, r0, n)
                    except _Unfusable as e:
                        e.node = getattr(e, "node", None) or node
                        raise
            self.pos = len(self.seg.nodes)
            for out in self.seg.outputs:
                v = self._ensure(env, out, r0, n)
                dst = hbm[out]
                with b.provenance(label="store", fx_node=out.name):
                    if v.kind == "const":
                        t = b.sbuf((n, v.width or 1), v.dtype, site=f"c:{out.name}")
                        b.memset(t, v.const)
                        v = _Val(v.kind, v.dtype, t, width=v.width or 1)
                    if v.kind == "colvec" and value_class(node_shape(out), self.crows, self.cd) == "colvec":
                        if r0 == 0:
                            b.dma_copy(dst[0:1], v.tile[0:1])
                    else:
                        b.dma_copy(dst[r0:r0 + n], v.tile[:n])

    def _operand(self, env, a, r0, n):
        if isinstance(a, fx.Node):
            v = self._ensure(env, a, r0, n)
            if v.kind in ("rowvec", "colvec"):
                # a per-row value whose shape broadcasts along the last dim (or the reverse)
                # would mean a transpose: leave such an op to eager execution
                cls = value_class(node_shape(a), self.crows, self.cd)
                if cls in ("rowvec", "colvec") and cls != v.kind and not v.once:
                    raise _Unfusable(f"{a.name} holds per-{'row' if v.kind == 'rowvec' else 'column'} "
                                     f"values but its shape {node_shape(a)} broadcasts the other way")
            return v
        if isinstance(a, bool):
            return _Val("const", "float32", const=float(a))
        if isinstance(a, (int, float)):
            return _Val("const", "float32", const=float(a))
        raise _Unfusable(f"operand {a!r} is neither a tensor nor a number")

    def _emit_node(self, env, node, r0, n) -> _Val:
        name = packet_name(node.target)
        out_dt = _dt(node_dtype(node))
        args = node.args
        if name in VIEWS:
            return self._view(env, node, r0, n)
        if name in CASTS:
            src = self._operand(env, args[0], r0, n)
            return self._unary(env, node, src, "copy", out_dt, n, cast=True)
        if name in ("full", "scalar_tensor"):
            return _Val("const", out_dt, const=float(args[-1] if name == "full" else args[0]))
        if name in REDUCTIONS:
            op, mean = REDUCTIONS[name]
            src = self._operand(env, args[0], r0, n)
            return self._reduce(env, node, src, op, mean, out_dt, n)
        if name == "var":
            return self._var(env, node, r0, n, out_dt)
        if name == "where":
            cond, x, y = (self._operand(env, a, r0, n) for a in args[:3])
            return self._where(env, node, cond, x, y, out_dt, n)
        if name == "clamp":
            x = self._operand(env, args[0], r0, n)
            lo = args[1] if len(args) > 1 else node.kwargs.get("min")
            hi = args[2] if len(args) > 2 else node.kwargs.get("max")
            for bound, alu in ((lo, "maximum"), (hi, "minimum")):
                if bound is not None:  # a number, or a tensor (clamp.Tensor): read like any operand
                    other = (self._operand(env, bound, r0, n) if isinstance(bound, fx.Node)
                             else _Val("const", "float32", const=float(bound)))
                    x = self._binary(env, node, x, other, alu, out_dt, n)
            return x
        if name == "pow" and not isinstance(args[1], fx.Node):
            kind, what = pow_scalar_rule(args[1])
            x = self._operand(env, args[0], r0, n)
            if kind == "act":
                return self._unary(env, node, x, what, out_dt, n)
            return self._binary(env, node, x, _Val("const", "float32", const=what), "power", out_dt, n)
        if name in UNARY:
            func = UNARY[name]
            if name == "gelu" and node.kwargs.get("approximate", "none") == "tanh":
                func = "gelu_tanh"
            return self._unary(env, node, self._operand(env, args[0], r0, n), func, out_dt, n)
        if name in BINARY:
            a = self._operand(env, args[0], r0, n)
            bv = self._operand(env, args[1], r0, n)
            alpha = node.kwargs.get("alpha", 1)
            if alpha != 1:
                bv = self._binary(env, node, bv, _Val("const", "float32", const=float(alpha)), "multiply", out_dt, n)
            if name == "rsub":
                a, bv = bv, a
            return self._binary(env, node, a, bv, BINARY[name], out_dt, n)
        raise _Unfusable(f"no emission rule for aten.{name}")

    def _view(self, env, node, r0, n) -> _Val:
        src = self._operand(env, node.args[0], r0, n)
        cls = value_class(node_shape(node), self.crows, self.cd)
        if src.kind == "const":
            return src
        if src.kind == "row" and cls != "row":
            raise _Unfusable("a view that changes the row layout")
        return src  # same data, same layout: no instruction

    def _width(self, kind):
        return self.d if kind in ("row", "colvec") else 1

    def _pick_engine(self, op: str, n_elem: int) -> str:
        """ScalarE can do multiply/add by a scalar as activation scale/bias: use whichever of
        ScalarE and VectorE has less modeled work so far (clock rates from the preset)."""
        spec = self.b.spec
        act = self.engine_time["act"] + n_elem / spec.scalar.clock_ghz
        dve = self.engine_time["dve"] + n_elem / spec.vector.clock_ghz
        return "act" if op in _ACT_ALU and act < dve else "dve"

    def _account(self, engine: str, n_elem: int, factor: int = 1) -> None:
        clock = self.b.spec.scalar.clock_ghz if engine == "act" else self.b.spec.vector.clock_ghz
        self.engine_time[engine] += factor * max(64, n_elem) / clock

    def _unary(self, env, node, x: _Val, func: str, out_dt: str, n: int, cast: bool = False) -> _Val:
        if x.kind == "const":
            return _Val("const", out_dt, const=float(ACTIVATIONS[func](np.float32(x.const))))
        width = self._width(x.kind)
        rows = P if x.once else n
        dst = self._new_tile(env, node, rows, width, out_dt)
        if cast and func == "copy":
            self.b.tensor_copy(dst, x.tile[:rows], engine="act" if self._pick_engine("multiply", width) == "act" else "dve")
            self._account("dve", width)
        else:
            index = self.b.activation(dst, x.tile[:rows], func)
            self._account("act", width)
            return _Val(x.kind, out_dt, dst, once=x.once, width=width, act=index)
        return _Val(x.kind, out_dt, dst, once=x.once, width=width)

    def _binary(self, env, node, a: _Val, bv: _Val, op: str, out_dt: str, n: int) -> _Val:
        if a.kind == "const" and bv.kind == "const":
            return _Val("const", out_dt, const=float(ALU_OPS[op](np.float32(a.const), np.float32(bv.const))))
        if op == "multiply" and a is bv:
            # x * x reads one tile: ScalarE's square (N cycles) instead of a two-input
            # VectorE pass (2N cycles)
            return self._unary(env, node, a, "square", out_dt, n)
        # order: a "big" (row/colvec) operand first where possible; remember reversal
        reverse = False
        rank = {"row": 3, "colvec": 2, "rowvec": 1, "const": 0}
        if rank[bv.kind] > rank[a.kind]:
            a, bv, reverse = bv, a, True
        kind = a.kind
        if {a.kind, bv.kind} == {"colvec", "rowvec"} or (a.kind == "colvec" and bv.kind == "row"):
            kind = "row"
        if a.kind == "colvec" and bv.kind in ("rowvec", "row"):
            kind = "row"
        width = self._width(kind)
        once = a.once and (bv.once or bv.kind == "const")
        rows = P if once else n
        dst = self._new_tile(env, node, rows, width, out_dt)
        src = a.tile[:rows]
        if bv.kind == "const" or bv.kind == "rowvec":
            scalar = bv.const if bv.kind == "const" else bv.tile[:rows]
            engine = self._pick_engine(op, width)
            if engine == "act" and not reverse:
                if op == "multiply":
                    self.b.activation(dst, src, "copy", scale=scalar)
                elif op == "add":
                    self.b.activation(dst, src, "copy", bias=scalar)
                else:  # subtract: x - s = x + (-s)
                    if bv.kind == "const":
                        self.b.activation(dst, src, "copy", bias=-scalar)
                    else:
                        engine = "dve"
                if engine == "act":
                    self._account("act", width)
                    return _Val(kind, out_dt, dst, once=once, width=width)
            self.b.tensor_scalar(dst, src, op, scalar, reverse0=reverse)
            self._account("dve", width)
        else:
            other = bv.tile[:rows]
            first, second = (other, src) if reverse else (src, other)
            self.b.tensor_tensor(dst, first, second, op)
            self._account("dve", width, 2)
        return _Val(kind, out_dt, dst, once=once, width=width)

    def _reduce(self, env, node, src: _Val, op: str, mean: bool, out_dt: str, n: int) -> _Val:
        if src.kind != "row":
            raise _Unfusable(f"a reduction over a {src.kind} value")
        acc_dt = out_dt
        dst = self._new_tile(env, node, n, 1, acc_dt)
        producer = node.args[0]
        if (src.act is not None and op in ("add", "max", "min") and len(self.uses.get(producer, ())) == 1
                and not src.once):
            # the value's only use is this reduction: ScalarE reduces while it computes it
            # (activation_reduce), instead of a second pass over the tile on VectorE
            from ..isa import ActivationReduce

            act = self.b.instruction(src.act)
            self.b.replace(src.act, ActivationReduce(act.dst, act.src, act.func, dst.ap, op, act.scale, act.bias))
            self._account("act", 64)
        else:
            self.b.tensor_reduce(dst, src.tile[:n], op)
            self._account("dve", self.d)
        if mean:
            self.b.tensor_scalar(dst, dst, "multiply", 1.0 / self.d)
            self._account("dve", 1)
        return _Val("rowvec", out_dt, dst, width=1)

    def _var(self, env, node, r0, n, out_dt) -> _Val:
        src = self._operand(env, node.args[0], r0, n)
        args = node.args
        correction = node.kwargs.get("correction", args[2] if len(args) > 2 else 1)
        if correction is None:
            correction = 1
        d = self.d
        chunks = -(-d // 512)
        stats = self._new_tile(env, node, n, 6 * chunks, "float32")
        for c in range(chunks):
            lo, hi = c * 512, min(d, (c + 1) * 512)
            self.b.bn_stats(stats[:, 6 * c:6 * c + 6], src.tile[:n, lo:hi])
        mv = self.b.sbuf((n, 2), "float32", site=f"mv:{node.name}")
        self.b.bn_aggr(mv, stats)
        dst = self._new_tile(env, node, n, 1, out_dt)
        # bn_aggr gives the population variance; torch's correction rescales it
        self.b.tensor_scalar(dst, mv[:, 1:2], "multiply", d / max(d - correction, 1))
        self._account("dve", d + 2)
        return _Val("rowvec", out_dt, dst, width=1)

    def _where(self, env, node, cond: _Val, x: _Val, y: _Val, out_dt: str, n: int) -> _Val:
        kinds = {cond.kind, x.kind, y.kind} - {"const"}
        kind = "row" if "row" in kinds or {"colvec", "rowvec"} <= kinds else (kinds.pop() if kinds else "const")
        width = self._width(kind)
        dst = self._new_tile(env, node, n, width, out_dt)

        def full(v: _Val, dt: str):
            if v.kind == "const" or self._width(v.kind) != width:
                t = self.b.sbuf((n, width), dt, site=f"bc:{node.name}")
                if v.kind == "const":
                    self.b.memset(t, v.const)
                elif v.kind == "rowvec":
                    self.b.memset(t, 0.0)
                    self.b.tensor_scalar(t, t, "add", v.tile[:n])
                else:  # colvec: row-broadcast tile already [P, width]
                    return v.tile[:n]
                return t
            return v.tile[:n]

        pred = full(cond, cond.dtype if cond.kind != "const" else "float32")
        on_true = full(x, out_dt)
        on_false = y.const if y.kind == "const" else full(y, out_dt)
        self.b.select(dst, pred, on_true, on_false)
        self._account("dve", 2 * width)
        return _Val(kind, out_dt, dst, width=width)


class _Unfusable(Exception):
    pass


def _broadcast_rows(src_view, width: int):
    """An HBM view of a [width] vector repeated over P partitions (partition stride 0)."""
    from ..isa import AP
    from ..program import View

    ap = src_view.ap
    return View(src_view.buffer, AP(ap.buffer, ap.dtype, ap.offset, ((0, P), (1, width))), (P, width))


def _hbm_view(b: TileBuilder, name: str, node, rows: int, d: int, role: str, shape=None, layout=None):
    dt = _dt(node_dtype(node))
    if shape is not None:
        hshape = shape
    elif layout is not None and value_class(node_shape(node), rows, d) == "row":
        hshape = layout  # the same bytes, seen as the group's wider rows
    else:
        cls = value_class(node_shape(node), rows, d)
        if role == "output" and packet_name(node.target) in (*REDUCTIONS, "var"):
            cls = "rowvec"  # a reduction's result is per row, whatever its shape says
        hshape = {"row": (rows, d), "rowvec": (rows, 1), "colvec": (1, d), "scalar": (1, 1)}.get(
            cls, (prod(node_shape(node)) or 1, 1))
    handle = b.input(name, hshape, dt) if role == "input" else b.output(name, hshape, dt)
    return handle


_LAYOUT_MAX_FREE = 4096  # elements per partition a re-laid-out tile may hold


def pointwise_layout(seg: Segment) -> tuple[int, int] | None:
    """Wider rows for a group that only does pointwise work on full row blocks.

    With no reduction along D and no per-row or per-column operand, any split of the
    elements into rows computes the same thing; a narrow D (e.g. the W of an NCHW image)
    would make tiny tiles and DMAs, so take the widest D2 <= 4096 that divides the element
    count and leaves at least 128 rows. Returns None when the layout must stay.
    """
    rows, d = seg.space
    if d >= 512:
        return None
    for node in seg.nodes:
        name = packet_name(node.target)
        if name in REDUCTIONS or name == "var":
            return None
    values = list(seg.inputs) + list(seg.nodes)
    for v in values:
        if value_class(node_shape(v), rows, d) not in ("row", "scalar"):
            return None
    total = rows * d
    for d2 in range(min(_LAYOUT_MAX_FREE, total // P), d, -1):
        if total % d2 == 0 and (total // d2) % P == 0:
            return (total // d2, d2)
    return None


def emit_segments(segments: list[Segment], name: str, spec, *, budget_fraction: float = 0.4):
    """One Program for a list of fused segments (run in order), plus emission statistics.

    Raises ``_Unfusable`` when a node has no emission rule (the caller then runs it eagerly).
    """
    from ..spec import preset

    spec = preset(spec)
    last_error = None
    for bufs, fraction in ((2, budget_fraction), (1, budget_fraction), (1, budget_fraction / 2)):
        stats = EmitStats(bufs=bufs)
        b = TileBuilder(name, spec, bufs=bufs)
        try:
            _emit_all(b, segments, spec, fraction, stats)
            return b.build(meta={"kind": "compiled", "segments": [s.names for s in segments]}), stats
        except CapacityError as e:
            last_error = e
    raise last_error


def _emit_all(b: TileBuilder, segments, spec, fraction, stats) -> None:
    from ._matmul import emit_matmul

    hbm: dict = {}
    produced = set()
    for seg in segments:
        for n in seg.nodes:
            produced.add(n)
    externals = []
    for seg in segments:
        for inp in seg.inputs:
            if inp not in produced and inp not in externals:
                externals.append(inp)
    outputs = []
    for seg in segments:
        outputs.extend(o for o in seg.outputs if o not in outputs)
    from ._matmul import matmul_operand_shapes

    for seg in segments:
        rows, d = seg.space
        if seg.kind == "rowgroup":
            seg.layout = pointwise_layout(seg)
        natural = matmul_operand_shapes(seg) if seg.kind == "matmul" else {}
        for inp in seg.inputs:
            if inp not in hbm and inp in externals:
                hbm[inp] = _hbm_view(b, inp.name, inp, rows, d, "input", natural.get(inp), seg.layout)
        for out in seg.outputs:
            if out not in hbm:
                hbm[out] = _hbm_view(b, out.name, out, rows, d, "output", None, seg.layout)
    budget = int(spec.sbuf_bytes_per_partition * fraction / stats.bufs)
    for seg in segments:
        if seg.kind == "rowgroup":
            _RowGroupEmitter(b, seg, budget, stats).emit(hbm)
        elif seg.kind == "matmul":
            emit_matmul(b, seg, hbm, stats)
        else:
            raise _Unfusable(f"segment kind {seg.kind} is not emitted")
