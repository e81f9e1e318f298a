"""The fused built-ins of the simulated device, written as tile kernels.

``torch.rms_norm``, ``layer_norm``, ``softmax``, ``log_softmax``, ``gelu`` and ``silu``
on the ``sim`` device each run as one device execution whose Program is traced from a
kernel below (``tilescope.lang``): read them to see how a Trainium-class core does the
job, and run them yourself with ``tilescope.simulate(kernel, *arrays)``.
``scaled_dot_product_attention`` (strided views, masks, shared key/value heads, dropout)
is built with the tile builder directly: :mod:`tilescope.lower._attention`.

All kernels take row-major ``[rows, d]`` views of their tensors (the op's last dim is
``d``); 128 rows go to the partitions, the last tile is masked when ``rows`` is not a
multiple of 128. Statistics are kept in float32 whatever the input dtype.

>>> import numpy as np, tilescope
>>> from tilescope.lower.kernels import softmax_kernel
>>> x = np.random.default_rng(0).standard_normal((200, 64), dtype=np.float32)
>>> r = tilescope.simulate(softmax_kernel, x)
>>> bool(np.allclose(r.value.sum(axis=1), 1.0, atol=1e-5))
True
"""

from __future__ import annotations

import numpy as np

import tilescope.isa as nisa
import tilescope.lang as tl

__all__ = [
    "rms_norm_kernel", "layer_norm_kernel", "softmax_kernel", "log_softmax_kernel", "gelu_kernel",
    "silu_kernel", "softmax_backward_kernel", "log_softmax_backward_kernel",
    "layer_norm_backward_kernel", "rms_norm_backward_kernel",
]

P = tl.tile_size.pmax


@tl.kernel
def rms_norm_kernel(x, weight, eps):
    """``y = x * rsqrt(mean(x**2) + eps) * weight`` over the last dim; also returns ``rstd`` [rows, 1].

    ``weight`` is a [d] tensor or None. ScalarE squares and sums in one pass
    (``activation_reduce``), VectorE scales by the per-row factor and the weight.
    """
    rows, d = x.shape
    out = tl.ndarray(x.shape, x.dtype, buffer=tl.hbm, name="out")
    rstd_out = tl.ndarray((rows, 1), tl.float32, buffer=tl.hbm, name="rstd")
    if weight is not None:
        w = tl.load(weight.reshape((1, d)).broadcast_to((P, d)))  # once, into every partition
    i_p, i_f = tl.mgrid[0:P, 0:d]
    i_1 = tl.arange(1)[None, :]
    for t in tl.affine_range((rows + P - 1) // P):
        r = t * P + i_p
        xt = tl.load(x[r, i_f], mask=(r < rows))
        ss = tl.ndarray((P, 1), tl.float32)
        nisa.activation_reduce(tl.square, xt, reduce_op=np.add, reduce_res=ss, dtype=tl.float32,
                               mask=(r < rows))
        rstd = tl.rsqrt(ss * (1.0 / d) + eps, mask=(r < rows))          # [P, 1]
        y = nisa.tensor_scalar(xt, np.multiply, rstd, mask=(r < rows))
        if weight is not None:
            y = tl.multiply(y, w, mask=(r < rows))
        tl.store(out[r, i_f], y, mask=(r < rows))
        tl.store(rstd_out[r, i_1], rstd, mask=(r < rows))
    return out, rstd_out


@tl.kernel
def layer_norm_kernel(x, weight, bias, eps):
    """``y = (x - mean) * rsqrt(var + eps) * weight + bias``; also returns mean and rstd [rows, 1].

    Mean and variance come from VectorE's ``bn_stats`` (per 512 elements) and
    ``bn_aggr`` in one pass; one ``tensor_scalar`` subtracts and scales.
    """
    rows, d = x.shape
    out = tl.ndarray(x.shape, x.dtype, buffer=tl.hbm, name="out")
    mean_out = tl.ndarray((rows, 1), tl.float32, buffer=tl.hbm, name="mean")
    rstd_out = tl.ndarray((rows, 1), tl.float32, buffer=tl.hbm, name="rstd")
    if weight is not None:
        w = tl.load(weight.reshape((1, d)).broadcast_to((P, d)))
    if bias is not None:
        b = tl.load(bias.reshape((1, d)).broadcast_to((P, d)))
    i_p, i_f = tl.mgrid[0:P, 0:d]
    i_1 = tl.arange(1)[None, :]
    fmax = tl.tile_size.bn_stats_fmax
    chunks = (d + fmax - 1) // fmax
    for t in tl.affine_range((rows + P - 1) // P):
        r = t * P + i_p
        xt = tl.load(x[r, i_f], mask=(r < rows))
        stats = tl.ndarray((P, 6 * chunks), tl.float32)
        for c in tl.static_range(chunks):
            stats[:, 6 * c:6 * c + 6] = nisa.bn_stats(xt[:, c * fmax:min(d, (c + 1) * fmax)], mask=(r < rows))
        mv = nisa.bn_aggr(stats, mask=(r < rows))                           # [P, 2]: mean, variance
        rstd = tl.rsqrt(mv[:, 1] + eps, mask=(r < rows))                    # [P]
        y = nisa.tensor_scalar(xt, np.subtract, mv[:, 0], op1=np.multiply, operand1=rstd, mask=(r < rows))
        if weight is not None:
            y = tl.multiply(y, w, mask=(r < rows))
        if bias is not None:
            y = tl.add(y, b, mask=(r < rows))
        tl.store(out[r, i_f], y, mask=(r < rows))
        tl.store(mean_out[r, i_1], mv[:, 0:1], mask=(r < rows))
        tl.store(rstd_out[r, i_1], rstd, mask=(r < rows))
    return out, mean_out, rstd_out


@tl.kernel
def rms_norm_backward_kernel(grad, x, rstd, weight):
    """RMSNorm's backward: ``grad_input = rstd * (g*w - xhat * mean(g*w*xhat))`` per row, and
    ``grad_weight`` [1, d] = column sums of ``g * xhat`` (TensorE ``ones.T @ ...`` in PSUM)."""
    rows, d = x.shape
    dx = tl.ndarray(x.shape, x.dtype, buffer=tl.hbm, name="grad_input")
    dw = tl.ndarray((1, d), tl.float32, buffer=tl.hbm, name="grad_weight")
    if weight is not None:
        w = tl.load(weight.reshape((1, d)).broadcast_to((P, d)))
    ones = tl.ones((P, 1), tl.float32)
    chunk = tl.tile_size.gemm_moving_fmax
    spans = [(c0, min(d, c0 + chunk)) for c0 in range(0, d, chunk)]
    acc_w = [tl.zeros((1, c1 - c0), tl.float32, buffer=tl.psum) for c0, c1 in spans]
    i_p, i_f = tl.mgrid[0:P, 0:d]
    i_1 = tl.arange(1)[None, :]
    for t in tl.static_range((rows + P - 1) // P):
        n = min(P, rows - t * P)
        r = t * P + i_p
        valid = r < rows
        g = tl.load(grad[r, i_f], mask=valid, dtype=tl.float32)
        rs = tl.load(rstd[r, i_1], mask=valid)
        xhat = nisa.tensor_scalar(tl.load(x[r, i_f], mask=valid, dtype=tl.float32), np.multiply, rs, mask=valid)
        gw = tl.multiply(g, w, mask=valid) if weight is not None else g
        c = tl.mean(tl.multiply(gw, xhat, mask=valid), axis=1, mask=valid)
        inner = tl.subtract(gw, tl.multiply(xhat, c, mask=valid), mask=valid)
        tl.store(dx[r, i_f], nisa.tensor_scalar(inner, np.multiply, rs, mask=valid), mask=valid)
        gx = tl.multiply(g, xhat, mask=valid)
        for k, (c0, c1) in enumerate(spans):
            acc_w[k] += tl.matmul(ones[0:n, :], gx[0:n, c0:c1], transpose_x=True)
    for k, (c0, c1) in enumerate(spans):
        tl.store(dw[0:1, c0:c1], tl.copy(acc_w[k]))
    return dx, dw


@tl.kernel
def layer_norm_backward_kernel(grad, x, mean, rstd, weight):
    """LayerNorm's backward: ``grad_input`` per row, ``grad_weight`` / ``grad_bias`` [1, d] summed
    over all rows.

    Per row tile, VectorE rebuilds ``xhat`` from the saved mean and rstd and takes the two row
    means of the input gradient formula. The column sums over rows are cross-partition
    reductions: TensorE accumulates ``ones.T @ (grad * xhat)`` and ``ones.T @ grad`` in PSUM across
    all row tiles (512 columns per bank), so they leave the chip once at the end.
    """
    rows, d = x.shape
    dx = tl.ndarray(x.shape, x.dtype, buffer=tl.hbm, name="grad_input")
    dw = tl.ndarray((1, d), tl.float32, buffer=tl.hbm, name="grad_weight")
    db = tl.ndarray((1, d), tl.float32, buffer=tl.hbm, name="grad_bias")
    if weight is not None:
        w = tl.load(weight.reshape((1, d)).broadcast_to((P, d)))
    ones = tl.ones((P, 1), tl.float32)
    chunk = tl.tile_size.gemm_moving_fmax
    spans = [(c0, min(d, c0 + chunk)) for c0 in range(0, d, chunk)]
    acc_w = [tl.zeros((1, c1 - c0), tl.float32, buffer=tl.psum) for c0, c1 in spans]
    acc_b = [tl.zeros((1, c1 - c0), tl.float32, buffer=tl.psum) for c0, c1 in spans]
    i_p, i_f = tl.mgrid[0:P, 0:d]
    i_1 = tl.arange(1)[None, :]
    for t in tl.static_range((rows + P - 1) // P):
        n = min(P, rows - t * P)  # valid rows of this tile
        r = t * P + i_p
        valid = r < rows
        g = tl.load(grad[r, i_f], mask=valid, dtype=tl.float32)
        xt = tl.load(x[r, i_f], mask=valid, dtype=tl.float32)
        m = tl.load(mean[r, i_1], mask=valid)
        rs = tl.load(rstd[r, i_1], mask=valid)
        xhat = nisa.tensor_scalar(xt, np.subtract, m, op1=np.multiply, operand1=rs, mask=valid)
        gw = tl.multiply(g, w, mask=valid) if weight is not None else g
        c1 = tl.mean(gw, axis=1, mask=valid)
        c2 = tl.mean(tl.multiply(gw, xhat, mask=valid), axis=1, mask=valid)
        inner = tl.subtract(tl.subtract(gw, c1, mask=valid), tl.multiply(xhat, c2, mask=valid), mask=valid)
        tl.store(dx[r, i_f], nisa.tensor_scalar(inner, np.multiply, rs, mask=valid), mask=valid)
        gx = tl.multiply(g, xhat, mask=valid)
        for k, (c0, c1_) in enumerate(spans):
            acc_w[k] += tl.matmul(ones[0:n, :], gx[0:n, c0:c1_], transpose_x=True)
            acc_b[k] += tl.matmul(ones[0:n, :], g[0:n, c0:c1_], transpose_x=True)
    for k, (c0, c1_) in enumerate(spans):
        tl.store(dw[0:1, c0:c1_], tl.copy(acc_w[k]))
        tl.store(db[0:1, c0:c1_], tl.copy(acc_b[k]))
    return dx, dw, db


@tl.kernel
def softmax_kernel(x):
    """Softmax over the last dim: ``-max`` on VectorE, then one ScalarE ``activation_reduce``
    computes ``exp(x - max)`` and its row sum together; VectorE divides."""
    rows, d = x.shape
    out = tl.ndarray(x.shape, x.dtype, buffer=tl.hbm, name="out")
    i_p, i_f = tl.mgrid[0:P, 0:d]
    for t in tl.affine_range((rows + P - 1) // P):
        r = t * P + i_p
        xt = tl.load(x[r, i_f], mask=(r < rows))
        neg_max = nisa.tensor_reduce(np.max, xt, axis=1, negate=True, keepdims=True, mask=(r < rows))
        total = tl.ndarray((P, 1), tl.float32)
        e = nisa.activation_reduce(tl.exp, xt, bias=neg_max, reduce_op=np.add, reduce_res=total,
                                   dtype=tl.float32, mask=(r < rows))
        tl.store(out[r, i_f], nisa.tensor_scalar(e, np.divide, total, mask=(r < rows)), mask=(r < rows))
    return out


@tl.kernel
def log_softmax_kernel(x):
    """Log-softmax over the last dim: ``x - max - log(sum(exp(x - max)))``."""
    rows, d = x.shape
    out = tl.ndarray(x.shape, x.dtype, buffer=tl.hbm, name="out")
    i_p, i_f = tl.mgrid[0:P, 0:d]
    for t in tl.affine_range((rows + P - 1) // P):
        r = t * P + i_p
        xt = tl.load(x[r, i_f], mask=(r < rows))
        neg_max = nisa.tensor_reduce(np.max, xt, axis=1, negate=True, keepdims=True, mask=(r < rows))
        total = tl.ndarray((P, 1), tl.float32)
        nisa.activation_reduce(tl.exp, xt, bias=neg_max, reduce_op=np.add, reduce_res=total,
                               dtype=tl.float32, mask=(r < rows))
        shift = tl.subtract(neg_max, tl.log(total, mask=(r < rows)), mask=(r < rows))   # -max - log(sum)
        tl.store(out[r, i_f], nisa.tensor_scalar(xt, np.add, shift, mask=(r < rows)), mask=(r < rows))
    return out


@tl.kernel
def softmax_backward_kernel(grad, y):
    """Softmax's backward over the last dim: ``y * (grad - sum(grad * y))``."""
    rows, d = y.shape
    out = tl.ndarray(y.shape, y.dtype, buffer=tl.hbm, name="out")
    i_p, i_f = tl.mgrid[0:P, 0:d]
    for t in tl.affine_range((rows + P - 1) // P):
        r = t * P + i_p
        gt = tl.load(grad[r, i_f], mask=(r < rows))
        yt = tl.load(y[r, i_f], mask=(r < rows))
        dot = tl.sum(tl.multiply(gt, yt, mask=(r < rows)), axis=1, mask=(r < rows))   # [P]
        tl.store(out[r, i_f], tl.multiply(yt, tl.subtract(gt, dot, mask=(r < rows)), mask=(r < rows)),
                 mask=(r < rows))
    return out


@tl.kernel
def log_softmax_backward_kernel(grad, y):
    """Log-softmax's backward over the last dim: ``grad - exp(y) * sum(grad)``."""
    rows, d = y.shape
    out = tl.ndarray(y.shape, y.dtype, buffer=tl.hbm, name="out")
    i_p, i_f = tl.mgrid[0:P, 0:d]
    for t in tl.affine_range((rows + P - 1) // P):
        r = t * P + i_p
        gt = tl.load(grad[r, i_f], mask=(r < rows))
        total = tl.sum(gt, axis=1, mask=(r < rows))                                        # [P]
        p = tl.exp(tl.load(y[r, i_f], mask=(r < rows)), mask=(r < rows))
        tl.store(out[r, i_f], tl.subtract(gt, tl.multiply(p, total, mask=(r < rows)), mask=(r < rows)),
                 mask=(r < rows))
    return out


@tl.kernel
def gelu_kernel(x, approximate):
    """GELU on ScalarE's activation table (``"none"``: erf form, ``"tanh"``: tanh form)."""
    rows, d = x.shape
    out = tl.ndarray(x.shape, x.dtype, buffer=tl.hbm, name="out")
    i_p, i_f = tl.mgrid[0:P, 0:d]
    for t in tl.affine_range((rows + P - 1) // P):
        r = t * P + i_p
        xt = tl.load(x[r, i_f], mask=(r < rows))
        y = tl.gelu_tanh(xt, mask=(r < rows)) if approximate == "tanh" else tl.gelu(xt, mask=(r < rows))
        tl.store(out[r, i_f], y, mask=(r < rows))
    return out


@tl.kernel
def silu_kernel(x):
    """SiLU (``x * sigmoid(x)``) on ScalarE's activation table."""
    rows, d = x.shape
    out = tl.ndarray(x.shape, x.dtype, buffer=tl.hbm, name="out")
    i_p, i_f = tl.mgrid[0:P, 0:d]
    for t in tl.affine_range((rows + P - 1) // P):
        r = t * P + i_p
        xt = tl.load(x[r, i_f], mask=(r < rows))
        tl.store(out[r, i_f], tl.silu(xt, mask=(r < rows)), mask=(r < rows))
    return out
