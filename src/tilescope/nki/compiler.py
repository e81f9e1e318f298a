"""``nki.compiler``: allocation and scheduling directives, accepted so kernels run unchanged.

tilescope allocates every tile itself (live ranges per loop iteration, rotating
buffers, spills when SBUF is full: ``docs/nki.md``), so NKI's manual allocators
(``ncc.sbuf.mod_alloc(...)``, ``ncc.psum.auto_alloc()``) place a tile in their memory
and leave the address to tilescope; decorators such as ``skip_middle_end_transformations``
return the kernel unchanged.
"""

from __future__ import annotations

import contextlib

from ..lang._types import psum as _psum, sbuf as _sbuf

__all__ = [
    "sbuf", "psum", "skip_middle_end_transformations", "enable_stack_allocator", "force_auto_alloc",
    "multi_buffer", "no_reorder", "allocation_scope", "CompileConfig", "SpecializationConfig",
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
    """A rotation hint; tilescope rotates each allocation site over ``bufs`` buffers anyway."""
    return contextlib.nullcontext()


def no_reorder():
    return contextlib.nullcontext()


def allocation_scope():
    return contextlib.nullcontext()


class CompileConfig:
    """Accepted and ignored (compiler options of hardware NKI)."""

    def __init__(self, **kwargs):
        self.options = kwargs


class SpecializationConfig(CompileConfig):
    pass
