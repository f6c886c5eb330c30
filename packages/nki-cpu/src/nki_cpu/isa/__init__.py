"""``nki.isa`` on the CPU: one function per hardware instruction, destination first, one trace record each."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

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
from nki_cpu.isa.select_move import memset, nc_stream_shuffle, range_select, select_reduce, tensor_copy_predicated
from nki_cpu.isa.tensor_engine import nc_matmul, nc_transpose
from nki_cpu.scalar import NkiScalar
from nki_cpu.tensor import NkiTensor

# The submodule import above bound ``isa.tensor_engine`` to the module; the NKI name is the engine constant.
tensor_engine = engine.tensor  # noqa: F811


def register_alloc(x: Any = None) -> VirtualRegister:
    """A runtime register holding ``x`` (an int, or the value of a 1x1 tensor)."""
    if isinstance(x, NkiTensor):
        return VirtualRegister(int(x.read().reshape(-1)[0]))
    return VirtualRegister(0 if x is None else int(x))


def register_move(dst: VirtualRegister, src: Any) -> None:
    """``dst = src`` (register or int)."""
    dst.value = int(src)


def register_load(dst: VirtualRegister, src: NkiTensor) -> None:
    """Load a register from a 1x1 tensor."""
    dst.value = int(src.read().reshape(-1)[0])


def register_store(dst: NkiTensor, src: VirtualRegister) -> None:
    """Store a register into a 1x1 tensor."""
    dst.write(np.full(dst.shape, int(src), dtype=np.int64))


def scalar_load(src: NkiTensor) -> NkiScalar:
    """Read a 1x1 ``nl.int32`` / ``nl.int64`` tile into a run-time scalar of the tile's width (SDK 2.33)."""
    if src.dtype.name not in ("int32", "int64") or math.prod(src.shape) != 1:
        raise TypeError(
            f"scalar_load: src must be a 1x1 int32 or int64 tile, got {src.dtype.name} {tuple(src.shape)}. Fix: "
            "load from a [1, 1] nl.int32 (or nl.int64) tile"
        )
    return NkiScalar(int(src.read().reshape(-1)[0]), src.dtype.name)


def scalar_store(dst: NkiTensor, value: NkiScalar) -> None:
    """Write a run-time scalar to a 1x1 tile of the same width (SDK 2.33: a Python int is not accepted)."""
    if not isinstance(value, NkiScalar):
        raise TypeError(f"scalar_store: value must be an NkiScalar, got {value!r}. Fix: nisa.memset for a constant")
    if dst.dtype.name != value.dtype or math.prod(dst.shape) != 1:
        raise TypeError(
            f"scalar_store: dst must be a 1x1 {value.dtype} tile (the scalar's width), got {dst.dtype.name} "
            f"{tuple(dst.shape)}"
        )
    dst.write(np.full(dst.shape, value.value, dtype=dst.dtype))


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
