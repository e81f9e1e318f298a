"""Compare the three RMSNorm profiles of the study, beside the published real-hardware figures.

Run: python examples/rmsnorm/compare.py DIR_NAIVE DIR_FUSED DIR_COMPILED
(or `compare.py [fp32|bf16]`: the newest profile of each implementation under profile_out/rmsnorm).

Every tilescope figure printed is *modeled*; the published figures were measured on real
Trainium hardware (one profiler run, input shape not published) and are shown for the shape
of the result only.
"""

import sys
from pathlib import Path

from tilescope.studies.rmsnorm import compare, latest

if __name__ == "__main__":
    argv = sys.argv[1:]
    if len(argv) == 3:
        paths = dict(zip(("naive", "fused", "compiled"), map(Path, argv)))
    else:
        dtype = argv[0] if argv else "fp32"
        paths = {impl: latest(Path("profile_out/rmsnorm"), f"{impl}_{dtype}") for impl in ("naive", "fused", "compiled")}
    compare(paths)
