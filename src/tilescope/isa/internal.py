"""What tilescope's other packages use of the ISA layer beyond its public API (:mod:`tilescope.isa`):
the hook the tile language binds its implementation of the kernel-callable ISA functions to
(isa sits below lang and never imports it). No stability promise."""

from __future__ import annotations

from ._kernel_api import bind as bind_kernel_language

__all__ = ["bind_kernel_language"]
