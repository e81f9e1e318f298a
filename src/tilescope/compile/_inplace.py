"""In-place updates of graph inputs without extra copies.

AOT autograd (with ``keep_inference_input_mutations``) ends a graph that changes its inputs
-- BatchNorm's running statistics, ``num_batches_tracked``, an optimizer's parameters and
state -- with ``copy_(input, new_value)`` nodes. Run as they are, each is one more device
execution. Two rewrites remove them:

* :func:`reinplace` -- a functional op whose extra outputs are only copied back into the
  arguments it was given (``_native_batch_norm_legit_functional`` and its running
  statistics) becomes its mutating variant (``_native_batch_norm_legit``), as eager PyTorch
  runs it: the copies disappear with it;
* :func:`plan_writebacks` -- a value computed by a fused Program and copied into an input is
  written by the Program straight into the input's memory (the ``copy_`` becomes a no-op),
  when nothing reads the input's old value after that value is computed.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

__all__ = ["reinplace", "plan_writebacks", "hoist_input_updates"]

aten = torch.ops.aten


def _is_copy_(node) -> bool:
    return node.op == "call_function" and node.target is aten.copy_.default


def _mutable_variant(target):
    """``aten.X_functional.ov`` -> (``aten.X.ov``, positions of its mutated arguments)."""
    packet = getattr(target, "_overloadpacket", None)
    name = getattr(packet, "__name__", "").split(".")[-1]
    if not name.endswith("_functional"):
        return None
    base = getattr(aten, name[: -len("_functional")], None)
    if base is None:
        return None
    mutable = getattr(base, target._overloadname, None)
    if mutable is None:
        return None
    schema = mutable._schema
    positions = [i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write]
    if not positions or len(target._schema.returns) != len(schema.returns) + len(positions):
        return None
    return mutable, positions


def _reads_after(node: fx.Node, value: fx.Node, order: dict, ignore=()) -> bool:
    """Does any node after ``node`` (graph order) read ``value``, other than those in ``ignore``?"""
    return any(order[u] > order[node] and u not in ignore and u.op != "output" for u in value.users)


def reinplace(gm: fx.GraphModule) -> int:
    """Functional ops whose new values of some arguments are only copied back into those
    arguments run as their mutating variant. Returns how many were rewritten."""
    order = {n: k for k, n in enumerate(gm.graph.nodes)}
    done = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        found = _mutable_variant(node.target)
        if found is None:
            continue
        mutable, positions = found
        n_ret = len(mutable._schema.returns)
        items = {u.args[1]: u for u in node.users if u.target is operator.getitem}
        if len(items) != len(node.users):
            continue
        copies, ok = [], True
        for j, pos in enumerate(positions):
            arg = node.args[pos] if pos < len(node.args) else None
            item = items.get(n_ret + j)
            if not isinstance(arg, fx.Node) or item is None:
                ok = False
                break
            cps = [u for u in item.users if _is_copy_(u) and u.args[0] is arg and u.args[1] is item]
            # the argument's old value must not be read after the op (the new one is in place)
            if len(cps) != 1 or _reads_after(node, arg, order, ignore=set(cps)):
                ok = False
                break
            copies.append((arg, item, cps[0]))
        if not ok:
            continue
        node.target = mutable
        for arg, item, cp in copies:
            # the new value is the argument itself, updated in place (as eager PyTorch saves it)
            cp.replace_all_uses_with(arg)
            gm.graph.erase_node(cp)
            item.replace_all_uses_with(arg)
            gm.graph.erase_node(item)
        done += 1
    if done:
        gm.graph.lint()
        gm.recompile()
    return done


def plan_writebacks(gm: fx.GraphModule, steps) -> dict:
    """``{copy_ node: (program step, value node, input node)}`` for each copy of a value a
    fused Program computes into a graph input that the Program may write directly."""
    order = {n: k for k, n in enumerate(gm.graph.nodes)}
    producer = {}
    for st in steps:
        if st.kind == "program":
            for o in st.outputs:
                producer[o] = st
    out = {}
    for node in gm.graph.nodes:
        if not _is_copy_(node):
            continue
        dst, src = node.args[0], node.args[1]
        st = producer.get(src)
        if st is None or not isinstance(dst, fx.Node) or dst.op != "placeholder":
            continue
        dv, sv = dst.meta.get("val"), src.meta.get("val")
        if not (isinstance(dv, torch.Tensor) and isinstance(sv, torch.Tensor)) or dv.shape != sv.shape \
                or dv.dtype != sv.dtype or not dv.is_contiguous():
            continue
        if _reads_after(src, dst, order, ignore={node}) or any(v[2] is dst for v in out.values()):
            continue
        out[node] = (st, src, dst)
    return out


def hoist_input_updates(gm: fx.GraphModule) -> int:
    """Move the updates that read only graph inputs and feed only copies back into inputs
    (``num_batches_tracked + 1``, one per BatchNorm) to the start of the graph, together: they
    then share one Program instead of one execution each between the layers."""
    first = next((n for n in gm.graph.nodes if n.op not in ("placeholder", "get_attr")), None)
    if first is None:
        return 0
    moved = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node is first or _is_mutating(node):
            continue
        if not node.all_input_nodes or not all(a.op in ("placeholder", "get_attr") for a in node.all_input_nodes):
            continue
        if not node.users or not all(_is_copy_(u) and u.args[1] is node for u in node.users):
            continue
        first.prepend(node)
        moved += 1
    if moved:
        gm.recompile()
    return moved


def _is_mutating(node) -> bool:
    schema = getattr(node.target, "_schema", None)
    return schema is None or any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
