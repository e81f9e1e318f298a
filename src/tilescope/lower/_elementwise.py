"""Elementwise ops: one tiled loop over the output, operands through their own strides.

Broadcasting is an access pattern (stride 0), so each operand is loaded straight from
HBM into a tile of the output's shape. Each op is one row of :data:`OPS`: which
arguments are tensor operands and how to compute one tile from them with engine
instructions (ScalarE activations, VectorE tensor-tensor / tensor-scalar ALU ops,
selects). Number arguments arrive as runtime scalars.

Engines compute in float32 and round when writing the destination tile, as the
hardware's engines do; integer and bool tensors go through the same instructions.
"""

from __future__ import annotations

from collections import Counter

from ..isa import AP, RuntimeScalar
from ..program import TileBuilder, View
from ._call import Call, ScalarArg, TensorMeta
from ._layout import coalesce, hbm_input, hbm_output, load_operand, memory_order, plan_ns, spread
from ._transposed import out_shape, queues, row_ap, subtiles, transpose_in, transposed_ns, transposed_plan, transposed_tiles
from ._rules import Rule, add_rules

__all__ = ["OPS", "TileOps", "EngineLoad", "balanced_copy", "partition_scalar", "lower_elementwise", "lower_foreach",
           "broadcast_strides"]

_MAX_FREE = 2048


def broadcast_strides(meta: TensorMeta, shape: tuple[int, ...]) -> tuple[int, ...]:
    """``meta``'s strides over the broadcast ``shape`` (0 where it is broadcast)."""
    pad = len(shape) - len(meta.shape)
    out = []
    for i, n in enumerate(shape):
        j = i - pad
        if j < 0 or meta.shape[j] == 1 and n != 1:
            out.append(0)
        else:
            out.append(meta.stride[j])
    return tuple(out)


class _Decline(Exception):
    """This call is outside what the row handles (the generic lowering takes it)."""


# ALU ops ScalarE also runs as tensor_scalar ([isa] nki.isa.tensor_scalar: "using Vector or
# Scalar or GpSimd Engine"; bit-vector operators are VectorE only)
_ACT_ALU = frozenset({"add", "subtract", "multiply"})


class EngineLoad:
    """Modeled busy time per engine of what a builder has emitted so far (from the cost table),
    to give work that two engines can do to the one that finishes it first.

    >>> from tilescope.program import TileBuilder
    >>> b = TileBuilder("x")
    >>> t = b.sbuf((128, 512), "float32", site="t")
    >>> _ = b.memset(t, 1.0)
    >>> load = EngineLoad(b)
    >>> load.busy_ns("dve") > 0 and load.busy_ns("act") == 0
    True
    """

    def __init__(self, b: TileBuilder):
        self.b = b
        self._seen = 0
        self._ns: dict[str, float] = {}
        self._cost: dict[int, tuple[str, float]] = {}  # template id -> (engine, ns)

    def busy_ns(self, engine: str) -> float:
        from ..isa import engine_ns

        b = self.b
        n = b.instruction_count
        if n > self._seen:
            # an instruction costs what its template does (the template differs only in buffers of
            # the same memory, shape and dtype, and in offsets): each template is priced once
            tmpl = b.rows(self._seen, n)[0]
            for t, count in Counter(tmpl.tolist()).items():
                cost = self._cost.get(t)
                if cost is None:
                    instr = b.template(t)
                    ns = engine_ns(instr, b.spec) if instr.engine not in ("dma", "pe") else 0.0
                    cost = self._cost[t] = (instr.engine, ns)
                if cost[1]:
                    self._ns[cost[0]] = self._ns.get(cost[0], 0.0) + count * cost[1]
            self._seen = n
        return self._ns.get(engine, 0.0)

    def pick(self, instr, engines: tuple[str, ...]):
        """``instr`` on whichever of ``engines`` would finish it first."""
        import dataclasses

        from ..isa import engine_ns

        best, best_end = instr, None
        for e in engines:
            cand = instr if instr.engine == e else dataclasses.replace(instr, engine=e)
            end = self.busy_ns(e) + engine_ns(cand, self.b.spec)
            if best_end is None or end < best_end:
                best, best_end = cand, end
        return best


def balanced_copy(b: TileBuilder, load: EngineLoad | None, dst, src) -> None:
    """``tensor_copy`` (a cast, a PSUM evacuation) on whichever of VectorE and ScalarE frees up
    first by the cost table (VectorE without a ``load``)."""
    engine = "dve"
    if load is not None:
        from ..isa import TensorCopy
        from ..program import as_ap

        engine = load.pick(TensorCopy(as_ap(dst), as_ap(src)), ("dve", "act")).engine
    b.tensor_copy(dst, src, engine=engine)


def partition_scalar(v):
    """The ``[P, 1]`` per-partition scalar a tile operand holds, or None.

    A value broadcast along every free dim (a per-row statistic when each partition holds one
    row, a 0-d tensor) is a ``tensor_scalar`` operand: one pass over the other operand instead
    of a two-input ``tensor_tensor``."""
    if not isinstance(v, View):
        return None
    dims = v.ap.dims
    if len(dims) < 2 or any(c > 1 and s != 0 for s, c in dims[1:]):
        return None
    if v.ap.free_size == 1 and len(dims) == 2:
        return v
    ap = AP(v.ap.buffer, v.ap.dtype, v.ap.offset, (dims[0], (1, 1)))
    return View(v.buffer, ap, (dims[0][1], 1))


class TileOps:
    """What an op row uses to compute one tile: engines, temporaries, operands.

    The eager lowering calls each row once per tile of the op's output; the compiler's fusion
    calls it once per tile of a fused group, with operands that already live on chip. ``load``
    (an :class:`EngineLoad`) lets ``tensor_scalar`` work go to ScalarE when VectorE is busier.
    """

    def __init__(self, b: TileBuilder, out: View, shape, *, load: EngineLoad | None = None, site: str = "ew"):
        self.b = b
        self.out = out
        self.shape = shape
        self.load = load
        self.site = site
        self._n = 0

    def tmp(self) -> View:
        self._n += 1
        return self.b.sbuf(self.shape, "float32", site=f"{self.site}.tmp{self._n}")

    # one method per instruction form (dst first)
    def act(self, dst, src, func, scale=1.0, bias=None):
        self.b.activation(dst, src, func, scale=scale, bias=bias)

    def ts(self, dst, src, op0, s0, op1=None, s1=None, rev0=False, rev1=False):
        engine = "dve"
        if self.load is not None and op0 in _ACT_ALU and (op1 is None or op1 in _ACT_ALU):
            from ..isa import TensorScalar
            from ..program import as_ap
            from ..program.internal import scalar_operand as _scalar

            cand = TensorScalar(as_ap(dst), as_ap(src), op0, _scalar(s0), op1, _scalar(s1), rev0, rev1)
            engine = self.load.pick(cand, ("dve", "act")).engine
        self.b.tensor_scalar(dst, src, op0, s0, op1, s1, reverse0=rev0, reverse1=rev1, engine=engine)

    def tt(self, dst, a, b, op):
        self.b.tensor_tensor(dst, a, b, op)

    def copy(self, dst, src):
        balanced_copy(self.b, self.load, dst, src)

    def select(self, dst, pred, on_true, on_false):
        self.b.select(dst, pred, on_true, on_false)

    def binary(self, dst, a, b, op, reverse=False):
        """``a op b`` where either may be a scalar (``reverse``: ``b op a``); a tile operand
        broadcast along every free dim is a per-partition scalar."""
        if reverse:
            a, b = b, a
        if isinstance(a, View) and a is b and op == "multiply":
            self.act(dst, a, "square")  # x * x reads one tile: ScalarE's square, one pass
            return
        sa, sb = partition_scalar(a), partition_scalar(b)
        if isinstance(a, View) and isinstance(b, View) and sb is not None and sa is None:
            self.ts(dst, a, op, sb)
        elif isinstance(a, View) and isinstance(b, View) and sa is not None and sb is None:
            self.ts(dst, b, op, sa, rev0=True)
        elif isinstance(a, View) and isinstance(b, View):
            self.tt(dst, a, b, op)
        elif isinstance(a, View):
            self.ts(dst, a, op, b)
        elif isinstance(b, View):
            self.ts(dst, b, op, a, rev0=True)
        else:
            raise _Decline(f"{op} of two scalars")


_Emit = TileOps


def _is_tile(v) -> bool:
    return isinstance(v, View)


def _default(v, d):
    return d if v is None else v


# ---- op rows: (tensor argument names, emit(E, args)) ----
# emit computes the tile into E.out and returns None; or returns a tile holding the result
# already (a copy of an operand); or False to decline the call.

def _unary(func, scale=1.0, bias=None, post=None):
    def emit(E, a):
        E.act(E.out if post is None else E.out, a["self"], func, scale=scale, bias=bias)
        if post is not None:
            post(E)
    return (("self",), emit)


def _alpha_other(E, a, op):
    other, alpha = a["other"], a.get("alpha", 1)
    if isinstance(alpha, (int, float)) and alpha == 1:
        E.binary(E.out, a["self"], other, op)
        return None
    if _is_tile(other):
        t = E.tmp()
        E.ts(t, other, "multiply", alpha)
        E.tt(E.out, a["self"], t, op)
        return None
    return False  # scalar other with a non-default alpha: two runtime scalars multiplied


def _rsub(E, a):
    other, alpha = a["other"], a.get("alpha", 1)
    x = a["self"]
    if _is_tile(other):
        if isinstance(alpha, (int, float)) and alpha == 1:
            E.tt(E.out, other, x, "subtract")
        else:
            t = E.tmp()
            E.ts(t, x, "multiply", alpha)
            E.tt(E.out, other, t, "subtract")
    else:
        E.ts(E.out, x, "multiply", alpha, "subtract", other, rev1=True)


def _div(E, a):
    mode = a.get("rounding_mode")
    if mode is None:
        E.binary(E.out, a["self"], a["other"], "divide")
        return None
    if mode not in ("trunc", "floor"):
        return False
    q = E.tmp()
    E.binary(q, a["self"], a["other"], "divide")
    r = E.tmp()
    E.ts(r, q, "mod", 1.0)  # fmod: the fraction, with the quotient's sign
    if mode == "trunc":
        E.tt(E.out, q, r, "subtract")
    else:
        t = E.tmp()
        E.tt(t, q, r, "subtract")
        neg = E.tmp()
        E.ts(neg, r, "less", 0.0)  # a negative fraction: floor is one below trunc
        E.tt(E.out, t, neg, "subtract")


def _cmp(op):
    return (("self", "other"), lambda E, a: E.binary(E.out, a["self"], a["other"], op))


def _pow(E, a):
    base, exp = a["self"], a["exponent"]
    if _is_tile(base):
        E.binary(E.out, base, exp, "power")
    else:  # Scalar base, tensor exponent
        E.ts(E.out, exp, "power", base, rev0=True)


def _clamp(E, a):
    x, lo, hi = a["self"], a.get("min"), a.get("max")
    if lo is None and hi is None:
        return False
    if lo is not None and hi is not None:
        if _is_tile(lo) or _is_tile(hi):
            t = E.tmp()
            E.binary(t, x, lo, "maximum")
            E.binary(E.out, t, hi, "minimum")
        else:
            E.ts(E.out, x, "maximum", lo, "minimum", hi)
    elif lo is not None:
        E.binary(E.out, x, lo, "maximum")
    else:
        E.binary(E.out, x, hi, "minimum")


def _clamp_one(op):
    def emit(E, a):
        bound = a.get("min") if op == "maximum" else a.get("max")
        E.binary(E.out, a["self"], bound, op)
    return emit


def _where(E, a):
    cond, x, y = a["condition"], a["self"], a["other"]
    if _is_tile(x):
        E.select(E.out, cond, x, y)
    elif _is_tile(y):
        # cond ? scalar : tile  ==  (cond == 0) ? tile : scalar
        inv = E.tmp()
        E.ts(inv, cond, "equal", 0.0)
        E.select(E.out, inv, y, x)
    else:
        return False


def _masked_fill(E, a):
    keep = E.tmp()
    E.ts(keep, a["mask"], "equal", 0.0)
    E.select(E.out, keep, a["self"], a["value"])  # a tensor value (0-dim) arrives broadcast as a tile


def _addc(op):
    def emit(E, a):
        t = E.tmp()
        E.tt(t, a["tensor1"], a["tensor2"], op)
        value = a.get("value", 1)
        if not (isinstance(value, (int, float)) and value == 1):
            E.ts(t, t, "multiply", value)
        E.tt(E.out, a["self"], t, "add")
    return (("self", "tensor1", "tensor2"), emit)


def _lerp(E, a):
    x, end, w = a["self"], a["end"], a["weight"]
    t = E.tmp()
    E.tt(t, end, x, "subtract")
    E.binary(t, t, w, "multiply")
    E.tt(E.out, x, t, "add")


def _fill(E, a):
    value = a["value"]
    if _is_tile(value):
        E.copy(E.out, value)  # fill_.Tensor: a 0-dim tensor broadcast by its access pattern
        return None
    E.b.memset(E.out, 0.0)
    if not (isinstance(value, (int, float)) and value == 0):
        E.ts(E.out, E.out, "add", value)


def _zero(E, a):
    E.b.memset(E.out, 0.0)


def _copy_like(E, a):
    src = a["self"]
    if isinstance(src, View) and src.dtype == E.out.dtype:
        return src  # the same bytes: stored straight from the tile they were loaded into
    E.copy(E.out, src)


def _leaky_relu(E, a):
    slope = a.get("negative_slope", 0.01)
    neg = E.tmp()
    E.ts(neg, a["self"], "minimum", 0.0, "multiply", slope)
    pos = E.tmp()
    E.ts(pos, a["self"], "maximum", 0.0)
    E.tt(E.out, pos, neg, "add")


def _hardtanh(E, a):
    E.ts(E.out, a["self"], "maximum", _default(a.get("min_val"), -1.0), "minimum", _default(a.get("max_val"), 1.0))


def _gelu(E, a):
    E.act(E.out, a["self"], "gelu_tanh" if a.get("approximate", "none") == "tanh" else "gelu")


def _softplus(E, a):
    beta = a.get("beta", 1)
    if isinstance(beta, (int, float)) and beta == 1:
        E.act(E.out, a["self"], "softplus")
    else:
        t = E.tmp()
        E.act(t, a["self"], "softplus", scale=beta)
        E.ts(E.out, t, "divide", beta)


def _elu(E, a):
    alpha = a.get("alpha", 1.0)
    if not all(isinstance(a.get(k, 1), (int, float)) and a.get(k, 1) == 1 for k in ("scale", "input_scale")):
        return False
    x = a["self"]
    e = E.tmp()
    E.ts(e, x, "minimum", 0.0)
    E.act(e, e, "exp")
    E.ts(e, e, "subtract", 1.0, "multiply", alpha)
    p = E.tmp()
    E.ts(p, x, "maximum", 0.0)
    E.tt(E.out, p, e, "add")


def _hardsigmoid(E, a):
    E.ts(E.out, a["self"], "divide", 6.0, "add", 0.5)
    E.ts(E.out, E.out, "maximum", 0.0, "minimum", 1.0)


def _hardswish(E, a):
    t = E.tmp()
    E.ts(t, a["self"], "divide", 6.0, "add", 0.5)
    E.ts(t, t, "maximum", 0.0, "minimum", 1.0)
    E.tt(E.out, t, a["self"], "multiply")


def _mish(E, a):
    t = E.tmp()
    E.act(t, a["self"], "softplus")
    E.act(t, t, "tanh")
    E.tt(E.out, t, a["self"], "multiply")


def _sigmoid_backward(E, a):
    g, y = a["grad_output"], a["output"]
    t = E.tmp()
    E.ts(t, y, "subtract", 1.0, rev0=True)  # 1 - y
    E.tt(t, t, y, "multiply")
    E.tt(E.out, t, g, "multiply")


def _tanh_backward(E, a):
    g, y = a["grad_output"], a["output"]
    t = E.tmp()
    E.tt(t, y, y, "multiply")
    E.ts(t, t, "subtract", 1.0, rev0=True)  # 1 - y^2
    E.tt(E.out, t, g, "multiply")


def _threshold_backward(E, a):
    g, x, thr = a["grad_output"], a["self"], a["threshold"]
    keep = E.tmp()
    E.ts(keep, x, "greater", thr)
    E.tt(E.out, keep, g, "multiply")


def _silu_backward(E, a):
    g, x = a["grad_output"], a["self"]
    s = E.tmp()
    E.act(s, x, "sigmoid")
    t = E.tmp()
    E.ts(t, s, "subtract", 1.0, rev0=True)  # 1 - s
    E.tt(t, t, x, "multiply")
    E.ts(t, t, "add", 1.0)  # 1 + x (1 - s)
    E.tt(t, t, s, "multiply")
    E.tt(E.out, t, g, "multiply")


_GELU_K = 0.7978845608028654  # sqrt(2 / pi)
_GELU_C = 0.044715


def _gelu_tanh_backward(E, g, x):
    """d/dx of 0.5 x (1 + tanh(u)), u = k (x + c x^3). With s = sigmoid(2u) = 0.5 (1 + tanh u)
    and 1 - tanh(u)^2 = 4 s (1 - s): s (1 + 2 x (1 - s) k (1 + 3 c x^2)). The affine steps and the
    square run on ScalarE (func(scale * x + bias) in one pass), the products on VectorE."""
    x2 = E.tmp()
    E.act(x2, x, "square")
    s = E.tmp()
    E.act(s, x2, "identity", scale=_GELU_C * _GELU_K, bias=_GELU_K)  # u / x
    E.tt(s, s, x, "multiply")  # u
    E.act(s, s, "sigmoid", scale=2.0)
    du = E.tmp()
    E.act(du, x2, "identity", scale=6 * _GELU_C * _GELU_K, bias=2 * _GELU_K)  # 2 du/dx
    t = E.tmp()
    E.act(t, s, "identity", scale=-1.0, bias=1.0)  # 1 - s
    E.tt(t, t, x, "multiply")
    E.tt(t, t, du, "multiply")
    E.act(t, t, "identity", bias=1.0)
    E.tt(t, t, s, "multiply")
    E.tt(E.out, t, g, "multiply")


def _gelu_backward(E, a):
    g, x = a["grad_output"], a["self"]
    if a.get("approximate", "none") == "tanh":
        return _gelu_tanh_backward(E, g, x)
    if a.get("approximate", "none") != "none":
        return False
    cdf = E.tmp()
    E.act(cdf, x, "erf", scale=0.7071067811865476)
    E.ts(cdf, cdf, "multiply", 0.5, "add", 0.5)  # Phi(x)
    pdf = E.tmp()
    E.tt(pdf, x, x, "multiply")
    E.act(pdf, pdf, "exp", scale=-0.5)
    E.tt(pdf, pdf, x, "multiply")
    E.ts(pdf, pdf, "multiply", 0.3989422804014327)  # x phi(x)
    E.tt(cdf, cdf, pdf, "add")
    E.tt(E.out, cdf, g, "multiply")


def _dropout_backward(E, a):
    t = E.tmp()
    E.tt(t, a["grad_output"], a["mask"], "multiply")
    E.ts(E.out, t, "multiply", a.get("scale", 1.0))


def _isinf(E, a):
    t = E.tmp()
    E.act(t, a["self"], "abs")
    E.ts(E.out, t, "equal", float("inf"))


def _remainder(E, a):
    """Python's modulo (the divisor's sign): fmod, plus the divisor where the signs differ."""
    x, y = a["self"], a["other"]
    m = E.tmp()
    E.binary(m, x, y, "mod")
    neg = E.tmp()
    E.binary(neg, m, y, "multiply")
    E.ts(neg, neg, "less", 0.0)
    E.binary(neg, neg, y, "multiply")
    E.tt(E.out, m, neg, "add")


def _logaddexp(E, a):
    x, y = a["self"], a["other"]
    hi = E.tmp()
    E.binary(hi, x, y, "maximum")
    d = E.tmp()
    E.binary(d, x, y, "subtract")
    E.act(d, d, "abs")
    E.act(d, d, "exp", scale=-1.0)     # exp(-|x - y|)
    E.act(d, d, "log", bias=1.0)       # log1p
    E.tt(E.out, hi, d, "add")


def _log_base(k):
    def emit(E, a):
        t = E.tmp()
        E.act(t, a["self"], "log")
        E.ts(E.out, t, "multiply", k)
    return (("self",), emit)


def _expm1(E, a):
    t = E.tmp()
    E.act(t, a["self"], "exp")
    E.ts(E.out, t, "subtract", 1.0)


def _rsqrt_like(func):
    return (("self",), lambda E, a: E.act(E.out, a["self"], func))


_BIN = ("self", "other")

# Rows exist for ops that reach a backend: CompositeImplicitAutograd ops (subtract, clip,
# isfinite, relu6, ...) are decomposed by torch before the device or the compiler sees them.
OPS: dict[str, tuple[tuple[str, ...], object]] = {
    # unary, ScalarE activation table
    "abs": _unary("abs"), "neg": _unary("negative"),
    "exp": _unary("exp"), "log": _unary("log"), "sqrt": _unary("sqrt"), "rsqrt": _unary("rsqrt"),
    "tanh": _unary("tanh"), "sigmoid": _unary("sigmoid"), "relu": _unary("relu"),
    "sin": _unary("sin"), "cos": _unary("cos"), "erf": _unary("erf"), "sign": _unary("sign"),
    "sgn": _unary("sign"), "reciprocal": _unary("reciprocal"), "silu": _unary("silu"),
    "log1p": _unary("log", bias=1.0), "exp2": _unary("exp", scale=0.6931471805599453),
    "log2": _log_base(1.4426950408889634), "log10": _log_base(0.4342944819032518),
    "expm1": (("self",), _expm1), "gelu": (("self",), _gelu), "softplus": (("self",), _softplus),
    "leaky_relu": (("self",), _leaky_relu), "hardtanh": (("self",), _hardtanh),
    "elu": (("self",), _elu), "hardsigmoid": (("self",), _hardsigmoid),
    "hardswish": (("self",), _hardswish), "mish": (("self",), _mish),
    # binary, VectorE ALU (tensor-tensor, or tensor-scalar with a runtime scalar)
    "add": (_BIN, lambda E, a: _alpha_other(E, a, "add")),
    "sub": (_BIN, lambda E, a: _alpha_other(E, a, "subtract")),
    "rsub": (_BIN, _rsub),
    "mul": (_BIN, lambda E, a: E.binary(E.out, a["self"], a["other"], "multiply")),
    "div": (_BIN, _div),
    "maximum": (_BIN, lambda E, a: E.binary(E.out, a["self"], a["other"], "maximum")),
    "minimum": (_BIN, lambda E, a: E.binary(E.out, a["self"], a["other"], "minimum")),
    "fmod": (_BIN, lambda E, a: E.binary(E.out, a["self"], a["other"], "mod")),
    "remainder": (_BIN, _remainder), "logaddexp": (_BIN, _logaddexp),
    "pow": (("self", "exponent"), _pow),
    "eq": _cmp("equal"), "ne": _cmp("not_equal"), "lt": _cmp("less"), "le": _cmp("less_equal"),
    "gt": _cmp("greater"), "ge": _cmp("greater_equal"),
    "logical_and": _cmp("logical_and"), "logical_or": _cmp("logical_or"),
    "logical_xor": _cmp("logical_xor"),
    "logical_not": (("self",), lambda E, a: E.ts(E.out, a["self"], "equal", 0.0)),
    "clamp": (("self", "min", "max"), _clamp),
    "clamp_min": (("self", "min"), _clamp_one("maximum")),
    "clamp_max": (("self", "max"), _clamp_one("minimum")),
    "where": (("condition", "self", "other"), _where),
    "masked_fill": (("self", "mask", "value"), _masked_fill),
    "addcmul": _addc("multiply"), "addcdiv": _addc("divide"),
    "lerp": (("self", "end", "weight"), _lerp),
    "fill": (("self", "value"), _fill), "zero": (("self",), _zero),
    "_to_copy": (("self",), _copy_like), "clone": (("self",), _copy_like),
    "alias_copy": (("self",), _copy_like),
    # backward formulas of activations
    "sigmoid_backward": (("grad_output", "output"), _sigmoid_backward),
    "tanh_backward": (("grad_output", "output"), _tanh_backward),
    "threshold_backward": (("grad_output", "self"), _threshold_backward),
    "silu_backward": (("grad_output", "self"), _silu_backward),
    "gelu_backward": (("grad_output", "self"), _gelu_backward),
    "native_dropout_backward": (("grad_output", "mask"), _dropout_backward),
    # classification
    "isnan": (("self",), lambda E, a: E.tt(E.out, a["self"], a["self"], "not_equal")),
    "isinf": (("self",), _isinf),
    "isposinf": (("self",), lambda E, a: E.ts(E.out, a["self"], "equal", float("inf"))),
    "isneginf": (("self",), lambda E, a: E.ts(E.out, a["self"], "equal", float("-inf"))),
}


def lower_elementwise(call: Call, spec):
    """The Program of an elementwise ``call`` (None when the row declines)."""
    packet = call.packet.rstrip("_") if call.packet not in ("_to_copy",) else call.packet
    row = OPS.get(packet)
    if row is None or len(call.outputs) != 1:
        return None
    tensor_names, emit = row
    b = TileBuilder(call.op, spec)
    with b.provenance(op=call.op):
        if not _emit_one(b, spec, call.named(), tensor_names, emit, call.outputs[0], ""):
            return None
    return b.build(meta={"lowering": "elementwise"})


# foreach argument name -> the per-tensor row's argument name
_FOREACH_ARGS = {"scalar": "other", "scalars": "other", "tensors1": "end", "weights": "weight"}
_FOREACH_VALUE = {"addcmul", "addcdiv"}  # their Scalar(s) is the row's "value"


def lower_foreach(call: Call, spec):
    """``_foreach_<op>``: the elementwise row of ``<op>`` for every tensor of the lists, in
    one Program (one device execution for the whole list, as a fused multi-tensor kernel)."""
    base = call.packet[len("_foreach_"):].rstrip("_")
    row = OPS.get(base)
    named = call.named()
    selves = named.get("self")
    if row is None or not isinstance(selves, tuple) or len(call.outputs) != len(selves) or not selves:
        return None
    tensor_names, emit = row
    n = len(selves)
    b = TileBuilder(call.op, spec)
    with b.provenance(op=call.op):
        for i, out in enumerate(call.outputs):
            per = {}
            for k, v in named.items():
                key = "value" if base in _FOREACH_VALUE and k in ("scalar", "scalars") else _FOREACH_ARGS.get(k, k)
                per[key] = v[i] if isinstance(v, tuple) and len(v) == n else v
            if not _emit_one(b, spec, per, tensor_names, emit, out, f"t{i}_"):
                return None
    return b.build(meta={"lowering": "elementwise"})


def _load_operand(b, plan, tile, view, st, m, tshape, name):
    """One operand's tile (:func:`~tilescope.lower._layout.load_operand`: a broadcast value -- a
    per-row statistic, a row under several rows, a scalar -- loaded once per partition and
    widened on chip, instead of a DMA that reads it once per output element)."""
    return load_operand(b, plan.operand_ap(view, st, tile), plan.part_dims, tshape, m.device_dtype, f"ew.in_{name}")


def _operands(named: dict, tensor_names, out: TensorMeta):
    """The row's tensor operands ``[(name, meta)]``, or None when the op is not elementwise over
    them: complex values, or an operand that is not a broadcast of the output."""
    tensors = [(n, named[n]) for n in tensor_names if isinstance(named.get(n), TensorMeta)]
    if out.is_complex or any(m.is_complex for _, m in tensors):
        return None  # complex arithmetic is not elementwise over pairs of reals
    shape = out.shape
    for _, m in tensors:
        if len(m.shape) > len(shape) or any(
            n != 1 and n != shape[len(shape) - len(m.shape) + i] for i, n in enumerate(m.shape)
        ):
            return None  # not a broadcast of the output (the op does more than elementwise)
    return tensors


def _compute_tile(b, emit, args, tshape, dtype: str, load) -> View | None:
    """The row ``emit`` over one tile's operands: the tile holding the result, or None when the
    row declines."""
    o = b.sbuf(tshape, dtype, site="ew.out")
    try:
        result = emit(TileOps(b, o, tshape, load=load), args)
    except _Decline:
        return None
    if result is False:
        return None
    return result if isinstance(result, View) else o


def _emit_one(b: TileBuilder, spec, named: dict, tensor_names, emit, out: TensorMeta, prefix: str) -> bool:
    """Emit one elementwise op into ``b``; False when the row declines."""
    tensors = _operands(named, tensor_names, out) if out.numel else None
    if tensors is None:
        return False
    shape = out.shape
    strides = [tuple(out.stride)] + [broadcast_strides(m, shape) for _, m in tensors]
    cshape, cstrides = coalesce(*memory_order(tuple(shape) or (1,), [s or (0,) for s in strides] if not shape else strides))
    max_free = _MAX_FREE if len(tensors) <= 2 else _MAX_FREE // 2
    dtypes = [out.device_dtype] + [m.device_dtype for _, m in tensors]
    layout = spread(cshape, cstrides, dtypes, spec, max_free=max_free)
    views = {n: hbm_input(b, f"{prefix}in_{n}", m) for n, m in tensors}
    out_view = hbm_output(b, f"{prefix}out", out)
    load = EngineLoad(b)
    tplan = transposed_plan(cshape, cstrides, dtypes, spec)
    if tplan is not None and transposed_ns(tplan, cstrides, dtypes, spec) < plan_ns(layout, dtypes, spec,
                                                                                       max_free=max_free):
        return _emit_transposed(b, tplan, cstrides, named, tensors, views, out, out_view, emit, load)
    cstrides = layout.strides
    plan = layout.plan(max_free=max_free, partitions=spec.partitions)
    for tile in plan.tiles:
        tshape = (tile.partitions, tile.free)
        args = {}
        for k, v in named.items():
            args[k] = RuntimeScalar(v.name) if isinstance(v, ScalarArg) else v
        for (n, m), st in zip(tensors, cstrides[1:]):
            args[n] = _load_operand(b, plan, tile, views[n], st, m, tshape, n)
        result = _compute_tile(b, emit, args, tshape, out.device_dtype, load)
        if result is None:
            return False
        b.dma_copy(plan.operand_ap(out_view, cstrides[0], tile), result)
    return True


def _emit_transposed(b, plan, strides, named, tensors, views, out, out_view, emit, load) -> bool:
    """:func:`_emit_one` over a :class:`~tilescope.lower._transposed.TransposedPlan`: the
    transposed operands come through TensorE into PSUM, the others are loaded in the output's
    layout, the row computes each output tile."""
    scalars = {k: RuntimeScalar(v.name) if isinstance(v, ScalarArg) else v for k, v in named.items()}
    queue = queues(b.spec)
    for tile in transposed_tiles(plan):
        from_pe = {i: transpose_in(b, views[n], strides[i], m.device_dtype, plan, tile, f"ew.T{n}", queue)
                   for i, (n, m) in enumerate(tensors, 1) if i in plan.transposed}
        for s, (q0, rq) in enumerate(subtiles(plan, tile)):
            tshape = out_shape(plan, tile, rq)
            parts = 2 if tile.k > 1 else 1
            args = dict(scalars)
            for i, (n, m) in enumerate(tensors, 1):
                if i in from_pe:
                    args[n] = from_pe[i][s]
                else:
                    full = row_ap(views[n], strides[i], plan, tile, q0, rq)
                    args[n] = load_operand(b, full, parts, tshape, m.device_dtype, f"ew.in_{n}", next(queue))
            result = _compute_tile(b, emit, args, tshape, out.device_dtype, load)
            if result is None:
                return False
            b.dma_copy(row_ap(out_view, strides[0], plan, tile, q0, rq), result, queue=next(queue))
    return True


_NAMES = []
for _name in OPS:
    _NAMES += [_name, _name + "_"]
add_rules(_NAMES, Rule("elementwise", lower_elementwise, __doc__.splitlines()[0]))
_FOREACH = []
for _name in OPS:
    _FOREACH += [f"_foreach_{_name}", f"_foreach_{_name}_"]
add_rules(_FOREACH, Rule("elementwise", lower_foreach, "foreach ops: the row of each tensor, one Program"))
