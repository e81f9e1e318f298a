"""An event's lifecycle from the timeline index alone: bounded, paged, in milliseconds.

The edges are the analysis engine's (:meth:`tilescope.trace.Trace.links`: each device event,
the host launch that submitted it, the framework op behind the launch), indexed once with
the timeline. Two shapes of answer:

* **a chain** for an op, a launch or a device event: the op's enclosing events (``parent``),
  the op, then each launch and the device work it caused, in the device work's time order
  (tilescope executions add their modeled ``instructions`` hop);
* **the launches inside** a parent that launched nothing itself (a profiler step, a module,
  ``CompiledFunction``): its own ancestors, the event (``self``), then the launches made
  inside it on its thread — nested in it (CUDA) or by the ops nested in it (tilescope's
  runtime launches on its own lane) —, a page at a time, each with the op that made it and
  its device work.

Each hop says which earlier hop caused it (``after``) and how long after that one started
(``delay_ns``) and ended (``gap_ns``): an op's launch is measured from the op, a kernel from
its launch — never from whatever row happens to be above it.
"""

from __future__ import annotations

import numpy as np

from ._work import check

__all__ = ["lifecycle", "PAGE"]

PAGE = 25  # launches (with their op and device work) per page of a parent's lifecycle
MAX_PAGE = 200


def _hop(ix, ref: int, hop: str) -> dict:
    g = int(ix.group[ref])
    return {"hop": hop, "ref": int(ref), "eid": int(ix.eid[ref]), "lane": int(ix.g_lane[g]), "depth": int(ix.g_depth[g]),
            "kind": ix.kinds[int(ix.kind[ref])], "name": ix.names[int(ix.name[ref])], "start_ns": int(ix.start[ref]),
            "dur_ns": int(ix.dur[ref])}


def _after(hops: list[dict], i: int, j: int) -> None:
    """Hop ``i`` was caused by hop ``j``: its delay from j's start and its gap after j's end."""
    a, b = hops[i], hops[j]
    hops[i]["after"] = j
    hops[i]["delay_ns"] = a["start_ns"] - b["start_ns"]
    hops[i]["gap_ns"] = a["start_ns"] - (b["start_ns"] + b["dur_ns"])


class _Builder:
    def __init__(self, ix, executions: dict):
        self.ix = ix
        self.execs = executions
        self.hops: list[dict] = []
        self.at: dict[tuple[int, str], int] = {}

    def add(self, ref: int, hop: str, cause: int | None = None) -> int:
        key = (int(ref), hop)
        if key in self.at:
            return self.at[key]
        self.hops.append(_hop(self.ix, ref, hop))
        i = len(self.hops) - 1
        self.at[key] = i
        if cause is not None:
            _after(self.hops, i, cause)
        if hop == "device":
            self._instructions(i)
        return i

    def _instructions(self, i: int) -> None:
        h = self.hops[i]
        ex = self.execs.get(h["eid"])
        if ex is None:
            return
        view = {"hash": ex["program_hash"], "run": ex["run"], "own_trace": ex["own_trace"]}
        h["device_view"] = view
        h["program_hash"] = ex["program_hash"]
        self.hops.append({"hop": "instructions", "program_hash": ex["program_hash"], "run": ex["run"],
                          "instructions": ex["instructions"], "engines": ex.get("engines"),
                          "dma_queues": ex.get("dma_queues"), "span_ns": ex.get("span_ns"),
                          "device_view": view, "modeled": True, "after": i})

    def chain(self, rows: np.ndarray) -> None:
        ix = self.ix
        for r in rows.tolist():
            check()
            op, launch, dev = int(ix.lk_op[r]), int(ix.lk_launch[r]), int(ix.lk_dev[r])
            oi = self.at.get((op, "op")) if op >= 0 else None
            li = self.add(launch, "launch", oi)
            self.add(dev, "device", li)


def lifecycle(ix, ref: int, *, executions: dict | None = None, page: int = 0, per_page: int = PAGE) -> dict:
    """The lifecycle of event ``ref`` (see the module doc): ``{"hops", "shape", "total",
    "page", "pages", "per_page"}``; ``total`` counts links (a chain) or launches (a parent)."""
    if not 0 <= ref < ix.n:
        raise KeyError(f"no event with ref {ref} (the index holds {ix.n:,})")
    per_page = max(1, min(int(per_page), MAX_PAGE))
    b = _Builder(ix, executions or {})
    rows = np.unique(np.concatenate([ix.links_of(ref, c) for c in ("dev", "launch", "op")]))
    if rows.size:
        rows = rows[np.lexsort((rows, ix.start[ix.lk_dev[rows]]))]  # device work in time order
        total = int(rows.size)
        pages = max(1, -(-total // per_page))
        page = max(0, min(int(page), pages - 1))
        part = rows[page * per_page:(page + 1) * per_page]
        ops = sorted({int(o) for o in ix.lk_op[rows].tolist() if o >= 0}, key=lambda o: (int(ix.start[o]), o))
        anchor = ops[0] if ops else ref
        for a in ix.ancestors(anchor):
            b.add(a, "parent")
        for o in ops[:MAX_PAGE]:
            b.add(o, "op")
        b.chain(part)
        shape = "chain"
    else:
        # the links made inside it on its lane: launches nested in it (CUDA), or ops nested in
        # it whose work another lane launched (tilescope's runtime), one row per device event
        rows = np.union1d(ix.links_inside(ref, "launch"), ix.links_inside(ref, "op"))
        rows = rows[np.lexsort((ix.lk_dev[rows], ix.start[ix.lk_launch[rows]]))]
        for a in ix.ancestors(ref):
            b.add(a, "parent")
        me = b.add(ref, "self")
        launches = np.unique(ix.lk_launch[rows])
        total = int(launches.size)
        pages = max(1, -(-total // per_page))
        page = max(0, min(int(page), pages - 1))
        order = launches[np.lexsort((launches, ix.start[launches]))]
        shown = set(order[page * per_page:(page + 1) * per_page].tolist())
        for r in rows.tolist():
            la = int(ix.lk_launch[r])
            if la not in shown:
                continue
            check()
            op = int(ix.lk_op[r])
            oi = me if op < 0 or op == ref else b.add(op, "op", me)
            li = b.add(la, "launch", oi)
            b.add(int(ix.lk_dev[r]), "device", li)
        shape = "launches" if total else "self"
    return {"hops": b.hops, "shape": shape, "total": total, "page": page, "pages": pages, "per_page": per_page}
