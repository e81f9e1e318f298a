"""LayerNorm as a tile kernel: two passes vs ``bn_stats``/``bn_aggr`` (the NKI tutorial's pair).

``y = (x - mean) / sqrt(var + eps) * gamma + beta`` over the last dim, at the tutorial's
shape [300, 1000] fp32 (the last of three 128-row tiles is ragged: masks handle it).

* ``layernorm_two_pass``: mean, then the mean of ``(x - mean)**2`` -- four VectorE passes
  over the tile before normalising.
* ``layernorm_bn_stats``: VectorE's ``bn_stats`` (per 512-element chunk) and ``bn_aggr``
  give mean and variance in one pass; one ``tensor_scalar`` then subtracts and scales.

Run: ``python examples/layernorm/layernorm_kernel.py``.
"""

from __future__ import annotations

import numpy as np

import tilescope
import tilescope.isa as nisa
import tilescope.lang as tl

P = tl.tile_size.pmax


@tilescope.kernel
def layernorm_two_pass(x, gamma, beta, eps=1e-5):
    rows, d = x.shape
    out = tl.ndarray(x.shape, x.dtype, buffer=tl.hbm)
    g = tl.load(gamma.reshape((1, d)).broadcast_to((P, d)))
    b = tl.load(beta.reshape((1, d)).broadcast_to((P, d)))
    i_p, i_f = tl.mgrid[0:P, 0:d]
    for t in tl.affine_range((rows + P - 1) // P):
        r = t * P + i_p
        xt = tl.load(x[r, i_f], mask=(r < rows))
        centered = xt - tl.mean(xt, axis=1)
        inv = tl.rsqrt(tl.mean(centered * centered, axis=1) + eps)
        tl.store(out[r, i_f], centered * inv * g + b, mask=(r < rows))
    return out


@tilescope.kernel
def layernorm_bn_stats(x, gamma, beta, eps=1e-5):
    rows, d = x.shape
    out = tl.ndarray(x.shape, x.dtype, buffer=tl.hbm)
    g = tl.load(gamma.reshape((1, d)).broadcast_to((P, d)))
    b = tl.load(beta.reshape((1, d)).broadcast_to((P, d)))
    i_p, i_f = tl.mgrid[0:P, 0:d]
    fmax = tl.tile_size.bn_stats_fmax
    chunks = (d + fmax - 1) // fmax
    for t in tl.affine_range((rows + P - 1) // P):
        r = t * P + i_p
        xt = tl.load(x[r, i_f], mask=(r < rows))
        stats = tl.ndarray((P, 6 * chunks), tl.float32)
        for c in tl.static_range(chunks):
            stats[:, 6 * c:6 * c + 6] = nisa.bn_stats(xt[:, c * fmax:min(d, (c + 1) * fmax)])
        mean_var = nisa.bn_aggr(stats)                      # [P, 2]: mean, variance
        inv = tl.rsqrt(mean_var[:, 1] + eps)                # [P]
        y = nisa.tensor_scalar(xt, np.subtract, mean_var[:, 0], op1=np.multiply, operand1=inv)
        tl.store(out[r, i_f], y * g + b, mask=(r < rows))
    return out


def layernorm_reference(x, gamma, beta, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def main(rows: int = 300, d: int = 1000) -> int:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, d), dtype=np.float32) * 2 + 1
    gamma = rng.uniform(0.5, 1.5, d).astype(np.float32)
    beta = rng.standard_normal(d, dtype=np.float32)
    ok = True
    for kernel in (layernorm_two_pass, layernorm_bn_stats):
        r = tilescope.simulate(kernel, x, gamma, beta)
        err = float(np.abs(r.value - layernorm_reference(x, gamma, beta)).max())
        ok &= err < 1e-4
        print(f"{kernel.name}: max |tile kernel - numpy| = {err:.1e}; {r.summary}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
