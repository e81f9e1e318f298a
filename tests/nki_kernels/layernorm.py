"""LayerNorm over rows (neuronxcc.nki API): mean and variance from bn_stats per 512
columns and bn_aggr, one tensor_scalar for (x - mean) * rstd, gamma/beta broadcast across
partitions, and a bf16 result cast by the store."""
import numpy as np
import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl


@nki.jit
def layernorm(x, gamma, beta, eps=1e-5):
    N, D = x.shape
    P = nl.tile_size.pmax
    CH = nl.tile_size.bn_stats_fmax
    n_chunks = D // CH
    out = nl.ndarray((N, D), dtype=nl.bfloat16, buffer=nl.shared_hbm)
    g = nl.load(gamma.reshape((1, D))).broadcast_to((P, D))
    b = nl.load(beta.reshape((1, D))).broadcast_to((P, D))
    for i in nl.affine_range(N // P):
        xt = nl.load(x[nl.ds(i * P, P), :])
        stats = nl.ndarray((P, 6 * n_chunks), dtype=nl.float32)
        for c in nl.affine_range(n_chunks):
            stats[:, nl.ds(6 * c, 6)] = nisa.bn_stats(xt[:, nl.ds(c * CH, CH)])
        mv = nisa.bn_aggr(stats)
        rstd = nl.rsqrt(nl.add(mv[:, 1:2], eps))
        y = nisa.tensor_scalar(xt, np.subtract, mv[:, 0:1], op1=np.multiply, operand1=rstd)
        y = nl.add(nl.multiply(y, g), b)
        nl.store(out[nl.ds(i * P, P), :], value=y)      # float32 tile into a bfloat16 tensor
    return out


def check():
    import ml_dtypes

    rng = np.random.default_rng(5)
    x = rng.standard_normal((256, 1024)).astype(np.float32) * 3 + 1
    gamma = rng.standard_normal(1024).astype(np.float32)
    beta = rng.standard_normal(1024).astype(np.float32)
    mu, var = x.mean(axis=1, keepdims=True), x.var(axis=1, keepdims=True)
    ref = ((x - mu) / np.sqrt(var + 1e-5) * gamma + beta).astype(ml_dtypes.bfloat16).astype(np.float32)
    got = layernorm(x, gamma, beta).astype(np.float32)
    np.testing.assert_allclose(got, ref, rtol=1e-2, atol=1e-2)
    print("layernorm: OK")


if __name__ == "__main__":
    check()
