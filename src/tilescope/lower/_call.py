"""What a lowering rule sees: one aten call with tensors replaced by their metadata.

Tensors become :class:`TensorMeta` (shape, strides, dtype); arguments whose schema
type is ``Scalar`` (and lists of them) become :class:`ScalarArg` placeholders --
runtime operands of the Program, so a new value (an optimizer's step size) never
makes a new Program. Everything else (dims, sizes, flags, ``float`` constants such
as ``eps``) is part of the call's identity.

>>> m = TensorMeta((4, 8), (8, 1), "float32")
>>> m.numel, m.is_contiguous
(32, True)
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

__all__ = ["TensorMeta", "ScalarArg", "OutputRef", "Call", "meta_of", "contiguous_strides", "schema_names",
           "COMPLEX"]


def contiguous_strides(shape) -> tuple[int, ...]:
    out = []
    acc = 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(out))


# host-compatibility dtypes -> the device dtype that models them (complex tensors are
# described as pairs: a trailing dim of 2, as torch.view_as_real shows them)
_DEVICE_ALIASES = {"float64": "float32", "complex64": "float32", "complex128": "float32", "complex32": "float16"}
COMPLEX = frozenset({"complex64", "complex128", "complex32"})


@dataclass(frozen=True, slots=True)
class TensorMeta:
    """Shape, element strides and dtype of one tensor operand.

    ``dtype`` is the torch dtype's name (``"float32"``, ``"bool"``, ``"int64"``); the
    Program buffer's dtype is its device form (``bool`` is stored as ``uint8``).
    """

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        return prod(self.shape)

    @property
    def device_dtype(self) -> str:
        """The dtype of this tensor's Program buffer.

        ``bool`` is stored as ``uint8``. ``float64`` has no engine arithmetic: the device
        accepts it for compatibility (printing upcasts to it) and models it as float32.
        """
        from ..dtypes import canonical

        return canonical(_DEVICE_ALIASES.get(self.dtype, self.dtype))

    @property
    def is_complex(self) -> bool:
        return self.dtype in COMPLEX

    @property
    def itemsize(self) -> int:
        from ..dtypes import itemsize

        return itemsize(self.device_dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def is_contiguous(self) -> bool:
        expected = 1
        for n, s in zip(reversed(self.shape), reversed(self.stride)):
            if n != 1 and s != expected:
                return False
            expected *= n
        return True

    @property
    def extent(self) -> int:
        """Elements of memory spanned, from the first element to the last."""
        if self.numel == 0:
            return 0
        return 1 + sum((n - 1) * s for n, s in zip(self.shape, self.stride))


@dataclass(frozen=True, slots=True)
class ScalarArg:
    """A number argument passed at run time: runtime scalar ``name`` of Python type ``kind``."""

    name: str
    kind: type


@dataclass(frozen=True, slots=True)
class OutputRef:
    """An ``out=`` argument: the call writes output ``index`` there (it is not read)."""

    index: int


@dataclass(frozen=True, slots=True)
class Call:
    """One aten call as the lowering sees it.

    ``op`` is the qualified overload name (``"aten::add.Tensor"``); ``args`` and
    ``kwargs`` hold TensorMeta / ScalarArg / plain values; ``outputs`` the metadata of
    the tensors the call writes (fresh outputs, or the mutated argument for in-place
    and ``out=`` forms).
    """

    op: str
    args: tuple
    kwargs: tuple  # sorted (name, value) pairs
    outputs: tuple[TensorMeta, ...]

    @property
    def packet(self) -> str:
        """The op without namespace and overload (``"add"``)."""
        return self.op.split("::", 1)[-1].split(".", 1)[0]

    @property
    def overload(self) -> str:
        name = self.op.split("::", 1)[-1]
        return name.split(".", 1)[1] if "." in name else "default"

    def kw(self, name: str, default=None):
        for k, v in self.kwargs:
            if k == name:
                return v
        return default

    def arg(self, index: int, name: str | None = None, default=None):
        """Positional argument ``index``, else keyword ``name``, else ``default``."""
        if index < len(self.args):
            return self.args[index]
        if name is not None:
            return self.kw(name, default)
        return default

    def named(self) -> dict:
        """Every argument by schema name (defaults filled in)."""
        names, defaults = schema_names(self.op)
        out = dict(defaults)
        for name, v in zip(names, self.args):
            out[name] = v
        out.update(self.kwargs)
        return out

    def tensors(self) -> list[TensorMeta]:
        """Every tensor operand in argument order (lists flattened)."""
        out = []
        for v in list(self.args) + [v for _, v in self.kwargs]:
            if isinstance(v, TensorMeta):
                out.append(v)
            elif isinstance(v, tuple):
                out.extend(x for x in v if isinstance(x, TensorMeta))
        return out


def meta_of(t) -> TensorMeta:
    """The TensorMeta of a torch tensor (complex ones as (..., 2) pairs of reals)."""
    dtype = str(t.dtype)[6:]
    if dtype in COMPLEX:
        return TensorMeta(tuple(t.shape) + (2,), tuple(2 * s for s in t.stride()) + (1,), dtype)
    return TensorMeta(tuple(t.shape), tuple(t.stride()), dtype)


_SCHEMAS: dict = {}


def schema_names(op: str) -> tuple[tuple[str, ...], dict]:
    """(argument names in order, {name: default}) of the torch op ``op`` (cached)."""
    hit = _SCHEMAS.get(op)
    if hit is not None:
        return hit
    import torch

    if op.startswith("tilescope::"):
        from . import _custom_ops

        _custom_ops.define()
    ns, rest = op.split("::", 1)
    packet, _, overload = rest.partition(".")
    schema = getattr(getattr(getattr(torch.ops, ns), packet), overload or "default")._schema
    names = tuple(a.name for a in schema.arguments)
    defaults = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}
    _SCHEMAS[op] = (names, defaults)
    return names, defaults
