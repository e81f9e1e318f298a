"""The lane table and the op table computed without a database (``_columns``, ``_op_table``) against
the same definitions written in SQL over the Parquet cache (an independent oracle)."""

from __future__ import annotations

import json
import os

import duckdb
import pytest

import tilescope.trace as tt
from tilescope.trace import _columns
from tilescope.trace._devices import DEVICE_PROCESS
from tilescope.trace._schema import CATEGORY_KINDS, kind_case_sql

KINETO = os.path.join(os.path.dirname(__file__), "data", "kineto")
TRACES = ["cuda_alexnet_small.json.gz", "rocm_mi250_small.json.gz", "mtia_inference_rank_0.json.gz",
          "cpu_only_tiny.json.gz", "cuda_triton_tiny.json.gz"]

pytestmark = pytest.mark.usefixtures("module_cache_dir")


def _lanes_sql(glob: str, rank: int) -> str:
    device_cats = " OR ".join(f"cat = '{c}'" for c in sorted({c for c, _p, _k, s in CATEGORY_KINDS if c and s == "device"}))
    dev = f"regexp_matches(coalesce({{}}, ''), '{DEVICE_PROCESS}')"
    return f"""
    WITH meta AS (SELECT pid, tid, name, json_extract_string(args, '$.name') AS v,
                         json_extract_string(args, '$.labels') AS labels
                  FROM read_parquet('{glob}') WHERE ph = 'M'),
    pn AS (SELECT pid, any_value(v) AS process_name FROM meta WHERE name = 'process_name' GROUP BY pid),
    pl AS (SELECT pid, any_value(labels) AS labels FROM meta WHERE name = 'process_labels' GROUP BY pid),
    tn AS (SELECT pid, tid, any_value(v) AS thread_name FROM meta WHERE name = 'thread_name' GROUP BY pid, tid),
    st AS (SELECT pid, tid, count(*) AS events, min(ts_ns) AS first_ns,
                  max(ts_ns + greatest(coalesce(dur_ns, 0), 0)) AS last_ns,
                  count(*) FILTER (WHERE {device_cats}) AS dev,
                  to_json(histogram(coalesce(cat, '(no category)')) FILTER (WHERE ph = 'X' AND {kind_case_sql()} = 'other'))
                    AS other_cats
           FROM read_parquet('{glob}') WHERE ph NOT IN ('M', 's', 't', 'f', 'B', 'E') GROUP BY pid, tid)
    SELECT {rank}::INTEGER AS rank, st.pid, st.tid, pn.process_name, tn.thread_name, pl.labels, st.events,
           st.first_ns, st.last_ns, st.other_cats::VARCHAR,
           CASE WHEN st.dev * 2 > st.events OR {dev.format('pl.labels')} OR {dev.format('pn.process_name')}
                THEN 'device' ELSE 'host' END AS side
    FROM st LEFT JOIN pn USING (pid) LEFT JOIN pl USING (pid) LEFT JOIN tn USING (pid, tid)
    ORDER BY pid, tid"""


def _parsed(row: tuple) -> tuple:
    """A lane row with its unclassified-categories JSON parsed (key order is not meaning)."""
    return row[:9] + (json.loads(row[9]) if row[9] else None, row[10])


@pytest.mark.parametrize("name", TRACES)
def test_the_lane_table_equals_its_sql_definition(name):
    t = tt.open(os.path.join(KINETO, name))
    entry, rank = t.entries[0], t.ranks[0]
    cols = _columns.read_entry(entry, rank)
    rows = _columns.lane_rows(cols, rank)
    keys = ["rank", "pid", "tid", "process_name", "thread_name", "labels", "events", "first_ns", "last_ns",
            "other_cats", "side"]
    ours = sorted((tuple(rows[k][i] for k in keys) for i in range(len(rows["pid"]))),
                  key=lambda r: (r[1] is None, r[1] or "", r[2] is None, r[2] or ""))
    sql = duckdb.sql(_lanes_sql(os.path.join(entry, "events", "*", "*.parquet"), rank)).fetchall()
    assert [_parsed(r) for r in ours] == [_parsed(r) for r in sql]
    assert len(ours) == t.sql("SELECT count(*) FROM lanes").fetchall()[0][0] + sum(r[1] is None for r in ours)


@pytest.mark.parametrize("name", TRACES)
def test_the_op_table_equals_its_sql_definition(name):
    t = tt.open(os.path.join(KINETO, name))
    for kinds in (("op",), ("op", "annotation"), ("kernel",)):
        ours = t.op_table(kinds=kinds)
        k = ", ".join(f"'{x}'" for x in kinds)
        sql = t.sql(f"""
          SELECT e.name, count(*) AS calls, sum(e.dur_ns)::BIGINT AS host_total_ns, sum(h.self_ns)::BIGINT AS host_self_ns,
                 sum(h.dev_total_ns)::BIGINT AS device_total_ns, sum(h.dev_self_ns)::BIGINT AS device_self_ns,
                 sum(h.n_dev)::BIGINT AS device_calls, sum(e.dur_ns) / count(*) AS host_avg_ns,
                 sum(h.dev_total_ns) / count(*) AS device_avg_ns
          FROM events e JOIN _hier h USING (eid)
          WHERE e.ph = 'X' AND e.dur_ns IS NOT NULL AND (e.kind IN ({k})
                OR (e.kind = 'launch' AND h.dev_self_ns > 0 AND {'TRUE' if 'op' in kinds else 'FALSE'}))
          GROUP BY ALL ORDER BY device_total_ns DESC, host_total_ns DESC, e.name""").fetchall()
        assert [tuple(r.values()) for r in ours.to_pylist()] == sql, kinds
