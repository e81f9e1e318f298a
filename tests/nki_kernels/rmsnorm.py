"""RMSNorm over rows (current ``nki`` API, ``dst=`` forms): ScalarE squares each row and
sums it in the same instruction (reduce_cmd), gamma is broadcast across partitions once."""
import numpy as np
import nki
import nki.isa as nisa
import nki.language as nl


@nki.jit
def rmsnorm(x, gamma, eps=1e-6):
    N, D = x.shape
    P = nl.tile_size.pmax
    out = nl.ndarray((N, D), dtype=x.dtype, buffer=nl.shared_hbm)
    g_row = nl.ndarray((1, D), dtype=gamma.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=g_row, src=gamma.reshape((1, D)))
    g = nl.broadcast_to(g_row, (P, D))                 # one partition -> P partitions (TensorE)
    for i in nl.affine_range(N // P):
        xt = nl.ndarray((P, D), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt, src=x[i * P:(i + 1) * P, :])
        sq = nl.ndarray((P, D), dtype=nl.float32, buffer=nl.sbuf)
        ss = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=sq, op=nl.square, data=xt, reduce_op=nl.add, reduce_res=ss,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        rs = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=rs, data=ss, op0=nl.multiply, operand0=1.0 / D, op1=nl.add, operand1=eps)
        nisa.activation(dst=rs, op=nl.rsqrt, data=rs)
        y = nl.ndarray((P, D), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=y, data=xt, op0=nl.multiply, operand0=rs)
        nisa.tensor_tensor(dst=y, data1=y, data2=g, op=nl.multiply)
        nisa.dma_copy(dst=out[i * P:(i + 1) * P, :], src=y)
    return out


def check():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((512, 384)).astype(np.float32)
    gamma = rng.standard_normal(384).astype(np.float32)
    ref = x / np.sqrt((x * x).mean(axis=1, keepdims=True) + 1e-6) * gamma
    np.testing.assert_allclose(rmsnorm(x, gamma), ref, rtol=2e-5, atol=2e-5)
    print("rmsnorm: OK")


if __name__ == "__main__":
    check()
