"""The kernel being traced, and the ``builtin`` decorator every language call goes through.

While a kernel is traced, one :class:`KernelContext` is active (per thread). A
builtin looks it up, records the user's source line as the provenance of the
instructions it emits, and turns any tilescope error it raises into one that
names that line. Outside a kernel, a builtin raises a :class:`KernelError`
that says so.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from dataclasses import dataclass

from ..errors import KernelError, TilescopeError
from ..isa import AP, Matmul, Memset
from ..program import Provenance
from ._frames import display_path, locate, user_frame

__all__ = ["KernelContext", "BufState", "builtin", "current", "active", "maybe_current"]

_local = threading.local()


def maybe_current() -> "KernelContext | None":
    return getattr(_local, "ctx", None)


def current(name: str = "this call") -> "KernelContext":
    ctx = getattr(_local, "ctx", None)
    if ctx is None:
        raise _outside(name)
    return ctx


def _outside(name: str) -> KernelError:
    err = KernelError(
        f"{name}() was called outside a tile kernel: language calls work only while a "
        f"@tilescope.kernel function is traced (run it with tilescope.simulate(kernel, *arrays)). "
        f"Did you forget the @tilescope.kernel decorator, or keep a tile after the kernel returned?")
    return locate(err, user_frame(3))


@contextlib.contextmanager
def active(ctx: "KernelContext"):
    outer = getattr(_local, "ctx", None)
    if outer is not None:
        raise KernelError(f"kernel {ctx.kernel!r} is traced while kernel {outer.kernel!r} is being traced; "
                          f"call a kernel's function from another kernel instead of simulating it")
    _local.ctx = ctx
    try:
        yield ctx
    finally:
        _local.ctx = None


class BufState:
    """What the tracer knows about one on-chip buffer.

    ``fill``: a constant the buffer is still to be filled with (``tl.zeros``),
    emitted only if something reads it or writes part of it first. ``temp``: made
    by an operation (not by ``tl.ndarray``/``tl.zeros``), so its one writer may be
    retargeted into the tile it is assigned to.
    """

    __slots__ = ("name", "size", "nbytes", "fill", "fill_prov", "writes", "read", "writer", "temp", "acc_open")

    def __init__(self, name: str, size: int, nbytes: int, temp: bool):
        self.name = name
        self.size = size
        self.nbytes = nbytes
        self.fill: float | None = None
        self.fill_prov: Provenance | None = None
        self.writes = 0
        self.read = False
        self.writer = -1
        self.temp = temp
        self.acc_open: set = set()  # PSUM regions a matmul accumulation group is open on


class BufStates(dict):
    """Buffer name -> :class:`BufState`; the states of buffers written by loop replication
    are kept as records (``pending``, by buffer id) and made when first asked for: an outer
    loop's replicas give thousands, of which a kernel touches few again."""

    def __init__(self, builder):
        super().__init__()
        self.b = builder
        self.pending: dict[int, tuple] = {}  # buffer id -> record (see record)

    @staticmethod
    def record(st: BufState, writer: int) -> tuple:
        """What a state copied to a replica holds (the replica's own ``writer``)."""
        return (st.size, st.nbytes, st.temp, st.fill, st.fill_prov, st.writes, st.read, writer, frozenset(st.acc_open))

    def of_id(self, i: int):
        """The state (or pending record) of buffer id ``i``: a BufState, a record tuple, or None."""
        rec = self.pending.get(i)
        return rec if rec is not None else dict.get(self, self.b.buffer_name(i))

    def get(self, name, default=None):
        st = dict.get(self, name)
        if st is None:
            if self.pending and "~r" in name:
                st = self._made(name)
            if st is None:
                return default
        return st

    def __getitem__(self, name):
        st = self.get(name)
        if st is None:
            raise KeyError(name)
        return st

    def __contains__(self, name) -> bool:
        return self.get(name) is not None

    def _made(self, name: str):
        tail = name[name.rindex("~r") + 2:]
        if not tail.isdigit():
            return None
        i = int(tail)
        rec = self.pending.get(i)
        if rec is None or self.b.buffer_name(i) != name:
            return None
        del self.pending[i]
        size, nbytes, temp, fill, fill_prov, writes, read, writer, acc_open = rec
        st = BufState(name, size, nbytes, temp)
        st.fill, st.fill_prov, st.writes, st.read, st.writer = fill, fill_prov, writes, read, writer
        st.acc_open = set(acc_open)
        dict.__setitem__(self, name, st)
        return st


def _covers(ap: AP, st: BufState) -> bool:
    return ap.offset == 0 and ap.size == st.size and ap.contiguous_bytes() == st.nbytes


@dataclass
class _Launch:
    grid: tuple[int, ...]
    program_id: tuple[int, ...]


DEFAULT_MAX_INSTRUCTIONS = 20_000_000


def max_instructions() -> int:
    """The most instructions one kernel's trace may emit: ``TILESCOPE_MAX_INSTRUCTIONS``."""
    from .._env import count

    n = count("TILESCOPE_MAX_INSTRUCTIONS", DEFAULT_MAX_INSTRUCTIONS, minimum=1)
    assert n is not None  # (None only when the default is)
    return n


class KernelContext:
    """Tracing state of one kernel: its builder, on-chip buffer states, print hooks."""

    def __init__(self, builder, kernel: str, grid: tuple[int, ...], *, fail_at: int | None = None,
                 fail_exc: BaseException | None = None):
        self.b = builder
        self.kernel = kernel
        self.launch = _Launch(grid, (0,) * len(grid))
        self.states = BufStates(builder)
        self.hooks: dict[int, list] = {}
        self.depth = 0
        self.frame = None
        self.label = ""
        self.fail_at = fail_at
        self.fail_exc = fail_exc
        self.hbm_shared: list = []  # HBM tensors made by the first program of a grid
        self.hbm_cursor = 0
        self.written_hbm: set[str] = set()
        self.site_labels: dict[str, str] = {}
        self._prov: dict[tuple, Provenance] = {}
        self._positions: dict = {}
        self._sites: dict = {}  # (code, instruction offset) -> site (see site)
        self.instance = 0
        self.index_cache: dict = {}  # tile view by index structure (see _semantic.tile_index)
        self.consts: dict = {}  # tiles made once per kernel (ones rows, engine registers, constants)
        self.constants: dict = {}  # Program input name -> values of a shared_constant
        self.last_emit = None  # (file, line) of the user's line that emitted the last instruction
        self.loops: list = []  # language loops being traced, outermost first (see _loops)
        self.touch_log: list[str] = []  # buffers touched, in order (what a loop iteration touched)
        self.materialized: list[tuple[int, int]] = []  # (instruction, buffer id) of fills emitted in loops
        self.replica_states: set[int] = set()  # ids of replicated buffers given a state (see _loops)
        self.loop_stats: dict = {}  # (file, line) -> [label, iterations, replicated, why not]
        self.template_keys: dict = {}  # builder template id -> shape id (loop replication compares them)
        self.max_instructions = max_instructions()  # a trace this long stops (a Python loop that never ends)

    # ---- where we are -----------------------------------------------------
    def enter(self, frame, label: str) -> None:
        self.frame = frame
        self.label = label
        key = (frame.f_code.co_filename, frame.f_lineno, label)
        prov = self._prov.get(key)
        if prov is None:
            prov = self._prov[key] = Provenance(op=self.kernel, file=display_path(key[0]), line=key[1], label=label)
        self.b.set_provenance(prov)

    def site(self) -> str:
        """The allocation site of the current call: ``file:line:column`` of the user's expression."""
        f = self.frame
        if f is None:
            return "kernel"
        code = f.f_code
        site = self._sites.get((code, f.f_lasti))
        if site is not None and site in self.site_labels:
            return site
        pos = self._positions.get(code)
        if pos is None:
            pos = self._positions[code] = list(code.co_positions())
        k = f.f_lasti // 2
        col = pos[k][2] if k < len(pos) and pos[k][2] is not None else 0
        site = self._sites[(code, f.f_lasti)] = f"{display_path(code.co_filename)}:{f.f_lineno}:{col + 1}"
        if site not in self.site_labels:
            self.site_labels[site] = self.label
        return site

    def describe_site(self, site: str) -> str:
        label = self.site_labels.get(site)
        return f"{site} ({label})" if label else site

    def tile_name(self, label: str) -> str:
        line = self.frame.f_lineno if self.frame is not None else 0
        return f"{label.rsplit('.', 1)[-1]}@{line}"

    # ---- buffers and emission ----------------------------------------------
    def state(self, buffer, *, temp: bool) -> BufState:
        st = self.states[buffer.name] = BufState(buffer.name, buffer.size, buffer.nbytes, temp)
        if self.loops:
            self.touch_log.append(buffer.name)
        return st

    def emit(self, instr) -> int:
        """Emit one instruction, first filling any pending-``zeros`` buffer it touches
        (unless it overwrites the whole buffer without reading it)."""
        states = self.states
        reads = instr.reads()
        writes = instr.writes()
        if self.loops:
            log = self.touch_log
            for ap in reads:
                log.append(ap.buffer)
            for ap in writes:
                log.append(ap.buffer)
        for ap in reads:
            st = states.get(ap.buffer)
            if st is not None:
                if st.fill is not None:
                    self.materialize(st)
                st.read = True
        for ap in writes:
            st = states.get(ap.buffer)
            if st is not None and st.fill is not None:
                if _covers(ap, st) and not any(r.buffer == ap.buffer for r in reads):
                    st.fill = None
                else:
                    self.materialize(st)
        if instr.__class__ is not Matmul:  # anything else touching PSUM closes its accumulation groups
            for ap in reads + writes:
                st = states.get(ap.buffer)
                if st is not None and st.acc_open:
                    st.acc_open.clear()
        idx = self._emit(instr)
        for ap in writes:
            st = states.get(ap.buffer)
            if st is not None:
                st.writes += 1
                st.writer = idx
        return idx

    def _emit(self, instr) -> int:
        idx = self.b.emit(instr)
        if idx >= self.max_instructions:
            raise KernelError(
                f"kernel {self.kernel!r} traced more than {self.max_instructions:,} instructions, the limit "
                f"(TILESCOPE_MAX_INSTRUCTIONS, "
                f"default {DEFAULT_MAX_INSTRUCTIONS:,}): a Python loop that never ends? Each pass of a Python loop "
                f"emits its instructions again; bound the loop, or raise the limit for a kernel this long")
        f = self.frame
        self.last_emit = (f.f_code.co_filename, f.f_lineno) if f is not None else None
        if idx == self.fail_at:  # re-raise a build-time error where its tile is first used
            assert self.fail_exc is not None  # (given with fail_at)
            raise self.fail_exc.with_traceback(None)
        return idx

    def materialize(self, st: BufState) -> None:
        value, prov = st.fill, st.fill_prov
        assert value is not None  # (only a pending fill is materialized)
        st.fill = None
        buf = self.b.buffer(st.name)
        outer = self.b.current_provenance
        self.b.set_provenance(prov)
        try:
            idx = self._emit(Memset(buf.full(), float(value)))
        finally:
            self.b.set_provenance(outer)
        st.writes += 1
        st.writer = idx
        if self.loops:
            self.materialized.append((idx, self.b.buffer_id(st.name)))

    def add_hook(self, fn) -> None:
        idx = max(self.b.instruction_count - 1, 0)
        self.hooks.setdefault(idx, []).append(fn)


def builtin(label: str):
    """Decorate a language call: kernel context, provenance, and errors at the user's line."""

    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            ctx = getattr(_local, "ctx", None)
            if ctx is None:
                raise _outside(label)
            if ctx.depth:  # called by another builtin: provenance stays the user's call
                return fn(*args, **kwargs)
            frame = user_frame(2)
            ctx.depth = 1
            ctx.enter(frame, label)
            try:
                return fn(*args, **kwargs)
            except TilescopeError as e:
                raise locate(e, frame, ctx.kernel)
            finally:
                ctx.depth = 0
                ctx.frame = None

        wrapper.__wrapped_label__ = label
        return wrapper

    return deco
