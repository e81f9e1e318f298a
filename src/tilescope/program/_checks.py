"""Tile-limit checks, shared by the builder (at emission) and Program.validate.

Limits come from the architecture guide (nki/guides/architecture/
trainium_inferentia2_arch.rst): partition dim <= 128; matmul stationary free <= 128
and moving free <= 512; VectorE/ScalarE free size <= 64K elements in SBUF and <= 4K
in PSUM; bn_stats free size <= 512; start partition 0 for > 64 partitions, 0 or 64
for 33-64, 0/32/64/96 for <= 32.
"""

from __future__ import annotations

from typing import Any, Callable

from ..dtypes import itemsize
from ..errors import CapacityError, IndexRangeError, ProgramError, TileLimitError
from ..isa import (
    AP, ActivationReduce, AffineSelect, BnAggr, BnStats, DmaCopy, DmaIndirect, GpsimdCall, Instruction,
    FindIndex8, MatchReplace8, Matmul, Max8,
    TensorReduce, TensorScalarReduce, Transpose, field_access,
)
from ..spec import CoreSpec

__all__ = ["check_buffer", "check_instruction", "check_slots", "ap_bounds"]

SBUF_FREE_MAX = 64 * 1024  # elements, VectorE/ScalarE operand in SBUF
PSUM_FREE_MAX = 4 * 1024  # elements, VectorE/ScalarE operand in PSUM
BN_STATS_FREE_MAX = 512


def _kib(n: int) -> str:
    return f"{n / 1024:g} KiB"


def check_buffer(b, spec: CoreSpec) -> None:
    if any(n <= 0 for n in b.shape):
        raise ProgramError(f"buffer {b.name!r} has shape {b.shape}; every dimension must be >= 1")
    if b.memory == "hbm":
        return
    if b.shape[0] > spec.partitions:
        raise TileLimitError(
            f"number of partitions {b.shape[0]} of tile {b.name!r} {b.shape} exceeds the "
            f"architecture limit of {spec.partitions}; make the first (partition) dimension "
            f"at most {spec.partitions} and loop over tiles"
        )
    per_part = b.bytes_per_partition
    if b.memory == "psum" and per_part > spec.psum_bytes_per_partition:
        banks = spec.psum_bytes_per_partition // spec.psum_bank_bytes
        raise TileLimitError(
            f"PSUM tile {b.name!r} {b.shape} {b.dtype} needs {per_part} bytes per partition, "
            f"but PSUM holds {spec.psum_bytes_per_partition} bytes per partition ({banks} banks of "
            f"{spec.psum_bank_bytes}); use fewer or smaller PSUM blocks and copy results out to SBUF"
        )
    if b.memory == "sbuf" and per_part > spec.sbuf_bytes_per_partition:
        raise CapacityError(
            f"SBUF tile {b.name!r} {b.shape} {b.dtype} needs {_kib(per_part)} per partition, "
            f"more than the whole SBUF partition ({_kib(spec.sbuf_bytes_per_partition)} on "
            f"{spec.name}); use a smaller free dimension"
        )


def ap_bounds(ap: AP) -> tuple[int, int]:
    """Lowest and highest flat element index an AP touches."""
    lo = hi = ap.offset
    for stride, count in ap.dims:
        if count <= 0:
            raise ProgramError(f"access to {ap.buffer!r} has a dimension of count {count}; counts must be >= 1")
        ext = stride * (count - 1)
        if ext < 0:
            lo += ext
        else:
            hi += ext
    return lo, hi


def _check_ap(ap: AP, buffers, role: str, kind: str) -> None:
    b = buffers.get(ap.buffer)
    if b is None:
        raise ProgramError(f"operand {role!r} of {kind} refers to unknown buffer {ap.buffer!r}")
    if ap.dtype != b.dtype:
        raise ProgramError(
            f"operand {role!r} of {kind} reads {ap.buffer!r} as {ap.dtype}, but the buffer holds {b.dtype}"
        )
    lo, hi = ap_bounds(ap)
    if lo < 0 or hi >= b.size:
        raise IndexRangeError(
            f"operand {role!r} of {kind} reaches elements [{lo}, {hi}] of {ap.buffer!r}, "
            f"which has {b.size} elements (shape {b.shape})"
        )
    if b.memory != "hbm" and ap.partitions > 1 and ap.dims[0][0] != b.row_elems:
        raise ProgramError(
            f"operand {role!r} of {kind}: the first dimension of an on-chip access must be the "
            f"partition dimension (stride {b.row_elems}), got stride {ap.dims[0][0]}"
        )


def _start_partition(ap: AP, b) -> int:
    return ap.offset // b.row_elems if b.row_elems else 0


def _check_start_partition(ap: AP, b, role: str, kind: str) -> None:
    start, n = _start_partition(ap, b), ap.partitions
    allowed: tuple[int, ...]
    if n > 64:
        allowed = (0,)
    elif n > 32:
        allowed = (0, 64)
    else:
        allowed = (0, 32, 64, 96)
    if start not in allowed:
        raise TileLimitError(
            f"operand {role!r} of {kind} starts at partition {start} with {n} partitions; an "
            f"engine access of {n} partitions must start at partition {' or '.join(map(str, allowed))}"
        )


_FIELD_CACHE: dict[type, tuple[tuple[str, bool], ...]] = {}
_SCALAR_ROLES = frozenset({"scalar0", "scalar1", "scale", "bias", "initial"})


def _operands(instr: Instruction):
    """(role, AP, is_write) for every AP operand."""
    names = _FIELD_CACHE.get(type(instr))
    if names is None:
        writes = set(instr._WRITES)
        names = _FIELD_CACHE[type(instr)] = tuple((name, name in writes) for name in field_access(type(instr))[0])
    out = []
    for name, is_write in names:
        v = getattr(instr, name)
        if v.__class__ is AP:
            out.append((name, v, is_write))
        elif v.__class__ is tuple:
            out.extend((f"{name}[{k}]", x, is_write) for k, x in enumerate(v) if x.__class__ is AP)
    return out


def _same_size(kind, a_role, a: AP, b_role, b: AP) -> None:
    if a.partitions != b.partitions or a.free_size != b.free_size:
        raise ProgramError(
            f"{kind}: operand {b_role!r} has shape {b.shape} ({b.partitions} partitions x "
            f"{b.free_size}) but {a_role!r} has {a.shape} ({a.partitions} x {a.free_size}); "
            f"the partition count and elements per partition must match"
        )


def check_instruction(instr: Instruction, buffers, spec: CoreSpec) -> None:
    kind = instr.KIND
    ops = _operands(instr)
    for role, ap, _ in ops:
        _check_ap(ap, buffers, role, kind)

    if isinstance(instr, DmaIndirect):
        _check_indirect(instr, buffers, spec)
        return
    if isinstance(instr, DmaCopy):
        _check_dma(instr, spec)
        return
    for role, ap, _ in ops:
        _check_on_chip_operand(instr, role, ap, buffers[ap.buffer], spec)
    if isinstance(instr, (Matmul, Transpose)):
        _check_one_bank(instr, buffers, spec)
    for cls in type(instr).__mro__:  # the kind's own rule (the table below), else the elementwise one
        check = _KIND_CHECKS.get(cls)
        if check is not None:
            check(instr, buffers, spec)
            return
    _check_elementwise(instr, ops)


def _check_dma(instr: DmaCopy, spec: CoreSpec) -> None:
    if instr.src.size != instr.dst.size:
        raise ProgramError(
            f"dma_copy moves {instr.src.size} elements from {instr.src.buffer!r} {instr.src.shape} "
            f"into {instr.dst.size} elements of {instr.dst.buffer!r} {instr.dst.shape}; sizes must match"
        )
    # dtypes may differ: "a cast will happen if the src and dst have different dtype" [isa]
    if instr.queue is not None and not 0 <= instr.queue < spec.dma.queues:
        raise ProgramError(f"dma_copy queue {instr.queue} out of range [0, {spec.dma.queues})")


def _check_on_chip_operand(instr: Instruction, role: str, ap: AP, b, spec: CoreSpec) -> None:
    """An engine operand: on chip, within the partitions, at an allowed start partition, and
    (VectorE / ScalarE) within the free size the engine reads from its memory."""
    kind = instr.KIND
    if b.memory == "hbm":
        raise ProgramError(
            f"Expected operand {role!r} of {kind!r} to be in SBUF or PSUM, but got a region of "
            f"HBM tensor {ap.buffer!r}; load it into an SBUF tile first"
        )
    if ap.partitions > spec.partitions:
        raise TileLimitError(
            f"number of partitions {ap.partitions} of operand {role!r} of {kind} exceeds the "
            f"architecture limit of {spec.partitions}"
        )
    _check_start_partition(ap, b, role, kind)
    if instr.engine == "pool" and b.memory == "psum":
        # "Since GpSimd Engine cannot access PSUM, Scalar or Vector Engine must be chosen when the
        # input or output tile is in PSUM" [NKI isa: tensor_copy]
        raise ProgramError(
            f"operand {role!r} of {kind} on GpSimd is PSUM tile {ap.buffer!r}; GpSimd cannot access "
            f"PSUM: run the instruction on VectorE or ScalarE, or copy the tile to SBUF first"
        )
    if instr.engine in ("dve", "act"):
        limit = PSUM_FREE_MAX if b.memory == "psum" else SBUF_FREE_MAX
        if ap.free_size > limit:
            raise TileLimitError(
                f"operand {role!r} of {kind} has {ap.free_size} elements per partition in "
                f"{b.memory.upper()}; {instr.engine} accepts at most {limit} there; split the free dimension"
            )


def _check_transpose(instr: Transpose, buffers, spec: CoreSpec) -> None:
    if buffers[instr.dst.buffer].memory != "psum":
        raise ProgramError("transpose writes its result into PSUM; give it a PSUM tile as dst")
    if instr.src.free_size > spec.matmul_stationary_fmax:
        raise TileLimitError(
            f"transpose source has {instr.src.free_size} elements per partition; TensorE "
            f"transposes at most {spec.matmul_stationary_fmax} (it becomes the partition dim)"
        )
    if instr.dst.partitions != instr.src.free_size or instr.dst.free_size != instr.src.partitions:
        raise ProgramError(
            f"transpose of {instr.src.shape} needs a [{instr.src.free_size}, {instr.src.partitions}] "
            f"destination, got {instr.dst.shape}"
        )


def _check_bn_stats(instr: BnStats, buffers, spec: CoreSpec) -> None:
    if instr.src.free_size > BN_STATS_FREE_MAX:
        raise TileLimitError(
            f"bn_stats reads {instr.src.free_size} elements per partition; the limit is "
            f"{BN_STATS_FREE_MAX}: call it per chunk of 512 and combine with bn_aggr"
        )
    if instr.dst.free_size != 6 or instr.dst.partitions != instr.src.partitions:
        raise ProgramError(f"bn_stats writes [{instr.src.partitions}, 6], got dst {instr.dst.shape}")


def _check_bn_aggr(instr: BnAggr, buffers, spec: CoreSpec) -> None:
    if instr.src.free_size % 6 or instr.dst.free_size != 2:
        raise ProgramError(
            f"bn_aggr reads [P, 6k] stats and writes [P, 2]; got src {instr.src.shape}, dst {instr.dst.shape}"
        )


def _check_tensor_reduce(instr: TensorReduce, buffers, spec: CoreSpec) -> None:
    axes = instr.axes if instr.axes is not None else tuple(range(1, len(instr.src.dims)))
    if any(a < 1 or a >= len(instr.src.dims) for a in axes):
        raise ProgramError(
            f"tensor_reduce axes {axes} must be free dimensions of src (1..{len(instr.src.dims) - 1})"
        )
    kept = 1
    for k, (_, c) in enumerate(instr.src.dims[1:], start=1):
        if k not in axes:
            kept *= c
    if instr.dst.free_size != kept or instr.dst.partitions != instr.src.partitions:
        raise ProgramError(
            f"tensor_reduce of {instr.src.shape} over axes {axes} gives {instr.src.partitions} x "
            f"{kept} elements, but dst is {instr.dst.shape}"
        )


def _check_with_reduction(instr, buffers, spec: CoreSpec) -> None:
    """activation_reduce, tensor_scalar_reduce: the result, its [P, 1] reduction, the scalar."""
    kind = instr.KIND
    _same_size(kind, "src", instr.src, "dst", instr.dst)
    r = instr.reduce_dst
    if r.free_size != 1 or r.partitions != instr.src.partitions:
        raise ProgramError(f"{kind} reduce_dst must be [{instr.src.partitions}, 1], got {r.shape}")
    s0 = getattr(instr, "scalar0", None)
    if s0.__class__ is AP and (s0.free_size != 1 or s0.partitions != instr.src.partitions):
        raise ProgramError(f"{kind}: per-partition scalar operand must be [{instr.src.partitions}, 1], "
                           f"got {s0.shape}")


def _check_affine_select(instr: AffineSelect, buffers, spec: CoreSpec) -> None:
    _same_size(instr.KIND, "dst", instr.dst, "on_true", instr.on_true)
    n = 1
    for _, num in instr.pattern:
        n *= num
    if n != instr.dst.free_size:
        raise ProgramError(f"affine_select pattern {instr.pattern} covers {n} elements per partition; dst "
                           f"{instr.dst.shape} has {instr.dst.free_size}")


def _check_elementwise(instr, ops) -> None:
    """Elementwise kinds: every tile operand has the destination's size, except [P, 1]
    per-partition scalar operands."""
    kind = instr.KIND
    dst = instr.dst
    for role, ap, _ in ops:
        if ap is dst or role in _SCALAR_ROLES:
            if role in _SCALAR_ROLES and (
                ap.free_size != 1 or ap.partitions != dst.partitions
            ):
                raise ProgramError(
                    f"{kind}: per-partition scalar operand {role!r} must be [{dst.partitions}, 1], "
                    f"got {ap.shape}"
                )
            continue
        _same_size(kind, "dst", dst, role, ap)


def _no_shape_rule(instr, buffers, spec: CoreSpec) -> None:
    """A GpSimd call's operands are whatever its routine takes: no rule beyond the operands'."""


def _check_one_bank(instr, buffers, spec: CoreSpec) -> None:
    """A TensorE result stays inside one PSUM bank (a PSUM tile may span several: its
    block dimension indexes the banks, e.g. a (128, 8, 512) fp32 tile is 8 banks)."""
    dst = instr.dst
    b = buffers[dst.buffer]
    if b.memory != "psum":
        return
    isz = itemsize(dst.dtype)
    lo = hi = dst.offset % b.row_elems  # within one partition's row
    for stride, count in dst.dims[1:]:
        ext = stride * (count - 1)
        lo, hi = (lo + ext, hi) if ext < 0 else (lo, hi + ext)
    bank = spec.psum_bank_bytes
    first, last = lo * isz // bank, ((hi + 1) * isz - 1) // bank
    if first != last:
        per_bank = bank // isz
        raise TileLimitError(
            f"{instr.KIND} writes bytes [{lo * isz}, {(hi + 1) * isz}) of each partition of PSUM tile "
            f"{dst.buffer!r} {b.shape}, which spans banks {first}..{last}; a TensorE result stays inside one "
            f"{bank}-byte bank ({per_bank} {dst.dtype} elements): index one bank of the tile, e.g. "
            f"t[:, k, :] of a (P, banks, {per_bank}) tile")


TOP8_FREE = (8, 16384)  # nki.isa.max8 / nc_find_index8: elements read per partition


def _check_top8(instr) -> None:
    kind = instr.KIND
    data = instr.src if isinstance(instr, Max8) else instr.data
    lo, hi = TOP8_FREE
    if not lo <= data.free_size <= hi:
        raise TileLimitError(
            f"{kind} reads {data.free_size} elements per partition; it takes {lo} to {hi}: split the row "
            f"into chunks of at most {hi} and merge their top 8s"
        )
    if isinstance(instr, Max8):
        eights = [("dst", instr.dst)]
    elif isinstance(instr, FindIndex8):
        eights = [("vals", instr.vals), ("dst", instr.dst)]
    else:
        eights = [("vals", instr.vals)] + ([("dst_idx", instr.dst_idx)] if instr.dst_idx is not None else [])
    for role, ap in eights:
        if ap.free_size != 8 or ap.partitions != data.partitions:
            raise ProgramError(f"{kind}: {role!r} must be [{data.partitions}, 8], got {ap.shape}")
    if isinstance(instr, MatchReplace8):
        _same_size(kind, "data", data, "dst", instr.dst)
    if isinstance(instr, FindIndex8) and instr.dst.dtype not in ("uint16", "uint32"):
        raise ProgramError(f"{kind}: dst holds positions: uint16 or uint32, got {instr.dst.dtype}")


def _check_indirect(instr: DmaIndirect, buffers, spec: CoreSpec) -> None:
    kind, idx, table, direct = instr.KIND, instr.index, instr.table, instr.direct
    if instr.indirect not in ("src", "dst"):
        raise ProgramError(f"{kind}: indirect must be 'src' (gather) or 'dst' (scatter), got {instr.indirect!r}")
    if buffers[idx.buffer].memory != "sbuf" or idx.dtype not in ("int64", "int32", "int16", "uint8", "int8"):
        raise ProgramError(
            f"{kind}: the index operand must be an integer SBUF tile, got {idx.dtype} in "
            f"{buffers[idx.buffer].memory.upper()} ({idx.buffer!r}); load the indices into SBUF first"
        )
    row = 1
    for _, c in table.dims[1:]:
        row *= c
    if direct.size != idx.size * row or direct.partitions != idx.partitions:
        raise ProgramError(
            f"{kind}: {idx.size} indices on {idx.partitions} partitions of rows of {row} elements need a "
            f"{'destination' if instr.indirect == 'src' else 'source'} of {idx.size * row} elements on "
            f"{idx.partitions} partitions, got {direct.shape}"
        )
    if instr.src.dtype != instr.dst.dtype:
        raise ProgramError(
            f"{kind} cannot convert {instr.src.dtype} to {instr.dst.dtype}; move the rows in their own dtype "
            f"and cast with tensor_copy on an engine"
        )
    if instr.queue is not None and not 0 <= instr.queue < spec.dma.queues:
        raise ProgramError(f"{kind} queue {instr.queue} out of range [0, {spec.dma.queues})")


def _check_matmul(instr: Matmul, buffers, spec: CoreSpec) -> None:
    st, mv, dst = instr.stationary, instr.moving, instr.dst
    if buffers[dst.buffer].memory != "psum":
        raise ProgramError(
            f"matmul accumulates into PSUM; dst {dst.buffer!r} is in {buffers[dst.buffer].memory.upper()}"
        )
    for role, ap in (("stationary", st), ("moving", mv)):
        if buffers[ap.buffer].memory != "sbuf":
            raise ProgramError(f"matmul operand {role!r} must be in SBUF, got {buffers[ap.buffer].memory.upper()}")
    if st.partitions != mv.partitions:
        raise ProgramError(
            f"matmul contracts over the partition dim: stationary has {st.partitions} partitions, "
            f"moving has {mv.partitions}; they must match"
        )
    if st.free_size > spec.matmul_stationary_fmax:
        raise TileLimitError(
            f"matmul stationary free size {st.free_size} exceeds gemm_stationary_fmax "
            f"{spec.matmul_stationary_fmax}; tile the stationary (left) operand's columns"
        )
    if mv.free_size > spec.matmul_moving_fmax:
        raise TileLimitError(
            f"matmul moving free size {mv.free_size} exceeds gemm_moving_fmax "
            f"{spec.matmul_moving_fmax} (one PSUM bank of fp32); tile the moving operand's columns"
        )
    if dst.partitions != st.free_size or dst.free_size != mv.free_size:
        raise ProgramError(
            f"matmul of stationary {st.shape} and moving {mv.shape} gives "
            f"[{st.free_size}, {mv.free_size}], but dst is {dst.shape}"
        )
    if dst.dtype != "float32":
        raise ProgramError(f"matmul accumulates in float32 PSUM; dst is {dst.dtype}")


def check_slots(program, spec: CoreSpec) -> None:
    """On-chip slots fit their memory and never overlap while both are live."""
    caps = {"sbuf": spec.sbuf_bytes_per_partition, "psum": spec.psum_bytes_per_partition}
    by_mem: dict[str, list] = {"sbuf": [], "psum": []}
    for s in program.slots.values():
        if s.addr + s.nbytes > caps[s.memory]:
            raise CapacityError(
                f"{s.memory.upper()} slot {s.name!r} at byte {s.addr} + {s.nbytes} exceeds the "
                f"{_kib(caps[s.memory])} per partition of {spec.name}"
            )
        by_mem[s.memory].append(s)
    for slots in by_mem.values():
        slots.sort(key=lambda s: s.start)
        for i, a in enumerate(slots):
            for b in slots[i + 1:]:
                if b.start > a.end:
                    break
                if a.addr < b.addr + b.nbytes and b.addr < a.addr + a.nbytes:
                    raise CapacityError(
                        f"slots {a.name!r} and {b.name!r} overlap in {a.memory.upper()} while both are live"
                    )


# instruction kind -> its shape rule (beyond the operand checks every engine instruction gets);
# a kind not listed is elementwise
_KIND_CHECKS: dict[type, Callable[[Any, Any, CoreSpec], None]] = {
    Matmul: _check_matmul,
    Transpose: _check_transpose,
    BnStats: _check_bn_stats,
    BnAggr: _check_bn_aggr,
    TensorReduce: _check_tensor_reduce,
    ActivationReduce: _check_with_reduction,
    TensorScalarReduce: _check_with_reduction,
    AffineSelect: _check_affine_select,
    Max8: lambda instr, buffers, spec: _check_top8(instr),
    MatchReplace8: lambda instr, buffers, spec: _check_top8(instr),
    FindIndex8: lambda instr, buffers, spec: _check_top8(instr),
    GpsimdCall: _no_shape_rule,
}
