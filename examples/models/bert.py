"""A BERT-style encoder: word + position + token-type embeddings, post-LayerNorm blocks whose
attention takes a padding mask (padded keys are never attended to), a GELU MLP, and a
sequence-classification head on the first token (tanh pooler, as BERT's).

>>> import torch
>>> m = Bert(BertConfig(vocab=64, seq=16, d=32, layers=1, heads=2, ffn=64, classes=3))
>>> ids = torch.zeros(2, 16, dtype=torch.long)
>>> mask = torch.ones(2, 16, dtype=torch.long); mask[1, 10:] = 0   # the second sequence is 10 tokens long
>>> tuple(m(ids, mask).shape)
(2, 3)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["BertConfig", "Bert"]


@dataclass(frozen=True)
class BertConfig:
    vocab: int = 30522
    seq: int = 512
    d: int = 768
    layers: int = 12
    heads: int = 12
    ffn: int = 3072
    type_vocab: int = 2
    classes: int = 2
    eps: float = 1e-12


class SelfAttention(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.heads = cfg.heads
        self.q, self.k, self.v = (nn.Linear(cfg.d, cfg.d) for _ in range(3))
        self.out = nn.Linear(cfg.d, cfg.d)

    def forward(self, x, keep):  # keep: (b, 1, 1, t) bool, True for real tokens
        b, t, d = x.shape
        q, k, v = (f(x).view(b, t, self.heads, d // self.heads).transpose(1, 2) for f in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class Layer(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.attn = SelfAttention(cfg)
        self.ln1 = nn.LayerNorm(cfg.d, eps=cfg.eps)
        self.fc = nn.Linear(cfg.d, cfg.ffn)
        self.proj = nn.Linear(cfg.ffn, cfg.d)
        self.ln2 = nn.LayerNorm(cfg.d, eps=cfg.eps)

    def forward(self, x, keep):
        x = self.ln1(x + self.attn(x, keep))
        return self.ln2(x + self.proj(F.gelu(self.fc(x))))


class Bert(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.cfg = cfg
        self.word = nn.Embedding(cfg.vocab, cfg.d)
        self.pos = nn.Embedding(cfg.seq, cfg.d)
        self.token_type = nn.Embedding(cfg.type_vocab, cfg.d)
        self.ln = nn.LayerNorm(cfg.d, eps=cfg.eps)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.layers))
        self.pooler = nn.Linear(cfg.d, cfg.d)
        self.classifier = nn.Linear(cfg.d, cfg.classes)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    def forward(self, ids, attention_mask):  # (b, t) ids, (b, t) 1 = token, 0 = padding -> (b, classes)
        t = ids.shape[1]
        pos = torch.arange(t, device=ids.device)
        x = self.ln(self.word(ids) + self.pos(pos) + self.token_type(torch.zeros_like(ids)))
        keep = attention_mask.bool()[:, None, None, :]  # (b, 1, 1, t): a query may attend to real tokens only
        for layer in self.layers:
            x = layer(x, keep)
        return self.classifier(torch.tanh(self.pooler(x[:, 0])))
