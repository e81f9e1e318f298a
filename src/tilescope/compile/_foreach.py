"""An optimizer step as one execution: ``_foreach_*`` ops split per tensor, chains regrouped.

A ``_foreach_<op>`` node applies ``<op>`` to every tensor of its lists. :func:`expand_foreach`
replaces it by one ``<op>`` node per tensor (the op the eager lowering's table defines), and
:func:`cluster` reorders the graph so that each tensor's chain -- momentum, update, the copy
back into the parameter -- is contiguous: each chain is one row group, consecutive groups
share one Program, and the copies back become in-place writes (:mod:`._inplace`). An
optimizer step over a parameter group is then one device execution, as a multi-tensor
kernel is on a GPU.
"""

from __future__ import annotations

import heapq
import operator

import torch
import torch.fx as fx

__all__ = ["expand_foreach", "cluster"]

aten = torch.ops.aten

# foreach argument name -> the per-tensor op's argument name, by op (default: the same name)
_ARG_NAMES = {
    "default": {"scalar": "other", "scalars": "other"},
    "addcmul": {"scalar": "value", "scalars": "value"},
    "addcdiv": {"scalar": "value", "scalars": "value"},
    "lerp": {"tensors1": "end", "weights": "weight"},
    "pow": {"scalar": "exponent", "scalars": "exponent"},
    "clamp_min": {"scalar": "min", "scalars": "min", "other": "min"},
    "clamp_max": {"scalar": "max", "scalars": "max", "other": "max"},
}


def _per_tensor_op(base: str, kwargs: dict):
    """The overload of ``aten.<base>`` that takes these per-tensor arguments."""
    packet = getattr(aten, base, None)
    if packet is None:
        return None
    for name in ("Tensor", "Scalar", "default", "Tensor_Scalar", "Tensor_Tensor"):
        op = getattr(packet, name, None)
        if op is None:
            continue
        args = {a.name: a for a in op._schema.arguments}
        if not set(kwargs) <= set(args) or any(a.alias_info is not None for a in op._schema.arguments):
            continue
        fits = True
        for k, v in kwargs.items():
            typ = str(args[k].type)
            if isinstance(v, fx.Node) and "Tensor" not in typ:
                fits = False
            elif not isinstance(v, fx.Node) and typ.startswith("Tensor") and not isinstance(v, (int, float)):
                fits = False
        if fits and all(a.has_default_value() or a.name in kwargs or a.kwarg_only and a.name in kwargs
                        for a in op._schema.arguments):
            return op
    return None


def expand_foreach(gm: fx.GraphModule) -> int:
    """Replace every ``_foreach_<op>`` node whose results are only unpacked by ``getitem`` with one
    ``<op>`` node per tensor. Returns how many were expanded."""
    done = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        name = getattr(getattr(node.target, "_overloadpacket", None), "__name__", "").split(".")[-1]
        if not name.startswith("_foreach_") or name.endswith("_"):
            continue
        if not all(u.target is operator.getitem for u in node.users):
            continue
        base = name[len("_foreach_"):]
        schema = node.target._schema
        named = {}
        for i, a in enumerate(schema.arguments):
            if i < len(node.args) and not a.kwarg_only:
                named[a.name] = node.args[i]
            elif a.name in node.kwargs:
                named[a.name] = node.kwargs[a.name]
        lists = [v for v in named.values() if isinstance(v, (list, tuple))]
        if not lists:
            continue
        n = len(lists[0])
        rename = {**_ARG_NAMES["default"], **_ARG_NAMES.get(base, {})}
        per_tensor = []
        for i in range(n):
            kw = {}
            for k, v in named.items():
                kw[rename.get(k, k)] = v[i] if isinstance(v, (list, tuple)) and len(v) == n else v
            per_tensor.append(kw)
        op = _per_tensor_op(base, per_tensor[0])
        if op is None:
            continue
        items = {u.args[1]: u for u in node.users}
        with gm.graph.inserting_before(node):
            for i, kw in enumerate(per_tensor):
                positional = [a.name for a in op._schema.arguments if not a.kwarg_only]
                args = []
                for a in positional:
                    if a not in kw:
                        break
                    args.append(kw.pop(a))
                new = gm.graph.call_function(op, tuple(args), kw)
                new.meta["foreach_index"] = i
                item = items.get(i)
                if item is not None:
                    val = item.meta.get("val")
                    if val is not None:
                        new.meta["val"] = val
                    item.replace_all_uses_with(new)
                    gm.graph.erase_node(item)
        gm.graph.erase_node(node)
        done += 1
    if done:
        gm.graph.lint()
        gm.recompile()
    return done


def _is_mutation(node) -> bool:
    schema = getattr(node.target, "_schema", None)
    return node.op == "call_function" and schema is not None and any(
        a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


def cluster(gm: fx.GraphModule) -> None:
    """Reorder so that each tensor's nodes (``foreach_index``) are contiguous, copies into
    inputs last; every node still follows what it reads, a mutation follows every earlier read
    of the tensor it changes and precedes every later one."""
    nodes = list(gm.graph.nodes)
    if not any("foreach_index" in n.meta for n in nodes):
        return
    order = {n: k for k, n in enumerate(nodes)}
    index = {}
    for n in nodes:  # a node of one tensor's chain takes the chain's index
        if "foreach_index" in n.meta:
            index[n] = n.meta["foreach_index"]
        else:
            got = {index[a] for a in n.all_input_nodes if a in index}
            if len(got) == 1:
                index[n] = got.pop()
    deps = {n: set(n.all_input_nodes) for n in nodes}
    for n in nodes:
        if _is_mutation(n):  # after every earlier read of what it writes, before every later one
            for target in n.all_input_nodes:
                deps[n] |= {u for u in target.users if order[u] < order[n]}
                for u in target.users:
                    if order[u] > order[n]:
                        deps[u].add(n)
    users: dict = {n: [] for n in nodes}
    for n, ds in deps.items():
        for d in ds:
            users[d].append(n)
    waiting = {n: len(ds) for n, ds in deps.items()}

    def key(n):
        if n.op in ("placeholder", "get_attr"):
            return (0, 0, order[n])
        if n.op == "output":
            return (4, 0, order[n])
        if n.target is aten.copy_.default:  # copies into inputs: after every chain
            return (3, 0, order[n])
        if n in index:
            return (2, index[n], order[n])
        return (1, 0, order[n])

    ready = [(key(n), n.name, n) for n in nodes if waiting[n] == 0]
    heapq.heapify(ready)
    result = []
    while ready:
        _, _, n = heapq.heappop(ready)
        result.append(n)
        for u in users[n]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, (key(u), u.name, u))
    if len(result) != len(nodes):
        return  # a cycle through the mutation edges: keep the graph as it was
    for prev, n in zip(result, result[1:]):
        if n.prev is not prev:
            prev.append(n)
    gm.recompile()
