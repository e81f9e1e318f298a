"""An LSTM language model: embedding, a stacked ``nn.LSTM`` (batch first) and a linear head
predicting the next token at every position.

>>> import torch
>>> m = LSTMModel(LSTMConfig(vocab=64, d=16, hidden=32, layers=2))
>>> tuple(m(torch.zeros(2, 12, dtype=torch.long)).shape)
(2, 12, 64)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn as nn

__all__ = ["LSTMConfig", "LSTMModel"]


@dataclass(frozen=True)
class LSTMConfig:
    vocab: int = 10000
    d: int = 512  # embedding width
    hidden: int = 1024
    layers: int = 2


class LSTMModel(nn.Module):
    def __init__(self, cfg: LSTMConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.d)
        self.lstm = nn.LSTM(cfg.d, cfg.hidden, num_layers=cfg.layers, batch_first=True)
        self.head = nn.Linear(cfg.hidden, cfg.vocab)

    def forward(self, idx):  # (b, t) token ids -> (b, t, vocab) logits
        y, _ = self.lstm(self.embed(idx))
        return self.head(y)
