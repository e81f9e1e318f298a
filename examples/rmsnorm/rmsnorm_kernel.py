"""RMSNorm as a tile kernel: ``y = x / sqrt(mean(x**2) + eps) * gamma`` over the last dim.

One tile is 128 rows (the partition dim) by the whole hidden dim; ``gamma`` is loaded
once into every partition through a broadcast HBM view (one DMA, reused by all tiles).
Per tile: ScalarE squares, VectorE sums (``tensor_reduce``) and scales, ScalarE takes
``rsqrt``, VectorE multiplies by the per-partition factor and by gamma. A ragged last
tile is handled with masks. With three rotating buffers per allocation site, the load
of tile i+1 overlaps the compute of tile i in the modeled timeline.

Run: ``python examples/rmsnorm/rmsnorm_kernel.py``.
"""

from __future__ import annotations

import numpy as np

import tilescope
import tilescope.lang as tl

P = tl.tile_size.pmax


@tilescope.kernel
def rmsnorm_kernel(x, gamma, eps=1e-6):
    """x: [rows, d]; gamma: [d]; returns y [rows, d] (same dtype as x)."""
    rows, d = x.shape
    out = tl.ndarray(x.shape, x.dtype, buffer=tl.hbm)
    g = tl.load(gamma.reshape((1, d)).broadcast_to((P, d)))   # gamma in every partition
    i_p, i_f = tl.mgrid[0:P, 0:d]
    for t in tl.affine_range((rows + P - 1) // P):
        r = t * P + i_p
        xt = tl.load(x[r, i_f], mask=(r < rows))
        ms = tl.mean(tl.square(xt), axis=1)          # [P]: one value per row
        inv = tl.rsqrt(ms + eps)                      # [P]
        tl.store(out[r, i_f], xt * inv * g, mask=(r < rows))
    return out


def rmsnorm_reference(x: np.ndarray, gamma: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    x32 = x.astype(np.float32)
    return (x32 / np.sqrt(np.mean(x32 * x32, axis=-1, keepdims=True) + eps) * gamma.astype(np.float32))


def main(rows: int = 1000, d: int = 2048) -> int:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, d), dtype=np.float32)
    gamma = rng.uniform(0.5, 1.5, d).astype(np.float32)
    r = tilescope.simulate(rmsnorm_kernel, x, gamma)
    err = float(np.abs(r.value - rmsnorm_reference(x, gamma)).max())
    print(f"RMSNorm [{rows}, {d}] fp32: max |tile kernel - numpy| = {err:.2e}")
    print(r.summary)
    print(r.timeline.text())
    return 0 if err < 1e-4 else 1


if __name__ == "__main__":
    raise SystemExit(main())
