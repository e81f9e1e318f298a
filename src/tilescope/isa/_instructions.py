"""Engine instructions as frozen dataclasses.

One class per instruction kind. Operands are :class:`~tilescope.isa.AP` regions of
named buffers; scalars are constants, :class:`~tilescope.isa.RuntimeScalar` slots or
per-partition ``[P, 1]`` APs. Each instruction is bound to one engine: ``pe``
(TensorE), ``act`` (ScalarE), ``dve`` (VectorE), ``pool`` (GpSimd) or ``dma``.
Which engines may run a kind is the ``ENGINES`` row of its class.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Callable, ClassVar, dataclass_transform

from ._ap import AP, RuntimeScalar

__all__ = [
    "Instruction", "DmaCopy", "DmaIndirect", "TensorTensor", "TensorScalar", "Activation",
    "ActivationReduce", "TensorReduce", "TensorCopy", "Select", "Iota", "Memset",
    "Matmul", "Transpose", "BnStats", "BnAggr", "GpsimdCall", "TensorTensorScan",
    "TensorScalarReduce", "AffineSelect", "Reciprocal", "Max8", "MatchReplace8", "FindIndex8", "Dropout",
    "ScalarTensorTensor",
    "INSTRUCTION_KINDS",
    "ENGINE_NAMES",
]

# engine id -> display name
ENGINE_NAMES = {"pe": "TensorE", "act": "ScalarE", "dve": "VectorE", "pool": "GpSimd", "dma": "DMA"}


class Instruction:
    """Base of every instruction: operand bookkeeping shared by all kinds."""

    KIND: ClassVar[str] = ""
    ENGINES: ClassVar[tuple[str, ...]] = ()
    _READS: ClassVar[tuple[str, ...]] = ()
    _WRITES: ClassVar[tuple[str, ...]] = ("dst",)
    __slots__ = ()
    if TYPE_CHECKING:  # fields every kind declares (each subclass is the dataclass that holds them)
        engine: str
        dst: AP

    def reads(self) -> tuple[AP, ...]:
        """Every region this instruction reads (scalar operands given as APs included)."""
        return tuple(v for v in map(self.__getattribute__, self._READS) if v.__class__ is AP)

    def writes(self) -> tuple[AP, ...]:
        return tuple(v for v in map(self.__getattribute__, self._WRITES) if v.__class__ is AP)

    def __reduce__(self):
        # rebuilt from its field values: a cached Program unpickles thousands of these, and the
        # default for frozen slotted dataclasses looks the fields up again for every one
        return type(self), field_access(type(self))[1](self)

    def key(self) -> tuple:
        """A tuple of primitives identifying this instruction (for the Program hash)."""
        _, values = field_access(type(self))
        return (self.KIND,) + tuple(_key(v) for v in values(self))

    def to_json(self) -> dict:
        # "kind" names the instruction; "op" is kept for readers of the first files, but an
        # instruction with a field called ``op`` (tensor_tensor, tensor_reduce) overwrites it.
        names, values = field_access(type(self))
        d = {"kind": self.KIND, "op": self.KIND}
        for name, v in zip(names, values(self)):  # executables hold thousands: plain values as is
            d[name] = v if v.__class__ in _PLAIN else _to_json(v)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Instruction":
        name = d.get("kind", d.get("op"))
        if name not in INSTRUCTION_KINDS:
            raise ValueError(
                f"unknown instruction kind {name!r}; known kinds: {', '.join(sorted(INSTRUCTION_KINDS))}"
            )
        kind = INSTRUCTION_KINDS[name]
        kwargs = {name: _from_json(d[name]) for name in field_access(kind)[0] if name in d}
        return kind(**kwargs)

    def __post_init__(self) -> None:
        if self.engine not in self.ENGINES:
            raise ValueError(
                f"{self.KIND} cannot run on engine {self.engine!r}; it runs on "
                f"{', '.join(repr(e) for e in self.ENGINES)}"
            )


# field names, and one getter of all their values as a tuple
FieldAccess = tuple[tuple[str, ...], Callable[[Any], tuple]]
_FIELD_ACCESS: dict[type, FieldAccess] = {}


def field_access(cls) -> FieldAccess:
    """A dataclass's field names and one getter of all their values as a tuple (``attrgetter``
    does the reads in C: serialising an executable reads tens of thousands of fields)."""
    access = _FIELD_ACCESS.get(cls)
    if access is None:
        names = tuple(f.name for f in fields(cls))
        if len(names) > 1:
            getter: Callable[[Any], tuple] = attrgetter(*names)
        else:  # attrgetter of one name returns the value, not a tuple
            def getter(o, _n=names):
                return tuple(getattr(o, n) for n in _n)
        access = _FIELD_ACCESS[cls] = (names, getter)
    return access


def _key(v):
    if v.__class__ is AP:
        return (v.buffer, v.dtype, v.offset, v.dims)
    if isinstance(v, RuntimeScalar):
        return ("rt", v.name)
    if isinstance(v, tuple):
        return tuple(_key(x) for x in v)
    return v


_PLAIN = frozenset({int, str, bool, type(None)})


def _to_json(v):
    if isinstance(v, AP):
        return {"ap": [v.buffer, v.dtype, v.offset, v.dims]}  # JSON writes the tuples as lists
    if isinstance(v, RuntimeScalar):
        return {"runtime": v.name}
    if isinstance(v, tuple):
        return {"tuple": [_to_json(x) for x in v]}
    if isinstance(v, float) and v != v:
        return {"float": "nan"}
    if isinstance(v, float) and v in (float("inf"), float("-inf")):
        return {"float": "inf" if v > 0 else "-inf"}
    return v


def _from_json(v):
    if isinstance(v, dict):
        if "ap" in v:
            b, dt, off, dims = v["ap"]
            return AP(b, dt, off, tuple(tuple(d) for d in dims))
        if "runtime" in v:
            return RuntimeScalar(v["runtime"])
        if "tuple" in v:
            return tuple(_from_json(x) for x in v["tuple"])
        if "float" in v:
            return float(v["float"])
    return v


@dataclass_transform(frozen_default=True)  # type checkers see each instruction's generated __init__
def _instruction(kind: str, engines: tuple[str, ...], reads: tuple[str, ...], writes=("dst",)):
    """Class decorator: a frozen, slotted dataclass registered as an instruction kind."""

    def wrap(cls):
        cls.KIND = kind
        cls.ENGINES = engines
        cls._READS = reads
        cls._WRITES = writes
        cls = dataclass(frozen=True, slots=True)(cls)
        INSTRUCTION_KINDS[kind] = cls
        return cls

    return wrap


INSTRUCTION_KINDS: dict[str, type[Instruction]] = {}


@_instruction("dma_copy", ("dma",), ("src",))
class DmaCopy(Instruction):
    """Copy between HBM and SBUF (either way) or SBUF to SBUF on a DMA queue."""

    dst: AP
    src: AP
    queue: int | None = None  # None: the scheduler picks the earliest free queue
    engine: str = "dma"


@_instruction("dma_indirect", ("dma",), ("src", "index"))
class DmaIndirect(DmaCopy):
    """A gather (``indirect="src"``) or scatter (``"dst"``) of rows by indices held in SBUF.

    NKI's ``nisa.dma_copy`` with a ``vector_offset`` access pattern (software DGE: GpSimd
    writes one descriptor per index, nki/deep-dives/nki-dge.rst). ``index`` is an SBUF
    tile ``[P, K]`` of row numbers. The indirect operand's first dimension
    ``(row_stride, rows)`` spans every row the indices may name (``rows`` bounds them);
    its other dimensions are one row. The direct operand holds ``P x K`` rows in order.
    Element ``(p, k, j)`` of the direct operand pairs with element ``j`` of row
    ``index[p, k]``. An index outside ``[0, rows)`` is an error, as with
    ``oob_mode.error``; a scatter writes rows in order, so of two equal indices the
    later row lands.
    """

    index: AP = None  # type: ignore[assignment]  # required; a default only because DmaCopy's fields have them
    indirect: str = "src"

    @property
    def table(self) -> AP:
        """The indirect operand (the table the indices pick rows of)."""
        return self.src if self.indirect == "src" else self.dst

    @property
    def direct(self) -> AP:
        """The operand holding the gathered (or to-be-scattered) rows in order."""
        return self.dst if self.indirect == "src" else self.src


@_instruction("tensor_tensor", ("dve", "pool"), ("a", "b"))
class TensorTensor(Instruction):
    """``dst = op(a, b)`` elementwise over two tiles."""

    dst: AP
    a: AP
    b: AP
    op: str
    engine: str = "dve"


@_instruction("scalar_tensor_tensor", ("dve",), ("src", "scalar0", "b"))
class ScalarTensorTensor(Instruction):
    """``dst = op1(op0(src, scalar0), b)``: a per-partition (or constant) operand, then a tile of
    ``src``'s shape (nki.isa.scalar_tensor_tensor); ``reverse`` swaps an op's operands."""

    dst: AP
    src: AP
    op0: str
    scalar0: object
    op1: str
    b: AP
    reverse0: bool = False
    reverse1: bool = False
    engine: str = "dve"


@_instruction("tensor_scalar", ("dve", "act", "pool"), ("src", "scalar0", "scalar1"))
class TensorScalar(Instruction):
    """``dst = op1(op0(src, scalar0), scalar1)``; ``reverse`` swaps operand order."""

    dst: AP
    src: AP
    op0: str
    scalar0: object
    op1: str | None = None
    scalar1: object = None
    reverse0: bool = False
    reverse1: bool = False
    engine: str = "dve"


@_instruction("activation", ("act",), ("src", "scale", "bias"))
class Activation(Instruction):
    """``dst = func(src * scale + bias)`` on ScalarE (``+=`` into dst with ``accumulate``).

    ``scale`` is a constant, runtime scalar or ``[P, 1]`` AP; ``bias`` a ``[P, 1]`` AP,
    a constant or None.
    """

    dst: AP
    src: AP
    func: str
    scale: object = 1.0
    bias: object = None
    accumulate: bool = False
    engine: str = "act"

    def reads(self):
        base = Instruction.reads(self)
        return base + (self.dst,) if self.accumulate else base


@_instruction("activation_reduce", ("act",), ("src", "scale", "bias"), ("dst", "reduce_dst"))
class ActivationReduce(Instruction):
    """An activation that also reduces its result along the free dims into ``reduce_dst`` [P, 1].

    With ``accumulate`` the reduction is combined (``reduce_op``) with what ``reduce_dst``
    holds: ScalarE's accumulation registers kept over several instructions
    (``reduce_cmd.reduce`` in NKI).
    """

    dst: AP
    src: AP
    func: str
    reduce_dst: AP
    reduce_op: str = "add"
    scale: object = 1.0
    bias: object = None
    engine: str = "act"
    accumulate: bool = False

    def reads(self):
        base = Instruction.reads(self)
        return base + (self.reduce_dst,) if self.accumulate else base


@_instruction("tensor_reduce", ("dve", "pool"), ("src",))
class TensorReduce(Instruction):
    """Reduce ``src`` over free axes ``axes`` (indices into ``src.dims``; default all free)."""

    dst: AP
    src: AP
    op: str
    axes: tuple[int, ...] | None = None
    negate: bool = False
    engine: str = "dve"


@_instruction("tensor_copy", ("dve", "act", "pool"), ("src",))
class TensorCopy(Instruction):
    """Copy (and cast to ``dst``'s dtype) on a compute engine."""

    dst: AP
    src: AP
    engine: str = "dve"


@_instruction("select", ("dve", "pool"), ("pred", "on_true", "on_false"))
class Select(Instruction):
    """``dst = on_true where pred != 0 else on_false`` (``on_false`` may be a constant)."""

    dst: AP
    pred: AP
    on_true: AP
    on_false: object
    engine: str = "dve"


@_instruction("iota", ("pool",), ())
class Iota(Instruction):
    """``dst[p, i...] = base + partition_step * p + sum(step_k * i_k)`` on GpSimd."""

    dst: AP
    base: int = 0
    partition_step: int = 0
    steps: tuple[int, ...] = ()
    engine: str = "pool"


@_instruction("memset", ("dve", "pool", "act"), ())
class Memset(Instruction):
    """Fill ``dst`` with a constant."""

    dst: AP
    value: float = 0.0
    engine: str = "dve"


@_instruction("matmul", ("pe",), ("stationary", "moving"))
class Matmul(Instruction):
    """``dst[M, N] (+)= stationary[K, M].T @ moving[K, N]`` into PSUM on TensorE.

    ``accumulate=False`` starts an accumulation group (overwrite), ``True`` adds.
    The stationary operand is loaded into the array first (LoadStationary) unless
    the previous matmul used the same one.
    """

    dst: AP
    stationary: AP
    moving: AP
    accumulate: bool = False
    engine: str = "pe"

    def reads(self):
        base = (self.stationary, self.moving)
        return base + (self.dst,) if self.accumulate else base


@_instruction("transpose", ("pe",), ("src",))
class Transpose(Instruction):
    """``dst[F, P] = src[P, F].T`` into PSUM on TensorE (a matmul against identity)."""

    dst: AP
    src: AP
    engine: str = "pe"


@_instruction("bn_stats", ("dve",), ("src",))
class BnStats(Instruction):
    """Per-partition mean/variance statistics of ``src`` [P, N<=512] into ``dst`` [P, 6]."""

    dst: AP
    src: AP
    engine: str = "dve"


@_instruction("bn_aggr", ("dve",), ("src",))
class BnAggr(Instruction):
    """Combine ``bn_stats`` groups ``src`` [P, 6k] into ``dst`` [P, 2] = (mean, variance)."""

    dst: AP
    src: AP
    engine: str = "dve"


@_instruction("dropout", ("dve",), ("src",))
class Dropout(Instruction):
    """``dst = src`` with each element zeroed with probability ``prob`` (VectorE's random
    number generator, as ``nki.isa.dropout``); survivors are not rescaled."""

    dst: AP
    src: AP
    prob: float
    engine: str = "dve"


@_instruction("gpsimd_call", ("pool",), ("inputs",), ("outputs",))
class GpsimdCall(Instruction):
    """A general-purpose GpSimd routine (C++ operators, generic lowerings).

    ``impl`` names a numerics function registered with
    :func:`tilescope.sim.register_gpsimd_impl`; ``cycles`` is the modeled cost per
    GpSimd core, computed by whoever emits the call; ``attrs`` are hashed constants.
    """

    name: str
    impl: str
    inputs: tuple[AP, ...]
    outputs: tuple[AP, ...]
    cycles: float
    attrs: tuple = ()
    engine: str = "pool"

    def reads(self):
        return self.inputs

    def writes(self):
        return self.outputs


@_instruction("tensor_tensor_scan", ("dve",), ("a", "b", "initial"))
class TensorTensorScan(Instruction):
    """A scan along the free dims of each partition (flattened):
    ``dst[:, 0] = op1(op0(a[:, 0], initial), b[:, 0])``, then
    ``dst[:, i] = op1(op0(a[:, i], dst[:, i-1]), b[:, i])``; ``reverse`` swaps an op's operands.

    ``initial`` is a constant or a per-partition ``[P, 1]`` AP.
    """

    dst: AP
    a: AP
    b: AP
    initial: object
    op0: str
    op1: str
    reverse0: bool = False
    reverse1: bool = False
    engine: str = "dve"


@_instruction("tensor_scalar_reduce", ("dve",), ("src", "scalar0"), ("dst", "reduce_dst"))
class TensorScalarReduce(Instruction):
    """``dst = op0(src, scalar0)`` and ``reduce_dst [P, 1] = reduce_op(dst)`` over the free dims."""

    dst: AP
    src: AP
    op0: str
    scalar0: object
    reduce_op: str
    reduce_dst: AP
    reverse0: bool = False
    engine: str = "dve"


@_instruction("affine_select", ("pool",), ("on_true", "on_false"))
class AffineSelect(Instruction):
    """``dst = on_true where cmp(v, 0) else on_false``, the engine computing per element
    ``v = base + partition_step * p + sum(step_k * i_k)`` over ``pattern`` ``((step, num), ...)``
    (outermost first; the nums multiply to the elements per partition, taken in ``dst``'s
    order). ``cmp`` is one of ``<``, ``<=``, ``==``, ``>``, ``>=``, ``!=``."""

    dst: AP
    on_true: AP
    on_false: object
    base: int = 0
    partition_step: int = 0
    pattern: tuple[tuple[int, int], ...] = ()
    cmp: str = "=="
    engine: str = "pool"


@_instruction("reciprocal", ("dve",), ("src",))
class Reciprocal(Instruction):
    """``dst = 1 / src`` on VectorE."""

    dst: AP
    src: AP
    engine: str = "dve"


@_instruction("max8", ("dve",), ("src",))
class Max8(Instruction):
    """The 8 largest values of each partition of ``src`` (8..16384 elements), in descending order,
    into ``dst`` ``[P, 8]`` (nki.isa.max8; NaN counts as the largest, as torch orders it)."""

    dst: AP
    src: AP
    engine: str = "dve"


@_instruction("find_index8", ("dve",), ("data", "vals"))
class FindIndex8(Instruction):
    """``dst`` ``[P, 8]``: the position (from 0) of the first occurrence of each of the 8 ``vals``
    in its partition of ``data`` (nki.isa.nc_find_index8; a value that is not there gets the
    all-ones sentinel of ``dst``'s integer dtype, 0xFFFFFFFF for uint32)."""

    dst: AP
    data: AP
    vals: AP
    engine: str = "dve"


@_instruction("match_replace8", ("dve",), ("data", "vals"), ("dst", "dst_idx"))
class MatchReplace8(Instruction):
    """``dst`` = ``data`` with the first occurrence of each of the 8 ``vals`` per partition replaced
    by ``imm``; ``dst_idx`` ``[P, 8]`` (optional) gets the positions matched
    (nki.isa.nc_match_replace8: vals are taken in reverse order, so repeated values pair with
    distinct positions, the first position with the highest slot)."""

    dst: AP
    data: AP
    vals: AP
    imm: float
    dst_idx: AP | None = None
    engine: str = "dve"

