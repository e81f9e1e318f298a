"""``nki.compiler``: allocation and scheduling directives, accepted so kernels run unchanged.

tilescope allocates every tile itself (live ranges per loop iteration, a fresh address per
tile as NKI's RING allocation mode gives, spills when SBUF is full: ``docs/nki.md``);
``CompileConfig(experimental_allocation_mode=AllocationMode.MAX_REUSE)`` picks the
best-fitting freed range instead. NKI's manual allocators
(``ncc.sbuf.mod_alloc(...)``, ``ncc.psum.auto_alloc()``) place a tile in their memory
and leave the address to tilescope; decorators such as ``skip_middle_end_transformations``
return the kernel unchanged.
"""

from __future__ import annotations

import contextlib
import enum

from ..lang import psum as _psum, sbuf as _sbuf

__all__ = [
    "sbuf", "psum", "skip_middle_end_transformations", "enable_stack_allocator", "force_auto_alloc",
    "multi_buffer", "no_reorder", "allocation_scope", "CompileConfig", "SpecializationConfig",
    "AllocationMode", "allocation_of",
]


class _Allocators:
    """``nki.compiler.sbuf`` / ``.psum``: usable as ``buffer=`` itself, or through its allocators."""

    def __init__(self, memory):
        self.memory = memory

    def auto_alloc(self, *args, **kwargs):
        return self.memory

    def mod_alloc(self, *args, **kwargs):
        return self.memory

    def alloc(self, func=None, *args, **kwargs):
        return self.memory

    def __repr__(self) -> str:
        return f"nki.compiler.{self.memory.name}"


sbuf = _Allocators(_sbuf)
psum = _Allocators(_psum)


def _passthrough(func=None, **kwargs):
    if func is None:
        return lambda f: f
    return func


skip_middle_end_transformations = _passthrough
enable_stack_allocator = _passthrough
force_auto_alloc = _passthrough


def multi_buffer(factor=2):
    """A rotation hint, accepted: the ring allocation already gives each iteration's tiles fresh
    addresses while SBUF has room (``docs/nki.md``, Memory)."""
    return contextlib.nullcontext()


def no_reorder():
    return contextlib.nullcontext()


def allocation_scope():
    return contextlib.nullcontext()


class AllocationMode(enum.Enum):
    """How each tile's address is chosen (NKI API reference, ``nki.compiler.AllocationMode``).

    ``RING``: a fresh address per tile, freed memory reused only after the allocation wraps
    around; ``MAX_REUSE``: the freed range that fits best. ``FAST`` (nested lifetimes stacked,
    best fit for the rest) is modeled as ``MAX_REUSE``: the stacking is not modeled.
    """

    RING = "ring"
    FAST = "fast"
    MAX_REUSE = "max_reuse"


_MODE = {AllocationMode.RING: "ring", AllocationMode.FAST: "max_reuse", AllocationMode.MAX_REUSE: "max_reuse"}


class CompileConfig:
    """Compiler options of hardware NKI: ``experimental_allocation_mode`` (an
    :class:`AllocationMode`) decides tilescope's allocation mode; the rest are accepted and
    have no effect."""

    def __init__(self, **kwargs):
        self.options = kwargs
        mode = kwargs.get("experimental_allocation_mode")
        if mode is not None and not isinstance(mode, AllocationMode):
            raise TypeError(f"experimental_allocation_mode must be an nki.compiler.AllocationMode "
                            f"(e.g. AllocationMode.RING), not {mode!r}")

    def __repr__(self) -> str:
        return f"CompileConfig({', '.join(f'{k}={v!r}' for k, v in self.options.items())})"


def allocation_of(compile_config) -> str:
    """tilescope's allocation mode for a ``compile_config`` (``"ring"`` when it says none)."""
    mode = getattr(compile_config, "options", {}).get("experimental_allocation_mode")
    return _MODE[mode] if mode is not None else "ring"


class SpecializationConfig(CompileConfig):
    pass
