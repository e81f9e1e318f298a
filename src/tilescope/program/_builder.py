"""The tile builder: the one way Programs are made.

Tile kernels, the eager lowerings of aten ops and the compiler's fusion all build
Programs through :class:`TileBuilder`: HBM tensors and on-chip tiles, loops over
tiles (plain Python loops, unrolled at build time), one method per engine
instruction, provenance on every instruction, tile-limit checks at emission, and
on-chip allocation with rotating buffers at :meth:`TileBuilder.build`.

>>> from tilescope.program import TileBuilder
>>> b = TileBuilder("double")
>>> x = b.input("x", (256, 512), "float32")
>>> y = b.output("y", (256, 512), "float32")
>>> for r0, rows in b.tiles(256, 128):
...     t = b.sbuf((rows, 512), "float32", site="x")
...     load = b.dma_copy(t, x[r0:r0 + rows, :])      # each call returns the
...     mul = b.tensor_scalar(t, t, "multiply", 2.0)  # instruction's index
...     store = b.dma_copy(y[r0:r0 + rows, :], t)
>>> prog = b.build()
>>> len(prog), prog.summary_counts()["dma_copy"]
(6, 4)
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from typing import Iterator

from ..dtypes import canonical
from ..errors import IndexRangeError, ProgramError
from ..isa import (
    AP, Activation, ActivationReduce, BnAggr, BnStats, DmaCopy, DmaIndirect, Dropout, GpsimdCall, Instruction,
    MatchReplace8, Max8,
    Iota, Matmul, Memset, RuntimeScalar, Select, TensorCopy, TensorReduce, TensorScalar,
    TensorTensor, Transpose,
)
from ..spec import CoreSpec, preset
from ._alloc import allocate
from ._checks import check_buffer, check_instruction
from ._program import Buffer, Program, Provenance

__all__ = ["TileBuilder", "Handle", "View", "as_ap"]


class View:
    """A region of a buffer with a logical shape; index it further or pass it to an op."""

    __slots__ = ("buffer", "ap", "shape")

    def __init__(self, buffer: Buffer, ap: AP, shape: tuple[int, ...]):
        self.buffer = buffer
        self.ap = ap
        self.shape = shape

    @property
    def dtype(self) -> str:
        return self.buffer.dtype

    @property
    def memory(self) -> str:
        return self.buffer.memory

    @property
    def name(self) -> str:
        return self.buffer.name

    def __getitem__(self, index) -> "View":
        return _index(self, index)

    def __repr__(self) -> str:
        return f"<{self.buffer.memory} view of {self.buffer.name!r} shape={self.shape} {self.dtype}>"


class Handle(View):
    """A whole buffer (HBM tensor or on-chip tile)."""

    __slots__ = ()

    def __init__(self, buffer: Buffer):
        super().__init__(buffer, buffer.full(), buffer.shape)


def as_ap(x) -> AP:
    if isinstance(x, View):
        return x.ap
    if isinstance(x, AP):
        return x
    raise ProgramError(f"expected a tile, tensor view or AP, got {type(x).__name__}: {x!r}")


def _index(view: View, index) -> View:
    if not isinstance(index, tuple):
        index = (index,)
    if Ellipsis in index:
        k = index.index(Ellipsis)
        fill = len(view.shape) - (len(index) - 1)
        index = index[:k] + (slice(None),) * fill + index[k + 1:]
    if len(index) > len(view.shape):
        raise IndexRangeError(f"too many indices ({len(index)}) for {view.buffer.name!r} of shape {view.shape}")
    index = index + (slice(None),) * (len(view.shape) - len(index))
    offset = view.ap.offset
    dims, shape = [], []
    keep_unit = view.buffer.memory != "hbm"
    for k, (ix, (stride, size)) in enumerate(zip(index, view.ap.dims)):
        if isinstance(ix, slice):
            start, stop, step = ix.indices(size)
            if step <= 0:
                raise IndexRangeError(f"negative slice steps are not supported (dim {k} of {view.buffer.name!r})")
            if ix.stop is not None and ix.stop > size:
                raise IndexRangeError(
                    f"index range [{start}, {ix.stop - 1}] exceeds dimension size {size} "
                    f"(dim {k} of {view.buffer.name!r}, shape {view.shape})"
                )
            count = max(0, -(-(stop - start) // step))
            if count == 0:
                raise IndexRangeError(f"empty slice {ix} on dim {k} of {view.buffer.name!r} (size {size})")
            offset += start * stride
            dims.append((stride * step, count))
            shape.append(count)
        else:
            i = int(ix)
            if i < 0:
                i += size
            if not 0 <= i < size:
                raise IndexRangeError(
                    f"index {int(ix)} is out of range for dimension size {size} "
                    f"(dim {k} of {view.buffer.name!r}, shape {view.shape})"
                )
            offset += i * stride
            if keep_unit and k == 0:
                dims.append((stride, 1))
                shape.append(1)
    if not dims:
        dims, shape = [(1, 1)], [1]
    return View(view.buffer, AP(view.ap.buffer, view.ap.dtype, offset, tuple(dims)), tuple(shape))


def _caller_site(depth: int = 3) -> str:
    try:
        f = sys._getframe(depth)
    except ValueError:  # called from the top level of a script
        f = sys._getframe(depth - 1)
    return f"{f.f_code.co_filename.rsplit('/', 1)[-1]}:{f.f_lineno}"


class TileBuilder:
    """Builds one Program.

    Args:
        name: the Program's name (an aten op, a kernel, a fused region).
        spec: hardware preset (name or CoreSpec); limits and capacities come from it.
        bufs: default rotation depth of SBUF allocation sites (PSUM sites use 2).
    """

    def __init__(self, name: str, spec: str | CoreSpec | None = None, *, bufs: int = 3):
        self.name = name
        self.spec = preset(spec)
        self.default_bufs = bufs
        self._buffers: dict[str, Buffer] = {}
        self._instructions: list[Instruction] = []
        self._instr_prov: list[int] = []
        self._prov_index: dict[Provenance, int] = {Provenance(): 0}
        self._prov_list: list[Provenance] = [Provenance()]
        self._prov: Provenance = Provenance()
        self._inputs: list[str] = []
        self._outputs: list[str] = []
        self._counter = 0
        self.check = True
        self.buffer_order: list[str] = []  # buffer names in the order they were made

    # ---- buffers ---------------------------------------------------------
    def _new_buffer(self, name: str | None, prefix: str, **kw) -> Buffer:
        if name is None or name in self._buffers:
            base = name or prefix
            while True:
                self._counter += 1
                candidate = f"{base}.{self._counter}" if name else f"{base}{self._counter}"
                if candidate not in self._buffers:
                    name = candidate
                    break
        kw["shape"] = tuple(int(n) for n in kw["shape"])
        kw["dtype"] = canonical(kw["dtype"])
        b = Buffer(name=name, **kw)
        check_buffer(b, self.spec)
        self._buffers[name] = b
        self.buffer_order.append(name)
        return b

    def add_buffer(self, b: Buffer) -> None:
        """Add a buffer made elsewhere (a replica of a checked one: loop replication)."""
        if b.name in self._buffers:
            raise ProgramError(f"a buffer named {b.name!r} already exists in {self.name!r}")
        self._buffers[b.name] = b
        self.buffer_order.append(b.name)

    def input(self, name: str, shape, dtype) -> Handle:
        """An HBM tensor the caller provides."""
        b = self._new_buffer(name, "in", memory="hbm", shape=shape, dtype=dtype, role="input")
        if b.name != name:
            raise ProgramError(f"an input named {name!r} already exists in {self.name!r}")
        self._inputs.append(name)
        return Handle(b)

    def output(self, name: str, shape, dtype) -> Handle:
        """An HBM tensor the Program produces."""
        b = self._new_buffer(name, "out", memory="hbm", shape=shape, dtype=dtype, role="output")
        if b.name != name:
            raise ProgramError(f"an output named {name!r} already exists in {self.name!r}")
        self._outputs.append(name)
        return Handle(b)

    def mark_output(self, handle: View) -> None:
        """Make an existing HBM tensor (e.g. an input written in place) an output too.

        A scratch tensor marked as an output becomes an output tensor (role ``output``).
        """
        name = handle.buffer.name
        b = self._buffers[name]
        if b.memory != "hbm":
            raise ProgramError(f"only HBM tensors can be outputs; {name!r} is in {b.memory.upper()}")
        if b.role == "scratch":
            self._buffers[name] = dataclasses.replace(b, role="output")
        if name not in self._outputs:
            self._outputs.append(name)

    def scratch(self, shape, dtype, *, name: str | None = None) -> Handle:
        """A private HBM tensor (spills, intermediates that do not fit on chip)."""
        return Handle(self._new_buffer(name, "hbm", memory="hbm", shape=shape, dtype=dtype, role="scratch"))

    def sbuf(self, shape, dtype, *, site: str | None = None, bufs: int | None = None,
             name: str | None = None) -> Handle:
        """A new SBUF tile ``(partitions, *free)``; tiles of one ``site`` rotate over ``bufs`` buffers."""
        site = site or _caller_site()
        return Handle(self._new_buffer(name, "sb", memory="sbuf", shape=shape, dtype=dtype,
                                       site=site, bufs=bufs or self.default_bufs))

    def psum(self, shape, dtype="float32", *, site: str | None = None, bufs: int | None = None,
             name: str | None = None) -> Handle:
        """A new PSUM tile: whole 2 KiB banks per partition (a TensorE result stays in one bank)."""
        site = site or _caller_site()
        return Handle(self._new_buffer(name, "ps", memory="psum", shape=shape, dtype=dtype,
                                       site=site, bufs=bufs or 2))

    @staticmethod
    def tiles(total: int, size: int) -> Iterator[tuple[int, int]]:
        """``(start, length)`` of each tile of ``size`` covering ``range(total)``."""
        if size <= 0:
            raise ProgramError(f"tile size must be >= 1, got {size}")
        for start in range(0, total, size):
            yield start, min(size, total - start)

    # ---- provenance --------------------------------------------------------
    @contextlib.contextmanager
    def provenance(self, **fields):
        """Instructions emitted inside carry this provenance (fields merge with the outer one)."""
        outer = self._prov
        merged = {k: getattr(outer, k) for k in ("op", "fx_node", "file", "line", "label")}
        merged.update(fields)
        self._prov = Provenance(**merged)
        try:
            yield
        finally:
            self._prov = outer

    def set_provenance(self, prov: Provenance) -> None:
        self._prov = prov

    @property
    def current_provenance(self) -> Provenance:
        """The provenance the next emitted instruction gets."""
        return self._prov

    def buffer(self, name: str) -> Buffer:
        """The buffer named ``name``."""
        return self._buffers[name]

    # ---- emission ----------------------------------------------------------
    def emit(self, instr: Instruction) -> int:
        """Append one instruction (checked against the tile limits); returns its index."""
        if self.check:
            check_instruction(instr, self._buffers, self.spec)
        idx = self._prov_index.get(self._prov)
        if idx is None:
            idx = self._prov_index[self._prov] = len(self._prov_list)
            self._prov_list.append(self._prov)
        self._instructions.append(instr)
        self._instr_prov.append(idx)
        return len(self._instructions) - 1

    def extend_replicas(self, instrs: list, prov: list[int]) -> None:
        """Append instructions that repeat already checked ones at shifted offsets (loop
        replication); their offset-dependent limits are checked by :meth:`check_replicas`."""
        self._instructions.extend(instrs)
        self._instr_prov.extend(prov)

    def check_replicas(self, first: int, templates: int, count: int) -> None:
        """Check replicated instructions ``[first, first + templates * count)``: operands are
        affine in the replica number, so bounds hold if they hold for the first and last
        replica; start-partition rules are checked for every replica of an on-chip operand
        whose offset moves."""
        if not self.check or count == 0:
            return
        instrs = self._instructions
        for j in list(range(templates)) + list(range((count - 1) * templates, count * templates)):
            check_instruction(instrs[first + j], self._buffers, self.spec)
        if count > 2:
            from ._checks import check_start_partitions

            check_start_partitions(instrs, first, templates, count, self._buffers)

    def replace(self, index: int, instr: Instruction) -> None:
        """Swap the instruction at ``index`` for ``instr`` (checked like a new one).

        The tile language uses it to write a result straight into the tile it is
        assigned to (``t[...] = tl.exp(x)`` retargets the activation's ``dst``)
        instead of emitting a copy. Program order and provenance are unchanged.
        """
        if not 0 <= index < len(self._instructions):
            raise ProgramError(f"no instruction #{index} to replace ({len(self._instructions)} emitted)")
        if self.check:
            check_instruction(instr, self._buffers, self.spec)
        self._instructions[index] = instr

    def instruction(self, index: int) -> Instruction:
        """The instruction emitted at ``index``."""
        return self._instructions[index]

    @staticmethod
    def runtime_scalar(name: str) -> RuntimeScalar:
        """A scalar operand whose value is given per call (not part of the hash)."""
        return RuntimeScalar(name)

    def dma_copy(self, dst, src, *, queue: int | None = None) -> int:
        return self.emit(DmaCopy(as_ap(dst), as_ap(src), queue))

    def dma_indirect(self, dst, src, index, *, indirect: str = "src", queue: int | None = None) -> int:
        """Gather (``indirect="src"``) or scatter (``"dst"``) rows by an SBUF index tile; see
        :class:`~tilescope.isa.DmaIndirect` (the indirect operand's first dim spans the table)."""
        return self.emit(DmaIndirect(as_ap(dst), as_ap(src), queue, "dma", as_ap(index), indirect))

    def max8(self, dst, src) -> int:
        """The 8 largest values of each partition, descending (VectorE)."""
        return self.emit(Max8(as_ap(dst), as_ap(src)))

    def match_replace8(self, dst, data, vals, imm: float, dst_idx=None) -> int:
        """``data`` with each of the 8 ``vals`` per partition replaced by ``imm``; positions to ``dst_idx``."""
        return self.emit(MatchReplace8(as_ap(dst), as_ap(data), as_ap(vals), float(imm),
                                       as_ap(dst_idx) if dst_idx is not None else None))

    def tensor_tensor(self, dst, a, b, op: str, *, engine: str = "dve") -> int:
        return self.emit(TensorTensor(as_ap(dst), as_ap(a), as_ap(b), op, engine))

    def tensor_scalar(self, dst, src, op0: str, scalar0, op1: str | None = None, scalar1=None, *,
                      reverse0: bool = False, reverse1: bool = False, engine: str = "dve") -> int:
        return self.emit(TensorScalar(as_ap(dst), as_ap(src), op0, _scalar(scalar0), op1,
                                      _scalar(scalar1), reverse0, reverse1, engine))

    def activation(self, dst, src, func: str, *, scale=1.0, bias=None, accumulate: bool = False) -> int:
        return self.emit(Activation(as_ap(dst), as_ap(src), func, _scalar(scale), _scalar(bias), accumulate))

    def activation_reduce(self, dst, src, func: str, reduce_dst, *, reduce_op: str = "add",
                          scale=1.0, bias=None) -> int:
        return self.emit(ActivationReduce(as_ap(dst), as_ap(src), func, as_ap(reduce_dst), reduce_op,
                                          _scalar(scale), _scalar(bias)))

    def tensor_reduce(self, dst, src, op: str, *, axes: tuple[int, ...] | None = None,
                      negate: bool = False, engine: str = "dve") -> int:
        return self.emit(TensorReduce(as_ap(dst), as_ap(src), op, axes, negate, engine))

    def tensor_copy(self, dst, src, *, engine: str = "dve") -> int:
        return self.emit(TensorCopy(as_ap(dst), as_ap(src), engine))

    def select(self, dst, pred, on_true, on_false, *, engine: str = "dve") -> int:
        return self.emit(Select(as_ap(dst), as_ap(pred), as_ap(on_true), _scalar(on_false), engine))

    def iota(self, dst, *, base: int = 0, partition_step: int = 0, steps: tuple[int, ...] = ()) -> int:
        return self.emit(Iota(as_ap(dst), base, partition_step, tuple(steps)))

    def memset(self, dst, value: float = 0.0, *, engine: str = "dve") -> int:
        return self.emit(Memset(as_ap(dst), float(value), engine))

    def matmul(self, dst, stationary, moving, *, accumulate: bool = False) -> int:
        return self.emit(Matmul(as_ap(dst), as_ap(stationary), as_ap(moving), accumulate))

    def transpose(self, dst, src) -> int:
        return self.emit(Transpose(as_ap(dst), as_ap(src)))

    def bn_stats(self, dst, src) -> int:
        return self.emit(BnStats(as_ap(dst), as_ap(src)))

    def bn_aggr(self, dst, src) -> int:
        return self.emit(BnAggr(as_ap(dst), as_ap(src)))

    def dropout(self, dst, src, prob: float) -> int:
        return self.emit(Dropout(as_ap(dst), as_ap(src), float(prob)))

    def gpsimd_call(self, name: str, impl: str, inputs, outputs, cycles: float, attrs: tuple = ()) -> int:
        return self.emit(GpsimdCall(name, impl, tuple(as_ap(x) for x in inputs),
                                    tuple(as_ap(x) for x in outputs), float(cycles), tuple(attrs)))

    # ---- result --------------------------------------------------------------
    @property
    def instruction_count(self) -> int:
        return len(self._instructions)

    def build(self, meta: dict | None = None, *, describe_site=None, spill: bool = False,
              shrink_rotation: bool = False, report: dict | None = None) -> Program:
        """Allocate on-chip memory and return the finished, immutable Program.

        ``describe_site(site) -> str`` words allocation sites in capacity errors
        (e.g. as the kernel source line that made the tiles). With ``spill``, SBUF tiles that
        do not fit are stored to HBM and loaded back around the instructions that need the
        room (``meta["spills"]`` lists them); see :func:`~tilescope.program._alloc.allocate`.
        """
        if not self._instructions:
            raise ProgramError(f"program {self.name!r} has no instructions")
        alloc = allocate(self._buffers, self._instructions, self.spec, describe_site=describe_site, spill=spill)
        if alloc.instructions is not None:
            self._apply_spills(alloc)
        meta = dict(meta or {})
        if alloc.spills:
            meta["spills"] = alloc.spills
        placement = alloc.placement
        used = {n for n in placement} | set(self._inputs) | set(self._outputs)
        used |= {b.name for b in self._buffers.values() if b.memory == "hbm"}
        return Program(
            self.name,
            [b for b in self._buffers.values() if b.name in used],
            self._instructions,
            inputs=self._inputs,
            outputs=self._outputs,
            provenance=self._prov_list,
            instr_prov=self._instr_prov,
            slots=alloc.slots,
            placement=placement,
            meta=meta,
            spec_name=self.spec.name,
        )

    def _apply_spills(self, alloc) -> None:
        """Take the allocator's instruction list (spill DMAs inserted); their provenance says
        what they are and names the site of the tile that was spilled."""
        for b in alloc.buffers:
            self._buffers[b.name] = b
        old_prov = self._instr_prov
        prov = []
        for o in alloc.origin:
            if o >= 0:
                prov.append(old_prov[o])
                continue
            k, reload = (-o - 1) // 2, (-o - 1) % 2 == 1
            rec = alloc.spills[k]
            file, line = _site_location(rec["site"])
            p = Provenance(op=self.name, file=file, line=line,
                           label=f"{'reload' if reload else 'spill'}: SBUF full, tile {rec['tile']} "
                                 f"{'loaded back from' if reload else 'stored to'} HBM")
            idx = self._prov_index.get(p)
            if idx is None:
                idx = self._prov_index[p] = len(self._prov_list)
                self._prov_list.append(p)
            prov.append(idx)
        self._instructions = list(alloc.instructions)
        self._instr_prov = prov


def _site_location(site: str) -> tuple[str | None, int | None]:
    """(file, line) of an allocation site written ``file:line:column`` (else (None, None))."""
    parts = site.rsplit(":", 2)
    if len(parts) == 3 and parts[1].isdigit():
        return parts[0], int(parts[1])
    return None, None


def _scalar(v):
    if v is None or isinstance(v, (RuntimeScalar, AP)):
        return v
    if isinstance(v, View):
        return v.ap
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    try:  # numpy scalars
        return float(v)
    except (TypeError, ValueError):
        raise ProgramError(f"expected a scalar (number, runtime scalar or [P, 1] tile), got {v!r}") from None
