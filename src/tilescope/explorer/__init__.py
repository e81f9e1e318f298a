"""The browser explorer: a local web app over the analysis engine.

``tilescope explore PATH [PATH ...]`` opens profile directories, Kineto traces, directories
of per-rank traces or executable + instruction-trace pairs, and serves a viewer on
127.0.0.1: system trace lanes, an op's whole lifecycle, the device view of one execution,
tables, summary, roofline and comparison. The same data is available without a browser:

>>> from tilescope.explorer import Session, api                                  # doctest: +SKIP
>>> s = Session(["tests/data/kineto/cuda_alexnet_small.json.gz"])         # doctest: +SKIP
>>> api(s, "/api/p/p0/summary")["label"]                                        # doctest: +SKIP
'measured on NVIDIA A100-PG509-200, as recorded in the trace; ...'

The explorer reads the analysis engine (``tilescope.trace``), never the device.
"""

from __future__ import annotations

__all__ = ["Session", "make_server", "api", "serve"]


def __getattr__(name):
    if name == "Session":
        from ._session import Session

        return Session
    if name == "make_server":
        from ._server import make_server

        return make_server
    raise AttributeError(f"module 'tilescope.explorer' has no attribute {name!r}")


def api(session, path: str, **query):
    """Call one API endpoint in-process: JSON endpoints return the decoded object, packed ones
    ``(header, arrays)``; an error raises ``ValueError`` with the message and the fix."""
    import json
    from urllib.parse import parse_qs, urlsplit

    from ._api import handle
    from ._binary import unpack

    u = urlsplit(path)
    q = parse_qs(u.query)
    q.update({k: [str(v)] for k, v in query.items()})
    r = handle(session, u.path, q)
    if r.status != 200:
        err = json.loads(r.body)
        raise ValueError(f"{err['error']} (fix: {err['fix']})")
    if r.content_type == "application/octet-stream":
        return unpack(r.body)
    if r.content_type == "application/json":
        return json.loads(r.body)
    return r.body


def serve(paths, *, host: str = "127.0.0.1", port: int = 8765, source_dirs=None, quiet: bool = True):
    """Open ``paths`` and serve them until interrupted (what ``tilescope explore`` runs)."""
    from ._session import Session
    from ._server import make_server

    server = make_server(Session(list(paths), source_dirs=source_dirs), host, port, quiet=quiet)
    try:
        server.serve_forever()
    finally:
        server.server_close()
