"""Running a compiled plan: fused Programs as single device executions, the rest op by op."""

from __future__ import annotations

import torch
import torch.fx as fx

__all__ = ["run_steps", "interpret_nodes"]


def _materialize(x, env):
    if isinstance(x, fx.Node):
        return env[x]
    if isinstance(x, (list, tuple)):
        return type(x)(_materialize(v, env) for v in x)
    if isinstance(x, dict):
        return {k: _materialize(v, env) for k, v in x.items()}
    return x


_VIEWS = {torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default}


def _viewable(t, shape) -> bool:
    if not isinstance(t, torch.Tensor) or t.is_contiguous():
        return True
    try:
        t.view(shape) if t.device.type == "cpu" else torch.empty_strided(t.shape, t.stride(), device="meta").view(shape)
        return True
    except RuntimeError:
        return False


def interpret_nodes(nodes, env: dict, *, device: torch.device | None = None) -> None:
    """Run ``nodes`` with torch on whatever device their inputs are (the reference path);
    ``device``: where factory nodes (``scalar_tensor``, ``full``: a ``device`` argument) make
    their tensors instead of the graph's device -- a fused Program's numerics run on CPU views,
    on the device worker, which cannot make device tensors."""
    for n in nodes:
        args, kwargs = _materialize(n.args, env), _materialize(n.kwargs, env)
        if device is not None and "device" in kwargs:
            kwargs = {**kwargs, "device": device}
        if n.target in _VIEWS and not _viewable(args[0], args[1]):
            # the graph was traced with another op's output strides (e.g. attention returning a
            # transposed layout); post-AOT graphs are functional, so a copy is as good as a view
            env[n] = torch.ops.aten.reshape.default(args[0], args[1])
            continue
        env[n] = n.target(*args, **kwargs)


def _on_sim(tensors) -> bool:
    return any(isinstance(t, torch.Tensor) and t.device.type not in ("cpu", "cuda", "meta") for t in tensors)


def run_steps(steps, env: dict, compiled) -> None:
    for step in steps:
        if step.kind == "writeback" and env.get(step.nodes[0].args[1]) is env.get(step.nodes[0].args[0]):
            env[step.nodes[0]] = env[step.nodes[0].args[0]]  # the Program wrote the value in place
            continue
        if step.kind != "program":
            interpret_nodes(step.nodes, env)
            continue
        inputs = [env[i] for i in step.inputs]
        if _on_sim(inputs):
            from ._fused_launch import run_program_step

            run_program_step(step, inputs, env, compiled)
        else:
            # off the simulated device there is no device model: compute with torch
            interpret_nodes(step.nodes, env)
