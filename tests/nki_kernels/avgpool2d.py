"""2-D average pooling (neuronxcc.nki API): channels on partitions, each pool window
selected by affine index expressions, summed over the window axes and scaled."""
import numpy as np
import neuronxcc.nki as nki
import neuronxcc.nki.language as nl

POOL = 2


@nki.jit
def avgpool2d(x):
    C, H, W = x.shape
    HO, WO = H // POOL, W // POOL
    out = nl.ndarray((C, HO, WO), dtype=x.dtype, buffer=nl.shared_hbm)
    tile = nl.load(x)
    i_c, i_h, i_kh, i_w, i_kw = nl.mgrid[0:C, 0:HO, 0:POOL, 0:WO, 0:POOL]
    windows = tile[i_c, POOL * i_h + i_kh, POOL * i_w + i_kw]      # [C, HO, POOL, WO, POOL] view
    total = nl.sum(windows, axis=(2, 4), dtype=nl.float32)
    nl.store(out, nl.multiply(total, 1.0 / (POOL * POOL), dtype=x.dtype))
    return out


def check():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((128, 32, 48)).astype(np.float32)
    ref = x.reshape(128, 16, 2, 24, 2).mean(axis=(2, 4))
    np.testing.assert_allclose(avgpool2d(x), ref, rtol=1e-5, atol=1e-6)
    print("avgpool2d: OK")


if __name__ == "__main__":
    check()
