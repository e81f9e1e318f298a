"""NKI names tilescope does not provide, each with what to use instead.

A kernel that touches one (``nl.gather_flattened``, ``nisa.max8``, a tensor method
such as ``t.permute``) gets a :class:`~tilescope.errors.KernelError` at its own line
naming the construct and the alternative, instead of an ``AttributeError`` from
inside tilescope. Names that are not NKI's either get the usual "no attribute"
error, with the closest names NKI has.
"""

from __future__ import annotations

import difflib

from ..errors import UnsupportedError
from ..lang.internal import locate, user_frame
from ..lang.internal import TENSOR_METHODS_LACK

__all__ = ["Unsupported", "unsupported", "LANGUAGE_LACKS", "ISA_LACKS", "TENSOR_METHODS_LACK", "missing"]


Unsupported = UnsupportedError

_COLLECTIVES = "collective communication is not modeled (one core); compute per core and combine on the host"
_RANDOM = "random numbers are not modeled; pass random values in as an input array"
_DYNAMIC = "loops with bounds known only on the device are not modeled; loop with range()/nl.affine_range"
_REGISTERS = "device registers and dynamic control flow are not modeled; use Python values known at trace time"
_MX = "microscaling (MX) formats are not modeled; use bfloat16/float8 tiles"

# nki.language names -> what to use instead
LANGUAGE_LACKS = {
    "all_reduce": _COLLECTIVES, "atomic_rmw": "atomic read-modify-write on HBM is not modeled; load, update "
                                              "and store with nl.load / nl.store",
    "gather_flattened": "indirect gathers are not modeled; load the rows you need with nl.load on slices",
    "rand": _RANDOM, "random_seed": _RANDOM, "dropout": _RANDOM,
    "dynamic_range": _DYNAMIC, "fori_loop": _DYNAMIC, "while_loop": _DYNAMIC,
    "loop_reduce": "accumulate across iterations explicitly: acc[...] = nl.add(acc, x) in the loop",
    "gemm_grid": "use nl.mgrid", "gemm_stationary_grid": "use nl.mgrid",
    "finfo": "use numpy.finfo on the numpy dtype (nl.float32 is the name 'float32')",
    "bfp16": "block floating point is not modeled; use nl.bfloat16",
    "float8_e4m3fn_x4": _MX, "float8_e5m2_x4": _MX, "float4_e2m1fn_x4": _MX, "float8_e8m0fnu": _MX,
    "tfloat32": "tfloat32 tiles are not modeled; use nl.float32 (TensorE rounds fp32 passes itself)",
    "prelu": "use nl.maximum(x, alpha * x) for 0 <= alpha <= 1",
    "average": "use nl.mean", "bypass": "use nl.copy",
    "MemoryRegion": "use nl.sbuf, nl.psum, nl.hbm, nl.shared_hbm or nl.private_hbm",
    "NkiTensor": "tiles and tensors are tilescope.lang.Tile / tilescope.lang.Tensor",
    "NKIObject": "not needed in kernels", "DType": "dtypes are names: nl.float32 == 'float32'",
}

# nki.isa names -> what to use instead
ISA_LACKS = {
    "activate2": "use nisa.activation followed by nisa.tensor_scalar",
    "builtin_custom_op": "write a GpSimd C++ operator (tilescope.cpp) and call it from PyTorch",
    "core_barrier": _COLLECTIVES, "sendrecv": _COLLECTIVES, "dma_compute": _COLLECTIVES,
    "dropout": _RANDOM, "rng": _RANDOM, "rand2": _RANDOM, "rand_get_state": _RANDOM, "rand_set_state": _RANDOM,
    "set_rng_seed": _RANDOM,
    "local_gather": "indirect gathers are not modeled; select rows with slices, or use nisa.select",
    "nc_n_gather": "indirect gathers are not modeled; select rows with slices, or use nisa.select",
    "topk": "the top-k search is not modeled; sort on the host",
    "nonzero_with_count": "data-dependent compaction is not modeled",
    "nc_matmul_mx": _MX, "quantize_mx": _MX,
    "nc_stream_shuffle": "partition shuffles are not modeled; broadcast a row with nl.broadcast_to "
                         "(TensorE) or move partitions with a matmul against a 0/1 matrix",
    "range_select": "use nisa.affine_select or nl.where with comparisons",
    "select_reduce": "use nisa.select, then nisa.tensor_reduce",
    "sequence_bounds": "compute segment bounds on the host",
    "tensor_copy_dynamic_dst": _REGISTERS, "tensor_copy_dynamic_src": _REGISTERS,
    "tensor_copy_predicated": "use nisa.select(predicate, on_true, on_false)",
    "tensor_partition_reduce": "reduce across partitions with a TensorE matmul against a ones column "
                               "(nisa.nc_matmul), or transpose and use nisa.tensor_reduce",
    "tensor_scalar_cumulative": "use nisa.tensor_tensor_scan (a running op along the free dim)",
    "exponential": "use nisa.activation(op=nl.exp, bias=-max) and reduce with activation_reduce",
    "register_alloc": _REGISTERS, "register_load": _REGISTERS, "register_move": _REGISTERS,
    "register_store": _REGISTERS, "VirtualRegister": _REGISTERS,
    "get_nc_sub_version": "use nisa.get_nc_version()", "dma_engine": "DMA queues are chosen by the scheduler",
    "NkiInstruction": "instructions are tilescope.isa classes", "NkiValidationError": "errors are KernelError",
}

def _names_of(module) -> list[str]:
    return [n for n in dir(module) if not n.startswith("_")]


def unsupported(qualname: str, why: str, depth: int = 3) -> Unsupported:
    """The error for an NKI construct tilescope lacks, located at the user's line."""
    err = Unsupported(f"{qualname} is not supported by tilescope: {why}")
    return locate(err, user_frame(depth))


def missing(module, prefix: str, name: str, lacks: dict[str, str]):
    """What a module's ``__getattr__`` raises for ``name``."""
    if name.startswith("__"):
        raise AttributeError(name)
    why = lacks.get(name)
    if why is not None:
        raise unsupported(f"{prefix}.{name}", why, depth=3)
    close = difflib.get_close_matches(name, _names_of(module) + list(lacks), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(f'{prefix}.{c}' for c in close)}?" if close else ""
    err = Unsupported(f"{prefix}.{name} is not an NKI name{hint}")
    raise locate(err, user_frame(3))
