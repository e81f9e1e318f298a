"""``nki.typing``: ``tensor[shape, dtype]`` placeholders for inputs known by shape only.

NKI's tutorials benchmark kernels on ``nt.tensor[[8192, 4096], nl.bfloat16]``
placeholders (no data); here they are :class:`tilescope.lang.TensorSpec`, so the
kernel is traced and timed (modeled) without values. ``tensor[M, N]`` in annotations
is accepted too.

>>> import tilescope.nki.typing as nt
>>> nt.tensor[[128, 512], "bfloat16"]
TensorSpec(shape=(128, 512), dtype='bfloat16')
"""

from __future__ import annotations

from ..dtypes import canonical
from ..lang import TensorSpec

__all__ = ["tensor", "TensorSpec"]


class _TensorType:
    """``tensor[shape, dtype]`` -> a TensorSpec; ``tensor[M, N]`` (sizes only) -> float32."""

    def __getitem__(self, item) -> TensorSpec:
        if not isinstance(item, tuple):
            item = (item,)
        dtype = "float32"
        if len(item) == 2 and isinstance(item[0], (list, tuple)):
            shape, dtype = item
        elif item and not isinstance(item[-1], int) and len(item) >= 2:
            shape, dtype = item[:-1], item[-1]
        else:
            shape = item
        if len(shape) == 1 and isinstance(shape[0], (list, tuple)):
            shape = shape[0]
        return TensorSpec(tuple(int(n) for n in shape), canonical(dtype))

    def __call__(self, shape, dtype="float32") -> TensorSpec:
        return TensorSpec(tuple(int(n) for n in shape), canonical(dtype))

    def __repr__(self) -> str:
        return "nki.typing.tensor"


tensor = _TensorType()
