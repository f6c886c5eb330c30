"""``nki.isa`` on the CPU: one function per hardware instruction, destination first, one trace record each."""

from __future__ import annotations

from typing import Any

from nki_cpu.isa.activations import activation, activation_reduce, exponential
from nki_cpu.isa.dma import dma_compute, dma_copy, dma_transpose
from nki_cpu.isa.elementwise import reciprocal, scalar_tensor_tensor, tensor_copy, tensor_scalar, tensor_tensor
from nki_cpu.isa.enums import (
    NkiInstruction,
    NkiValidationError,
    VirtualRegister,
    dge_mode,
    dma_engine,
    engine,
    get_nc_sub_version,
    get_nc_version,
    gpsimd_engine,
    matmul_perf_mode,
    nc_version,
    oob_mode,
    reduce_cmd,
    scalar_engine,
    tensor_engine,
    unknown_engine,
    vector_engine,
)
from nki_cpu.isa.gpsimd import affine_select, iota, tensor_partition_reduce
from nki_cpu.isa.reductions import (
    bn_aggr,
    bn_stats,
    tensor_reduce,
    tensor_scalar_cumulative,
    tensor_scalar_reduce,
    tensor_tensor_scan,
)
from nki_cpu.isa.registers import (
    register_alloc,
    register_load,
    register_move,
    register_store,
    scalar_load,
    scalar_store,
)
from nki_cpu.isa.select_move import memset, nc_stream_shuffle, range_select, select_reduce, tensor_copy_predicated
from nki_cpu.isa.tensor_engine import nc_matmul, nc_transpose
from nki_cpu.scalar import NkiScalar
from nki_cpu.tensor import NkiTensor as NkiTensor

# The submodule import above bound ``isa.tensor_engine`` to the module; the NKI name is the engine constant.
tensor_engine = engine.tensor  # noqa: F811


def core_barrier(data: Any = None, cores: Any = (0, 1), engine: Any = engine.gpsimd, name: str | None = None) -> None:
    """Barrier of the programs of an LNC launch; programs run one after another here, so it is a no-op."""


def sendrecv(*args: Any, **kwargs: Any) -> None:
    """Not supported: programs of a launch run sequentially in nki-cpu (README)."""
    raise NotImplementedError("nki-cpu runs LNC programs sequentially; nisa.sendrecv is not supported")


__all__ = [
    "NkiInstruction",
    "NkiScalar",
    "NkiValidationError",
    "VirtualRegister",
    "activation",
    "activation_reduce",
    "affine_select",
    "bn_aggr",
    "bn_stats",
    "core_barrier",
    "dge_mode",
    "dma_compute",
    "dma_copy",
    "dma_engine",
    "dma_transpose",
    "engine",
    "exponential",
    "get_nc_sub_version",
    "get_nc_version",
    "gpsimd_engine",
    "iota",
    "matmul_perf_mode",
    "memset",
    "nc_matmul",
    "nc_stream_shuffle",
    "nc_transpose",
    "nc_version",
    "oob_mode",
    "range_select",
    "reciprocal",
    "reduce_cmd",
    "register_alloc",
    "register_load",
    "register_move",
    "register_store",
    "scalar_engine",
    "scalar_load",
    "scalar_store",
    "scalar_tensor_tensor",
    "select_reduce",
    "sendrecv",
    "tensor_copy",
    "tensor_copy_predicated",
    "tensor_engine",
    "tensor_partition_reduce",
    "tensor_reduce",
    "tensor_scalar",
    "tensor_scalar_cumulative",
    "tensor_scalar_reduce",
    "tensor_tensor",
    "tensor_tensor_scan",
    "unknown_engine",
    "vector_engine",
]
