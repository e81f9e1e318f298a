"""The fused RMSNorm of the study (see study.py for the shared input, config and schedule).

Run: python examples/rmsnorm/fused.py [--dtype fp32|bf16] [--out DIR]
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from study import main  # noqa: E402

if __name__ == "__main__":
    main("fused")
