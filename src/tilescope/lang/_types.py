"""Names a kernel uses for dtypes, memories and tile sizes.

Dtypes are the canonical names of :mod:`tilescope.dtypes` (so ``x.dtype ==
tl.float32`` compares strings); numpy and torch dtypes are accepted wherever a
dtype is.

>>> from tilescope import lang as tl
>>> tl.bfloat16, tl.tile_size.pmax, tl.tile_size.psum_fmax
('bfloat16', 128, 512)
>>> tl.par_dim(128)
par_dim(128)
"""

from __future__ import annotations

from dataclasses import dataclass

from ..dtypes import canonical

__all__ = [
    "float32", "bfloat16", "float16", "float8_e4m3", "int32", "int16", "int8", "uint8", "bool_",
    "Memory", "sbuf", "psum", "hbm", "shared_hbm", "private_hbm", "par_dim", "tile_size",
    "to_dtype", "DtypeName", "dtype_name",
]

float32 = "float32"
bfloat16 = "bfloat16"
float16 = "float16"
float8_e4m3 = "float8_e4m3"
int32 = "int32"
int16 = "int16"
int8 = "int8"
uint8 = "uint8"
bool_ = "uint8"  # predicates are 0/1 bytes, as on the device


def to_dtype(dtype) -> str:
    """Canonical dtype name of a name, numpy dtype or torch dtype."""
    return canonical(dtype)


class DtypeName(str):
    """A tile's or tensor's ``.dtype``: its canonical name, which also equals the numpy,
    torch or alias spelling of the same type (``t.dtype == np.float32``, ``== "fp32"``).

    >>> DtypeName("float32") == "fp32", DtypeName("bfloat16") == "float32"
    (True, False)
    """

    __slots__ = ()

    def __eq__(self, other):
        if isinstance(other, str) and str.__eq__(self, other):
            return True
        try:
            return str.__eq__(self, canonical(other))
        except TypeError:
            return False

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = str.__hash__


_NAMES: dict[str, DtypeName] = {}


def dtype_name(name: str) -> DtypeName:
    hit = _NAMES.get(name)
    if hit is None:
        hit = _NAMES[name] = DtypeName(name)
    return hit


@dataclass(frozen=True)
class Memory:
    """Where a buffer lives: ``name`` is the Program memory, ``shared`` tells HBM
    tensors shared by every program of a launch grid from private ones."""

    name: str
    shared: bool = True

    def __repr__(self) -> str:
        return f"tl.{self.label}"

    @property
    def label(self) -> str:
        if self.name == "hbm":
            return "shared_hbm" if self.shared else "private_hbm"
        return self.name


sbuf = Memory("sbuf")
psum = Memory("psum")
shared_hbm = Memory("hbm", shared=True)
private_hbm = Memory("hbm", shared=False)
hbm = shared_hbm


@dataclass(frozen=True)
class par_dim:  # noqa: N801 - the name kernels use
    """Marks the partition dimension in a buffer shape: dimensions before it are
    *block* dimensions (``tl.ndarray((8, tl.par_dim(128), 512), ...)`` is eight
    [128, 512] tiles, indexed ``t[k]``)."""

    size: int

    def __post_init__(self) -> None:
        if int(self.size) != self.size or self.size < 1:
            raise ValueError(f"par_dim size must be a positive integer, got {self.size!r}")

    def __index__(self) -> int:
        return int(self.size)

    def __int__(self) -> int:
        return int(self.size)

    def __repr__(self) -> str:
        return f"par_dim({self.size})"


class tile_size:  # noqa: N801 - the name kernels use
    """Tile-size limits of the modeled core (architecture guide, NeuronCore-v2 and -v3).

    =====================  =====  ==============================================
    name                   value  meaning
    =====================  =====  ==============================================
    pmax                   128    partitions of SBUF / PSUM (partition dim limit)
    psum_fmax              512    fp32 elements per partition in one PSUM bank
    gemm_stationary_fmax   128    free size of matmul's stationary operand
    gemm_moving_fmax       512    free size of matmul's moving operand
    bn_stats_fmax          512    free size one ``bn_stats`` reads
    =====================  =====  ==============================================
    """

    pmax = 128
    psum_fmax = 512
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512
    bn_stats_fmax = 512
