"""The naive RMSNorm of the study (shared input, config and schedule: tilescope.studies.rmsnorm).

Run: python examples/rmsnorm/naive.py [--dtype fp32|bf16] [--out DIR]
"""

from tilescope.studies.rmsnorm import main

if __name__ == "__main__":
    main("naive")
