"""Causal flash attention forward for one head (neuronxcc.nki API).

Queries go 128 at a time; keys and values stream in blocks of 512 with an online
softmax: a running row max and row sum rescale the partial output. Scores are one
TensorE matmul per block, the causal mask an affine_select on GpSimd, exp and its row
sum one ScalarE activation_reduce; p @ v needs p transposed in 128-key pieces (TensorE).
"""
import numpy as np
import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

KV_BLOCK = 512


@nki.jit
def flash_attention(q_t, k_t, v, causal=True):
    """q_t, k_t: [d, S] (head dim on partitions); v: [S, d]; returns [S, d]."""
    d, S = q_t.shape
    Q = nl.tile_size.pmax
    out = nl.ndarray((S, d), dtype=v.dtype, buffer=nl.shared_hbm)
    scale = 1.0 / float(np.sqrt(d))
    for qi in nl.affine_range(S // Q):
        q_tile = nl.load(q_t[:, nl.ds(qi * Q, Q)])                      # [d, Q]: stationary
        m = nl.full((Q, 1), nl.fp32.min, dtype=nl.float32)
        l = nl.zeros((Q, 1), dtype=nl.float32)
        o = nl.zeros((Q, d), dtype=nl.float32)
        n_blocks = (qi * Q + Q + KV_BLOCK - 1) // KV_BLOCK if causal else S // KV_BLOCK
        for kb in nl.sequential_range(n_blocks):
            k_tile = nl.load(k_t[:, nl.ds(kb * KV_BLOCK, KV_BLOCK)])    # [d, KV]
            s_psum = nisa.nc_matmul(q_tile, k_tile)                      # [Q, KV] = q @ k.T
            s = nisa.tensor_scalar(s_psum, np.multiply, scale)
            if causal:
                i_q, i_k = nl.mgrid[0:Q, 0:KV_BLOCK]
                s = nisa.affine_select(pred=(qi * Q + i_q - (kb * KV_BLOCK + i_k) >= 0), on_true_tile=s,
                                       on_false_value=-30000.0)
            m_new = nl.maximum(m, nisa.tensor_reduce(np.max, s, axis=1, keepdims=True))
            neg_m = nl.multiply(m_new, -1.0)
            row_sum = nl.ndarray((Q, 1), dtype=nl.float32)
            p = nisa.activation_reduce(np.exp, s, bias=neg_m, reduce_op=np.add, reduce_res=row_sum)
            corr = nisa.activation(np.exp, m, bias=neg_m)                # exp(m_old - m_new)
            l[...] = nl.add(nl.multiply(l, corr), row_sum)
            pv = nl.zeros((Q, d), dtype=nl.float32, buffer=nl.psum)
            for c in nl.affine_range(KV_BLOCK // Q):
                p_t = nl.copy(nisa.nc_transpose(p[:, nl.ds(c * Q, Q)]))     # [keys, Q] in SBUF
                v_tile = nl.load(v[nl.ds(kb * KV_BLOCK + c * Q, Q), :])     # [keys, d]
                pv += nisa.nc_matmul(p_t, v_tile)
            o[...] = nisa.tensor_scalar(o, np.multiply, corr, op1=np.add, operand1=0.0)
            o[...] = nl.add(o, pv)
            m[...] = m_new
        nl.store(out[nl.ds(qi * Q, Q), :], value=nl.multiply(o, nl.reciprocal(l)))
    return out


def reference(q_t, k_t, v, causal=True):
    s = (q_t.T @ k_t) / np.sqrt(q_t.shape[0])
    if causal:
        s = np.where(np.tril(np.ones_like(s, dtype=bool)), s, -np.inf)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ v


def check():
    rng = np.random.default_rng(7)
    d, S = 64, 1024
    q_t = rng.standard_normal((d, S)).astype(np.float32)
    k_t = rng.standard_normal((d, S)).astype(np.float32)
    v = rng.standard_normal((S, d)).astype(np.float32)
    for causal in (True, False):
        got = flash_attention(q_t, k_t, v, causal=causal)
        np.testing.assert_allclose(got, reference(q_t, k_t, v, causal), rtol=1e-4, atol=1e-4)
    print("flash_attention: OK")


if __name__ == "__main__":
    check()
