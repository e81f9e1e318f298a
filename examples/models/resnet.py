"""ResNet-18: a 7x7 stride-2 stem with max-pooling, four stages of two basic blocks (3x3
convolutions, batch norm, ReLU, a 1x1 projection where the shape changes), global average
pooling and a linear classifier -- torchvision's ``resnet18`` at any width.

>>> import torch
>>> m = ResNet18(ResNetConfig(widths=(8, 16, 32, 64), classes=10))
>>> tuple(m(torch.zeros(2, 3, 32, 32)).shape), sum(isinstance(x, torch.nn.Conv2d) for x in m.modules())
((2, 10), 20)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn as nn
import torch.nn.functional as F

__all__ = ["ResNetConfig", "ResNet18"]


@dataclass(frozen=True)
class ResNetConfig:
    widths: tuple[int, int, int, int] = (64, 128, 256, 512)
    classes: int = 1000
    channels: int = 3


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:  # project the shortcut to the new shape
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    def __init__(self, cfg: ResNetConfig):
        super().__init__()
        self.cfg = cfg
        w = cfg.widths
        self.stem = nn.Sequential(nn.Conv2d(cfg.channels, w[0], 7, 2, 3, bias=False), nn.BatchNorm2d(w[0]),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        stages, cin = [], w[0]
        for i, cout in enumerate(w):
            stride = 1 if i == 0 else 2
            stages.append(nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)))
            cin = cout
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(w[-1], cfg.classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):  # (b, c, H, W) -> (b, classes)
        x = self.stages(self.stem(x))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))
