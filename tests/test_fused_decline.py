"""A fused tile kernel declines only a shape whose tiles do not fit; any other error surfaces.

Catching everything would send an op to a slower lowering whenever its kernel has a bug, and
the model would quietly price the wrong Program (lower/_fused.py).
"""

from __future__ import annotations

import pytest

from tilescope.errors import CapacityError
from tilescope.lower import Call, TensorMeta, cache_info, clear_cache, declines, kernels, lower

X = TensorMeta((256, 512), (512, 1), "float32")


def _softmax():
    clear_cache()  # lowerings are cached by call: build this one again
    return lower(Call("aten::_softmax", (X, -1, False), (), (X,)))


def test_the_fused_kernel_lowers_softmax():
    assert _softmax().rule == "fused:softmax"


def test_tiles_that_do_not_fit_fall_back_to_the_next_rule(monkeypatch):
    def too_big(*args, **kwargs):
        raise CapacityError("live tiles need more SBUF than a partition has")

    monkeypatch.setattr(kernels.softmax_kernel, "program_for", too_big)
    low = _softmax()
    assert low.rule != "fused:softmax" and low.rule != "generic", low.rule
    # the decline is counted with its reason, and shown by cache_info
    assert ("fused:softmax", "tiles do not fit the kernel (CapacityError)", 1) in declines()
    assert {"rule": "fused:softmax", "reason": "tiles do not fit the kernel (CapacityError)",
            "calls": 1} in cache_info()["declined"]


def test_a_call_outside_a_rules_form_is_counted_as_such():
    clear_cache()
    xt = TensorMeta((512, 256), (1, 512), "float32")  # transposed: not the fused kernel's [rows, d] rows
    low = lower(Call("aten::_softmax", (xt, -1, False), (), (xt,)))
    assert low.rule != "fused:softmax"
    assert ("fused:softmax", "outside the rule's form", 1) in declines()
    clear_cache()
    assert declines() == []


def test_a_bug_in_the_kernel_is_not_a_decline(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("bug in the kernel")

    monkeypatch.setattr(kernels.softmax_kernel, "program_for", broken)
    with pytest.raises(RuntimeError, match="bug in the kernel"):
        _softmax()
    clear_cache()
