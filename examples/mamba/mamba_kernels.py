"""Mamba's selective scan as tile kernels: the three steps of the public NKI "fused Mamba" tutorial.

For every state ``s`` of a channel tile (channels on partitions, the sequence along the free
dimension)::

    h[t]   = exp(delta[t] * A[s]) * h[t-1] + delta[t] * u[t] * B[s, t]   (one VectorE scan)
    out[t] = sum over s of C[s, t] * h[t]

* ``mamba_v1``: the state loop outside, everything loaded inside it -- delta and u are loaded
  once per state (16 times), so at 4K channels VectorE waits on their loads.
* ``mamba_v2``: delta and u loaded once per channel tile and reused across the states.
* ``mamba_v3``: the sequence tiled by 512 as well (the scan carries its last column into the
  next tile), so long sequences fit SBUF without spilling.

Every step runs ``activation`` (exp with a per-partition scale) on ScalarE and five VectorE
passes per state (two multiplies, the scan, a multiply by C and the accumulation); B and C
rows are broadcast across partitions. All times are modeled; ``benchmarks/fidelity.py``
compares them with the tutorial's published latencies.

Run: ``python examples/mamba/mamba_kernels.py`` (values against numpy at a small shape).
"""

from __future__ import annotations

import numpy as np

import tilescope
import tilescope.isa as nisa
import tilescope.lang as tl

P = tl.tile_size.pmax


@tilescope.kernel
def mamba_v1(delta, u, A, B, C):
    """delta, u: [batch, channels, seq]; A: [channels, states]; B, C: [batch, states, seq]."""
    batch, channels, seq = delta.shape
    _, states = A.shape
    out = tl.ndarray((batch, channels, seq), delta.dtype, buffer=tl.hbm)
    for b in tl.affine_range(batch):
        for ct in tl.affine_range(channels // P):
            c0 = ct * P
            acc = tl.zeros((P, seq), delta.dtype)
            for s in tl.affine_range(states):
                d_t = tl.load(delta[b, c0:c0 + P, :])
                a_t = tl.load(A[c0:c0 + P, s:s + 1])
                dA = nisa.activation(np.exp, d_t, scale=a_t)
                u_t = tl.load(u[b, c0:c0 + P, :])
                b_row = tl.load(B[b, s:s + 1, :])
                du = nisa.tensor_tensor(d_t, u_t, np.multiply)
                dBu = nisa.tensor_tensor(du, tl.broadcast_to(b_row, (P, seq)), np.multiply)
                h = nisa.tensor_tensor_scan(dA, dBu, 0.0, np.multiply, np.add)
                c_row = tl.load(C[b, s:s + 1, :])
                hC = nisa.tensor_tensor(h, tl.broadcast_to(c_row, (P, seq)), np.multiply)
                acc[...] = nisa.tensor_tensor(acc, hC, np.add)
            tl.store(out[b, c0:c0 + P, :], acc)
    return out


@tilescope.kernel
def mamba_v2(delta, u, A, B, C):
    """As v1, with delta and u loaded once per channel tile (the tutorial's loop reordering)."""
    batch, channels, seq = delta.shape
    _, states = A.shape
    out = tl.ndarray((batch, channels, seq), delta.dtype, buffer=tl.hbm)
    for b in tl.affine_range(batch):
        for ct in tl.affine_range(channels // P):
            c0 = ct * P
            acc = tl.zeros((P, seq), delta.dtype)
            d_t = tl.load(delta[b, c0:c0 + P, :])
            u_t = tl.load(u[b, c0:c0 + P, :])
            for s in tl.affine_range(states):
                a_t = tl.load(A[c0:c0 + P, s:s + 1])
                dA = nisa.activation(np.exp, d_t, scale=a_t)
                b_row = tl.load(B[b, s:s + 1, :])
                du = nisa.tensor_tensor(d_t, u_t, np.multiply)
                dBu = nisa.tensor_tensor(du, tl.broadcast_to(b_row, (P, seq)), np.multiply)
                h = nisa.tensor_tensor_scan(dA, dBu, 0.0, np.multiply, np.add)
                c_row = tl.load(C[b, s:s + 1, :])
                hC = nisa.tensor_tensor(h, tl.broadcast_to(c_row, (P, seq)), np.multiply)
                acc[...] = nisa.tensor_tensor(acc, hC, np.add)
            tl.store(out[b, c0:c0 + P, :], acc)
    return out


@tilescope.kernel
def mamba_v3(delta, u, A, B, C, seq_tile=512):
    """As v2, with the sequence tiled by ``seq_tile``: the scan of each tile starts from the
    last column of the previous one."""
    batch, channels, seq = delta.shape
    _, states = A.shape
    out = tl.ndarray((batch, channels, seq), delta.dtype, buffer=tl.hbm)
    F = seq_tile
    for b in tl.affine_range(batch):
        for ct in tl.affine_range(channels // P):
            c0 = ct * P
            acc = tl.zeros((P, seq), delta.dtype)
            d_t = tl.load(delta[b, c0:c0 + P, :])
            u_t = tl.load(u[b, c0:c0 + P, :])
            for s in tl.affine_range(states):
                a_t = tl.load(A[c0:c0 + P, s:s + 1])
                carry = tl.zeros((P, 1), delta.dtype)
                for j in tl.sequential_range(seq // F):
                    f0 = j * F
                    dA = nisa.activation(np.exp, d_t[:, f0:f0 + F], scale=a_t)
                    b_row = tl.load(B[b, s:s + 1, f0:f0 + F])
                    du = nisa.tensor_tensor(d_t[:, f0:f0 + F], u_t[:, f0:f0 + F], np.multiply)
                    dBu = nisa.tensor_tensor(du, tl.broadcast_to(b_row, (P, F)), np.multiply)
                    h = nisa.tensor_tensor_scan(dA, dBu, carry, np.multiply, np.add)
                    carry[...] = tl.copy(h[:, F - 1:F])
                    c_row = tl.load(C[b, s:s + 1, f0:f0 + F])
                    hC = nisa.tensor_tensor(h, tl.broadcast_to(c_row, (P, F)), np.multiply)
                    acc[:, f0:f0 + F] = nisa.tensor_tensor(acc[:, f0:f0 + F], hC, np.add)
            tl.store(out[b, c0:c0 + P, :], acc)
    return out


def inputs(batch: int, channels: int, seq: int, states: int, seed: int = 0, data: bool = True):
    """fp32 ``delta, u, A, B, C`` (uninitialised specs when ``data`` is False: enough for
    modeled timing with ``numerics=False``)."""
    shapes = ((batch, channels, seq), (batch, channels, seq), (channels, states), (batch, states, seq),
              (batch, states, seq))
    if not data:
        return tuple(tl.TensorSpec(s, "float32") for s in shapes)
    rng = np.random.default_rng(seed)
    delta = rng.uniform(0.0, 0.1, shapes[0]).astype(np.float32)
    u = rng.standard_normal(shapes[1], dtype=np.float32)
    A = -rng.uniform(0.5, 1.5, shapes[2]).astype(np.float32)
    B = rng.standard_normal(shapes[3], dtype=np.float32)
    C = rng.standard_normal(shapes[4], dtype=np.float32)
    return delta, u, A, B, C


def reference(delta, u, A, B, C):
    batch, channels, seq = delta.shape
    out = np.zeros_like(delta)
    for s in range(A.shape[1]):
        dA = np.exp(delta * A[None, :, s:s + 1])
        dBu = delta * u * B[:, None, s, :]
        h = np.zeros((batch, channels), np.float32)
        for t in range(seq):
            h = dA[..., t] * h + dBu[..., t]
            out[..., t] += C[:, None, s, t] * h
    return out


def main() -> int:
    args = inputs(1, 256, 1024, 4, seed=1)
    expect = reference(*args)
    for k in (mamba_v1, mamba_v2, mamba_v3):
        r = tilescope.simulate(k, *args)
        np.testing.assert_allclose(r.value, expect, rtol=2e-3, atol=2e-3)
        print(f"{k.name}: matches numpy; {r.summary}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
