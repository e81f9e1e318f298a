"""Row softmax as a tile kernel, written two ways.

* ``softmax_kernel`` uses the language's operators: max (VectorE), subtract (VectorE),
  exp (ScalarE), sum (VectorE), divide (VectorE) -- five engine passes over each tile.
* ``softmax_fused`` picks instructions with ``tilescope.isa``: ``tensor_reduce`` with
  ``negate`` gives -max; one ScalarE ``activation_reduce`` computes ``exp(x - max)`` (the
  bias is free on ScalarE) *and* its row sum; a ``tensor_scalar`` divides. Three passes,
  and VectorE/ScalarE work is better balanced -- compare their modeled times.

Run: ``python examples/softmax/softmax_kernel.py``.
"""

from __future__ import annotations

import numpy as np

import tilescope
import tilescope.isa as nisa
import tilescope.lang as tl

P = tl.tile_size.pmax


@tilescope.kernel
def softmax_kernel(x):
    """softmax over the last dim of x [rows, d]."""
    rows, d = x.shape
    out = tl.ndarray(x.shape, x.dtype, buffer=tl.hbm)
    i_p, i_f = tl.mgrid[0:P, 0:d]
    for t in tl.affine_range((rows + P - 1) // P):
        r = t * P + i_p
        xt = tl.load(x[r, i_f], mask=(r < rows))
        e = tl.exp(xt - tl.max(xt, axis=1))
        tl.store(out[r, i_f], e / tl.sum(e, axis=1), mask=(r < rows))
    return out


@tilescope.kernel
def softmax_fused(x):
    """The same with three instructions per tile, chosen with tilescope.isa."""
    rows, d = x.shape
    out = tl.ndarray(x.shape, x.dtype, buffer=tl.hbm)
    i_p, i_f = tl.mgrid[0:P, 0:d]
    for t in tl.affine_range((rows + P - 1) // P):
        r = t * P + i_p
        xt = tl.load(x[r, i_f], mask=(r < rows))
        neg_max = nisa.tensor_reduce(np.max, xt, axis=1, negate=True, keepdims=True)   # [P, 1]
        total = tl.ndarray((P, 1), tl.float32)
        e = nisa.activation_reduce(tl.exp, xt, bias=neg_max, reduce_op=np.add, reduce_res=total)
        tl.store(out[r, i_f], nisa.tensor_scalar(e, np.divide, total), mask=(r < rows))
    return out


def softmax_reference(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def main(rows: int = 1024, d: int = 1024) -> int:
    x = np.random.default_rng(0).standard_normal((rows, d), dtype=np.float32)
    ok = True
    for kernel in (softmax_kernel, softmax_fused):
        r = tilescope.simulate(kernel, x)
        err = float(np.abs(r.value - softmax_reference(x)).max())
        ok &= err < 1e-6
        print(f"{kernel.name}: max |tile kernel - numpy| = {err:.1e}; {r.summary}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
