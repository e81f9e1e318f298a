"""A Llama-style decoder: RMSNorm, rotary position embeddings (RoPE, rotate-half form),
grouped-query attention (``kv_heads`` < ``heads``: each key/value head serves a group of query
heads), a SwiGLU MLP, no biases, an untied head.

>>> import torch
>>> m = Llama(LlamaConfig(vocab=64, seq=16, d=32, layers=1, heads=4, kv_heads=2, hidden=64))
>>> tuple(m(torch.zeros(2, 16, dtype=torch.long)).shape), m.blocks[0].attn.wk.out_features
((2, 16, 64), 16)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["LlamaConfig", "Llama", "rotary_tables", "apply_rotary"]


@dataclass(frozen=True)
class LlamaConfig:
    vocab: int = 32000
    seq: int = 2048
    d: int = 4096
    layers: int = 32
    heads: int = 32
    kv_heads: int = 8  # grouped-query attention: heads // kv_heads query heads share one key/value head
    hidden: int = 11008  # SwiGLU hidden width
    eps: float = 1e-5
    rope_theta: float = 10000.0


def rotary_tables(seq: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of RoPE's angles, (seq, head_dim), each frequency repeated for both halves."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    ang = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos(), ang.sin()


def _rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


def apply_rotary(x, cos, sin):
    """RoPE on (b, h, t, hd) with (t, hd) tables."""
    return x * cos + _rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.heads, self.kv_heads = cfg.heads, cfg.kv_heads
        self.hd = cfg.d // cfg.heads
        self.wq = nn.Linear(cfg.d, cfg.heads * self.hd, bias=False)
        self.wk = nn.Linear(cfg.d, cfg.kv_heads * self.hd, bias=False)
        self.wv = nn.Linear(cfg.d, cfg.kv_heads * self.hd, bias=False)
        self.wo = nn.Linear(cfg.heads * self.hd, cfg.d, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.heads, self.hd).transpose(1, 2)  # (b, h, t, hd)
        k = self.wk(x).view(b, t, self.kv_heads, self.hd).transpose(1, 2)  # (b, kvh, t, hd)
        v = self.wv(x).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        # grouped-query attention: query head i reads key/value head i // (heads // kv_heads)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads)
        return self.wo(y.transpose(1, 2).reshape(b, t, self.heads * self.hd))


class SwiGLU(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.d, cfg.hidden, bias=False)  # gate
        self.w3 = nn.Linear(cfg.d, cfg.hidden, bias=False)  # up
        self.w2 = nn.Linear(cfg.hidden, cfg.d, bias=False)  # down

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.d, eps=cfg.eps)
        self.attn = Attention(cfg)
        self.mlp_norm = nn.RMSNorm(cfg.d, eps=cfg.eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.d)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = nn.RMSNorm(cfg.d, eps=cfg.eps)
        self.head = nn.Linear(cfg.d, cfg.vocab, bias=False)
        cos, sin = rotary_tables(cfg.seq, cfg.d // cfg.heads, cfg.rope_theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx):  # (b, t) token ids -> (b, t, vocab) logits
        t = idx.shape[1]
        cos, sin = self.cos[:t], self.sin[:t]
        x = self.embed(idx)
        for blk in self.blocks:
            x = blk(x, cos, sin)
        return self.head(self.norm(x))
