"""Stream a Chrome trace file into newline-delimited JSON, one event per line, in bounded memory.

Chrome/Kineto traces are one JSON document (``{"traceEvents": [...], ...}`` or a bare
``[...]`` array), usually pretty-printed over many lines per event, which JSON readers
cannot split. This scanner finds the structure with numpy over fixed-size blocks
(quotes, escapes, brackets), never building a Python object per event:

* bytes inside the ``traceEvents`` array are re-emitted with every raw newline made a
  space (JSON forbids raw newlines inside strings, so this changes no value) and every
  top-level comma of the array made a newline: newline-delimited JSON that DuckDB's
  parallel reader ingests;
* every byte outside that array (``deviceProperties``, ``distributedInfo``, ...) is kept
  as a *skeleton* document and parsed once at the end (it is small).

>>> import io
>>> out = io.BytesIO()
>>> s = ChromeTraceScanner("t.json", out.write)
>>> s.feed(b'{"schemaVersion": 1, "traceEvents": [\\n {"ph": "X",\\n  "name": "a"},\\n {"ph": "i"}\\n]}')
>>> s.finish()
>>> out.getvalue().split(b"\\n")[:2]
[b'  {"ph": "X",   "name": "a"}', b'  {"ph": "i"} ']
>>> s.events, s.metadata
(2, {'schemaVersion': 1, 'traceEvents': []})
"""

from __future__ import annotations

import json
import re
import sys

import numpy as np

from ..errors import TilescopeError

__all__ = ["ChromeTraceScanner", "TraceFormatError"]


class TraceFormatError(TilescopeError, ValueError):
    """A file is not a readable trace. The message names the file and the byte offset or field."""


# byte -> class, applied with bytes.translate (one C pass): 1 quote, 2 backslash,
# 3 opening bracket, 4 closing bracket, 5 comma, 6 colon, 0 anything else
_CLASS = bytearray(256)
_CLASS[ord('"')] = 1
_CLASS[ord("\\")] = 2
_CLASS[ord("{")] = _CLASS[ord("[")] = 3
_CLASS[ord("}")] = _CLASS[ord("]")] = 4
_CLASS[ord(",")] = 5
_CLASS[ord(":")] = 6
_CLASS = bytes(_CLASS)
_DELTA = np.array([0, 0, 0, 1, -1, 0, 0], dtype=np.int64)
_NL_TO_SPACE = bytes.maketrans(b"\n\r", b"  ")
_FAST = bytes.maketrans(b"\n\r\x00", b"  \n")  # NUL marks a boundary: JSON text never holds a raw NUL
_FAST_TAIL_LIMIT = 64 << 20
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*$')
_WS = b" \t\r\n"
_SKELETON_LIMIT = 256 << 20  # bytes kept outside the events array before giving up on them


class ChromeTraceScanner:
    """Feed blocks of a Chrome trace; events go to ``emit`` as NDJSON, the rest is kept.

    After :meth:`finish`: ``events`` (complete events emitted), ``metadata`` (the
    top-level object without its events), ``warnings`` (list of strings) and
    ``truncated`` (the file ended before the document did).
    """

    def __init__(self, name: str, emit, fast: bool = True, native=None):
        self.name = name
        self.fast = fast and native is None
        self._native = native  # a NativeEvents: parses the events array itself (see _native_ingest.py)
        self._native_on = False
        self._sep: bytes | None = None  # the learned separator between two events, e.g. b"},\n  {"
        self._fast_on = False
        self._fast_used = False
        self.events_uncounted = False  # the fast path does not count events (DuckDB does)
        self._ftail = bytearray()
        self._raw_tail_start: int | None = None
        self._emit = emit
        self.offset = 0  # bytes consumed so far (of the decompressed stream)
        self.events = 0
        self.metadata: dict = {}
        self.warnings: list[str] = []
        self.truncated = False
        self._depth = 0
        self._in_string = False
        self._trailing_bs = 0
        self._top: bytes | None = None  # b"{" or b"["
        self._ev_depth = 0  # depth of the events array's interior
        self._in_events = False
        self._events_seen = False
        self._closed = False  # top-level document closed
        self._tail = bytearray()  # bytes of the event in progress
        self._tail_depth_ok = True
        self._skeleton = bytearray()
        self._skeleton_overflow = False

    # ---- helpers ----------------------------------------------------------------
    def _fail(self, offset: int, what: str) -> None:
        raise TraceFormatError(f"{self.name}: byte offset {offset:,}: {what}")

    def _skel(self, data) -> None:
        if self._skeleton_overflow:
            return
        if len(self._skeleton) + len(data) > _SKELETON_LIMIT:
            self._skeleton_overflow = True
            self.warnings.append(
                f"{self.name}: more than {_SKELETON_LIMIT >> 20} MiB outside 'traceEvents'; "
                f"that part (trace metadata) was not read"
            )
            return
        self._skeleton += data

    def _unescaped(self, idx: np.ndarray, k: np.ndarray, isq: np.ndarray) -> np.ndarray:
        """Drop quotes preceded by an odd run of backslashes (rare: a short Python loop)."""
        isq = isq.copy()
        cand = np.flatnonzero(isq)
        cand = cand[(cand > 0) & (k[np.maximum(cand - 1, 0)] == 2) & (idx[np.maximum(cand - 1, 0)] == idx[cand] - 1)]
        for j in cand.tolist():
            run, m = 0, j - 1
            while m >= 0 and k[m] == 2 and idx[m] == idx[j] - run - 1:
                run += 1
                m -= 1
            if m < 0 and idx[j] == run:  # the run reaches the block start
                run += self._trailing_bs
            if run % 2:
                isq[j] = False
        if self._trailing_bs % 2 and idx.size and idx[0] == 0 and k[0] == 1:
            isq[0] = False
        return isq

    # ---- the scan ------------------------------------------------------------------
    def feed(self, block: bytes) -> None:
        """Scan one block (any size; blocks may split tokens anywhere)."""
        if not block:
            return
        if self._native_on:
            self._feed_native(block)
            return
        if self._fast_on:
            self._feed_fast(block)
            return
        self._raw_tail_start = None
        self._feed_exact(block)
        if (self.fast and self._in_events and self._sep is not None
                and self._raw_tail_start is not None and block.find(b"\x00") < 0):
            self._fast_on = True
            self._fast_used = True
            self._ftail = bytearray(block[self._raw_tail_start:])
            self._tail = bytearray()

    # Fast path: once the separator between two events is known (e.g. b"},\n  {" in Kineto's
    # pretty print, b"},{" in compact JSON), every occurrence is taken for a boundary. A wrong
    # one (inside a string, or deeper in an event) always leaves at least one line that is not
    # a JSON object (an unterminated string or unbalanced brackets); DuckDB reads such a line
    # as a row of NULLs, and the caller then re-reads the file in exact mode. So a block needs
    # only bytes.replace + translate.
    def _feed_fast(self, block: bytes) -> None:
        if block.find(b"\x00") >= 0:
            self._leave_fast(block)
            return
        self.offset += len(block)
        sep = self._sep
        k = len(sep) - 1
        r = block.rfind(sep)
        junction = bytes(self._ftail[-k:]) + block[:k]
        if r < 0 or sep in junction:
            # rare: no separator in this block, or one straddles the previous block's end
            data = self._ftail + block
            r = data.rfind(sep)
            if r < 0:
                self._ftail = data
                if len(data) > _FAST_TAIL_LIMIT:
                    self._leave_fast(b"")
                return
            head = bytes(data[:r + 1])
            self._emit(head.replace(sep, b"}\x00{").translate(_FAST))
            self._emit(b"\n")
            self._ftail = data[r + k:]
            self.events_uncounted = True
            return
        # common case, three passes over the block: replace, translate, write
        out = block.replace(sep, b"}\x00{").translate(_FAST)
        q = out.rfind(b"}\n{")
        if self._ftail:
            self._emit(bytes(self._ftail).translate(_FAST))
        self._emit(memoryview(out)[:q + 1])
        self._emit(b"\n")
        self._ftail = bytearray(block[r + k:])
        self.events_uncounted = True

    @property
    def mode(self) -> str:
        """``native`` if the C parser read the events, ``fast`` if the separator path did, else ``exact``."""
        if self._native is not None:
            return "native"
        return "fast" if self._fast_used else "exact"

    def _leave_fast(self, block: bytes, final: bool = False) -> None:
        """Resume the exact scan at the last boundary (state there is known: depth of the array)."""
        data = bytes(self._ftail) + block
        self._fast_on = False
        self._ftail = bytearray()
        self.offset -= len(data) - len(block)
        self._depth = self._ev_depth
        self._in_string = False
        self._trailing_bs = 0
        self._tail = bytearray()
        if not final:
            self._sep = None
            self.fast = False
        self._feed_exact(data)

    def _feed_exact(self, block: bytes) -> None:
        base = self.offset
        if self._top is None:
            stripped = block.lstrip(_WS + b"\xef\xbb\xbf")
            if not stripped:
                self.offset += len(block)
                return
            first = stripped[:1]
            if first not in (b"{", b"["):
                at = base + len(block) - len(stripped)
                self._fail(at, f"expected a JSON object or array (a Chrome trace), found {stripped[:16]!r}")
            self._top = first
            self._ev_depth = 2 if first == b"{" else 1
        b = np.frombuffer(block, dtype=np.uint8)
        cls = np.frombuffer(block.translate(_CLASS), dtype=np.uint8)
        idx = np.flatnonzero(cls)
        k = cls[idx]
        isq = k == 1
        if self._trailing_bs or block.find(b"\\") >= 0:
            isq = self._unescaped(idx, k, isq)
        n_bs = len(block) - len(block.rstrip(b"\\"))
        self._trailing_bs = (self._trailing_bs + n_bs) if n_bs == len(block) else n_bs
        s0 = 1 if self._in_string else 0
        parity = np.cumsum(isq, dtype=np.int64)
        outside = ((parity + s0) % 2 == 0) & (k >= 3)
        self._in_string = ((int(parity[-1]) if parity.size else 0) + s0) % 2 == 1
        sp = idx[outside]
        ch = b[sp]
        delta = _DELTA[k[outside]]
        after = self._depth + np.cumsum(delta)
        before = after - delta
        if after.size and after.min() < 0:
            bad = int(sp[np.argmax(after < 0)])
            self._fail(base + bad, f"unbalanced {chr(b[bad])!r} (more closing than opening brackets)")
        ctrl = np.flatnonzero(np.minimum(before, after) < self._ev_depth)
        cursor = 0  # first byte of the block not yet routed
        for k in ctrl.tolist():
            p = int(sp[k])
            c = block[p:p + 1]
            d0, d1 = int(before[k]), int(after[k])
            if self._closed:
                self._fail(base + p, "data after the end of the trace document")
            if self._in_events:
                # the only control char inside the events region is the one closing it
                self._route_events(block, b, sp, ch, before, cursor, p, closing=True)
                self._in_events = False
                self._skel(block[p:p + 1])
                cursor = p + 1
                if d1 == 0:
                    self._closed = True
            elif c == b"[" and d1 == self._ev_depth and (
                self._top == b"[" or _EVENTS_KEY.search(self._skeleton[-512:] + block[cursor:p])
            ):
                if self._events_seen:
                    self._fail(base + p, "a second 'traceEvents' array")
                self._skel(block[cursor:p + 1])
                self._in_events = True
                self._events_seen = True
                cursor = p + 1
                if self._native is not None:
                    # the array's elements go to the native parser from here on
                    self._depth, self._in_string, self._trailing_bs = self._ev_depth, False, 0
                    self.offset = base + cursor
                    self._native_on = True
                    self._feed_native(block[cursor:])
                    return
            elif d1 == 0 and d0 == 1:
                self._skel(block[cursor:p + 1])
                cursor = p + 1
                self._closed = True
        if self._in_events:
            self._route_events(block, b, sp, ch, before, cursor, len(block), closing=False)
        else:
            rest = block[cursor:]
            if self._closed and rest.strip(_WS):
                self._fail(base + cursor + len(rest) - len(rest.lstrip(_WS)), "data after the end of the trace document")
            self._skel(rest)
        if after.size:
            self._depth = int(after[-1])
        self.offset += len(block)

    def _feed_native(self, data: bytes) -> None:
        """Hand bytes inside the events array to the native parser; resume the exact scan
        after the array's closing bracket."""
        ended = self._native.feed(data, self.offset)
        self.events = self._native.events
        if ended < 0:
            self.offset += len(data)
            return
        self._native_on = False
        self._in_events = False
        self._skel(b"]")
        self._depth = self._ev_depth - 1
        self._closed = self._depth == 0
        self.offset += ended
        self._feed_exact(data[ended:])

    def _route_events(self, block, b, sp, ch, before, start: int, end: int, closing: bool) -> None:
        """Emit the events among block[start:end] (inside the events array)."""
        lo, hi = np.searchsorted(sp, [start, end])
        seg_sp = sp[lo:hi]
        commas = seg_sp[(ch[lo:hi] == 44) & (before[lo:hi] == self._ev_depth)] - start
        seg = bytearray(block[start:end].translate(_NL_TO_SPACE))
        if commas.size:
            view = np.frombuffer(seg, dtype=np.uint8)
            view[commas] = 10
            last = int(commas[-1])
            self._raw_tail_start = start + last + 1
            if self.fast and self._sep is None:
                c = start + last
                a, z = block.rfind(b"}", 0, c), block.find(b"{", c)
                if a >= 0 and z > 0:
                    sep = block[a:z + 1]
                    if not sep[1:-1].replace(b",", b"", 1).strip(_WS):
                        self._sep = sep
            head = self._tail + seg[:last + 1] if self._tail else seg[:last + 1]
            self._emit(bytes(head))
            self.events += int(commas.size)
            self._tail = bytearray(seg[last + 1:])
        else:
            self._tail += seg
        if closing:
            if self._tail.strip(_WS):
                self._emit(bytes(self._tail) + b"\n")
                self.events += 1
            self._tail = bytearray()

    def finish(self) -> None:
        """Close the scan: parse the skeleton, and report truncation."""
        if self._fast_on:
            self._leave_fast(b"", final=True)
        if self._top is None:
            raise TraceFormatError(f"{self.name}: empty file (0 bytes of JSON); expected a Chrome trace")
        if self._in_events:
            self.truncated = True
            if self._native_on:
                dropped = self._native.finish()
                self.events = self._native.events
            else:
                tail = bytes(self._tail).strip(_WS)
                complete = tail.endswith(b"}") and self._depth == self._ev_depth and not self._in_string
                if complete:
                    self._emit(bytes(self._tail) + b"\n")
                    self.events += 1
                dropped = bool(tail) and not complete
            self.warnings.append(
                f"{self.name}: the file ends inside 'traceEvents' at byte offset {self.offset:,} "
                f"(truncated?): kept the {self.events:,} complete events"
                + (", dropped the incomplete last one" if dropped else "")
            )
            self._tail = bytearray()
            if self._top == b"{" and not self._skeleton_overflow:
                # the header before the array (deviceProperties, distributedInfo -> rank) is
                # whole: close the array and the document and read it
                self.metadata = self._parse_metadata(bytes(self._skeleton).rstrip(_WS) + b"]}")
            return
        if not self._events_seen and self._top == b"{":
            keys = []
            try:
                doc = json.loads(bytes(self._skeleton))
                keys = list(doc)
            except (ValueError, TypeError, RecursionError):
                doc = {}
            if isinstance(doc, dict) and "traceEvents" in doc:
                raise TraceFormatError(
                    f"{self.name}: field 'traceEvents' is a {type(doc['traceEvents']).__name__}, "
                    f"expected an array of events"
                )
            raise TraceFormatError(
                f"{self.name}: JSON without a 'traceEvents' array, so not a Chrome/Kineto trace "
                f"(top-level keys: {', '.join(keys) or 'none readable'})"
            )
        if self._top == b"[":
            if not self._closed:
                self.truncated = True
            self.metadata = {}
            return
        if not self._closed:
            self.truncated = True
            self.warnings.append(
                f"{self.name}: the document is not closed at byte offset {self.offset:,} "
                f"(truncated after 'traceEvents'); trace metadata may be incomplete"
            )
            text = bytes(self._skeleton).rstrip(_WS + b",") + b"}" * max(self._depth, 1)
        else:
            text = bytes(self._skeleton)
        if self._skeleton_overflow:
            return
        self.metadata = self._parse_metadata(text)

    def _parse_metadata(self, text: bytes) -> dict:
        """The top-level object outside the events (a warning, and {}, when it is not JSON)."""
        try:
            meta = json.loads(text.decode("utf-8", errors="replace"))
        except ValueError as e:
            self.warnings.append(f"{self.name}: trace metadata outside 'traceEvents' is not valid JSON ({e}); ignored")
            meta = {}
        except RecursionError:
            self.warnings.append(f"{self.name}: trace metadata outside 'traceEvents' nests deeper than the JSON "
                                 f"reader follows ({sys.getrecursionlimit():,} levels); ignored")
            meta = {}
        return meta if isinstance(meta, dict) else {}
