"""A fused Program as one device execution of the simulated device.

The host allocates the outputs, submits one execution (modeled time from the
simulator) and queues the numerics -- the fused FX nodes run with CPU torch on
zero-copy views of device memory -- for the device worker, like any eager op.
Inside a profile the execution sits under a ``tilescope::fused[...]`` range that
names the FX nodes it fused.
"""

from __future__ import annotations

import torch

from ..sim import simulate
from ._plan import node_shape
from ._execute_plan import interpret_nodes

__all__ = ["run_program_step"]

_CPU = torch.device("cpu")

def _native():
    from ..device.internal import load_native_runtime

    return load_native_runtime()


def inputs_device(inputs) -> str:
    return next(t.device.type for t in inputs if isinstance(t, torch.Tensor))


def _contiguous(t):
    return t if t.is_contiguous() else t.contiguous()


def _mm_operands(seg):
    from ._matmul_segment import _operands

    _, a, b, _, _ = _operands(seg.nodes[0])
    return ((a, seg.a_transposed), (b, seg.b_transposed))


def _work(nodes, in_nodes, in_views, out_nodes, out_views):
    env = dict(zip(in_nodes, in_views))
    interpret_nodes(nodes, env, device=_CPU)
    # outputs written into an input's memory last: another output may still be a view of it
    inputs = {v.data_ptr() for v in in_views if isinstance(v, torch.Tensor)}
    pairs = sorted(zip(out_nodes, out_views), key=lambda p: p[1].data_ptr() in inputs)
    for node, view in pairs:
        view.copy_(env[node])


def run_program_step(step, inputs, env, compiled) -> None:
    from ..device.internal import submit

    rt = _native()
    # matmul operands laid out transposed are read as stored (the Program expects W[N, K]);
    # anything else non-contiguous is copied to the layout the Program reads
    as_stored = {n for seg in step.segments if seg.kind == "matmul"
                 for n, flag in _mm_operands(seg) if flag}
    # inputs the Program reads by their strides, where they have the strides it was built for
    strided = set(step.program.meta.get("read_strided", ()))
    inputs = [t if (not isinstance(t, torch.Tensor) or node in as_stored
                    or node.name in strided and t.stride() == getattr(node.meta.get("val"), "stride", lambda: None)()) else _contiguous(t)
              for node, t in zip(step.inputs, inputs)]
    core = next(t.device.index for t in inputs if isinstance(t, torch.Tensor))
    outputs = []
    for node in step.outputs:
        val = node.meta.get("val")
        shape = list(node_shape(node))
        into = env.get(step.aliases.get(node))  # an input updated in place: written directly
        if isinstance(into, torch.Tensor) and into.is_contiguous() and list(into.shape) == shape \
                and into.dtype == val.dtype and into.device.type == inputs_device(inputs):
            outputs.append(into)
            continue
        stride = list(torch.empty(shape, device="meta").stride()) if shape else []
        outputs.append(rt.empty(shape, stride, val.dtype, core))
    in_views = [rt.cpu_view(t) if isinstance(t, torch.Tensor) else t for t in inputs]
    out_views = [rt.cpu_view(t) for t in outputs]
    program = step.program
    result = simulate(program)
    label = f"tilescope::fused[{', '.join(n.name for n in step.nodes)}]"
    work = (_work, (step.nodes, step.inputs, in_views, step.outputs, out_views), {}, label)
    with torch.profiler.record_function(label):
        submit(core, label, "kernel", "compiled", program, result.summary.total_ns, work,
               result.summary.hbm_bytes)
    for node, out in zip(step.outputs, outputs):
        env[node] = out
