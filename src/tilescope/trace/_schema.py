"""The analysis tables and the classification rules, as data.

Every table the engine writes is described here (column, type, meaning); the ingest and
the docs are generated from these rows, so they cannot drift apart.
"""

from __future__ import annotations

__all__ = ["SCHEMA_VERSION", "TABLES", "RAW_JSON_COLUMNS", "TS_EXACT_TYPE", "ARG_COLUMNS", "CATEGORY_KINDS", "kind_case_sql",
           "arg_columns_sql", "arg_paths_sql"]

SCHEMA_VERSION = 7  # 4: the typed args columns are stored at ingest; 5: executables.shapes; 6: device lanes by process label; 7: lanes.other_cats

# Columns read from each trace record by DuckDB's JSON reader. Times are microseconds; a
# double holds them exactly to the nanosecond below 2**53 ns (~104 days: relative clocks,
# and integer-microsecond epoch times are exact too). Epoch times with fractional
# microseconds (>= 13 integer digits) need DECIMAL, which makes DuckDB parse every number as
# text (~1.5x the parse time), so the ingest picks it only when the first block shows them
# (TS_EXACT_TYPE).
RAW_JSON_COLUMNS = {
    "ph": "VARCHAR", "cat": "VARCHAR", "name": "VARCHAR", "pid": "VARCHAR", "tid": "VARCHAR",
    "ts": "DOUBLE", "dur": "DOUBLE", "id": "VARCHAR", "bp": "VARCHAR", "s": "VARCHAR",
    "args": "JSON",
}
TS_EXACT_TYPE = "DECIMAL(24,3)"

# args fields promoted to typed columns, stored at ingest: (column, JSON path, SQL type).
# A BIGINT is an integer JSON number, or a string holding one (-?[0-9]+), within int64;
# anything else (fractions, exponents, booleans, objects) is NULL. A VARCHAR is a JSON
# string's value (other types: NULL); the first of duplicate keys counts. The C parser
# (_kscan.c) and arg_columns_sql() below (the DuckDB ingest) both implement this; they differ
# only on a key spelled with escapes ("\u0063orrelation"), which only DuckDB matches.
ARG_COLUMNS = (
    ("correlation", '$.correlation', "BIGINT"),      # CUDA/HIP: launch <-> kernel
    ("external_id", '$."External id"', "BIGINT"),    # Kineto: cpu_op <-> its launches
    ("stream", '$.stream', "BIGINT"),                # GPU stream of a kernel / copy
    ("device", '$.device', "BIGINT"),                # GPU index
    ("flow_id", '$.flow_id', "BIGINT"),              # tilescope: one device execution's hops
    ("program_hash", '$.program_hash', "VARCHAR"),   # tilescope: the executable that ran
)


def arg_columns_sql() -> str:
    """The ARG_COLUMNS as DuckDB select expressions (one JSON parse per record: they read the
    list ``_a`` of the extracted paths, which the query defines with ``arg_paths_sql()``)."""
    exprs = []
    for k, (col, _path, typ) in enumerate(ARG_COLUMNS, start=1):
        v, text = f"_a[{k}]", f"(_a[{k}] ->> '$')"
        if typ == "BIGINT":
            exprs.append(f"""CASE json_type({v}) WHEN 'BIGINT' THEN TRY_CAST({text} AS BIGINT)
                 WHEN 'UBIGINT' THEN TRY_CAST({text} AS BIGINT)
                 WHEN 'VARCHAR' THEN CASE WHEN regexp_full_match({text}, '-?[0-9]+') THEN TRY_CAST({text} AS BIGINT) END
                 END AS {col}""")
        else:
            exprs.append(f"CASE WHEN json_type({v}) = 'VARCHAR' THEN {text} END AS {col}")
    return ",\n      ".join(exprs)


def arg_paths_sql(args: str = "args") -> str:
    """``json_extract(args, [every ARG_COLUMNS path])``: the list ``arg_columns_sql`` reads."""
    paths = ", ".join("'" + path.replace("'", "''") + "'" for _c, path, _t in ARG_COLUMNS)
    return f"json_extract({args}, [{paths}])"

# table -> ((column, type, meaning), ...)
TABLES = {
    "events": (
        ("rank", "INTEGER", "rank of the trace (hive partition `rank=<n>`)"),
        ("part", "INTEGER", "ingest part; eid = part * 2**32 + row within the part file"),
        ("ph", "VARCHAR", "Chrome trace phase: X complete, i instant, C counter, s/t/f flow, M metadata"),
        ("cat", "VARCHAR", "category as written by the tracer"),
        ("name", "VARCHAR", "event name"),
        ("pid", "VARCHAR", "process id (text: Kineto uses numbers and names)"),
        ("tid", "VARCHAR", "thread / stream id (text)"),
        ("ts_ns", "BIGINT", "start, integer nanoseconds on the trace's clock"),
        ("dur_ns", "BIGINT", "duration in nanoseconds (NULL for instants)"),
        ("id", "VARCHAR", "flow id (flow records only)"),
        ("bp", "VARCHAR", "flow binding point ('e': enclosing slice)"),
        ("s", "VARCHAR", "instant scope"),
        ("args", "JSON", "the record's args object, verbatim"),
        # typed columns read from args at ingest (ARG_COLUMNS: an integer or a string holding one)
        *((c, t, f"args {p}, typed (NULL when absent or not of that type)") for c, p, t in ARG_COLUMNS),
    ),
    "lanes": (
        ("lane", "INTEGER", "lane index (dense, sorted: host lanes first, then devices)"),
        ("rank", "INTEGER", "rank"),
        ("pid", "VARCHAR", "process id"),
        ("tid", "VARCHAR", "thread / stream id"),
        ("process_name", "VARCHAR", "process_name metadata"),
        ("thread_name", "VARCHAR", "thread_name metadata"),
        ("instance", "VARCHAR", "host / instance"),
        ("subsystem", "VARCHAR", "framework | runtime | hardware | device | host | other"),
        ("identifier", "VARCHAR", "the lane's name within its subsystem (thread, stream, core)"),
        ("side", "VARCHAR", "host | device"),
        ("events", "BIGINT", "events on the lane"),
        ("first_ns", "BIGINT", "first event start"),
        ("last_ns", "BIGINT", "last event end"),
    ),
    "executables": (
        ("program_hash", "VARCHAR", "content hash of the Program"),
        ("name", "VARCHAR", "Program name"),
        ("spec", "VARCHAR", "preset it was built for"),
        ("instructions", "BIGINT", "instruction count"),
        ("path", "VARCHAR", "executable file"),
        ("shapes", "VARCHAR", "operand shapes the Program was lowered for, as JSON (NULL when it does not record them)"),
    ),
    "instructions": (
        ("program_hash", "VARCHAR", "executable"),
        ("run", "INTEGER", "run number of the instruction trace"),
        ("flow_id", "BIGINT", "the device execution it belongs to"),
        ("preset", "VARCHAR", "preset that modeled it"),
        ("index", "INTEGER", "instruction index in the Program"),
        ("engine", "VARCHAR", "lane: TensorE, ScalarE, VectorE, GpSimd, DMA.q<n>"),
        ("kind", "VARCHAR", "instruction kind"),
        ("start_ns", "DOUBLE", "start from the execution's start (modeled)"),
        ("end_ns", "DOUBLE", "end (modeled)"),
        ("bytes", "BIGINT", "bytes moved / touched"),
        ("flops", "DOUBLE", "floating-point operations"),
        ("source", "VARCHAR", "provenance: aten op, FX node, kernel line"),
    ),
}

# Event classification: first matching row wins. (category, name prefix or None) -> (kind, side)
# kind is what analyses group by; side says which clock domain the lane belongs to.
CATEGORY_KINDS = (
    (None, "ProfilerStep", "step", "host"),
    ("cpu_op", None, "op", "host"),
    ("user_annotation", None, "annotation", "host"),
    ("python_function", None, "python", "host"),
    ("cuda_runtime", None, "launch", "host"),
    ("cuda_driver", None, "launch", "host"),
    ("hip_runtime", None, "launch", "host"),
    ("kernel", None, "kernel", "device"),
    ("gpu_memcpy", None, "memcpy", "device"),
    ("gpu_memset", None, "memset", "device"),
    ("gpu_user_annotation", None, "annotation", "device"),
    ("cuda_sync", None, "sync", "device"),
    # Meta MTIA: device work is one category; DMA transfers and stream events are told apart by name
    ("mtia_ccp_events", "dma", "memcpy", "device"),
    ("mtia_ccp_events", "event_", "sync", "device"),   # event_wait / event_record order streams: no work
    ("mtia_ccp_events", None, "kernel", "device"),
    ("mtia_runtime", None, "launch", "host"),
    # Intel XPU, Intel Gaudi (HPU) and PrivateUse1 backends: host runtime calls (their device
    # work is Kineto's kernel / gpu_memcpy / gpu_memset above)
    ("xpu_runtime", None, "launch", "host"),
    ("hpu_op", None, "launch", "host"),
    ("privateuse1_runtime", None, "launch", "host"),
    ("privateuse1_driver", None, "launch", "host"),
    ("runtime", None, "launch", "host"),         # tilescope runtime queue: execute <op>
    ("hardware", None, "kernel", "device"),      # tilescope hardware: exec_running <op>
    ("memcpy", None, "memcpy", "device"),        # tilescope host<->device copies
    ("sync", None, "sync", "host"),              # tilescope synchronize waits
)


def kind_case_sql(cat: str = "cat", name: str = "name") -> str:
    """A SQL CASE expression giving each event its kind (from CATEGORY_KINDS)."""
    arms = []
    for c, prefix, kind, _side in CATEGORY_KINDS:
        conds = []
        if c is not None:
            conds.append(f"{cat} = '{c}'")
        if prefix is not None:
            conds.append(f"starts_with({name}, '{prefix}')")
        arms.append(f"WHEN {' AND '.join(conds)} THEN '{kind}'")
    return "CASE " + " ".join(arms) + " ELSE 'other' END"
