"""The explorer's HTTP server: the standard library's threaded server, local-first.

* binds 127.0.0.1 by default; any other address requires a random token (``?token=`` once,
  then an HttpOnly same-site cookie), compared in constant time;
* on a loopback address the ``Host`` header must name a loopback host, so a web page cannot
  reach the explorer through DNS rebinding;
* serves the package's ``static/`` files from a list made at start (no path from the URL
  ever reaches the file system) and the API (:mod:`._api`), which reads only the opened
  profiles;
* GET and HEAD only; responses carry ``no-store``, ``nosniff``, a same-origin content
  security policy and ``no-referrer`` (the token never leaks in a Referer header);
* one thread per connection, and nothing any request holds is needed by another (see
  :mod:`._work`); a watcher notices an API request whose client went away (the browser
  aborted the fetch or left the page) and cancels it: its query is interrupted, nothing is
  sent, and ``cancelled`` counts it.
"""

from __future__ import annotations

import gzip
import hmac
import ipaddress
import os
import secrets
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from ._api import CANCELLED, Response, handle, to_json
from ._work import Token, using

__all__ = ["ExplorerServer", "make_server", "is_loopback", "STATIC_DIR"]

STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
          ".svg": "image/svg+xml", ".png": "image/png", ".txt": "text/plain; charset=utf-8", ".json": "application/json"}
_CSP = ("default-src 'self'; img-src 'self' data: blob:; style-src 'self' 'unsafe-inline'; script-src 'self'; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
COOKIE = "tilescope_token"
# The explorer's process hands the GIL between threads every 0.5 ms instead of Python's 5 ms:
# a click's request (many short numpy calls, each releasing the GIL) otherwise waits up to 5 ms
# for it after each call while a background analysis runs Python code -- with one such thread,
# a click's p95 went from about 100 ms to 40 ms on the HTA control trace.
GIL_SWITCH_S = 0.0005


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``."""
    h = host.strip("[]")
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def _static_files(top: str = STATIC_DIR) -> dict[str, str]:
    """URL name -> file, for every file under ``top`` (made once; requests only look names up)."""
    out = {}
    for root, _dirs, files in os.walk(top):
        for f in files:
            full = os.path.join(root, f)
            rel = os.path.relpath(full, top).replace(os.sep, "/")
            out[rel] = full
    return out


class ExplorerServer(ThreadingHTTPServer):
    """A threaded HTTP server holding the session, the token and the static file list."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, addr, session, *, token: str | None, quiet: bool = True, static_dir: str = STATIC_DIR):
        host = addr[0]
        self.address_family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
        super().__init__((host.strip("[]"), addr[1]), _Handler)
        self.session = session
        self.token = token
        self.loopback = is_loopback(host)
        self.quiet = quiet
        self.static = _static_files(static_dir)
        self.cancelled = 0  # API requests cancelled because their client went away
        self._inflight: dict = {}  # socket -> Token of the API request it is waiting for
        self._watch_lock = threading.Lock()
        self._watcher: threading.Thread | None = None

    # ---- cancelling requests whose client went away ------------------------------------------
    def watch(self, sock, token: Token) -> None:
        with self._watch_lock:
            self._inflight[sock] = token
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._watch_loop, name="tilescope-explorer-watch", daemon=True)
                self._watcher.start()

    def unwatch(self, sock) -> None:
        with self._watch_lock:
            self._inflight.pop(sock, None)

    def _watch_loop(self) -> None:
        while True:
            time.sleep(0.02)
            with self._watch_lock:
                items = list(self._inflight.items())
            if not items:
                continue
            try:
                ready, _, bad = select.select([s for s, _t in items], [], [s for s, _t in items], 0)
            except (OSError, ValueError):  # a socket closed meanwhile: check them one by one below
                ready, bad = [s for s, _t in items], []
            for s, tok in items:
                if s not in ready and s not in bad:
                    continue
                try:
                    gone = s in bad or s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
                except BlockingIOError:
                    gone = False
                except OSError:
                    gone = True
                if gone and not tok.cancelled:
                    tok.cancel()
                    with self._watch_lock:
                        self.cancelled += 1

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        shown = f"[{host}]" if ":" in host else host
        if host in ("0.0.0.0", "::"):
            shown = socket.gethostname()
        return f"http://{shown}:{port}/" + (f"?token={self.token}" if self.token else "")

    def serve_in_thread(self) -> threading.Thread:
        th = threading.Thread(target=self.serve_forever, name="tilescope-explorer", daemon=True)
        th.start()
        return th


def make_server(session, host: str = "127.0.0.1", port: int = 8765, *, token: str | None = None,
                quiet: bool = True, static_dir: str = STATIC_DIR) -> ExplorerServer:
    """A server for ``session`` on ``host:port`` (port 0: a free port). A token is made when
    ``host`` is not a loopback address (pass one to choose it); on loopback none is needed.
    ``static_dir``: the front end's files (another version's, to compare two front ends on
    one session, as ``benchmarks/explorer_scale.py --reference-static`` does)."""
    if not is_loopback(host) and not token:
        token = secrets.token_urlsafe(24)
    try:
        return ExplorerServer((host, port), session, token=token, quiet=quiet, static_dir=static_dir)
    except OSError as e:
        if e.errno in (98, 48, 10048):  # address in use (Linux, macOS, Windows)
            raise OSError(e.errno, f"port {port} on {host} is in use; pass --port N for another port, "
                                   f"or --port 0 for any free one") from None
        if e.errno in (99, 49, -2, -3):
            raise OSError(e.errno, f"cannot bind {host!r}: not an address of this machine; "
                                   f"use --host 127.0.0.1 (default) or one of its addresses") from None
        raise


class _Handler(BaseHTTPRequestHandler):
    server: ExplorerServer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # small responses leave at once (no 40 ms wait for a delayed ACK)
    server_version = "tilescope-explorer"
    sys_version = ""

    def log_message(self, fmt, *args):  # noqa: D401 - quiet unless asked
        if not self.server.quiet:
            super().log_message(fmt, *args)

    # ---- plumbing -----------------------------------------------------------------------
    def _send(self, r: Response, head: bool = False, extra: dict | None = None) -> None:
        body = r.body
        headers = dict(r.headers)
        if (r.content_type.startswith(("application/json", "text/")) and len(body) > 32 << 10
                and "gzip" in (self.headers.get("Accept-Encoding") or "")):
            body = gzip.compress(body, 5)
            headers["Content-Encoding"] = "gzip"
        self.send_response(r.status)
        self.send_header("Content-Type", r.content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("Content-Security-Policy", _CSP)
        for k, v in {**headers, **(extra or {})}.items():
            self.send_header(k, v)
        # headers and body in one write: one send, no small trailing segment
        self._headers_buffer.append(b"\r\n")
        self.wfile.write(b"".join(self._headers_buffer) + (b"" if head else body))
        self._headers_buffer = []

    def _deny(self, status: int, message: str, fix: str, head: bool = False) -> None:
        if self.path.startswith("/api/"):
            r = Response(status, to_json({"error": message, "fix": fix}), "application/json")
        else:
            html = (f"<!doctype html><meta charset=utf-8><title>tilescope explorer</title>"
                    f"<body style='font-family:sans-serif;margin:3em'><h1>tilescope explorer</h1>"
                    f"<p>{_esc(message)}</p><p><b>Fix:</b> {_esc(fix)}</p>")
            r = Response(status, html.encode(), "text/html; charset=utf-8")
        self._send(r, head)

    def _authorised(self, query: dict) -> tuple[bool, bool]:
        """(allowed, token came in the URL)."""
        tok = self.server.token
        if tok is None:
            return True, False
        given = (query.get("token") or [None])[0]
        if given and hmac.compare_digest(given.encode(), tok.encode()):
            return True, True
        for part in (self.headers.get("Cookie") or "").split(";"):
            k, _, v = part.strip().partition("=")
            if k == COOKIE and hmac.compare_digest(v.encode(), tok.encode()):
                return True, False
        return False, False

    def _host_ok(self) -> bool:
        if not self.server.loopback:
            return True  # the token protects non-loopback addresses
        host = (self.headers.get("Host") or "").strip()
        if host.startswith("["):
            name = host[1:host.find("]")] if "]" in host else host
        else:
            name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
        return is_loopback(name)

    # ---- requests -----------------------------------------------------------------------
    def do_HEAD(self):
        self._get(head=True)

    def do_GET(self):
        self._get(head=False)

    def _get(self, head: bool) -> None:
        try:
            u = urlsplit(self.path)
            query = parse_qs(u.query, keep_blank_values=True)
            if not self._host_ok():
                return self._deny(403, f"unexpected Host header {self.headers.get('Host')!r} for a loopback server",
                                  "open the explorer at http://127.0.0.1:PORT/ (or localhost)", head)
            ok, via_url = self._authorised(query)
            if not ok:
                return self._deny(403, "this explorer is served on a non-loopback address and needs its token",
                                  "open the URL printed by `tilescope explore` (it ends with ?token=...)", head)
            extra = {}
            if via_url:
                extra["Set-Cookie"] = f"{COOKIE}={self.server.token}; HttpOnly; SameSite=Strict; Path=/"
            path = u.path
            if path.startswith("/api/"):
                t0 = time.perf_counter()
                token = Token()
                self.server.watch(self.connection, token)
                try:
                    with using(token):
                        r = handle(self.server.session, path, query)
                finally:
                    self.server.unwatch(self.connection)
                if r.status == CANCELLED:  # the client is gone: nothing to send
                    self.close_connection = True
                    return None
                extra["Server-Timing"] = f"app;dur={(time.perf_counter() - t0) * 1e3:.1f}"
                return self._send(r, head, extra)
            if path in ("/", "/index.html"):
                name = "index.html"
            elif path.startswith("/static/"):
                name = path[len("/static/"):]
            elif path == "/favicon.ico":
                name = "favicon.svg"
            else:
                return self._deny(404, f"nothing at {path!r}", "open / for the explorer", head)
            full = self.server.static.get(name)  # a lookup: no URL text reaches the file system
            if full is None:
                return self._deny(404, f"no static file {name!r}", "open / for the explorer", head)
            with open(full, "rb") as f:
                data = f.read()
            ctype = _TYPES.get(os.path.splitext(full)[1], "application/octet-stream")
            return self._send(Response(200, data, ctype), head, extra)
        except (BrokenPipeError, ConnectionResetError):
            return None
        except Exception as e:  # a bug must answer 500 with the reason, not drop the connection
            try:
                self._send(Response(500, to_json({"error": f"{type(e).__name__}: {e}",
                                                  "fix": "this is a tilescope bug; please report it with the request"}),
                                    "application/json"), head)
            except OSError:
                pass
            return None

    def _method_not_allowed(self):
        self._send(Response(405, to_json({"error": f"{self.command} is not supported", "fix": "the explorer is read-only: GET"}),
                            "application/json"), extra={"Allow": "GET, HEAD"})

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _method_not_allowed


def _esc(s: str) -> str:
    return (str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;"))
