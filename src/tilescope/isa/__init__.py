"""Engine instructions, their operands, and the one table of cost formulas.

Inside a tile kernel, each ``tilescope.isa`` call emits exactly one engine
instruction (see :mod:`tilescope.lang`); outside one, these are the plain data
classes every Program is made of.
"""

from ._ap import AP, RuntimeScalar, Scalar
from ._cost import (
    COST_TABLE, DGE_CYCLES_PER_DESCRIPTOR, GENERIC_CYCLES_PER_ELEMENT, LOCAL_GATHER_CYCLES_PER_ELEMENT,
    CostRule, DmaCost, dge_cycles, dma_cost, dma_engines, dma_indirect_cost, engine_cycles, engine_ns, flops,
    generic_routine_cycles, load_stationary_cycles, local_gather_cycles, matmul_cycles,
)
from ._instructions import (
    ENGINE_NAMES, INSTRUCTION_KINDS, Activation, ActivationReduce, BnAggr, BnStats,
    AffineSelect, DmaCopy, DmaIndirect, Dropout, GpsimdCall, Instruction, Iota, MatchReplace8, Matmul, Max8, Memset,
    FindIndex8, ScalarTensorTensor,
    Reciprocal, Select,
    TensorCopy, TensorReduce, TensorScalar, TensorScalarReduce, TensorTensor, TensorTensorScan,
    Transpose, field_access,
)
from ._kernel_api import (
    activation, activation_reduce, affine_select, bn_aggr, bn_stats, dma_copy, engine, iota, memset,
    nc_matmul, nc_transpose, reciprocal, select, tensor_copy, tensor_reduce, tensor_scalar,
    tensor_scalar_reduce, tensor_tensor, tensor_tensor_scan, max8, nc_find_index8, nc_match_replace8,
    scalar_tensor_tensor, dma_transpose,
)
from ._op_semantics import ACTIVATIONS, ALU_OPS, REDUCE_OPS

__all__ = [
    "AP", "RuntimeScalar", "Scalar",
    "Instruction", "DmaCopy", "DmaIndirect", "TensorTensor", "TensorScalar", "Activation",
    "ActivationReduce", "TensorReduce", "TensorCopy", "Select", "Iota", "Memset",
    "Matmul", "Transpose", "BnStats", "BnAggr", "GpsimdCall", "TensorTensorScan",
    "TensorScalarReduce", "AffineSelect", "Reciprocal", "Max8", "MatchReplace8", "FindIndex8", "Dropout", "ScalarTensorTensor",
    "INSTRUCTION_KINDS", "ENGINE_NAMES", "field_access", "ALU_OPS", "ACTIVATIONS", "REDUCE_OPS",
    "COST_TABLE", "CostRule", "DmaCost", "dma_cost", "dma_engines", "dma_indirect_cost", "engine_cycles", "engine_ns",
    "matmul_cycles", "load_stationary_cycles", "flops", "generic_routine_cycles", "GENERIC_CYCLES_PER_ELEMENT",
    "dge_cycles", "DGE_CYCLES_PER_DESCRIPTOR", "local_gather_cycles", "LOCAL_GATHER_CYCLES_PER_ELEMENT",
    # kernel calls: one instruction each, inside a tile kernel
    "nc_matmul", "nc_transpose", "activation", "activation_reduce", "tensor_tensor", "tensor_scalar",
    "tensor_reduce", "tensor_copy", "iota", "memset", "bn_stats", "bn_aggr", "dma_copy", "select",
    "tensor_tensor_scan", "tensor_scalar_reduce", "affine_select", "reciprocal", "engine", "max8", "scalar_tensor_tensor",
    "dma_transpose",
    "nc_find_index8", "nc_match_replace8",
]
