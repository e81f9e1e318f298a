"""Which lowering rule modeled the device time of a tilescope profile, and the generic share.

Every tilescope execution records the lowering rule that made its Program (the ``lowering``
arg of its runtime and hardware events, the ``lowering`` column of the ``events`` view). The
*generic* lowering prices an op without a specific rule as one GpSimd routine at an assumed
cycle per element: where it holds much of the modeled time, the profile's device time is
largely an estimate. Kernel executions only: host <-> device copies have no rule.

Kineto traces (CUDA, ROCm, CPU) record no lowering: both analyses are empty there.
"""

from __future__ import annotations

import json

__all__ = ["lowering_table", "generic_share", "GENERIC"]

GENERIC = "generic"

_KERNELS = "ph = 'X' AND cat = 'hardware' AND lowering IS NOT NULL"


def lowering_table(trace):
    """Per lowering rule: executions, modeled device time and its share of the modeled kernel
    time (``lowering, executions, device_ns, share``), largest first. Returns a pyarrow Table."""
    from ._trace import _arrow

    return _arrow(trace.sql(f"""
      SELECT lowering, count(*) AS executions, sum(dur_ns)::BIGINT AS device_ns,
             sum(dur_ns) / nullif(sum(sum(dur_ns)) OVER (), 0) AS share
      FROM events WHERE {_KERNELS} GROUP BY lowering ORDER BY device_ns DESC, lowering"""))


def generic_share(trace, *, top: int = 5) -> dict | None:
    """The generic lowering's share of modeled kernel time, with the ``top`` (op, operand
    shapes) pairs that hold it; None for a trace that records no lowering (not tilescope's).

    ``{"share", "generic_ns", "device_ns", "executions", "generic_executions", "top": [{"op",
    "shapes", "executions", "device_ns", "share"}]}``; shapes come from the executables
    (``executables.shapes``), None where the profile has no executable for the Program.
    """
    from ._trace import _arrow

    def rows(rel):
        return _arrow(rel).to_pylist()

    tot = rows(trace.sql(f"""
      SELECT count(*) AS n, coalesce(sum(dur_ns), 0)::BIGINT AS ns,
             count(*) FILTER (WHERE lowering = '{GENERIC}') AS gn,
             coalesce(sum(dur_ns) FILTER (WHERE lowering = '{GENERIC}'), 0)::BIGINT AS gns
      FROM events WHERE {_KERNELS}"""))[0]
    if not tot["n"]:
        return None
    ops = rows(trace.sql(f"""
      WITH g AS (SELECT coalesce(json_extract_string(args, '$.op'), name) AS op, program_hash, dur_ns
                 FROM events WHERE {_KERNELS} AND lowering = '{GENERIC}'),
      x AS (SELECT program_hash, any_value(shapes) AS shapes FROM executables GROUP BY 1)
      SELECT g.op, x.shapes, count(*) AS executions, sum(g.dur_ns)::BIGINT AS device_ns
      FROM g LEFT JOIN x USING (program_hash) GROUP BY ALL ORDER BY device_ns DESC, g.op LIMIT {int(top)}"""))
    total = tot["ns"]
    return {
        "share": tot["gns"] / total if total else 0.0, "generic_ns": tot["gns"], "device_ns": total,
        "executions": tot["n"], "generic_executions": tot["gn"],
        "top": [{"op": r["op"], "shapes": json.loads(r["shapes"]) if r["shapes"] else None,
                 "executions": r["executions"], "device_ns": r["device_ns"],
                 "share": r["device_ns"] / total if total else 0.0} for r in ops],
    }
