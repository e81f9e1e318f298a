"""A Vision Transformer: a strided-convolution patch embedding, a class token, learned
positions, pre-LayerNorm blocks (non-causal attention, GELU MLP) and a linear head on the
class token -- the layout of timm's ``vit_tiny_patch16_224`` at any size.

>>> import torch
>>> m = ViT(ViTConfig(image=16, patch=4, d=32, layers=1, heads=2, mlp=64, classes=10))
>>> tuple(m(torch.zeros(2, 3, 16, 16)).shape)
(2, 10)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["ViTConfig", "ViT"]


@dataclass(frozen=True)
class ViTConfig:
    image: int = 224
    patch: int = 16
    channels: int = 3
    d: int = 192
    layers: int = 12
    heads: int = 3
    mlp: int = 768
    classes: int = 1000


class Attention(nn.Module):
    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.d, 3 * cfg.d)
        self.proj = nn.Linear(cfg.d, cfg.d)

    def forward(self, x):
        b, n, d = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)  # (3, b, h, n, hd)
        y = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
        return self.proj(y.transpose(1, 2).reshape(b, n, d))


class Block(nn.Module):
    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d, eps=1e-6)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d, eps=1e-6)
        self.fc1 = nn.Linear(cfg.d, cfg.mlp)
        self.fc2 = nn.Linear(cfg.mlp, cfg.d)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class ViT(nn.Module):
    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.cfg = cfg
        n = (cfg.image // cfg.patch) ** 2
        self.patch_embed = nn.Conv2d(cfg.channels, cfg.d, cfg.patch, stride=cfg.patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, cfg.d))
        self.pos = nn.Parameter(torch.randn(1, n + 1, cfg.d) * 0.02)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = nn.LayerNorm(cfg.d, eps=1e-6)
        self.head = nn.Linear(cfg.d, cfg.classes)

    def forward(self, images):  # (b, c, H, W) -> (b, classes)
        x = self.patch_embed(images).flatten(2).transpose(1, 2)  # (b, patches, d)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x)[:, 0])
