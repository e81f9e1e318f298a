"""``tilescope explore``: open profiles and serve the explorer (or print one API answer)."""

from __future__ import annotations

import os
import socket
import sys
import time

__all__ = ["register"]


def register(sub) -> None:
    p = sub.add_parser(
        "explore", help="browse profiles and traces in a local web app (system trace, lifecycle, device view, compare)",
        description="Serve a local web app over profile directories, Kineto traces (.json/.json.gz), directories of "
                    "per-rank traces, or EXEC.json+ITRACE.json pairs. Binds 127.0.0.1 unless --host says otherwise "
                    "(then a token is required).")
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="profiles or traces (NAME=PATH names one); two or more can be compared")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 picks a free one)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1; any other address requires the printed token)")
    p.add_argument("--sources", action="append", default=[], metavar="DIR",
                   help="directory that kernel source paths are relative to, for the code view (repeatable)")
    p.add_argument("--json", metavar="API_PATH",
                   help="print one API answer and exit, e.g. --json /api/p/p0/summary (the data the page shows)")
    p.add_argument("--verbose", action="store_true", help="log every request")
    p.set_defaults(func=_cmd_explore)


def _cmd_explore(args) -> int:
    if not 0 <= args.port <= 65535:
        print(f"tilescope explore: --port {args.port} is not a port number (0..65535)", file=sys.stderr)
        return 2
    from ._session import Session

    t0 = time.perf_counter()
    session = Session(args.paths, source_dirs=args.sources)
    if args.json:
        return _print_json(session, args.json)
    for s in session.sources:
        if s.ok:
            print(f"  {s.id}  {s.label}: {s.index.n:,} events, {s.label_text()} "
                  f"(ready in {s.load_seconds:.1f} s{', index from cache' if s.index.loaded_from_cache else ''})")
        else:
            print(f"  {s.id}  cannot open {s.path}\n        {s.error}\n        fix: {s.fix}", file=sys.stderr)
    if not any(s.ok for s in session.sources):
        print("tilescope explore: none of the paths could be opened; the page shows why", file=sys.stderr)
    from ._server import GIL_SWITCH_S, make_server

    try:
        server = make_server(session, args.host, args.port, quiet=not args.verbose)
    except OSError as e:
        print(f"tilescope explore: {e.strerror or e}", file=sys.stderr)
        return 2
    port = server.server_address[1]
    sys.setswitchinterval(GIL_SWITCH_S)  # clicks answer while the analyses below compute
    session.warm_up()
    print(f"tilescope explorer ready in {time.perf_counter() - t0:.1f} s: {server.url}")
    if server.token:
        print(f"  bound to {args.host}: anyone who can reach this address needs the token in the URL above")
    user = os.environ.get("USER") or "USER"
    print(f"  from another machine: ssh -N -L {port}:127.0.0.1:{port} {user}@{socket.gethostname()}"
          f"  then open http://127.0.0.1:{port}/" + (f"?token={server.token}" if server.token else ""))
    if server.token is None:
        print("  (the explorer listens on 127.0.0.1 only; the SSH tunnel is the safe way to reach it remotely)")
    print("  Ctrl-C stops it.", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("\ntilescope explore: stopped")
    finally:
        server.server_close()
    return 0


def _print_json(session, path: str) -> int:
    from urllib.parse import parse_qs, urlsplit

    from ._api import handle

    u = urlsplit(path if path.startswith("/") else "/" + path)
    r = handle(session, u.path, parse_qs(u.query))
    if r.content_type == "application/octet-stream":
        from ._api import to_json
        from ._binary import unpack

        head, arrays = unpack(r.body)
        sys.stdout.write(to_json({"header": head, "arrays": {k: v.tolist() for k, v in arrays.items()}}).decode() + "\n")
    else:
        sys.stdout.write(r.body.decode("utf-8", "replace") + ("\n" if not r.body.endswith(b"\n") else ""))
    return 0 if r.status == 200 else 1
