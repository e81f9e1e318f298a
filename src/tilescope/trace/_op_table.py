"""The op table (self/total host and device time, calls, shapes) and the kernel table."""

from __future__ import annotations

import numpy as np

from ._nesting import hierarchy

__all__ = ["op_table", "kernel_table"]


_OP_SORTS = ("device_total_ns", "device_self_ns", "host_total_ns", "host_self_ns", "calls")


def op_table(trace, *, kinds=("op",), by_shape: bool = False, limit: int | None = None, sort: str = "device_total_ns"):
    """One row per op name (and input shapes with ``by_shape``), like ``key_averages()``.

    Columns: name, [shapes], calls, host_total_ns, host_self_ns, device_total_ns, device_self_ns,
    device_calls, host_avg_ns, device_avg_ns; only events with a usable duration count (a
    missing, negative or out-of-range ``dur`` is left out of calls as of totals). Device time of an op is the time of the device
    work it launched (self) and that its children launched (total); work launched outside any
    op is on the row of its launch call (``cudaLaunchKernel``). Returns a pyarrow Table.

    Computed from the nesting's arrays (``_nesting.hierarchy``), without a database: the
    first question about a trace does not pay for DuckDB's start.
    """
    import pyarrow as pa

    from ._columns import KINDS, _system_pool

    h = hierarchy(trace)
    want = np.isin(h["kind"], [KINDS.index(k) for k in kinds if k in KINDS])
    if "op" in kinds:  # a launch outside any op keeps the device time of the work it launched: its own row
        want |= (h["kind"] == KINDS.index("launch")) & (h["dev_self_ns"] > 0)
    rows = np.flatnonzero(want & h["dur_ok"])
    names = h["names"] + [None]
    key = h["name"][rows]  # (-1: a NULL name, the last of ``names``)
    labels: list[tuple] = [(names[k],) for k in range(len(names))]
    if by_shape:
        shapes = _input_dims(trace, h["eid"][rows])
        pairs = {p: i for i, p in enumerate(dict.fromkeys(zip(key.tolist(), shapes)))}
        labels = [(names[k], sh) for k, sh in pairs]
        key = np.array([pairs[p] for p in zip(key.tolist(), shapes)], dtype=np.int64)
    groups, inv = np.unique(key, return_inverse=True)
    g = len(groups)
    sums = {c: np.bincount(inv, weights=None, minlength=g) if c == "calls" else _isum(inv, h[src][rows], g)
            for c, src in (("calls", None), ("host_total_ns", "dur"), ("host_self_ns", "self_ns"),
                           ("device_total_ns", "dev_total_ns"), ("device_self_ns", "dev_self_ns"),
                           ("device_calls", "n_dev"))}
    out: dict = {"name": [labels[k][0] for k in groups.tolist()]}
    if by_shape:
        out["shapes"] = [labels[k][1] for k in groups.tolist()]
    out.update({c: v.astype(np.int64) for c, v in sums.items()})
    calls = np.maximum(out["calls"], 1)
    out["host_avg_ns"] = out["host_total_ns"] / calls
    out["device_avg_ns"] = out["device_total_ns"] / calls
    order = sort if sort in _OP_SORTS else "device_total_ns"
    idx = sorted(range(g), key=lambda i: (-out[order][i], -out["host_total_ns"][i], out["name"][i] is None,
                                          out["name"][i] or ""))
    if limit:
        idx = idx[:int(limit)]
    cols = {c: ([v[i] for i in idx] if isinstance(v, list) else v[idx]) for c, v in out.items()}
    with _system_pool(pa):  # (mimalloc, pyarrow's default, reserves ~5 MB for a table of a few kB)
        return pa.table({c: pa.array(v, pa.string()) if c in ("name", "shapes") else _numeric(pa, v)
                         for c, v in cols.items()})


def _numeric(pa, v: np.ndarray):
    """A numpy column as an Arrow array over the same memory (``pa.array`` of a numpy array
    imports ``numpy.ma``, ~25 ms of the first op table)."""
    v = np.ascontiguousarray(v)
    return pa.Array.from_buffers(pa.from_numpy_dtype(v.dtype), len(v), [None, pa.py_buffer(v)])


def _isum(inv: np.ndarray, values: np.ndarray, groups: int) -> np.ndarray:
    """Exact int64 sums per group (np.bincount's float weights would round above 2**53)."""
    out = np.zeros(groups, dtype=np.int64)
    np.add.at(out, inv, values.astype(np.int64))
    return out


def _input_dims(trace, eids: np.ndarray) -> list:
    """``args."Input Dims"`` of each slice, as compact JSON text (None when absent)."""
    from ._trace import _arrow

    con = trace.con
    import pyarrow as pa

    con.register("_want_eids", pa.table({"eid": eids, "k": np.arange(len(eids))}))
    try:
        t = _arrow(con.sql("""SELECT w.k, json_extract(e.args, '$."Input Dims"')::VARCHAR AS shapes
                              FROM _want_eids w JOIN raw e USING (eid) ORDER BY w.k"""))
    finally:
        con.unregister("_want_eids")
    return t.column("shapes").to_pylist()


def kernel_table(trace, *, limit: int | None = None, kinds=("kernel", "memcpy", "memset")):
    """Device work by name: calls, total, mean, min, max (ns), streams, share of device time."""
    from ._trace import _arrow

    kinds_sql = ", ".join(f"'{k}'" for k in kinds)
    q = f"""
      SELECT name, any_value(kind) AS kind, count(*) AS calls, sum(dur_ns)::BIGINT AS total_ns, avg(dur_ns) AS mean_ns,
             min(dur_ns) AS min_ns, max(dur_ns) AS max_ns, count(DISTINCT lane) AS lanes,
             sum(dur_ns) / sum(sum(dur_ns)) OVER () AS share
      FROM events WHERE ph = 'X' AND side = 'device' AND kind IN ({kinds_sql}) AND dur_ns IS NOT NULL
      GROUP BY name ORDER BY total_ns DESC, name {f'LIMIT {int(limit)}' if limit else ''}"""
    return _arrow(trace.sql(q))
