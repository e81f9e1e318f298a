"""Generalized IoU of box pairs as a tile kernel, checked against numpy.

The classic kernel study: two batches of boxes ``[batch, n, 4]`` fp32 (x1, y1, x2, y2),
batch 1024 x 256 boxes, and ``out[b, i] = GIoU(boxes1[b, i], boxes2[b, i])``::

    IoU  = area(A & B) / area(A | B)
    GIoU = IoU - (area(C) - area(A | B)) / area(C)     C: the smallest box enclosing A and B

The output buffer is passed in (``giou_kernel(boxes1, boxes2, out)``), and the kernel
stores into it: ``tilescope.simulate`` writes the result back into the caller's array.

Layout: 128 batch rows per tile (the partition dimension); each partition loads its
row's ``n`` boxes as one contiguous run of ``4 n`` floats (one large DMA per tile and
batch), and the coordinates are de-interleaved *on chip* with the strided index
``4 * i + k``. The stride is 16 bytes, which VectorE reads at full speed; loading with
that stride from HBM instead would make 4-byte DMA chunks (see the modeled DMA time).
``x`` and ``y`` travel together on ``[128, n, 2]`` views, so each instruction does both.

Run: ``python examples/giou/giou_kernel.py`` (prints the check, the modeled summary and
timeline).
"""

from __future__ import annotations

import numpy as np

import tilescope
import tilescope.lang as tl

P = tl.tile_size.pmax


@tilescope.kernel
def giou_kernel(boxes1, boxes2, out):
    """out[b, i] = GIoU(boxes1[b, i], boxes2[b, i]); boxes are [batch, n, 4] fp32."""
    batch, n, _ = boxes1.shape
    flat1 = boxes1.reshape((batch, n * 4))
    flat2 = boxes2.reshape((batch, n * 4))
    i_p, i_f = tl.mgrid[0:P, 0:n * 4]          # a tile: 128 rows x all coordinates of a row
    i_o = tl.arange(n)[None, :]                 # output columns
    r = tl.arange(P)[:, None, None]             # the same rows, on [128, n, 2] views
    i = tl.arange(n)[None, :, None]             # box index
    k = tl.arange(2)[None, None, :]             # 0: x, 1: y
    for t in tl.affine_range((batch + P - 1) // P):
        rows = t * P + i_p
        a = tl.load(flat1[rows, i_f], mask=(rows < batch))
        b = tl.load(flat2[rows, i_f], mask=(rows < batch))
        lo_a, hi_a = a[r, 4 * i + k], a[r, 4 * i + 2 + k]   # (x1, y1) and (x2, y2) of each box
        lo_b, hi_b = b[r, 4 * i + k], b[r, 4 * i + 2 + k]

        wh_a = hi_a - lo_a
        wh_b = hi_b - lo_b
        area_a = wh_a[:, :, 0] * wh_a[:, :, 1]
        area_b = wh_b[:, :, 0] * wh_b[:, :, 1]

        inter_wh = tl.maximum(tl.minimum(hi_a, hi_b) - tl.maximum(lo_a, lo_b), 0.0)
        inter = inter_wh[:, :, 0] * inter_wh[:, :, 1]
        union = area_a + area_b - inter
        iou = inter / union

        hull_wh = tl.maximum(hi_a, hi_b) - tl.minimum(lo_a, lo_b)
        hull = hull_wh[:, :, 0] * hull_wh[:, :, 1]
        giou = iou - (hull - union) / hull
        tl.store(out[t * P + tl.arange(P)[:, None], i_o], giou, mask=(t * P + tl.arange(P)[:, None] < batch))


def giou_reference(boxes1: np.ndarray, boxes2: np.ndarray) -> np.ndarray:
    """The same, vectorised numpy (fp32)."""
    lo_a, hi_a = boxes1[..., :2], boxes1[..., 2:]
    lo_b, hi_b = boxes2[..., :2], boxes2[..., 2:]
    area_a = np.prod(hi_a - lo_a, axis=-1)
    area_b = np.prod(hi_b - lo_b, axis=-1)
    inter = np.prod(np.maximum(np.minimum(hi_a, hi_b) - np.maximum(lo_a, lo_b), 0), axis=-1)
    union = area_a + area_b - inter
    hull = np.prod(np.maximum(hi_a, hi_b) - np.minimum(lo_a, lo_b), axis=-1)
    return inter / union - (hull - union) / hull


def random_boxes(batch: int = 1024, n: int = 256, seed: int = 0) -> np.ndarray:
    """Valid boxes (x1 < x2, y1 < y2) in the unit square, fp32."""
    rng = np.random.default_rng(seed)
    lo = rng.uniform(0.0, 0.8, size=(batch, n, 2)).astype(np.float32)
    wh = rng.uniform(0.02, 0.2, size=(batch, n, 2)).astype(np.float32)
    return np.concatenate([lo, lo + wh], axis=-1)


def main(batch: int = 1024, n: int = 256) -> int:
    from rich.console import Console

    boxes1, boxes2 = random_boxes(batch, n, 0), random_boxes(batch, n, 1)
    out = np.empty((batch, n), np.float32)
    result = tilescope.simulate(giou_kernel, boxes1, boxes2, out)
    err = float(np.abs(out - giou_reference(boxes1, boxes2)).max())
    console = Console()
    console.print(f"GIoU of {batch} x {n} box pairs: max |tile kernel - numpy| = {err:.2e}")
    console.print(result.summary.table())
    console.print(result.timeline.text(), markup=False)
    return 0 if err < 1e-5 else 1


if __name__ == "__main__":
    raise SystemExit(main())
