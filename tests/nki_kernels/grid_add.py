"""Element-wise add over a 2-D SPMD launch grid (neuronxcc.nki API).

Each program of the [gx, gy] grid adds one [128, 512] tile; the kernel is launched
directly as ``grid_add[gx, gy](a, b)``.
"""
import numpy as np
from neuronxcc import nki
import neuronxcc.nki.language as nl

TILE_P, TILE_F = 128, 512


@nki.jit
def grid_add(a_in, b_in):
    out = nl.ndarray(a_in.shape, dtype=a_in.dtype, buffer=nl.shared_hbm)
    row = nl.program_id(0) * TILE_P
    col = nl.program_id(1) * TILE_F
    a = nl.load(a_in[row:row + TILE_P, col:col + TILE_F])
    b = nl.load(b_in[row:row + TILE_P, col:col + TILE_F])
    nl.store(out[row:row + TILE_P, col:col + TILE_F], value=nl.add(a, b))
    return out


def check():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((256, 1024)).astype(np.float32)
    b = rng.standard_normal((256, 1024)).astype(np.float32)
    gx, gy = a.shape[0] // TILE_P, a.shape[1] // TILE_F
    c = grid_add[gx, gy](a, b)
    np.testing.assert_allclose(c, a + b, rtol=1e-6)
    print("grid_add: OK")


if __name__ == "__main__":
    check()
