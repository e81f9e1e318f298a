"""The ``torch.compile`` backend: fusion of post-AOT aten graphs into Programs.

The fuser finds fusion in the graph itself: row groups (pointwise ops, broadcasts
and last-dim reductions over one ``[rows, D]`` space) and matmul + pointwise
epilogue stages, each built with the one tile builder.
"""

from ._emit import EmitStats, emit_segments
from ._graph import DECOMPOSITIONS, trace_aten
from ._plan import Segment, plan_graph

__all__ = ["plan_graph", "emit_segments", "trace_aten", "Segment", "EmitStats", "DECOMPOSITIONS"]

from ._backend import STATS, CompiledGraph, cache_dir, tilescope_backend
from ._explain import Explanation, explain

__all__ += ["tilescope_backend", "explain", "Explanation", "CompiledGraph", "cache_dir", "STATS"]
