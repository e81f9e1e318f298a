"""A selective scan (Mamba's SSM, current ``nki`` API): for every state s,
h_t = exp(delta_t * A_s) * h_{t-1} + delta_t * u_t * B_{s,t} along the sequence, and
y = sum_s C_{s,t} * h. Channels are on partitions; the recurrence is one VectorE
tensor_tensor_scan per state; B and C rows are broadcast across partitions (TensorE)."""
import numpy as np
import nki
import nki.isa as nisa
import nki.language as nl


@nki.jit
def selective_scan(delta, u, A, B, C):
    """delta, u: [channels, L]; A: [channels, states]; B, C: [states, L]; returns [channels, L]."""
    channels, L = delta.shape
    _, states = A.shape
    P = nl.tile_size.pmax
    out = nl.ndarray((channels, L), dtype=delta.dtype, buffer=nl.shared_hbm)
    for ct in nl.affine_range(channels // P):
        rows = nl.ds(ct * P, P)
        delta_t = nl.load(delta[rows, :])
        u_t = nl.load(u[rows, :])
        a_t = nl.load(A[rows, :])
        du = nl.multiply(delta_t, u_t)
        y = nl.zeros((P, L), dtype=nl.float32)
        for s in nl.affine_range(states):
            dA = nl.ndarray((P, L), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(dst=dA, op=nl.exp, data=delta_t, scale=a_t[:, s:s + 1])
            b_row = nl.ndarray((1, L), dtype=B.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=b_row, src=B[s:s + 1, :])
            dBu = nl.multiply(du, b_row)                     # (1, L) broadcast across partitions
            h = nl.ndarray((P, L), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor_scan(dst=h, data0=dA, data1=dBu, initial=0.0, op0=nl.multiply, op1=nl.add)
            c_row = nl.load(C[s:s + 1, :])
            y[...] = nl.add(y, nl.multiply(h, c_row))
        nl.store(out[rows, :], y)
    return out


def reference(delta, u, A, B, C):
    channels, L = delta.shape
    y = np.zeros((channels, L), np.float64)
    for s in range(A.shape[1]):
        dA = np.exp(delta * A[:, s:s + 1])
        dBu = delta * u * B[s]
        h = np.zeros(channels)
        for t in range(L):
            h = dA[:, t] * h + dBu[:, t]
            y[:, t] += C[s, t] * h
    return y


def check():
    rng = np.random.default_rng(8)
    channels, L, states = 256, 96, 4
    delta = rng.uniform(0.01, 0.2, (channels, L)).astype(np.float32)
    u = rng.standard_normal((channels, L)).astype(np.float32)
    A = -rng.uniform(0.5, 2.0, (channels, states)).astype(np.float32)
    B = rng.standard_normal((states, L)).astype(np.float32)
    C = rng.standard_normal((states, L)).astype(np.float32)
    np.testing.assert_allclose(selective_scan(delta, u, A, B, C), reference(delta, u, A, B, C),
                               rtol=1e-4, atol=1e-4)
    print("selective_scan: OK")


if __name__ == "__main__":
    check()
