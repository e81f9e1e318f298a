"""Which lowering rule modeled each device execution, and the share the generic one holds.

An op without a specific lowering runs as the *generic* Program (DMA in, one GpSimd routine
priced at an assumed cycle per element, DMA out): its values are right, its modeled time is a
rough estimate, not the engines the hardware would use. A profile records, per execution, the
rule behind it (the runtime and hardware events' ``lowering`` arg) and, in its manifest's
``stats``, the totals per rule and the generic share of modeled kernel time with the ops that
hold it -- what ``tilescope doctor``, ``tilescope report`` and the explorer show.

Kernel executions only: host <-> device copies (``memcpy``) are not ops and have no rule.

>>> from types import SimpleNamespace as R
>>> recs = [R(kind="kernel", lowering="matmul", modeled_ns=3000.0, op="aten::mm", program=None),
...         R(kind="kernel", lowering="generic", modeled_ns=1000.0, op="aten::cumsum", program=None)]
>>> s = lowering_stats(recs)
>>> s["generic"]["share"], s["generic"]["top"][0]["op"], s["lowerings"]["matmul"]["executions"]
(0.25, 'aten::cumsum', 1)
"""

from __future__ import annotations

__all__ = ["GENERIC", "GENERIC_SHARE_LIMIT", "TOP_OPS", "lowering_stats", "operand_shapes", "generic_message"]

GENERIC = "generic"
# above this share of modeled kernel time in generic lowerings, the doctor warns: the
# profile's device time is then largely an estimate (issue threshold, not a tuned number)
GENERIC_SHARE_LIMIT = 0.05
TOP_OPS = 5  # generic (op, shapes) pairs named in the stats


def operand_shapes(program) -> list[list[int]]:
    """The tensor shapes a Program was lowered for: the lowering's record of its operands
    (``meta["shapes"]``), else its HBM input buffers' shapes."""
    if program is None:
        return []
    meta = getattr(program, "meta", None) or {}
    if meta.get("shapes") is not None:
        return [list(s) for s in meta["shapes"]]
    return [list(program.buffers[name].shape) for name in program.inputs if name in program.buffers]


def lowering_stats(records) -> dict:
    """``{"lowerings": {rule: {executions, modeled_us}}, "generic": {share, executions,
    modeled_us, kernel_modeled_us, kernel_executions, top: [{op, shapes, executions,
    modeled_us, share}]}}`` over
    execution records (``Execution``: ``kind``, ``lowering``, ``modeled_ns``, ``op``,
    ``program``). One pass; shapes are read for the generic Programs only."""
    by_rule: dict[str, list] = {}
    generic: dict[object, list] = {}  # Program (or op without one) -> [op, program, executions, ns]
    total = 0.0
    count = 0
    for rec in records:
        if rec.kind == "memcpy":
            continue
        ns = rec.modeled_ns
        total += ns
        count += 1
        acc = by_rule.get(rec.lowering)
        if acc is None:
            acc = by_rule[rec.lowering] = [0, 0.0]
        acc[0] += 1
        acc[1] += ns
        if rec.lowering == GENERIC:
            key = (rec.op, id(rec.program)) if rec.program is not None else (rec.op, None)
            g = generic.get(key)
            if g is None:
                g = generic[key] = [rec.op, rec.program, 0, 0.0]
            g[2] += 1
            g[3] += ns
    # one (op, shapes) row per distinct call: Programs of one call on two cores are one row
    rows: dict[tuple, list] = {}
    for op, program, n, ns in generic.values():
        shapes = operand_shapes(program)
        key = (op, repr(shapes))
        r = rows.get(key)
        if r is None:
            rows[key] = [op, shapes, n, ns]
        else:
            r[2] += n
            r[3] += ns
    top = sorted(rows.values(), key=lambda r: (-r[3], r[0]))[:TOP_OPS]
    g_n, g_ns = by_rule.get(GENERIC, (0, 0.0))
    return {
        "lowerings": {k: {"executions": n, "modeled_us": round(ns / 1000.0, 3)} for k, (n, ns) in sorted(by_rule.items())},
        "generic": {
            "share": g_ns / total if total else 0.0, "executions": g_n, "modeled_us": round(g_ns / 1000.0, 3),
            "kernel_modeled_us": round(total / 1000.0, 3), "kernel_executions": count,
            "top": [{"op": op, "shapes": shapes, "executions": n, "modeled_us": round(ns / 1000.0, 3),
                     "share": ns / total if total else 0.0} for op, shapes, n, ns in top],
        },
    }


def _shape_text(shapes) -> str:
    return ", ".join("x".join(str(d) for d in s) or "scalar" for s in shapes) if shapes else "-"


def generic_message(generic: dict) -> str | None:
    """The doctor's text for a generic share over :data:`GENERIC_SHARE_LIMIT` (None below it)."""
    share = generic.get("share") or 0.0
    if share <= GENERIC_SHARE_LIMIT:
        return None
    n = generic.get("executions", 0)
    of = f" of {generic['kernel_executions']:,}" if generic.get("kernel_executions") else ""
    ops = "; ".join(f"{t['op']} [{_shape_text(t.get('shapes'))}] {t.get('share', 0):.1%} ({t.get('executions', 0)}x)"
                    for t in generic.get("top", []))
    return (f"ops modeled by the generic lowering hold {share:.1%} of modeled kernel time "
            f"({generic.get('modeled_us', 0):,.1f} of {generic.get('kernel_modeled_us', 0):,.1f} us, {n:,}{of} "
            f"executions), over the {GENERIC_SHARE_LIMIT:.0%} past which the profile's device time is largely an "
            f"estimate: their time is one GpSimd routine at an assumed cycle per element, not the engines the "
            f"hardware would use. Top: {ops}")
