"""The explorer's in-memory timeline index: windowed, level-of-detail queries in milliseconds.

Built once per opened trace from the analysis engine's ``events`` and ``lanes`` views
(public SQL), then queried with numpy only, so a zoom or pan never touches the events
outside the window and never waits for DuckDB:

* every drawable event (slices and instants) sits in arrays sorted by (lane, depth, start);
  depth is the nesting level within the lane, computed vectorised (the number of earlier
  events on the lane still open at its start). Events of one (lane, depth) *group* do not
  overlap when the trace nests properly, so a running maximum of their ends is sorted and a
  window's events are found with two binary searches per group;
* a level-of-detail summary with levels of bucket width ``BASE_NS * 4**k``: at level *k*,
  events at least one bucket long are kept individually (an index subset) and shorter ones
  are summarised per (group, bucket): count, busy time, and the name of the longest one.
  Level *k+1* is built from level *k*'s buckets and the events that became short, so the
  whole summary costs one pass over the events.

A query for a window of ``pixels`` pixels returns every event exactly when the window holds
at most ``max_events`` of them; otherwise the finest level whose buckets are at least one
pixel wide (at most one bucket per pixel and row): its long events plus its buckets. Times are nanoseconds from the trace's first
event (``origin_ns``), so they fit a JavaScript double exactly.

Each event also gets a colour key: its own name, its *op* (the framework op that caused it:
for CUDA/ROCm kernels and copies the op enclosing the launch with the same correlation id;
for tilescope's runtime and hardware lanes the op named after ``execute ``/``exec_running ``),
or its kind.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time

import numpy as np

__all__ = ["TimelineIndex", "BASE_NS", "COLOR_MODES"]

BASE_NS = 16  # finest LOD bucket width; level k is BASE_NS * 4**k
COLOR_MODES = ("op", "name", "kind")
_DEVICE_PREFIXES = ("exec_running ", "execute ")  # tilescope hardware / runtime event names


def _col(table, name):
    return table.column(name).to_numpy(zero_copy_only=False)


def _dict_encode(table, name):
    """(int32 codes, list of strings) for a string column (nulls become '')."""
    import pyarrow as pa
    import pyarrow.compute as pc

    col = pc.fill_null(table.column(name).cast(pa.string()), "")  # an empty trace's column may be typed null
    enc = pc.dictionary_encode(col).combine_chunks()
    if isinstance(enc, pa.ChunkedArray):
        enc = enc.combine_chunks()
    return enc.indices.to_numpy(zero_copy_only=False).astype(np.int32), enc.dictionary.to_pylist()


def _segments(keys: np.ndarray) -> np.ndarray:
    """Start positions of runs of equal values in ``keys`` (plus len at the end)."""
    if keys.size == 0:
        return np.zeros(1, dtype=np.int64)
    change = np.flatnonzero(keys[1:] != keys[:-1]) + 1
    return np.concatenate(([0], change, [keys.size])).astype(np.int64)


def _lane_depths(start: np.ndarray, end: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Nesting depth of events of one lane sorted by (start, end desc, eid): the number of
    earlier events whose end is after this event's start (zero-length events contain nothing)."""
    n = start.size
    pos = np.arange(n, dtype=np.int64)
    closed_all = np.searchsorted(np.sort(end), start, side="right")
    zero = dur <= 0
    if zero.any():
        zs = start[zero]  # sorted, since start is sorted
        z_at = np.searchsorted(zs, start, side="right") - np.searchsorted(zs, start, side="left")
        # zero-length events at this start that sort after this event (they also ended by it)
        after = z_at.copy()
        zpos = np.arange(zs.size) - np.searchsorted(zs, zs, side="left")  # rank among equal starts
        after[zero] = z_at[zero] - zpos
        closed_before = closed_all - after
    else:
        closed_before = closed_all
    return np.maximum(pos - closed_before, 0)


class _Level:
    """One LOD level: long events (an index subset, or None when most events are long) and
    buckets of the short ones."""

    ARRAYS = ("idx", "idx_lo", "ecm", "b_group", "b_bucket", "b_count", "b_busy", "b_top", "b_lo")
    __slots__ = ("width",) + ARRAYS + ("b_topdur",)

    def __init__(self, width):
        self.width = width


_ARRAYS = ("eid", "start", "dur", "ecm", "name", "kind", "group", "op_key", "eid_order",
           "g_lo", "g_hi", "g_lane", "g_depth", "max_depth", "parent",
           "lk_dev", "lk_launch", "lk_op", "lk_by_dev", "lk_by_launch", "lk_by_op")
CACHE_VERSION = 3


class TimelineIndex:
    """Sorted event arrays of one trace and their level-of-detail summary (see the module doc).

    ``TimelineIndex.load_or_build(trace)`` keeps the arrays next to the engine's cache entry
    (``<entry>/explorer-index/``, removed with it when the source changes) and memory-maps
    them on the next open, so a second ``tilescope explore`` of a big trace starts at once."""

    @classmethod
    def load_or_build(cls, trace, *, cache: bool = True) -> "TimelineIndex":
        d = cls._cache_dir(trace) if cache else None
        ix = None
        if d is not None and os.path.exists(os.path.join(d, "meta.json")):
            try:
                ix = cls._load(d, trace)
            except (OSError, ValueError, KeyError):
                pass  # a stale or damaged cache is rebuilt below
        if ix is None:
            ix = cls(trace)
            if d is not None:
                ix._save(d, trace)
        ix._name_to_key("op")  # the default colouring's table: made at start, not by the first window
        return ix

    def __init__(self, trace=None, *, color_links: bool = True):
        if trace is None:
            return  # filled by _load
        t_build = time.perf_counter()
        from ._engine import arrow

        self.lanes = arrow(trace.sql("SELECT * FROM lanes ORDER BY lane")).to_pylist()
        self.origin_ns = int(trace.t0_ns)
        self.span_ns = max(1, int(trace.t1_ns) - self.origin_ns)
        o = self.origin_ns
        tab = arrow(trace.sql(f"""
            SELECT eid, lane, ts_ns - {o} AS s, greatest(coalesce(dur_ns, 0), 0) AS d, name, kind, rank,
                   CASE WHEN kind IN ('launch', 'kernel', 'memcpy', 'memset') THEN correlation END AS corr
            FROM events WHERE ph IN ('X', 'i', 'I') AND ts_ns IS NOT NULL"""))
        self.n = n = tab.num_rows
        eid = _col(tab, "eid").astype(np.int64, copy=False)
        lane = _col(tab, "lane").astype(np.int64, copy=False)
        start = _col(tab, "s").astype(np.int64, copy=False)
        dur = _col(tab, "d").astype(np.int64, copy=False)
        name, self.names = _dict_encode(tab, "name")
        kind, self.kinds = _dict_encode(tab, "kind")
        corr = tab.column("corr")
        has_corr = color_links and corr.null_count < n
        if has_corr:
            import pyarrow.compute as pc

            rank = _col(tab, "rank").astype(np.int64)
            corr = pc.fill_null(corr, -1).to_numpy(zero_copy_only=False).astype(np.int64)
            corr = np.where(corr >= 0, (rank << 40) ^ corr, -1)
            del rank
        del tab
        self.skipped = int(trace.sql("SELECT count(*) FROM events WHERE ph NOT IN ('X', 'i', 'I')").fetchall()[0][0])
        # nesting depth, lane by lane, in (lane, start, end desc, eid) order
        o1 = np.lexsort((eid, -(start + dur), start, lane))
        l1, s1, d1 = lane[o1], start[o1], dur[o1]
        depth = np.zeros(n, dtype=np.int64)
        lane_seg = _segments(l1)
        for a, b in zip(lane_seg[:-1], lane_seg[1:]):
            depth[a:b] = _lane_depths(s1[a:b], s1[a:b] + d1[a:b], d1[a:b])
        del s1, d1
        # final order (lane, depth, start): a stable sort by (lane, depth) keeps the start order
        key = l1 * (int(depth.max(initial=0)) + 1) + depth
        o2 = np.argsort(key, kind="stable")
        order = o1[o2]
        key, depth, l1 = key[o2], depth[o2], l1[o2]
        del o1, o2
        self.eid, self.start, self.dur = eid[order], start[order], dur[order]
        self.name, self.kind = name[order], kind[order].astype(np.int16)
        corr = corr[order] if has_corr else None
        del order, eid, lane, start, dur, name, kind
        seg = _segments(key)
        self.g_lo, self.g_hi = seg[:-1], seg[1:]
        self.g_lane = l1[self.g_lo].astype(np.int32) if n else np.zeros(0, dtype=np.int32)
        self.g_depth = depth[self.g_lo].astype(np.int32) if n else np.zeros(0, dtype=np.int32)
        del key, depth, l1
        n_lanes = max([x["lane"] for x in self.lanes], default=-1) + 1
        self.max_depth = np.zeros(max(n_lanes, 1), dtype=np.int32)
        if self.g_lane.size:
            np.maximum.at(self.max_depth, self.g_lane, self.g_depth)
        self.group = np.repeat(np.arange(self.g_lo.size, dtype=np.int32), self.g_hi - self.g_lo)
        # running maximum of ends within each group (sorted, for the left binary search)
        self.ecm = self.start + self.dur
        for a, b in zip(self.g_lo, self.g_hi):
            np.maximum.accumulate(self.ecm[a:b], out=self.ecm[a:b])
        self.eid_order = np.argsort(self.eid, kind="stable")
        self.parent = self._parents().astype(np.int32)
        self.op_key = self._op_keys(corr)
        del corr
        self._build_links(trace)
        self.levels = self._build_levels()
        self.build_seconds = time.perf_counter() - t_build
        self.loaded_from_cache = False

    @property
    def lane(self) -> np.ndarray:
        return self.g_lane[self.group]

    @property
    def end(self) -> np.ndarray:
        return self.start + self.dur

    # ---- persistence ----------------------------------------------------------------------
    @staticmethod
    def _cache_dir(trace):
        entries = list(getattr(trace, "entries", []) or [])
        if not entries:
            return None
        tag = hashlib.sha256("|".join(entries).encode()).hexdigest()[:10]
        return os.path.join(entries[0], f"explorer-index-{tag}")

    def _save(self, d: str, trace) -> None:
        tmp = f"{d}.tmp-{os.getpid()}-{time.monotonic_ns()}"
        try:
            os.makedirs(tmp)
            for k in _ARRAYS:
                np.save(os.path.join(tmp, f"{k}.npy"), getattr(self, k))
            levels = []
            for i, lv in enumerate(self.levels):
                has = lv.idx is not None
                levels.append({"width": int(lv.width), "has_idx": has})
                for k in _Level.ARRAYS:
                    if k in ("idx", "idx_lo", "ecm") and not has:
                        continue
                    np.save(os.path.join(tmp, f"L{i}_{k}.npy"), getattr(lv, k))
            meta = {"version": CACHE_VERSION, "entries": list(trace.entries), "n": self.n, "origin_ns": self.origin_ns,
                    "span_ns": self.span_ns, "names": self.names, "kinds": self.kinds, "lanes": self.lanes,
                    "levels": levels, "skipped": self.skipped, "build_seconds": self.build_seconds}
            with open(os.path.join(tmp, "meta.json"), "w", encoding="utf-8") as f:
                json.dump(meta, f, default=str)
            shutil.rmtree(d, ignore_errors=True)
            os.rename(tmp, d)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)  # a read-only cache: keep the index in memory only

    @classmethod
    def _load(cls, d: str, trace) -> "TimelineIndex":
        t0 = time.perf_counter()
        with open(os.path.join(d, "meta.json"), encoding="utf-8") as f:
            meta = json.load(f)
        if meta.get("version") != CACHE_VERSION or meta.get("entries") != list(trace.entries):
            raise ValueError("stale explorer index")
        ix = cls()
        ix.n, ix.origin_ns, ix.span_ns = meta["n"], meta["origin_ns"], meta["span_ns"]
        ix.names, ix.kinds, ix.lanes, ix.skipped = meta["names"], meta["kinds"], meta["lanes"], meta["skipped"]
        for k in _ARRAYS:
            setattr(ix, k, np.load(os.path.join(d, f"{k}.npy"), mmap_mode="r"))
        ix.levels = []
        for i, m in enumerate(meta["levels"]):
            lv = _Level(m["width"])
            for k in _Level.ARRAYS:
                if k in ("idx", "idx_lo", "ecm") and not m["has_idx"]:
                    setattr(lv, k, None)
                else:
                    setattr(lv, k, np.load(os.path.join(d, f"L{i}_{k}.npy"), mmap_mode="r"))
            ix.levels.append(lv)
        ix.build_seconds = time.perf_counter() - t0
        ix.loaded_from_cache = True
        ix._read_ahead()
        return ix

    def _read_ahead(self) -> None:
        """Ask the kernel to read the memory-mapped arrays in the background (madvise
        WILLNEED: asynchronous, no thread of ours waits): the first windows and clicks then
        find the pages in memory instead of reading them from disk one fault at a time."""
        import mmap

        arrays = [getattr(self, k) for k in _ARRAYS] + [getattr(lv, k) for lv in self.levels for k in _Level.ARRAYS]
        for a in arrays:
            m = getattr(a, "_mmap", None)
            if m is not None and hasattr(m, "madvise") and hasattr(mmap, "MADV_WILLNEED"):
                try:
                    m.madvise(mmap.MADV_WILLNEED)
                except (OSError, ValueError):  # advice only
                    pass

    # ---- lifecycle links --------------------------------------------------------------------
    def _build_links(self, trace) -> None:
        """The engine's device -> launch -> op edges (:meth:`Trace.links`) as refs, in device
        start order, with one sorted permutation per column so that the edges of any event
        are two binary searches away (the lifecycle endpoint reads only these arrays)."""
        empty = np.zeros(0, dtype=np.int32)
        dev = launch = op = empty
        if self.n:
            try:
                lk = trace.links()
            except Exception:  # a trace without nesting facts: every lifecycle is the event alone
                lk = None
            if lk is not None and lk.num_rows:
                import pyarrow.compute as pc

                dev = self.refs_of(_col(lk, "dev_eid").astype(np.int64))
                launch = self.refs_of(_col(lk, "launch_eid").astype(np.int64))
                op = self.refs_of(pc.fill_null(lk.column("op_eid"), -1).to_numpy().astype(np.int64))
                keep = (dev >= 0) & (launch >= 0)
                dev, launch, op = dev[keep], launch[keep], op[keep]
                o = np.lexsort((dev, self.start[dev]))
                dev, launch, op = dev[o].astype(np.int32), launch[o].astype(np.int32), op[o].astype(np.int32)
        self.lk_dev, self.lk_launch, self.lk_op = dev, launch, op
        self.lk_by_dev = np.argsort(dev, kind="stable").astype(np.int32)
        self.lk_by_launch = np.argsort(launch, kind="stable").astype(np.int32)
        self.lk_by_op = np.argsort(op, kind="stable").astype(np.int32)

    def links_of(self, ref: int, column: str) -> np.ndarray:
        """Rows of the link arrays whose ``column`` (``dev``, ``launch`` or ``op``) is ``ref``,
        in device start order."""
        col = getattr(self, f"lk_{column}")
        by = getattr(self, f"lk_by_{column}")
        if col.size == 0:
            return np.zeros(0, dtype=np.int64)
        cache = self.__dict__.setdefault("_link_keys", {})  # the column in its sorted order, made once
        keys = cache.get(column)
        if keys is None:
            keys = cache[column] = np.asarray(col)[by]
        a, b = np.searchsorted(keys, ref, side="left"), np.searchsorted(keys, ref, side="right")
        return np.sort(by[a:b].astype(np.int64))

    def ancestors(self, ref: int) -> list[int]:
        """Enclosing events of ``ref`` on its lane, outermost first."""
        out = []
        p = int(self.parent[ref])
        while p >= 0 and len(out) < 10_000:
            out.append(p)
            p = int(self.parent[p])
        return out[::-1]

    def inside(self, ref: int, refs: np.ndarray) -> np.ndarray:
        """Which of ``refs`` are nested in ``ref`` on its lane (at any depth): one vectorised
        test, no list of the descendants (a step may hold millions)."""
        refs = np.asarray(refs, dtype=np.int64)
        ok = refs >= 0
        r = np.where(ok, refs, 0)
        g, me = self.group[r], int(self.group[ref])
        s, e = int(self.start[ref]), int(self.start[ref]) + int(self.dur[ref])
        st = self.start[r]
        return (ok & (self.g_lane[g] == self.g_lane[me]) & (self.g_depth[g] > self.g_depth[me])
                & (st >= s) & ((st < e) | ((st == e) & (self.dur[r] == 0))))

    def prepare_links(self) -> None:
        """Make the sorted link columns :meth:`links_of` and :meth:`links_inside` search (once;
        the explorer does it in the background as it opens a trace)."""
        if self.lk_dev.size:
            for c in ("dev", "launch", "op"):
                self.links_of(0, c)
            for c in ("launch", "op"):
                self.links_inside(0, c)

    def links_inside(self, ref: int, col: str) -> np.ndarray:
        """Rows of the links whose ``col`` event (``"launch"`` or ``"op"``) is nested in ``ref``,
        sorted: those starting within its span, found by binary search over the links ordered
        by that event's start (made once), then tested with :meth:`inside` -- a step's
        lifecycle costs what the step holds, not what the trace holds."""
        cache = self.__dict__.setdefault("_link_order", {})
        if col not in cache:
            refs = np.asarray(getattr(self, f"lk_{col}"), dtype=np.int64)
            st = np.where(refs >= 0, np.asarray(self.start)[np.maximum(refs, 0)], np.iinfo(np.int64).max)
            order = np.argsort(st, kind="stable")
            cache[col] = (order, st[order])
        order, starts = cache[col]
        s = int(self.start[ref])
        e = s + int(self.dur[ref])
        cand = order[np.searchsorted(starts, s, side="left"):np.searchsorted(starts, e, side="right")]
        refs = np.asarray(getattr(self, f"lk_{col}"))[cand]
        return np.sort(cand[self.inside(ref, refs)])

    # ---- colour keys ----------------------------------------------------------------------
    def _name_id(self, s: str) -> int:
        lookup = getattr(self, "_name_lookup", None)
        if lookup is None:
            lookup = self._name_lookup = {v: i for i, v in enumerate(self.names)}
        i = lookup.get(s)
        if i is None:
            i = lookup[s] = len(self.names)
            self.names.append(s)
        return i

    def _parents(self) -> np.ndarray:
        """Index of each event's enclosing event on its lane (-1 at depth 0), vectorised per group."""
        parent = np.full(self.n, -1, dtype=np.int64)
        gid = {(int(l), int(d)): g for g, (l, d) in enumerate(zip(self.g_lane, self.g_depth))}
        for g, (l, d) in enumerate(zip(self.g_lane.tolist(), self.g_depth.tolist())):
            if d == 0:
                continue
            pg = gid.get((l, d - 1))
            if pg is None:
                continue
            a, b = self.g_lo[g], self.g_hi[g]
            pa_, pb = self.g_lo[pg], self.g_hi[pg]
            j = np.searchsorted(self.start[pa_:pb], self.start[a:b], side="right") - 1
            parent[a:b] = np.where(j >= 0, pa_ + j, -1)
        return parent

    def _op_keys(self, corr) -> np.ndarray:
        """Name id of the op behind each event (its own name where none is known); ``corr``
        holds each event's (rank, correlation id) key or -1."""
        key = self.name.copy()
        # tilescope: 'execute aten::mul' / 'exec_running aten::mul' take the colour of 'aten::mul'
        remap = {}
        present = set(self.names)
        for i, nm in enumerate(list(self.names)):
            for p in _DEVICE_PREFIXES:
                if nm.startswith(p):
                    op = nm[len(p):]
                    base = op.rsplit(".", 1)[0]  # 'aten::mul.Tensor' (an overload) -> 'aten::mul' when that op is in the trace
                    remap[i] = self._name_id(op if op in present or base not in present else base)
        if remap:
            lut = np.arange(len(self.names), dtype=np.int64)
            lut[np.fromiter(remap.keys(), dtype=np.int64)] = np.fromiter(remap.values(), dtype=np.int64)
            key = lut[key].astype(np.int32)
        kinds = {k: i for i, k in enumerate(self.kinds)}
        if corr is None or "op" not in kinds or "launch" not in kinds:
            return key
        # CUDA / ROCm: device work -> launch (same correlation id) -> nearest enclosing op
        parent = self.parent.astype(np.int64)
        op_code, launch_code = kinds["op"], kinds["launch"]
        op_of = np.where(self.kind == op_code, np.arange(self.n), -1)
        cur = parent.copy()
        todo = np.flatnonzero((op_of < 0) & (cur >= 0))
        while todo.size:  # one step up the nesting per round
            hit = self.kind[cur[todo]] == op_code
            op_of[todo[hit]] = cur[todo[hit]]
            rest = todo[~hit]
            cur[rest] = parent[cur[rest]]
            todo = rest[cur[rest] >= 0]
        is_launch = (self.kind == launch_code) & (corr >= 0)
        l_ref = np.flatnonzero(is_launch)
        l_key = corr[l_ref]
        o = np.argsort(l_key, kind="stable")
        l_key, l_ref = l_key[o], l_ref[o]
        d_ref = np.flatnonzero(~is_launch & (corr >= 0))
        d_key = corr[d_ref]
        if l_key.size and d_key.size:
            pos = np.minimum(np.searchsorted(l_key, d_key), l_key.size - 1)
            match = l_key[pos] == d_key
            op = op_of[l_ref[pos[match]]]
            good = op >= 0
            key[d_ref[match][good]] = self.name[op[good]]
        # launches take their op's colour too
        has = (self.kind == launch_code) & (op_of >= 0)
        key[has] = self.name[op_of[has]]
        return key

    def color_keys(self, mode: str) -> tuple[np.ndarray, list[str]]:
        """(key per event, the names the keys index) for a colour mode of :data:`COLOR_MODES`."""
        if mode == "op":
            return self.op_key, self.names
        if mode == "name":
            return self.name, self.names
        if mode == "kind":
            return self.kind, self.kinds
        raise ValueError(f"color mode {mode!r} is not one of {', '.join(COLOR_MODES)}")

    # ---- level of detail --------------------------------------------------------------------
    def _build_levels(self) -> list[_Level]:
        levels: list[_Level] = []
        if self.n == 0:
            return levels
        w = BASE_NS
        prev = None
        while True:
            lv = _Level(w)
            long_ = self.dur >= w
            n_long = int(np.count_nonzero(long_))
            if n_long * 2 > self.n:
                # most events are long at this width: filter the group ranges at query time
                # instead of keeping a near-copy of the index
                lv.idx = lv.idx_lo = lv.ecm = None
            else:
                lv.idx = np.flatnonzero(long_)
                lv.idx_lo = np.searchsorted(self.group[lv.idx], np.arange(self.g_lo.size + 1), side="left")
                lv.ecm = self.start[lv.idx] + self.dur[lv.idx]
                for g in np.flatnonzero(np.diff(lv.idx_lo) > 1):
                    a, b = lv.idx_lo[g], lv.idx_lo[g + 1]
                    np.maximum.accumulate(lv.ecm[a:b], out=lv.ecm[a:b])
            # buckets: the previous level's merged by 4, plus the events that became short here.
            # Both come sorted by (group, bucket), so one stable sort merges two runs.
            new = np.flatnonzero(~long_ if prev is None else (~long_ & (self.dur >= w // 4)))
            del long_
            g = self.group[new].astype(np.int64)
            bk = self.start[new] // w
            c = np.ones(new.size, dtype=np.int64)
            busy = self.dur[new]
            top = self.name[new].astype(np.int64)
            td = busy
            if prev is not None and prev.b_group.size:
                g = np.concatenate((g, prev.b_group))
                bk = np.concatenate((bk, prev.b_bucket // 4))
                c = np.concatenate((c, prev.b_count))
                busy = np.concatenate((busy, prev.b_busy))
                top = np.concatenate((top, prev.b_top))
                td = np.concatenate((td, prev.b_topdur))
            if g.size:
                if new.size and prev is not None and prev.b_group.size:
                    if int(bk.max()) < (1 << 43) and int(g.max()) < (1 << 20):
                        o = np.argsort((g << 43) | bk, kind="stable")  # merges the two sorted runs
                    else:
                        o = np.lexsort((bk, g))
                    g, bk, c, busy, top, td = g[o], bk[o], c[o], busy[o], top[o], td[o]
                change = np.flatnonzero((g[1:] != g[:-1]) | (bk[1:] != bk[:-1])) + 1
                heads = np.concatenate(([0], change)).astype(np.int64)
                lv.b_group = g[heads].astype(np.int32)
                lv.b_bucket = bk[heads]
                lv.b_count = np.add.reduceat(c, heads)
                lv.b_busy = np.add.reduceat(busy, heads)
                mx = np.maximum.reduceat(td, heads)
                # the name of the first row holding the maximum of each run
                run = np.repeat(np.arange(heads.size), np.diff(np.append(heads, g.size)))
                is_max = np.flatnonzero(td == mx[run])
                first = is_max[np.concatenate(([True], run[is_max][1:] != run[is_max][:-1]))]
                lv.b_top = top[first]
                lv.b_topdur = mx
            else:
                lv.b_group = np.zeros(0, dtype=np.int32)
                lv.b_bucket = lv.b_count = lv.b_busy = lv.b_top = lv.b_topdur = np.zeros(0, dtype=np.int64)
            lv.b_lo = np.searchsorted(lv.b_group, np.arange(self.g_lo.size + 1), side="left")
            levels.append(lv)
            prev = lv
            if w >= self.span_ns:
                break
            w *= 4
        return levels

    # ---- queries ----------------------------------------------------------------------------
    def refs_of(self, eids) -> np.ndarray:
        """Index (``ref``) of each engine event id in the sorted arrays, -1 where not drawn."""
        eids = np.asarray(eids, dtype=np.int64)
        if self.n == 0:
            return np.full(eids.shape, -1, dtype=np.int64)
        sorted_eids = self.eid[self.eid_order]
        pos = np.searchsorted(sorted_eids, eids)
        pos = np.minimum(pos, self.n - 1)
        hit = sorted_eids[pos] == eids
        return np.where(hit, self.eid_order[pos], -1)

    def groups_for(self, lanes) -> np.ndarray:
        if lanes is None:
            return np.arange(self.g_lo.size)
        return np.flatnonzero(np.isin(self.g_lane, np.asarray(list(lanes), dtype=np.int32)))

    def count_in(self, t0: int, t1: int, groups) -> int:
        """An upper bound of the events overlapping [t0, t1) in ``groups`` (exact when nested)."""
        total = 0
        for g in groups:
            a, b = self.g_lo[g], self.g_hi[g]
            i0 = a + np.searchsorted(self.ecm[a:b], t0, side="right")
            i1 = a + np.searchsorted(self.start[a:b], t1, side="left")
            total += max(0, i1 - i0)
        return int(total)

    def _exact(self, t0, t1, groups) -> np.ndarray:
        parts = []
        for g in groups:
            a, b = self.g_lo[g], self.g_hi[g]
            i0 = a + np.searchsorted(self.ecm[a:b], t0, side="right")
            i1 = a + np.searchsorted(self.start[a:b], t1, side="left")
            if i1 > i0:
                r = np.arange(i0, i1)
                keep = (self.start[r] + self.dur[r] > t0) | ((self.dur[r] == 0) & (self.start[r] >= t0))
                parts.append(r[keep])
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def window(self, t0=None, t1=None, lanes=None, pixels: int = 1000, *, max_events: int = 30000,
               color: str = "op") -> dict:
        """Events and buckets for ``[t0, t1)`` (ns from ``origin_ns``) on ``lanes`` (None: all).

        Returns ``{"t0", "t1", "exact", "bucket_ns", "events": {...}, "buckets": {...}, "total"}``
        with numpy columns: events ``ref, lane, depth, start, dur, key``; buckets ``lane, depth,
        start, count, busy, key`` (``busy`` is the summed duration of the bucket's events)."""
        a = 0 if t0 is None else int(t0)
        b = self.span_ns if t1 is None else int(t1)
        if b <= a:
            raise ValueError(f"empty window: t1 ({b}) must be greater than t0 ({a})")
        pixels = max(1, min(int(pixels), 100_000))
        keys, _ = self.color_keys(color)
        groups = self.groups_for(lanes)
        total = self.count_in(a, b, groups)
        px = (b - a) / pixels
        out = {"t0": a, "t1": b, "total": total, "exact": True, "bucket_ns": 0}
        empty = np.zeros(0, dtype=np.int64)
        if total <= max_events or not self.levels:
            ev = self._exact(a, b, groups)
            bk = None
        else:
            # the finest level whose buckets are at least one pixel wide (so at most one per pixel)
            wide = [lv for lv in self.levels if lv.width >= px]
            lv = wide[0] if wide else self.levels[-1]
            out["exact"] = False
            out["bucket_ns"] = lv.width
            ev_parts, bk_parts = [], []
            ba, bb = a // lv.width, (b - 1) // lv.width
            for g in groups:
                if lv.idx is None:
                    r = self._exact(a, b, (g,))
                    ev_parts.append(r[self.dur[r] >= lv.width])
                    p = q = 0
                else:
                    p, q = lv.idx_lo[g], lv.idx_lo[g + 1]
                if q > p:
                    sub = lv.idx[p:q]
                    i0 = np.searchsorted(lv.ecm[p:q], a, side="right")
                    i1 = np.searchsorted(self.start[sub], b, side="left")
                    if i1 > i0:
                        r = sub[i0:i1]
                        ev_parts.append(r[self.start[r] + self.dur[r] > a])
                p, q = lv.b_lo[g], lv.b_lo[g + 1]
                if q > p:
                    j0 = p + np.searchsorted(lv.b_bucket[p:q], ba, side="left")
                    j1 = p + np.searchsorted(lv.b_bucket[p:q], bb, side="right")
                    if j1 > j0:
                        bk_parts.append(np.arange(j0, j1))
            ev = np.concatenate(ev_parts) if ev_parts else empty
            bk = (lv, np.concatenate(bk_parts) if bk_parts else empty)
        out["events"] = {
            "ref": ev.astype(np.uint32), "lane": self.g_lane[self.group[ev]], "depth": self.g_depth[self.group[ev]],
            "start": self.start[ev].astype(np.float64), "dur": self.dur[ev].astype(np.float64), "key": keys[ev],
        }
        if bk is None:
            out["buckets"] = {k: empty for k in ("lane", "depth", "start", "count", "busy", "key")}
        else:
            lv, j = bk
            g = lv.b_group[j]
            top = lv.b_top[j]
            if color != "name":
                # a bucket's colour follows its longest event's name; map it through the mode's keys
                lut = self._name_to_key(color)
                top = lut[top]
            out["buckets"] = {
                "lane": self.g_lane[g], "depth": self.g_depth[g], "start": (lv.b_bucket[j] * lv.width).astype(np.float64),
                "count": lv.b_count[j], "busy": lv.b_busy[j].astype(np.float64), "key": top,
            }
        return out

    def _name_to_key(self, mode: str) -> np.ndarray:
        """name id -> key of ``mode`` (the key of the first event bearing that name)."""
        cache = self.__dict__.setdefault("_lut", {})
        if mode not in cache:
            keys, _ = self.color_keys(mode)
            lut = np.arange(len(self.names), dtype=np.int64)
            if self.n:
                # an event bearing each name (any representative is fine: one assignment, where
                # a ufunc.at over millions of events held the first window for 0.2 s)
                first = np.full(len(self.names), -1, dtype=np.int64)
                first[self.name] = np.arange(self.n, dtype=np.int64)
                ok = first >= 0
                lut[ok] = keys[first[ok]]
            cache[mode] = lut
        return cache[mode]

    def select(self, t0: int, t1: int, lanes=None, *, top: int = 50) -> dict:
        """Summary of a box selection: events overlapping [t0, t1) on ``lanes``, by name
        (count, time clipped to the box) and by lane (union busy time inside the box)."""
        a, b = int(t0), int(t1)
        if b <= a:
            raise ValueError(f"empty selection: t1 ({b}) must be greater than t0 ({a})")
        ev = self._exact(a, b, self.groups_for(lanes))
        ev_end = self.start[ev] + self.dur[ev]
        clip = np.maximum(np.minimum(ev_end, b) - np.maximum(self.start[ev], a), 0)
        if ev.size:
            names = self.name[ev]
            cnt = np.bincount(names, minlength=len(self.names))
            tot = np.bincount(names, weights=clip, minlength=len(self.names))
            order = np.argsort(-tot, kind="stable")
            order = order[cnt[order] > 0][:top]
            by_name = [{"name": self.names[i], "count": int(cnt[i]), "time_ns": float(tot[i])} for i in order]
        else:
            by_name = []
        by_lane = []
        ev_lane = self.g_lane[self.group[ev]]
        ev_top = self.g_depth[self.group[ev]] == 0
        for ln in np.unique(ev_lane).tolist():
            on = ev_lane == ln
            busy = float(clip[on & ev_top].sum())
            by_lane.append({"lane": ln, "events": int(on.sum()), "busy_ns": busy, "busy_share": busy / (b - a)})
        return {"t0": a, "t1": b, "events": int(ev.size), "by_name": by_name, "by_lane": by_lane}

    def event_brief(self, ref: int) -> dict:
        """Position facts of one event (lane, depth, start, dur, name) by its index."""
        if not 0 <= ref < self.n:
            raise KeyError(f"no event with ref {ref} (the index holds {self.n:,})")
        g = self.group[ref]
        return {"ref": int(ref), "eid": int(self.eid[ref]), "lane": int(self.g_lane[g]), "depth": int(self.g_depth[g]),
                "start": int(self.start[ref]), "dur": int(self.dur[ref]), "name": self.names[self.name[ref]]}

    def stats(self) -> dict:
        return {"events": self.n, "groups": int(self.g_lo.size), "levels": [int(lv.width) for lv in self.levels],
                "build_seconds": round(self.build_seconds, 3), "skipped_phases": self.skipped,
                "loaded_from_cache": self.loaded_from_cache,
                "bytes": int(sum(getattr(self, k).nbytes for k in _ARRAYS)
                             + sum((lv.idx.nbytes * 2 if lv.idx is not None else 0) + lv.b_bucket.nbytes * 6
                                   for lv in self.levels))}
