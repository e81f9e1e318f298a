"""Getting aten graphs with concrete shapes: decompositions and shape propagation."""

from __future__ import annotations

import torch
import torch.fx as fx
from torch._decomp import get_decompositions

aten = torch.ops.aten

__all__ = ["DECOMPOSITIONS", "trace_aten", "propagate_shapes"]

# composite ops the fuser should see as the pointwise ops and reductions they are made of
DECOMPOSITIONS = get_decompositions([
    aten._softmax, aten._log_softmax, aten.native_layer_norm, aten.var_mean, aten.linear,
    aten.addcmul, aten.addcdiv, aten.hardswish, aten.hardsigmoid, aten.mish, aten.softplus,
    aten.rsub, aten.elu, aten.leaky_relu, aten.native_dropout, aten.logsumexp, aten.norm,
])


def trace_aten(fn, *example_inputs) -> fx.GraphModule:
    """The functional aten graph of ``fn`` (with ``val`` metadata), as the compile backend sees it."""
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn, decomposition_table=DECOMPOSITIONS)(*example_inputs)


def propagate_shapes(gm: fx.GraphModule, shapes_and_dtypes) -> None:
    """Fill ``node.meta['val']`` with fake tensors for concrete input shapes (dynamic shapes).

    Each input is made on the device the graph was traced on (its placeholder's ``val``), so
    tensors the graph holds -- a ``torch.tensor([], device=x.device)`` lifted as a constant --
    meet inputs on the same device."""
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    args = []
    for k, s in enumerate(shapes_and_dtypes):
        if isinstance(s, tuple) and len(s) == 2 and isinstance(s[1], torch.dtype):
            val = placeholders[k].meta.get("val") if k < len(placeholders) else None
            device = val.device if isinstance(val, torch.Tensor) else torch.device("meta")
            with mode:
                args.append(torch.empty(s[0], dtype=s[1], device=device))
        else:
            args.append(s)
    FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*args)
