"""Small helpers for allocating on-chip tiles and naming the engines stages run on.

Engine choice per instruction is a performance decision documented where each stage calls these helpers: the
vector engine (DVE) carries the work only it can do (two-tile ops reading PSUM), the scalar engine (ACT) does
exponentials and PSUM evacuations, and GpSimd (POOL) takes SBUF-only elementwise work so the DVE stays free.
"""

from __future__ import annotations

from typing import Any

from .backend import nisa, nl

FP32 = nl.float32

# Engines, named by the role they play in this kernel.
EVACUATE = nisa.engine.scalar  # PSUM -> SBUF copies with an optional cast or scale
POOL = nisa.engine.gpsimd  # SBUF-only elementwise work off the vector engine
VECTOR = nisa.engine.vector


def sbuf(shape: tuple[int, ...], dtype: Any) -> Any:
    """A fresh SBUF tile (partition dim first)."""
    return nl.ndarray(shape, dtype=dtype, buffer=nl.sbuf)


def psum(shape: tuple[int, ...], dtype: Any = FP32) -> Any:
    """A fresh PSUM tile; fp32 unless a same-dtype PE transpose needs otherwise."""
    return nl.ndarray(shape, dtype=dtype, buffer=nl.psum)


def evacuate(src: Any, dtype: Any, scale: float | Any = 1.0) -> Any:
    """Copy a PSUM tile to a new SBUF tile of ``dtype``, multiplied by ``scale`` (free on the scalar engine)."""
    dst = sbuf(tuple(src.shape), dtype)
    nisa.activation(dst=dst, op=nl.copy, data=src, scale=scale)
    return dst


def copy_to(dst: Any, src: Any, engine: Any = VECTOR) -> Any:
    """``dst = src`` on ``engine`` (cast through fp32 when dtypes differ)."""
    nisa.tensor_copy(dst=dst, src=src, engine=engine)
    return dst


def matmul(stationary: Any, moving: Any, dst: Any | None = None, accumulate: bool = False) -> Any:
    """``dst (+)= stationaryᵀ @ moving`` into an fp32 PSUM tile (allocated when ``dst`` is None)."""
    if dst is None:
        dst = psum((stationary.shape[1], moving.shape[1]))
    nisa.nc_matmul(dst=dst, stationary=stationary, moving=moving, accumulate=accumulate)
    return dst


def transpose(data: Any) -> Any:
    """PE transpose of an SBUF tile into a PSUM tile of the same dtype (the transpose rule on gen3+)."""
    dst = psum((data.shape[1], data.shape[0]), data.dtype)
    nisa.nc_transpose(dst=dst, data=data, engine=nisa.tensor_engine)
    return dst


def multiply(a: Any, b: Any, dtype: Any, engine: Any = POOL) -> Any:
    """Elementwise ``a * b`` into a new tile of ``dtype``."""
    dst = sbuf(tuple(a.shape), dtype)
    nisa.tensor_tensor(dst=dst, data1=a, data2=b, op=nl.multiply, engine=engine)
    return dst


def scale_rows(x: Any, column: Any, dtype: Any, engine: Any = POOL) -> Any:
    """``x[p, :] * column[p]`` into a new tile of ``dtype`` (``column`` is [P, 1])."""
    dst = sbuf(tuple(x.shape), dtype)
    nisa.tensor_scalar(dst=dst, data=x, op0=nl.multiply, operand0=column, engine=engine)
    return dst


def exp(data: Any, bias: Any = None, scale: float = 1.0, dtype: Any = FP32) -> Any:
    """``exp(scale * data + bias)`` on the scalar engine into a new tile (bias is a [P, 1] tile)."""
    dst = sbuf(tuple(data.shape), dtype)
    nisa.activation(dst=dst, op=nl.exp, data=data, bias=bias, scale=scale)
    return dst
