"""Generalized IoU in plain PyTorch, and the study's seeded box batches.

GIoU (Rezatofighi et al., CVPR 2019) of aligned box pairs ``(x1, y1, x2, y2)``:
``IoU - (area(C) - union) / area(C)`` with C the smallest box enclosing both, written the
way torchvision's ``generalized_box_iou_loss`` computes it (``eps`` keeps empty boxes finite).
Eager, on the ``sim`` device, every line below is its own device execution.

>>> import torch
>>> b1, b2 = make_boxes(2, 3, seed=0)
>>> tuple(giou_torch(b1, b2).shape)
(2, 3)
>>> float(giou_torch(b1, b1).min()) > 0.999
True
"""

from __future__ import annotations

import torch

__all__ = ["giou_torch", "make_boxes", "BATCH", "BOXES", "EPS"]

BATCH, BOXES, EPS = 1024, 256, 1e-7  # the reference study: 1024 x 256 boxes x 4 coordinates, fp32


def giou_torch(boxes1: torch.Tensor, boxes2: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    x1, y1, x2, y2 = boxes1.unbind(dim=-1)
    x1g, y1g, x2g, y2g = boxes2.unbind(dim=-1)
    iw = (torch.minimum(x2, x2g) - torch.maximum(x1, x1g)).clamp(min=0)
    ih = (torch.minimum(y2, y2g) - torch.maximum(y1, y1g)).clamp(min=0)
    inter = iw * ih
    union = (x2 - x1) * (y2 - y1) + (x2g - x1g) * (y2g - y1g) - inter
    iou = inter / (union + eps)
    area_c = (torch.maximum(x2, x2g) - torch.minimum(x1, x1g)) * (torch.maximum(y2, y2g) - torch.minimum(y1, y1g))
    return iou - (area_c - union) / (area_c + eps)


def make_boxes(batch: int = BATCH, boxes: int = BOXES, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Two seeded batches of valid boxes (x1 < x2, y1 < y2) in [0, 1], shape (batch, boxes, 4)."""
    g = torch.Generator().manual_seed(seed)

    def one() -> torch.Tensor:
        xy = torch.rand(batch, boxes, 2, generator=g) * 0.8
        wh = torch.rand(batch, boxes, 2, generator=g) * 0.4 + 0.01
        return torch.cat([xy, xy + wh], dim=-1).contiguous()

    return one(), one()
