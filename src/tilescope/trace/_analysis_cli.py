"""CLI subcommands of the analysis engine: report, diff, compare, sql, replay, ranks.

``register(sub)`` adds them to ``tilescope``'s argparse subparsers; handlers import the
engine lazily.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

__all__ = ["register"]


def _console():
    from .._console import console

    return console()  # tables that never cut a number


def _open(paths, args):
    from . import open as open_trace

    return open_trace(paths if len(paths) > 1 else paths[0], align=getattr(args, "align", "none"),
                      refresh=getattr(args, "refresh", False))


def _fail(e) -> int:
    print(f"tilescope: {e}", file=sys.stderr)
    return 2


def _quiet_warnings():
    import warnings

    from ._trace import TraceWarning

    warnings.simplefilter("ignore", TraceWarning)  # the report prints them itself


def _count(text: str) -> int:
    """An argparse type: a whole number of rows, 0 or more."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"{n} rows: give 0 or more")
    return n


def _cmd_report(args) -> int:
    from ._jsonscan import TraceFormatError
    from ._report import print_report, report_dict, to_json, write_plots

    _quiet_warnings()
    if args.plot and os.path.exists(args.plot) and not os.path.isdir(args.plot):
        return _fail(f"--plot {args.plot}: a file is there; --plot takes a directory (made if missing)")
    try:
        t = _open(args.paths, args)
    except (TraceFormatError, OSError) as e:
        return _fail(e)
    if args.json:
        print(to_json(report_dict(t, args.top)))
    else:
        print_report(t, _console(), args.top)
    if args.plot:
        for p in write_plots(t, args.plot, args.top):
            print(f"wrote {p}", file=sys.stderr if args.json else sys.stdout)
    return 0


def _cmd_diff(args) -> int:
    from ._diff import diff
    from ._labels import split_name
    from ._jsonscan import TraceFormatError
    from ._report import print_diff, to_json

    _quiet_warnings()
    try:
        named = [split_name(p) for p in args.paths]  # NAME=PATH names a column
        d = diff(*[_open([path], args) for _, path in named], names=[name for name, _ in named])
    except (TraceFormatError, OSError, ValueError) as e:
        return _fail(e)
    if args.json:
        print(to_json(d.to_dict()))
    else:
        print_diff(d, _console(), args.top)
    return 0


def _cmd_sql(args) -> int:
    from rich.table import Table

    from ._jsonscan import TraceFormatError
    from ._report import to_json

    _quiet_warnings()
    try:
        t = _open(args.paths, args)
        rel = t.sql(args.query)
    except (TraceFormatError, OSError) as e:
        return _fail(e)
    except Exception as e:  # a SQL error: show DuckDB's message, which names the column or token
        return _fail(f"SQL error: {e}")
    if rel is None:  # a statement with no result (an empty query, a SET)
        return _fail("the query returned no table; give a SELECT (see docs/trace-analysis.md for the tables)")
    rows = rel.limit(args.limit + 1).fetchall()
    cols = rel.columns
    if args.json:  # strict JSON: NaN and infinities as null
        print(to_json([{c: (None if isinstance(v, float) and not math.isfinite(v) else v) for c, v in zip(cols, r)}
                       for r in rows[:args.limit]]))
        if len(rows) > args.limit:
            print(f"(first {args.limit} rows; --limit N for more)", file=sys.stderr)
        return 0
    tab = Table()
    for c in cols:
        tab.add_column(c)
    from rich.markup import escape

    for r in rows[:args.limit]:
        tab.add_row(*[escape(str(v)) for v in r])
    con = _console()
    con.print(tab)
    if len(rows) > args.limit:
        con.print(f"(first {args.limit} rows; --limit N for more)")
    return 0


def _cmd_replay(args) -> int:
    from ._diff import diff
    from ._jsonscan import TraceFormatError
    from ._report import print_diff, to_json

    _quiet_warnings()
    try:
        t = _open([args.path], args)
        r = t.replay(args.preset)
        d = diff(t, r, names=[f"recorded ({t.preset_name() or '?'})", f"replayed ({args.preset})"])
    except (TraceFormatError, OSError, ValueError) as e:
        return _fail(e)
    if args.out:
        r.export_parquet(args.out)
    if args.json:
        print(to_json(d.to_dict()))
    else:
        con = _console()
        con.print("[bold]what-if replay[/bold]: the profile's Programs re-simulated; all device times are modeled")
        print_diff(d, con, args.top)
    return 0


def _dask_client(address: str | None):
    """A ``dask.distributed.Client`` on ``address`` (a running scheduler), or None."""
    if not address:
        return None
    try:
        from distributed import Client
    except ImportError:
        raise OSError("--scheduler needs Dask: pip install 'tilescope[distributed]' (dask[distributed])") from None
    return Client(address)


def _cmd_ranks_ingest(args) -> int:
    from ._multirank import ingest_ranks

    try:
        client = _dask_client(args.scheduler)
        ranks = ingest_ranks(args.traces, args.out, workers=args.workers, client=client)
    except (OSError, ValueError) as e:
        return _fail(e)
    print(f"{len(ranks)} ranks ({min(ranks)}..{max(ranks)}) in {args.out}/events/rank=<r>/ "
          f"(next: tilescope ranks report {args.out})")
    return 0


def _cmd_ranks_report(args) -> int:
    from ._multirank import cross_rank
    from ._report import to_json

    if args.engine != "dask" and args.scheduler:
        return _fail("--scheduler runs on Dask: add --engine dask")
    try:
        x = cross_rank(args.layout, engine=args.engine, client=_dask_client(args.scheduler),
                       straggler_threshold=args.threshold)
    except (OSError, ValueError, ImportError) as e:
        return _fail(e)
    rows = x.pop("ranks").to_pylist()
    if args.json:
        print(to_json(x | {"ranks": rows}))
        return 0
    from rich.table import Table

    from ._report import fmt_ns

    con = _console()
    cols = ("rank", "steps", "step_mean_ns", "active_ns", "idle_ns", "compute_ns", "communication_ns",
            "memory_ns", "overlap_ns")
    tab = Table(title=f"per rank ({x['engine']}; measured times from the traces)")
    for c in cols:
        tab.add_column(c.removesuffix("_ns"), justify="right")
    for r in rows:
        tab.add_row(*[str(r[c]) if c in ("rank", "steps") else fmt_ns(r[c]) for c in cols])
    con.print(tab)
    st = x["step_time"]
    con.print(f"step time over ranks: median {fmt_ns(st['median_ns'])}, min {fmt_ns(st['min_ns'])}, "
              f"max {fmt_ns(st['max_ns'])}")
    sk = x["comm_wait_skew"]
    if sk:
        con.print(f"communication wait skew: {fmt_ns(sk['skew_ns'])} (rank {sk['min_rank']} {fmt_ns(sk['min_ns'])} "
                  f"to rank {sk['max_rank']} {fmt_ns(sk['max_ns'])})")
    for s in x["stragglers"]:
        con.print(f"straggler: rank {s['rank']}, {s['reason']}: {fmt_ns(s['value_ns'])} vs median "
                  f"{fmt_ns(s['median_ns'])} ({s['off_median']:+.0%})")
    if not x["stragglers"]:
        con.print(f"no straggler (threshold {args.threshold:.0%} off the median)")
    return 0


def _fraction(text: str) -> float:
    """An argparse type: a fraction, 0 or more (0.1 = 10%)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"{v}: give 0 or more (0.1 = 10% off the median)")
    return v


def register(sub) -> None:
    """Add report / diff / compare / sql / replay / ranks to ``tilescope``'s subparsers."""
    rep = sub.add_parser("report", help="summary, top ops, device breakdown, gaps, roofline of a profile or trace")
    rep.add_argument("paths", nargs="+", help="profile directory, Kineto trace (.json/.json.gz; one per rank), or "
                                               "executable + .itrace.json pair")
    rep.add_argument("--json", action="store_true", help="print the report as JSON")
    rep.add_argument("--plot", metavar="DIR", help="write breakdown.svg and roofline.svg into DIR")
    rep.add_argument("--top", type=_count, default=15, help="rows per table (default 15; 0: all)")
    rep.add_argument("--align", choices=("none", "start"), default="none", help="align ranks' clocks at their first event")
    rep.add_argument("--refresh", action="store_true", help="re-ingest even if cached")
    rep.set_defaults(func=_cmd_report)
    for name, helptext in (("diff", "compare two or more profiles/traces: by op, by region, by fusion"),
                           ("compare", "same as diff: side-by-side summary, op and region tables, fusion findings")):
        d = sub.add_parser(name, help=helptext)
        d.add_argument("paths", nargs="+", help="two or more profiles or traces; the first is the base")
        d.add_argument("--json", action="store_true")
        d.add_argument("--top", type=_count, default=20)
        d.add_argument("--refresh", action="store_true")
        d.set_defaults(func=_cmd_diff)
    q = sub.add_parser("sql", help="run SQL over a trace's tables (events, flows, lanes, executables, instructions)")
    q.add_argument("paths", nargs="+", help="profile / trace path(s)")
    q.add_argument("query", help="SQL, e.g. \"SELECT name, sum(dur_ns) FROM events GROUP BY name ORDER BY 2 DESC\"")
    q.add_argument("--json", action="store_true")
    q.add_argument("--limit", type=_count, default=50)
    q.add_argument("--refresh", action="store_true")
    q.set_defaults(func=_cmd_sql)
    r = sub.add_parser("replay", help="re-simulate a profile's Programs on another preset and diff (what-if)")
    r.add_argument("path", help="tilescope profile directory")
    r.add_argument("--preset", required=True, help="hardware preset to replay on (see `tilescope presets`)")
    r.add_argument("--out", help="also write the replayed tables (Parquet) into this directory")
    r.add_argument("--json", action="store_true")
    r.add_argument("--top", type=_count, default=20)
    r.set_defaults(func=_cmd_replay)
    rk = sub.add_parser("ranks", help="jobs past one machine: per-rank ingest in parallel, cross-rank analyses "
                                      "on DuckDB or a Dask cluster")
    rks = rk.add_subparsers(dest="ranks_cmd", required=True)
    ri = rks.add_parser("ingest", help="ingest per-rank traces into the layout OUT/events/rank=<r>/*.parquet")
    ri.add_argument("out", help="a new folder for the layout (on storage every worker sees)")
    ri.add_argument("traces", nargs="+", help="per-rank Kineto traces, or folders of them (*.json, *.json.gz)")
    ri.add_argument("--workers", type=int, default=None, help="local processes (default: one per CPU)")
    ri.add_argument("--scheduler", metavar="ADDR", help="a Dask scheduler (tcp://host:8786): one task per file")
    ri.set_defaults(func=_cmd_ranks_ingest)
    rr = rks.add_parser("report", help="per-rank step time, idle / compute / communication, stragglers, wait skew")
    rr.add_argument("layout", help="a folder ingest (or Trace.export_parquet) wrote")
    rr.add_argument("--engine", choices=("duckdb", "dask"), default="duckdb",
                    help="duckdb: embedded, this machine (default); dask: one task per rank")
    rr.add_argument("--scheduler", metavar="ADDR", help="with --engine dask: a running scheduler (tcp://host:8786); "
                                                        "without it a local cluster is started")
    rr.add_argument("--threshold", type=_fraction, default=0.1, help="straggler threshold off the median (0.1)")
    rr.add_argument("--json", action="store_true")
    rr.set_defaults(func=_cmd_ranks_report)
