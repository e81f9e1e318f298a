"""torch.nn module sweep: every module class in ``torch.nn``, forward and backward, sim vs CPU.

The OpInfo sweep (``opinfo_sweep.py``) covers functions; this covers what ``nn`` modules reach
(``nn.LSTM``'s fused cells, ``MultiheadAttention``'s fast path, lazy parameters, running
statistics, ...). :data:`CASES` is the table: per module a constructor with default-ish
arguments and its inputs (small shapes). Each case builds the module twice from one seed, moves
one copy to ``sim`` (``Module.to``), runs both in training mode (or as the case says), backs a
fixed random projection of the outputs through both, and compares outputs, the gradients of
floating inputs and parameters, and the buffers afterwards (running statistics). Random modules
(dropout, RReLU, fractional pooling) draw from the same seed on both sides (the device's
generators produce CPU's streams). :data:`EXCLUDED` lists, with reasons, the classes that are not
runnable modules; :func:`unlisted` names any ``torch.nn`` class in neither (a new PyTorch).

Each case reports ``pass`` / ``fail`` (a value differs) / ``error`` (it raised: the message must
name the op and the fix) / ``crash``, with the lowering rules its device executions used. Cases
run in subprocess chunks, so a crash takes out one chunk, whose cases are rerun one by one.

    .venv/bin/python benchmarks/nn_module_sweep.py                      # every case (~1 min)
    .venv/bin/python benchmarks/nn_module_sweep.py --cases LSTM,Conv2d  # some (by class name)
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class Case:
    """One row: how to build the module and its (CPU) inputs."""

    make: Callable[[], nn.Module]
    inputs: Callable[[], tuple]
    grad: tuple | None = None  # indices of the inputs that require grad (None: every floating one)
    train: bool = True  # training mode (else eval)
    backward: bool = True  # False: forward under no_grad (inference paths)
    reference: Callable[[], nn.Module] | None = None  # the CPU module, when the class refuses CPU
    rtol: float = 1.3e-5
    atol: float = 1e-5
    kwargs: dict = field(default_factory=dict)


def r(*shape):
    return torch.randn(*shape)


def u(*shape, lo=0.05, hi=0.95):
    return torch.rand(*shape) * (hi - lo) + lo


def ints(hi, *shape):
    return torch.randint(0, hi, shape)


def signs(*shape):
    return torch.randint(0, 2, shape).float() * 2 - 1


def _maxpool_indices(dims):
    def inputs():
        x = r(2, 3, *[4] * dims)
        _, idx = getattr(F, f"max_pool{dims}d")(x, 2, return_indices=True)
        return (r(*idx.shape), idx)
    return inputs


def _ctc_inputs():
    log_probs = r(6, 2, 4).log_softmax(2)
    return log_probs, torch.tensor([[1, 2, 3], [3, 1, 0]]), torch.tensor([6, 5]), torch.tensor([3, 2])


def _multilabel_targets():
    return torch.tensor([[3, 0, -1, 1], [1, 2, 3, -1], [0, -1, 2, 2]])


def _enc(layers=1):
    return nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16, 0.0, batch_first=True), layers,
                                 enable_nested_tensor=False)


def _dec(layers=1):
    return nn.TransformerDecoder(nn.TransformerDecoderLayer(8, 2, 16, 0.0, batch_first=True), layers)


X4 = lambda: (r(2, 3, 4, 5),)  # noqa: E731 - the usual activation input
LOSS = (0,)  # losses: the gradient of the input (targets need none)

CASES: dict[str, Case] = {
    # activations
    **{name: Case(getattr(nn, name), X4) for name in (
        "CELU", "ELU", "GELU", "Hardshrink", "Hardsigmoid", "Hardswish", "Hardtanh", "Identity", "LeakyReLU",
        "LogSigmoid", "Mish", "PReLU", "ReLU", "ReLU6", "SELU", "SiLU", "Sigmoid", "Softplus", "Softshrink",
        "Softsign", "Tanh", "Tanhshrink", "Softmax2d")},
    "GELU (tanh)": Case(lambda: nn.GELU("tanh"), X4),
    "GLU": Case(nn.GLU, lambda: (r(2, 3, 4, 6),)),
    "LogSoftmax": Case(lambda: nn.LogSoftmax(1), X4),
    "Softmax": Case(lambda: nn.Softmax(-1), X4),
    "Softmin": Case(lambda: nn.Softmin(1), X4),
    "Threshold": Case(lambda: nn.Threshold(0.1, 20.0), X4),
    "RReLU": Case(nn.RReLU, X4),
    "RReLU (eval)": Case(nn.RReLU, X4, train=False),
    "Flatten": Case(nn.Flatten, X4),
    "Unflatten": Case(lambda: nn.Unflatten(1, (3, 1)), X4),
    "ChannelShuffle": Case(lambda: nn.ChannelShuffle(2), lambda: (r(2, 4, 3, 3),)),
    "PixelShuffle": Case(lambda: nn.PixelShuffle(2), lambda: (r(2, 8, 3, 3),)),
    "PixelUnshuffle": Case(lambda: nn.PixelUnshuffle(2), lambda: (r(2, 2, 4, 4),)),
    "CosineSimilarity": Case(nn.CosineSimilarity, lambda: (r(3, 5), r(3, 5))),
    "PairwiseDistance": Case(nn.PairwiseDistance, lambda: (r(3, 5), r(3, 5))),
    # dropout (same seed on both sides)
    "Dropout": Case(nn.Dropout, X4),
    "Dropout (eval)": Case(nn.Dropout, X4, train=False),
    "Dropout1d": Case(nn.Dropout1d, lambda: (r(2, 3, 5),)),
    "Dropout2d": Case(nn.Dropout2d, X4),
    "Dropout3d": Case(nn.Dropout3d, lambda: (r(2, 3, 2, 2, 2),)),
    "AlphaDropout": Case(nn.AlphaDropout, X4),
    "FeatureAlphaDropout": Case(nn.FeatureAlphaDropout, X4),
    # linear, embeddings
    "Linear": Case(lambda: nn.Linear(5, 4), lambda: (r(3, 5),)),
    "LazyLinear": Case(lambda: nn.LazyLinear(4), lambda: (r(3, 5),)),
    "Bilinear": Case(lambda: nn.Bilinear(5, 6, 4), lambda: (r(3, 5), r(3, 6))),
    "Embedding": Case(lambda: nn.Embedding(10, 4), lambda: (ints(10, 2, 5),)),
    "Embedding (padding_idx, max_norm)": Case(lambda: nn.Embedding(10, 4, padding_idx=0, max_norm=1.0),
                                              lambda: (ints(10, 2, 5),)),
    "EmbeddingBag": Case(lambda: nn.EmbeddingBag(10, 4), lambda: (ints(10, 2, 5),)),
    "EmbeddingBag (sum, offsets)": Case(lambda: nn.EmbeddingBag(10, 4, mode="sum"),
                                        lambda: (ints(10, 7), torch.tensor([0, 3]))),
    "EmbeddingBag (max)": Case(lambda: nn.EmbeddingBag(10, 4, mode="max"), lambda: (ints(10, 2, 5),)),
    # convolutions, folding
    "Conv1d": Case(lambda: nn.Conv1d(3, 4, 3, stride=2, padding=1), lambda: (r(2, 3, 9),)),
    "Conv2d": Case(lambda: nn.Conv2d(3, 4, 3, padding=1), lambda: (r(2, 3, 6, 6),)),
    "Conv2d (stride, dilation)": Case(lambda: nn.Conv2d(3, 4, 3, stride=2, dilation=2, padding=2),
                                      lambda: (r(2, 3, 7, 7),)),
    "Conv2d (depthwise)": Case(lambda: nn.Conv2d(4, 4, 3, groups=4, padding=1), lambda: (r(2, 4, 5, 5),)),
    "Conv2d (padding same, reflect)": Case(lambda: nn.Conv2d(3, 4, 3, padding="same", padding_mode="reflect"),
                                           lambda: (r(2, 3, 5, 5),)),
    "Conv3d": Case(lambda: nn.Conv3d(3, 4, 2), lambda: (r(2, 3, 3, 4, 4),)),
    "ConvTranspose1d": Case(lambda: nn.ConvTranspose1d(3, 4, 3, stride=2), lambda: (r(2, 3, 5),)),
    "ConvTranspose2d": Case(lambda: nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1, output_padding=1),
                            lambda: (r(2, 3, 4, 4),)),
    "ConvTranspose3d": Case(lambda: nn.ConvTranspose3d(3, 2, 2, stride=2), lambda: (r(1, 3, 2, 3, 3),)),
    "LazyConv1d": Case(lambda: nn.LazyConv1d(4, 3), lambda: (r(2, 3, 6),)),
    "LazyConv2d": Case(lambda: nn.LazyConv2d(4, 3), lambda: (r(2, 3, 5, 5),)),
    "LazyConv3d": Case(lambda: nn.LazyConv3d(2, 2), lambda: (r(1, 3, 3, 3, 3),)),
    "LazyConvTranspose1d": Case(lambda: nn.LazyConvTranspose1d(4, 3), lambda: (r(2, 3, 5),)),
    "LazyConvTranspose2d": Case(lambda: nn.LazyConvTranspose2d(4, 3), lambda: (r(2, 3, 4, 4),)),
    "LazyConvTranspose3d": Case(lambda: nn.LazyConvTranspose3d(2, 2), lambda: (r(1, 3, 2, 2, 2),)),
    "Fold": Case(lambda: nn.Fold((4, 5), 2), lambda: (r(2, 12, 12),)),
    "Unfold": Case(lambda: nn.Unfold(2, padding=1), X4),
    # pooling
    "AdaptiveAvgPool1d": Case(lambda: nn.AdaptiveAvgPool1d(3), lambda: (r(2, 3, 8),)),
    "AdaptiveAvgPool2d": Case(lambda: nn.AdaptiveAvgPool2d((3, 2)), lambda: (r(2, 3, 7, 8),)),
    "AdaptiveAvgPool3d": Case(lambda: nn.AdaptiveAvgPool3d(2), lambda: (r(2, 3, 4, 5, 4),)),
    "AdaptiveMaxPool1d": Case(lambda: nn.AdaptiveMaxPool1d(3), lambda: (r(2, 3, 8),)),
    "AdaptiveMaxPool2d": Case(lambda: nn.AdaptiveMaxPool2d((3, 2), return_indices=True), lambda: (r(2, 3, 7, 8),)),
    "AdaptiveMaxPool3d": Case(lambda: nn.AdaptiveMaxPool3d(2), lambda: (r(2, 3, 4, 5, 4),)),
    "AvgPool1d": Case(lambda: nn.AvgPool1d(3, 2, 1), lambda: (r(2, 3, 9),)),
    "AvgPool2d": Case(lambda: nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False),
                      lambda: (r(2, 3, 8, 8),)),
    "AvgPool3d": Case(lambda: nn.AvgPool3d(2), lambda: (r(2, 3, 4, 4, 4),)),
    "MaxPool1d": Case(lambda: nn.MaxPool1d(3, 2, 1), lambda: (r(2, 3, 9),)),
    "MaxPool2d": Case(lambda: nn.MaxPool2d(3, 2, 1), lambda: (r(2, 3, 8, 8),)),
    "MaxPool2d (dilation, indices)": Case(lambda: nn.MaxPool2d(2, 1, dilation=2, return_indices=True),
                                          lambda: (r(2, 3, 6, 6),)),
    "MaxPool3d": Case(lambda: nn.MaxPool3d(2), lambda: (r(2, 3, 4, 4, 4),)),
    "MaxUnpool1d": Case(lambda: nn.MaxUnpool1d(2), _maxpool_indices(1), grad=(0,)),
    "MaxUnpool2d": Case(lambda: nn.MaxUnpool2d(2), _maxpool_indices(2), grad=(0,)),
    "MaxUnpool3d": Case(lambda: nn.MaxUnpool3d(2), _maxpool_indices(3), grad=(0,)),
    "LPPool1d": Case(lambda: nn.LPPool1d(2, 3, 2), lambda: (r(2, 3, 9),)),
    "LPPool2d": Case(lambda: nn.LPPool2d(2, 2), lambda: (r(2, 3, 6, 6),)),
    "LPPool3d": Case(lambda: nn.LPPool3d(2, 2), lambda: (r(2, 3, 4, 4, 4),)),
    "FractionalMaxPool2d": Case(lambda: nn.FractionalMaxPool2d(2, output_size=3), lambda: (r(2, 3, 7, 7),)),
    "FractionalMaxPool3d": Case(lambda: nn.FractionalMaxPool3d(2, output_size=2), lambda: (r(2, 3, 5, 5, 5),)),
    # padding
    **{f"{kind}Pad{d}d": Case(lambda kind=kind, d=d: getattr(nn, f"{kind}Pad{d}d")(
        *((1, 0.5) if kind == "Constant" else (1,))), lambda d=d: (r(2, 3, *[4] * d),))
       for kind in ("Circular", "Constant", "Reflection", "Replication", "Zero") for d in (1, 2, 3)},
    # normalization (training: batch statistics, running statistics compared afterwards)
    "BatchNorm1d": Case(lambda: nn.BatchNorm1d(3), lambda: (r(4, 3, 5),)),
    "BatchNorm2d": Case(lambda: nn.BatchNorm2d(3), lambda: (r(4, 3, 5, 5),)),
    "BatchNorm2d (eval)": Case(lambda: nn.BatchNorm2d(3), lambda: (r(4, 3, 5, 5),), train=False),
    "BatchNorm3d": Case(lambda: nn.BatchNorm3d(3), lambda: (r(2, 3, 3, 3, 3),)),
    "LazyBatchNorm1d": Case(nn.LazyBatchNorm1d, lambda: (r(4, 3),)),
    "LazyBatchNorm2d": Case(nn.LazyBatchNorm2d, lambda: (r(4, 3, 5, 5),)),
    "LazyBatchNorm3d": Case(nn.LazyBatchNorm3d, lambda: (r(2, 3, 3, 3, 3),)),
    "SyncBatchNorm": Case(lambda: nn.SyncBatchNorm(3), lambda: (r(4, 3, 5, 5),),
                          reference=lambda: nn.BatchNorm2d(3)),  # refuses CPU tensors; one process: BN
    "GroupNorm": Case(lambda: nn.GroupNorm(2, 4), lambda: (r(2, 4, 5, 5),)),
    "InstanceNorm1d": Case(lambda: nn.InstanceNorm1d(3, affine=True), lambda: (r(2, 3, 6),)),
    "InstanceNorm2d": Case(lambda: nn.InstanceNorm2d(3, track_running_stats=True), lambda: (r(2, 3, 5, 5),)),
    "InstanceNorm3d": Case(lambda: nn.InstanceNorm3d(3), lambda: (r(2, 3, 3, 3, 3),)),
    "LazyInstanceNorm1d": Case(lambda: nn.LazyInstanceNorm1d(affine=True), lambda: (r(2, 3, 6),)),
    "LazyInstanceNorm2d": Case(nn.LazyInstanceNorm2d, lambda: (r(2, 3, 5, 5),)),
    "LazyInstanceNorm3d": Case(nn.LazyInstanceNorm3d, lambda: (r(2, 3, 3, 3, 3),)),
    "LayerNorm": Case(lambda: nn.LayerNorm(5), X4),
    "LayerNorm (no affine)": Case(lambda: nn.LayerNorm((4, 5), elementwise_affine=False), X4),
    "RMSNorm": Case(lambda: nn.RMSNorm(5), X4),
    "LocalResponseNorm": Case(lambda: nn.LocalResponseNorm(2), lambda: (r(2, 3, 5, 5),)),
    "CrossMapLRN2d": Case(lambda: nn.CrossMapLRN2d(3), lambda: (r(2, 4, 5, 5),)),
    # upsampling
    "Upsample": Case(lambda: nn.Upsample(scale_factor=2), X4),
    "Upsample (bilinear)": Case(lambda: nn.Upsample(scale_factor=2, mode="bilinear"), X4),
    "Upsample (bicubic, align_corners)": Case(lambda: nn.Upsample(size=(7, 9), mode="bicubic", align_corners=True),
                                              X4),
    "Upsample (linear)": Case(lambda: nn.Upsample(scale_factor=1.5, mode="linear"), lambda: (r(2, 3, 6),)),
    "Upsample (trilinear)": Case(lambda: nn.Upsample(scale_factor=2, mode="trilinear"), lambda: (r(1, 2, 2, 3, 3),)),
    "UpsamplingBilinear2d": Case(lambda: nn.UpsamplingBilinear2d(scale_factor=2), X4),
    "UpsamplingNearest2d": Case(lambda: nn.UpsamplingNearest2d(scale_factor=2), X4),
    # recurrent
    "RNN": Case(lambda: nn.RNN(5, 4, num_layers=2), lambda: (r(6, 3, 5),)),
    "RNN (relu, bidirectional)": Case(lambda: nn.RNN(5, 4, nonlinearity="relu", bidirectional=True),
                                      lambda: (r(6, 3, 5),)),
    "RNNCell": Case(lambda: nn.RNNCell(5, 4), lambda: (r(3, 5), r(3, 4))),
    "LSTM": Case(lambda: nn.LSTM(5, 4, num_layers=2, bidirectional=True, batch_first=True), lambda: (r(3, 6, 5),)),
    "LSTMCell": Case(lambda: nn.LSTMCell(5, 4), lambda: (r(3, 5), (r(3, 4), r(3, 4)))),
    "GRU": Case(lambda: nn.GRU(5, 4, num_layers=2), lambda: (r(6, 3, 5), r(2, 3, 4))),
    "GRUCell": Case(lambda: nn.GRUCell(5, 4), lambda: (r(3, 5), r(3, 4))),
    # attention and transformers (dropout 0: deterministic; eval + no_grad: the fused fast paths)
    "MultiheadAttention": Case(lambda: nn.MultiheadAttention(8, 2), lambda: (r(5, 2, 8), r(5, 2, 8), r(5, 2, 8))),
    "MultiheadAttention (batch_first, masks, kdim)": Case(
        lambda: nn.MultiheadAttention(8, 2, batch_first=True, kdim=6, vdim=4),
        lambda: (r(2, 5, 8), r(2, 4, 6), r(2, 4, 4)),
        kwargs={"key_padding_mask": torch.tensor([[False] * 4, [False, False, True, True]]),
                "attn_mask": torch.triu(torch.ones(5, 4, dtype=torch.bool), 1)}),
    "MultiheadAttention (inference fast path)": Case(
        lambda: nn.MultiheadAttention(8, 2, batch_first=True), lambda: (r(2, 5, 8),) * 3, train=False,
        backward=False),
    "TransformerEncoderLayer": Case(lambda: nn.TransformerEncoderLayer(8, 2, 16, 0.0, batch_first=True),
                                    lambda: (r(2, 5, 8),)),
    "TransformerEncoderLayer (norm_first, gelu)": Case(
        lambda: nn.TransformerEncoderLayer(8, 2, 16, 0.0, "gelu", norm_first=True), lambda: (r(5, 2, 8),)),
    "TransformerEncoderLayer (inference fast path)": Case(
        lambda: nn.TransformerEncoderLayer(8, 2, 16, 0.0, batch_first=True), lambda: (r(2, 5, 8),), train=False,
        backward=False),
    "TransformerEncoder": Case(lambda: _enc(2), lambda: (r(2, 5, 8),),
                               kwargs={"src_key_padding_mask": torch.tensor([[False] * 5, [False] * 3 + [True] * 2])}),
    "TransformerDecoderLayer": Case(lambda: nn.TransformerDecoderLayer(8, 2, 16, 0.0, batch_first=True),
                                    lambda: (r(2, 4, 8), r(2, 5, 8))),
    "TransformerDecoder": Case(lambda: _dec(2), lambda: (r(2, 4, 8), r(2, 5, 8)),
                               kwargs={"tgt_is_causal": True, "tgt_mask": nn.Transformer.generate_square_subsequent_mask(4)}),
    "Transformer": Case(lambda: nn.Transformer(8, 2, 1, 1, 16, 0.0, batch_first=True),
                        lambda: (r(2, 5, 8), r(2, 4, 8))),
    # containers with a forward
    "Sequential": Case(lambda: nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 2)), lambda: (r(3, 5),)),
    # losses
    "L1Loss": Case(nn.L1Loss, lambda: (r(3, 5), r(3, 5)), grad=LOSS),
    "MSELoss": Case(nn.MSELoss, lambda: (r(3, 5), r(3, 5))),
    "SmoothL1Loss": Case(lambda: nn.SmoothL1Loss(beta=0.5), lambda: (r(3, 5), r(3, 5)), grad=LOSS),
    "HuberLoss": Case(lambda: nn.HuberLoss(delta=0.5), lambda: (r(3, 5), r(3, 5)), grad=LOSS),
    "SoftMarginLoss": Case(nn.SoftMarginLoss, lambda: (r(3, 5), signs(3, 5)), grad=LOSS),
    "BCELoss": Case(nn.BCELoss, lambda: (u(3, 5), u(3, 5)), grad=LOSS),
    "BCEWithLogitsLoss": Case(lambda: nn.BCEWithLogitsLoss(pos_weight=torch.full((5,), 2.0)),
                              lambda: (r(3, 5), u(3, 5)), grad=LOSS),
    "KLDivLoss": Case(lambda: nn.KLDivLoss(reduction="batchmean"), lambda: (r(3, 5).log_softmax(1), u(3, 5))),
    "CrossEntropyLoss": Case(nn.CrossEntropyLoss, lambda: (r(4, 5), ints(5, 4)), grad=LOSS),
    "CrossEntropyLoss (label smoothing, ignore_index, 2d)": Case(
        lambda: nn.CrossEntropyLoss(label_smoothing=0.1, ignore_index=2), lambda: (r(2, 5, 3, 3), ints(5, 2, 3, 3)),
        grad=LOSS),
    "CrossEntropyLoss (probabilities)": Case(nn.CrossEntropyLoss, lambda: (r(4, 5), r(4, 5).softmax(1)), grad=LOSS),
    "NLLLoss": Case(lambda: nn.NLLLoss(weight=torch.rand(5)), lambda: (r(4, 5).log_softmax(1), ints(5, 4)),
                    grad=LOSS),
    "NLLLoss2d": Case(nn.NLLLoss2d, lambda: (r(2, 5, 3, 3).log_softmax(1), ints(5, 2, 3, 3)), grad=LOSS),
    "PoissonNLLLoss": Case(nn.PoissonNLLLoss, lambda: (r(3, 5), u(3, 5) * 4), grad=LOSS),
    "GaussianNLLLoss": Case(nn.GaussianNLLLoss, lambda: (r(3, 5), r(3, 5), u(3, 5)), grad=(0, 2)),
    "HingeEmbeddingLoss": Case(nn.HingeEmbeddingLoss, lambda: (r(3, 5), signs(3, 5)), grad=LOSS),
    "MultiLabelMarginLoss": Case(nn.MultiLabelMarginLoss, lambda: (r(3, 4), _multilabel_targets()), grad=LOSS),
    "MultiLabelSoftMarginLoss": Case(nn.MultiLabelSoftMarginLoss, lambda: (r(3, 4), ints(2, 3, 4).float()),
                                     grad=LOSS),
    "MultiMarginLoss": Case(nn.MultiMarginLoss, lambda: (r(3, 4), ints(4, 3)), grad=LOSS),
    "MarginRankingLoss": Case(lambda: nn.MarginRankingLoss(0.1), lambda: (r(4), r(4), signs(4)), grad=(0, 1)),
    "CosineEmbeddingLoss": Case(nn.CosineEmbeddingLoss, lambda: (r(3, 5), r(3, 5), signs(3)), grad=(0, 1)),
    "TripletMarginLoss": Case(nn.TripletMarginLoss, lambda: (r(3, 5), r(3, 5), r(3, 5))),
    "TripletMarginWithDistanceLoss": Case(
        lambda: nn.TripletMarginWithDistanceLoss(distance_function=nn.PairwiseDistance(), swap=True),
        lambda: (r(3, 5), r(3, 5), r(3, 5))),
    "CTCLoss": Case(nn.CTCLoss, _ctc_inputs, grad=LOSS),
    "AdaptiveLogSoftmaxWithLoss": Case(lambda: nn.AdaptiveLogSoftmaxWithLoss(8, 10, [4, 8]),
                                       lambda: (r(3, 8), ints(10, 3)), grad=LOSS),
    "LinearCrossEntropyLoss": Case(lambda: nn.LinearCrossEntropyLoss(6, 10, bias=True),
                                   lambda: (r(4, 6), ints(10, 4)), grad=LOSS),
}

# torch.nn classes that are not runnable modules of their own, and why they are not rows
EXCLUDED = {
    "Module": "the base class: no forward of its own",
    "Container": "deprecated base class: no forward of its own",
    "ModuleList": "a container with no forward; what it holds is swept row by row",
    "ModuleDict": "a container with no forward; what it holds is swept row by row",
    "ParameterList": "a container of Parameters with no forward (moved by Module.to: see "
                     "tests/test_device_module_moves.py)",
    "ParameterDict": "a container of Parameters with no forward (moved by Module.to: see "
                     "tests/test_device_module_moves.py)",
    "RNNBase": "abstract base of RNN/LSTM/GRU (their rows cover it)",
    "RNNCellBase": "abstract base of RNNCell/LSTMCell/GRUCell (their rows cover it)",
    "DataParallel": "a wrapper with no computation of its own that scatters inputs over the accelerator's "
                    "devices with torch._C._scatter / _broadcast_coalesced / _gather, which only CUDA builds of "
                    "PyTorch have: on sim it raises AttributeError naming torch._C._scatter (pinned by "
                    "tests/test_device_nn_sweep.py). Run the module on one core, or one process per core",
}


def unlisted() -> list[str]:
    """torch.nn module classes neither in :data:`CASES` (by the name before any ``" ("``) nor in
    :data:`EXCLUDED`."""
    listed = {name.split(" (")[0] for name in CASES} | set(EXCLUDED)
    return sorted(n for n in dir(nn) if inspect.isclass(getattr(nn, n)) and issubclass(getattr(nn, n), nn.Module)
                  and n not in listed)


# ---- running one case -------------------------------------------------------------------------

def _tensors(x) -> list:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _tensors(v)]
    if isinstance(x, dict):
        return _tensors(list(x.values()))
    if hasattr(x, "data") and hasattr(x, "batch_sizes"):  # a PackedSequence
        return [x.data]
    return []


def _map(fn, x):
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*[_map(fn, v) for v in x])
    if isinstance(x, (list, tuple)):
        return type(x)(_map(fn, v) for v in x)
    if isinstance(x, dict):
        return {k: _map(fn, v) for k, v in x.items()}
    return x


def _forward(module, case, inputs, kwargs):
    torch.manual_seed(1)  # random modules draw the same numbers on both devices
    if case.backward:
        return module(*inputs, **kwargs)
    with torch.no_grad():
        return module(*inputs, **kwargs)


def _prepare(case, device):
    """Inputs on ``device`` (the gradients' leaves) and kwargs."""
    torch.manual_seed(2)
    cpu_inputs = case.inputs()
    grad = case.grad

    def leaf(t, index):
        t = t.detach().to(device)
        if case.backward and t.is_floating_point() and (grad is None or index in grad):
            t.requires_grad_()
        return t

    inputs = tuple(_map(lambda t, i=i: leaf(t, i), x) for i, x in enumerate(cpu_inputs))
    kwargs = _map(lambda t: t.to(device), case.kwargs)
    return inputs, kwargs


def _build(case, device):
    make = case.reference if device == "cpu" and case.reference is not None else case.make
    torch.manual_seed(0)
    module = make()
    module.train(case.train)
    return module.to(device)


def compare(case: Case) -> dict:
    """Run ``case`` on CPU and sim; raise AssertionError naming what differs. Returns how many
    outputs, gradients and buffers were compared."""
    cpu, sim = _build(case, "cpu"), _build(case, "sim")
    x_cpu, kw_cpu = _prepare(case, "cpu")
    x_sim, kw_sim = _prepare(case, "sim")
    if any(isinstance(p, nn.parameter.UninitializedParameter) for p in cpu.parameters()) or any(
            isinstance(b, nn.parameter.UninitializedBuffer) for b in cpu.buffers()):
        with torch.no_grad():  # lazy modules: materialize on each device, then share the values
            _forward(cpu, case, x_cpu, kw_cpu)
            _forward(sim, case, x_sim, kw_sim)
    sim.load_state_dict(cpu.state_dict())
    out_cpu = _forward(cpu, case, x_cpu, kw_cpu)
    out_sim = _forward(sim, case, x_sim, kw_sim)
    got, want = _tensors(out_sim), _tensors(out_cpu)
    assert len(got) == len(want), f"{len(got)} outputs, expected {len(want)}"
    checked = {"outputs": len(got), "grads": 0, "buffers": 0}
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.device.type == "sim", f"output {i} is on {g.device}, not on the device"
        torch.testing.assert_close(g.detach().cpu(), w.detach(), rtol=case.rtol, atol=case.atol,
                                   equal_nan=True, msg=lambda m, i=i: f"output {i}: {m}")
    if case.backward:
        torch.manual_seed(3)
        diff = [(w, g) for w, g in zip(want, got) if w.requires_grad and w.is_floating_point()]
        projections = [torch.randn(w.shape) for w, _ in diff]
        if diff:
            sum((w * p).sum() for (w, _), p in zip(diff, projections)).backward()
            sum((g * p.to("sim")).sum() for (_, g), p in zip(diff, projections)).backward()
        pairs = [(f"grad of input {i}", a, b) for i, (a, b) in enumerate(zip(_tensors(x_cpu), _tensors(x_sim)))]
        pairs += [(f"grad of {n}", p, q) for (n, p), q in zip(cpu.named_parameters(), sim.parameters())]
        for what, a, b in pairs:
            if a.grad is None:
                assert b.grad is None, f"{what}: sim has one, CPU has none"
                continue
            assert b.grad is not None, f"{what}: missing on sim"
            torch.testing.assert_close(b.grad.cpu(), a.grad, rtol=max(case.rtol, 1e-4), atol=max(case.atol, 1e-5),
                                       msg=lambda m, what=what: f"{what}: {m}")
            checked["grads"] += 1
    for (n, a), b in zip(cpu.named_buffers(), sim.buffers()):
        torch.testing.assert_close(b.cpu(), a, rtol=case.rtol, atol=case.atol, msg=lambda m, n=n: f"buffer {n}: {m}")
        checked["buffers"] += 1
    return checked


def run_one(name: str) -> dict:
    """Compare one case; its verdict and the lowering rules its device executions used."""
    import tilescope.device as dev

    rules: Counter = Counter()
    generic: set = set()

    def listen(e):
        if e.kind == "kernel":
            rules[e.lowering] += 1
            if e.lowering == "generic":
                generic.add(e.op)

    result = {"case": name, "status": "pass", "reason": "", "checked": {}}
    dev.subscribe(listen)
    try:
        result["checked"] = compare(CASES[name])
        torch.sim.synchronize()
    except AssertionError as e:
        result.update(status="fail", reason=" ".join(str(e).split())[:400])
    except Exception as e:  # noqa: BLE001 - reported: the message must name the op and the fix
        result.update(status="error", reason=f"{type(e).__name__}: {' '.join(str(e).split())}"[:400])
        try:
            torch.sim.synchronize()
        except Exception:  # noqa: BLE001 - the error above already reported it
            pass
    finally:
        dev.unsubscribe(listen)
    result["rules"] = dict(rules)
    result["generic_ops"] = sorted(generic)
    return result


# ---- subprocess chunks ----------------------------------------------------------------------------

def worker(names: list[str]) -> None:
    import warnings

    import tilescope.device as dev

    warnings.simplefilter("ignore")
    dev.register()
    for name in names:
        print("START " + name, flush=True)
        print("RESULT " + json.dumps(run_one(name)), flush=True)


def _run_chunk(names, timeout) -> list[dict]:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(names)]
    env = dict(os.environ, TILESCOPE_CLOCK="virtual")
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env).stdout
    except subprocess.TimeoutExpired as e:
        out = (e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout) or ""
    return [json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")]


def sweep(names=None, chunk=400, timeout=600, log=None) -> list[dict]:
    """Run the cases (default: all) in subprocess chunks. When a chunk dies, the case it was
    running is rerun alone (a crash if it dies again) and the chunk resumes after it."""
    names = list(CASES) if names is None else list(names)
    results: dict[str, dict] = {}
    pending = names
    while pending:
        part, pending = pending[:chunk], pending[chunk:]
        for res in _run_chunk(part, timeout):
            results[res["case"]] = res
        missing = [n for n in part if n not in results]
        if missing:
            alone = _run_chunk(missing[:1], timeout)
            results[missing[0]] = alone[0] if alone else {
                "case": missing[0], "status": "crash", "reason": "the process died", "rules": {}, "generic_ops": []}
            pending = missing[1:] + pending
        if log:
            log(f"  {len(results)}/{len(names)} cases swept")
    return [results[n] for n in names]


def report(results: list[dict]) -> dict:
    passed = [res for res in results if res["status"] == "pass"]
    specific = [res for res in passed if res["rules"] and "generic" not in res["rules"]]
    print(f"torch.nn module sweep (float32, forward + backward, sim vs CPU): {len(passed)}/{len(results)} cases "
          f"pass; {len(specific)} of them ran specific lowerings only; {len(EXCLUDED)} classes excluded "
          f"(not runnable modules); unlisted: {unlisted() or 'none'}")
    generic = Counter(op for res in passed for op in res["generic_ops"])
    if generic:
        print("ops modeled generically, by the number of cases that reach them: "
              + ", ".join(f"{op} ({n})" for op, n in generic.most_common(15)))
    bad = [res for res in results if res["status"] != "pass"]
    if bad:
        print("\n| case | status | reason |\n|---|---|---|")
        for res in bad:
            print(f"| {res['case']} | {res['status']} | {res['reason'].replace('|', '/')} |")
    return {"cases": len(results), "passed": len(passed), "specific": len(specific)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", help="comma-separated class names or case names (default: all)")
    p.add_argument("--json", help="write per-case results here")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker))
        return 0
    names = list(CASES)
    if args.cases:
        want = set(args.cases.split(","))
        names = [n for n in names if n in want or n.split(" (")[0] in want]
    t0 = time.time()
    results = sweep(names, log=lambda m: print(m, file=sys.stderr))
    summary = report(results)
    print(f"\nwall time {time.time() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "results": results}, f, indent=1)
    return 0 if summary["passed"] == summary["cases"] else 1


if __name__ == "__main__":
    sys.exit(main())
