"""Small helpers for allocating on-chip tiles and issuing the kernel's elementwise work.

Every elementwise helper here asks the launch's balancer (``engines.active``) which engine should run it: fixed instructions (exp on the
scalar engine, two-tile ops reading PSUM on the vector engine) are charged to their engine, and flexible ones
(PSUM evacuations, SBUF-only multiplies and row scalings, copies) go to whichever candidate engine has the least
work queued. Matmuls and transposes run on the tensor engine.
"""

from __future__ import annotations

from typing import Any

from . import engines
from .backend import nisa, nl
from .engines import GPSIMD, SCALAR, VECTOR, active, free_elements, stream_ns

FP32 = nl.float32
BF16_LIKE = (nl.bfloat16, nl.float16)


def sbuf(shape: tuple[int, ...], dtype: Any) -> Any:
    """A fresh SBUF tile (partition dim first)."""
    return nl.ndarray(shape, dtype=dtype, buffer=nl.sbuf)


def load_scalar(entry: Any, at_run_time: bool) -> Any:
    """``nisa.scalar_load`` of a [1, 1] int32 table entry (an ``NkiScalar``).

    An entry at a run-time offset (a column a compiled loop's iteration value picks) is first copied into a fixed
    [1, 1] tile: ``scalar_load`` takes "a 1x1 tensor in SBUF or HBM with dtype nl.int32 or nl.int64" (ISA
    ``scalar_load``, SDK 2.33) and no page says whether a view at a run-time offset is one; a fixed tile is. One
    GpSimd copy (int32 to int32 moves the bits), on the engine nki-cpu charges the load to (its README, known
    unknown 25), so the load does not wait on another engine's semaphore.
    """
    if at_run_time:
        fixed = sbuf((1, 1), entry.dtype)
        nisa.tensor_copy(dst=fixed, src=entry, engine=nisa.engine.gpsimd)
        entry = fixed
    return nisa.scalar_load(entry)


def psum(shape: tuple[int, ...], dtype: Any = FP32) -> Any:
    """A fresh PSUM tile; fp32 unless a same-dtype PE transpose needs otherwise."""
    return nl.ndarray(shape, dtype=dtype, buffer=nl.psum)


def in_psum(tile: Any) -> bool:
    return tile.buffer == nl.psum


def _narrow(*tiles: Any) -> bool:
    return all(t.dtype in BF16_LIKE for t in tiles)


def _vector_copy_ns(src: Any, dst: Any, *operands: Any) -> float:
    """DVE copy/scale: 4x perf mode when every tile is narrow and in SBUF, 2x with a PSUM side, else 1/cycle."""
    n = free_elements(src)
    if _narrow(src, dst, *operands):
        return stream_ns(VECTOR, n, 0.5 if in_psum(src) else 0.25)
    return stream_ns(VECTOR, n)


def evacuate(src: Any, dtype: Any, scale: float = 1.0) -> Any:
    """Copy ``src`` (PSUM or SBUF) to a new SBUF tile of ``dtype``, multiplied by the float ``scale``."""
    return copy_to(sbuf(tuple(src.shape), dtype), src, scale)


def copy_to(dst: Any, src: Any, scale: float = 1.0, engine: Any = None) -> Any:
    """``dst = scale * src`` on ``engine``, or else on whichever of the scalar or vector engine (GpSimd too for a
    plain copy with nothing in PSUM) has the least work queued.

    GpSimd only copies: its ``tensor_scalar`` is documented for rsqrt alone (ISA ``tensor_scalar``, ``engine``
    parameter, v2.33.0; docs/nki-sources.md §3.7), so a scaled copy never goes there.
    """
    n = free_elements(src)
    options = [(SCALAR, stream_ns(SCALAR, n)), (VECTOR, _vector_copy_ns(src, dst))]
    if not in_psum(src) and scale == 1.0:
        options.append((GPSIMD, stream_ns(GPSIMD, n)))
    if engine is not None:
        options = [option for option in options if option[0] == engine]
    engine = active().pick(options)
    if engine == SCALAR:
        nisa.activation(dst=dst, op=nl.copy, data=src, scale=scale)
    elif scale == 1.0:
        nisa.tensor_copy(dst=dst, src=src, engine=engine)
    else:
        nisa.tensor_scalar(dst=dst, data=src, op0=nl.multiply, operand0=scale, engine=engine)
    return dst


def combine(dst: Any, a: Any, b: Any, op: Any, engine: Any = None) -> Any:
    """``dst = a op b`` elementwise (on ``engine`` when given).

    All in SBUF: on GpSimd or the vector engine. One input in PSUM: either directly on the vector engine, or as a
    scalar-engine evacuation of the PSUM input followed by the op on GpSimd — whichever finishes first, the staged
    form charged one dependency latency more (its result waits on two instructions in a row, not one).
    """
    n = free_elements(a)
    balancer = active()
    if engine is not None:
        balancer.charge(engine, stream_ns(engine, n, 1.0 if engine != VECTOR else 2.0))
        nisa.tensor_tensor(dst=dst, data1=a, data2=b, op=op, engine=engine)
        return dst
    if not (in_psum(a) or in_psum(b)):
        vector_passes = 0.5 if _narrow(a, b, dst) else 2.0
        engine = balancer.pick([(GPSIMD, stream_ns(GPSIMD, n)), (VECTOR, stream_ns(VECTOR, n, vector_passes))])
        nisa.tensor_tensor(dst=dst, data1=a, data2=b, op=op, engine=engine)
        return dst
    direct = balancer.load[VECTOR] + stream_ns(VECTOR, n)
    staged = max(balancer.load[SCALAR] + stream_ns(SCALAR, n), balancer.load[GPSIMD]) + stream_ns(GPSIMD, n)
    staged += engines.DEPENDENCY_NS  # one hop more (scalar -> GpSimd) on the op's dependency path
    if balancer.decide(direct <= staged):
        balancer.charge(VECTOR, stream_ns(VECTOR, n))
        nisa.tensor_tensor(dst=dst, data1=a, data2=b, op=op, engine=VECTOR)
        return dst
    a, b = (_staged(x) for x in (a, b))
    balancer.charge(GPSIMD, stream_ns(GPSIMD, n))
    nisa.tensor_tensor(dst=dst, data1=a, data2=b, op=op, engine=GPSIMD)
    return dst


def _staged(x: Any) -> Any:
    """An SBUF copy of a PSUM tile made by the scalar engine (fp32, exact); SBUF tiles pass through."""
    if not in_psum(x):
        return x
    active().charge(SCALAR, stream_ns(SCALAR, free_elements(x)))
    staged = sbuf(tuple(x.shape), FP32)
    nisa.activation(dst=staged, op=nl.copy, data=x)
    return staged


def multiply(a: Any, b: Any, dtype: Any) -> Any:
    """Elementwise ``a * b`` into a new tile of ``dtype``."""
    return combine(sbuf(tuple(a.shape), dtype), a, b, nl.multiply)


def scale_rows(x: Any, column: Any, dtype: Any, dst: Any = None, among: tuple[Any, ...] | None = None) -> Any:
    """``x[p, :] * column[p]`` into ``dst`` or a new tile of ``dtype`` (``column`` is a [P, 1] fp32 tile; ``x`` in
    SBUF or PSUM), on the scalar or vector engine, or — ``x`` a [P, n] SBUF tile — on GpSimd as a ``tensor_tensor``
    multiply by the column broadcast along the free axis (a stride-0 view; GpSimd's ``tensor_scalar`` is rsqrt
    only); ``among`` limits the candidate engines."""
    dst = dst if dst is not None else sbuf(tuple(x.shape), dtype)
    n = free_elements(x)
    options = [(SCALAR, stream_ns(SCALAR, n)), (VECTOR, _vector_copy_ns(x, dst, column))]
    if not in_psum(x) and len(x.shape) == 2:
        options.append((GPSIMD, stream_ns(GPSIMD, n)))
    if among is not None:
        options = [option for option in options if option[0] in among]
    engine = active().pick(options)
    if engine == SCALAR:
        nisa.activation(dst=dst, op=nl.copy, data=x, scale=column)
    elif engine == GPSIMD:
        nisa.tensor_tensor(dst=dst, data1=x, data2=column.broadcast(1, x.shape[1]), op=nl.multiply, engine=engine)
    else:
        nisa.tensor_scalar(dst=dst, data=x, op0=nl.multiply, operand0=column, engine=engine)
    return dst


def exp(data: Any, bias: Any = None, scale: float = 1.0, dtype: Any = FP32) -> Any:
    """``exp(scale * data + bias)`` on the scalar engine into a new tile (bias is a [P, 1] tile)."""
    dst = sbuf(tuple(data.shape), dtype)
    active().charge(SCALAR, stream_ns(SCALAR, free_elements(data)))
    nisa.activation(dst=dst, op=nl.exp, data=data, bias=bias, scale=scale)
    return dst


def scale_add(dst: Any, data: Any, column: Any, tile: Any) -> Any:
    """``dst = data * column + tile`` in one vector-engine instruction (``column`` is [P, 1])."""
    active().charge(VECTOR, stream_ns(VECTOR, free_elements(data), 2.0))
    nisa.scalar_tensor_tensor(dst=dst, data=data, op0=nl.multiply, operand0=column, op1=nl.add, operand1=tile)
    return dst


def select_by_diagonal(dst: Any, on_true_tile: Any, on_false_value: float, cmp_op: Any) -> Any:
    """``dst = on_true_tile`` where ``cmp_op(column − row, 0)`` holds, else ``on_false_value`` (square tiles, GpSimd).

    A select, not a multiply: values it replaces may be inf (an overflowed exp) and never meet the fill.
    """
    active().charge(GPSIMD, stream_ns(GPSIMD, free_elements(dst), start=engines.GPSIMD_START))
    nisa.affine_select(
        dst=dst,
        pattern=[[1, dst.shape[1]]],
        channel_multiplier=-1,
        on_true_tile=on_true_tile,
        on_false_value=on_false_value,
        cmp_op=cmp_op,
    )
    return dst


def high_half(tile: Any) -> Any:
    """The bf16 view of an fp32 tile's elements truncated to bf16: the upper 16 bits of each (little-endian
    storage: the second bf16 of each fp32), read in place through ``view(dtype)`` and a step-2 slice."""
    halves = tile.view(nl.bfloat16)
    return halves[:, 1 : halves.shape[1] : 2]


def matmul(
    stationary: Any,
    moving: Any,
    dst: Any | None = None,
    accumulate: bool = False,
    moving_onezero: bool = False,
    stationary_onezero: bool = False,
) -> Any:
    """``dst (+)= stationaryᵀ @ moving`` into an fp32 PSUM tile (allocated when ``dst`` is None).

    ``moving_onezero`` / ``stationary_onezero`` declare that that operand holds only 0 and 1 (an identity, a
    selection), the documented hint that lets the tensor engine run an fp32 matmul up to 2× faster; it changes no
    value.
    """
    if dst is None:
        dst = psum((stationary.shape[1], moving.shape[1]))
    nisa.nc_matmul(dst=dst, stationary=stationary, moving=moving, accumulate=accumulate,
                   is_moving_onezero=moving_onezero, is_stationary_onezero=stationary_onezero)  # fmt: skip
    return dst


def transpose(data: Any) -> Any:
    """PE transpose of an SBUF tile into a PSUM tile of the same dtype (the transpose rule on gen3+)."""
    dst = psum((data.shape[1], data.shape[0]), data.dtype)
    nisa.nc_transpose(dst=dst, data=data, engine=nisa.tensor_engine)
    return dst
