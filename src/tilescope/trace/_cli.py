"""CLI subcommands of the analysis engine: report, diff, compare, sql, replay.

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
    from rich.console import Console

    return Console()


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


def register(sub) -> None:
    """Add report / diff / compare / sql / replay to ``tilescope``'s subparsers."""
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
