"""Programs (the one representation of device work) and the tile builder that makes them."""

from ._alloc import MODES as ALLOCATION_MODES
from ._builder import Handle, TileBuilder, View, as_ap
from ._instruction_columns import operand_slots, operands_of
from ._program import FORMAT_VERSION, MEMORIES, Buffer, Program, Provenance, Slot

__all__ = [
    "Program", "Buffer", "Provenance", "Slot", "TileBuilder", "Handle", "View", "as_ap",
    "MEMORIES", "FORMAT_VERSION",
    # how the allocator picks a tile's address (TileBuilder.build(allocation=...))
    "ALLOCATION_MODES",
    # an instruction's operand fields (the scheduler and the tile language read them)
    "operand_slots", "operands_of",
]
