"""Programs (the one representation of device work) and the tile builder that makes them."""

from ._builder import Handle, TileBuilder, View, as_ap
from ._program import FORMAT_VERSION, MEMORIES, Buffer, Program, Provenance, Slot

__all__ = [
    "Program", "Buffer", "Provenance", "Slot", "TileBuilder", "Handle", "View", "as_ap",
    "MEMORIES", "FORMAT_VERSION",
]
