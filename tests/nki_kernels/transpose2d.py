"""Transposes in NKI (current ``nki`` API): free axes F1 x F2 -> F2 x F1 within each
partition (an access-pattern copy), and the partition axis with HBM [F, P] -> SBUF [P, F]
(nl.load_transpose2d) and with TensorE (nisa.nc_transpose)."""
import numpy as np
import nki
import nki.isa as nisa
import nki.language as nl


@nki.jit
def transpose_free(x):
    P, F1, F2 = x.shape
    out = nl.ndarray((P, F2, F1), dtype=x.dtype, buffer=nl.shared_hbm)
    src = nl.ndarray((P, F1, F2), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=src, src=x)
    i_p, i_f2, i_f1 = nl.mgrid[0:P, 0:F2, 0:F1]
    dst = nl.ndarray((P, F2, F1), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=dst, src=src[i_p, i_f1, i_f2])
    nisa.dma_copy(dst=out, src=dst)
    return out


@nki.jit
def transpose_partition(x):
    F, P = x.shape
    out_dma = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    out_pe = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.load_transpose2d(x)                      # DMA transposes, element by element
    nl.store(out_dma, t)
    xt = nl.ndarray((F, P), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=xt, src=x)
    ps = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.psum)
    nisa.nc_transpose(dst=ps, data=xt)              # TensorE: a matmul against identity
    nl.store(out_pe, ps)                            # PSUM -> SBUF copy implied
    return out_dma, out_pe


def check():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((128, 16, 24)).astype(np.float32)
    np.testing.assert_array_equal(transpose_free(x), x.transpose(0, 2, 1))
    y = rng.standard_normal((96, 128)).astype(np.float32)
    a, b = transpose_partition(y)
    np.testing.assert_array_equal(a, y.T)
    np.testing.assert_array_equal(b, y.T)
    print("transpose2d: OK")


if __name__ == "__main__":
    check()
