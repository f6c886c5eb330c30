"""``nki.language`` on the CPU: dtypes, buffers, creation, loops, launch queries, operator tokens, convenience ops.

Operator tokens (``nl.add``, ``nl.exp``...) are :class:`nki_cpu.opcodes.Op` objects: passed to ``nisa`` they name
the operation; called (``nl.add(x, y)``) they run the convenience form, which allocates its SBUF (or PSUM) result
and lowers to ``nisa`` instructions, so every convenience op also leaves records in the trace.
"""

from __future__ import annotations

import builtins
import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from nki_cpu import checks, loops, opcodes, operands, state
from nki_cpu import isa as nisa
from nki_cpu.dtypes import (
    bfloat16,
    bool_,
    float4_e2m1fn_x4,
    float8_e4m3,
    float8_e4m3fn,
    float8_e4m3fn_x4,
    float8_e5m2,
    float8_e5m2_x4,
    float8_e8m0fnu,
    float16,
    float32,
    int8,
    int16,
    int32,
    int64,
    tfloat32,
    uint8,
    uint16,
    uint32,
)
from nki_cpu.isa.enums import VirtualRegister
from nki_cpu.opcodes import (
    abs,
    abs_max,
    abs_min,
    add,
    arctan,
    average,
    bitwise_and,
    bitwise_or,
    bitwise_xor,
    bypass,
    ceil,
    copy,
    cos,
    divide,
    equal,
    erf,
    erf_dx,
    exp,
    floor,
    fmod,
    gelu,
    gelu_apprx_sigmoid,
    gelu_apprx_sigmoid_dx,
    gelu_apprx_tanh,
    gelu_dx,
    greater,
    greater_equal,
    invert,
    left_shift,
    less,
    less_equal,
    log,
    logical_and,
    logical_not,
    logical_or,
    logical_xor,
    maximum,
    minimum,
    mish,
    mod,
    multiply,
    negative,
    not_equal,
    power,
    prelu,
    reciprocal,
    relu,
    right_shift,
    rsqrt,
    sigmoid,
    sign,
    silu,
    silu_dx,
    sin,
    softplus,
    sqrt,
    square,
    subtract,
    tan,
    tanh,
    trunc,
)
from nki_cpu.scalar import NkiScalar, runtime_value
from nki_cpu.tensor import DynamicSlice, MemoryRegion, NkiTensor, allocate

bool = bool_

# --- buffers -----------------------------------------------------------------------------------------------------
sbuf = MemoryRegion.sbuf
psum = MemoryRegion.psum
private_hbm = MemoryRegion.private_hbm
hbm = MemoryRegion.private_hbm
shared_hbm = MemoryRegion.shared_hbm

FP32_MIN = float(np.finfo(np.float32).min)


class tile_size:  # noqa: N801 - the NKI name
    """Hardware tile limits (Trn2 values; ``nl.tile_size`` page v2.33.0 and docs/nki-sources.md §2.9; README for the undocumented ones)."""

    pmax = 128
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512
    psum_bank_fmax = 512
    psum_fmax = 512
    psum_bank_fmax_bytes = checks.PSUM_BANK_BYTES
    psum_num_banks = checks.PSUM_BANKS
    bn_stats_fmax = 512
    sbuf_fmax_bytes = checks.SBUF_BYTES_PER_PARTITION
    sbuf_fmax = checks.SBUF_BYTES_PER_PARTITION // 4
    total_available_sbuf_size = checks.SBUF_BYTES_PER_PARTITION
    sbuf_size_bytes = 28 * 1024 * 1024
    psum_min_align = 4
    sbuf_min_align = 4


class NKIObject:
    """Base class for user dataclasses passed into kernels (no behaviour)."""


def ds(start: Any, size: int) -> DynamicSlice:
    """The slice ``start : start + size`` (``nl.ds``): ``size`` a trace-time int, ``start`` an int or a run-time
    value (``NkiScalar``, ``VirtualRegister``, 1x1 tensor), e.g. a ``fori_loop`` iteration value (nki.language.ds,
    SDK 2.33)."""
    if not isinstance(size, builtins.int) or isinstance(size, builtins.bool):
        checks.fail(
            f"nl.ds size must be a trace-time int (the access pattern needs a static count), got {size!r}",
            checks.KernelTypeError,
        )
    return DynamicSlice(start, size)


# --- creation ----------------------------------------------------------------------------------------------------
def ndarray(shape: Sequence[int], dtype: Any, buffer: Any = sbuf, name: str = "", address: Any = None) -> NkiTensor:
    """A fresh, uninitialised tensor (NaN for floats, 4 for integers, like the simulator).

    Dimensions:
        On-chip: dim 0 = partitions.

    Args:
        shape: tensor shape.
        dtype: element dtype.
        buffer: ``nl.sbuf`` (default), ``nl.psum``, ``nl.hbm``, ``nl.private_hbm``, ``nl.shared_hbm``.
        name: debug label.
        address: manual placement (ignored).

    Returns:
        The new tensor, with storage independent of every other allocation.
    """
    if isinstance(buffer, str) and not isinstance(buffer, MemoryRegion):
        operands.rule(
            "buffer_strings",
            f"ndarray buffer {buffer!r} is a string; pass nl.sbuf, nl.psum, nl.hbm or nl.shared_hbm (NKI 0.3.0+)",
        )
    return allocate(shape, dtype, MemoryRegion(buffer), name)


def _filled(shape: Sequence[int], value: float, dtype: Any, buffer: Any, name: str) -> NkiTensor:
    t = ndarray(shape, dtype, buffer, name)
    if t.buffer.on_chip:
        nisa.memset(t, value)
    else:
        t.write(np.full(t.shape, value, dtype=np.float32))
    return t


def zeros(shape: Sequence[int], dtype: Any, buffer: Any = sbuf, name: str = "") -> NkiTensor:
    """A tensor of zeros (on-chip: one memset)."""
    return _filled(shape, 0, dtype, buffer, name)


def ones(shape: Sequence[int], dtype: Any, buffer: Any = sbuf, name: str = "") -> NkiTensor:
    """A tensor of ones (on-chip: one memset)."""
    return _filled(shape, 1, dtype, buffer, name)


def full(shape: Sequence[int], fill_value: float, dtype: Any, buffer: Any = sbuf, name: str = "") -> NkiTensor:
    """A tensor filled with ``fill_value`` (on-chip: one memset)."""
    return _filled(shape, fill_value, dtype, buffer, name)


def zeros_like(x: NkiTensor, dtype: Any = None, buffer: Any = None, name: str = "") -> NkiTensor:
    """Zeros with ``x``'s shape (and dtype/buffer unless given)."""
    return zeros(x.shape, dtype or x.dtype, buffer or x.buffer, name)


def ones_like(x: NkiTensor, dtype: Any = None, buffer: Any = None, name: str = "") -> NkiTensor:
    """Ones with ``x``'s shape (and dtype/buffer unless given)."""
    return ones(x.shape, dtype or x.dtype, buffer or x.buffer, name)


def empty_like(x: NkiTensor, dtype: Any = None, buffer: Any = None, name: str = "") -> NkiTensor:
    """An uninitialised tensor with ``x``'s shape (and dtype/buffer unless given)."""
    return ndarray(x.shape, dtype or x.dtype, buffer or x.buffer, name)


_rng = np.random.default_rng(0)


def rand(shape: Sequence[int], dtype: Any = float32, buffer: Any = sbuf, name: str = "") -> NkiTensor:
    """Uniform [0, 1) values (numpy generator; seed with ``random_seed``)."""
    t = ndarray(shape, dtype, buffer, name)
    t.write(_rng.random(t.shape, dtype=np.float32))
    return t


def random_seed(seed: Any) -> None:
    """Seed ``rand`` from an int or a 1x1 tensor."""
    global _rng
    value = int(seed._read().reshape(-1)[0]) if isinstance(seed, NkiTensor) else int(seed)
    _rng = np.random.default_rng(value)


def shared_identity_matrix(n: int, dtype: Any = uint8, dst: NkiTensor | None = None) -> NkiTensor:
    """An n×n identity in SBUF (memset + affine_select)."""
    t = dst if dst is not None else ndarray((n, n), dtype, sbuf)
    nisa.memset(t, 1)
    nisa.affine_select(t, [[-1, n]], 1, t, 0.0, cmp_op=equal)
    return t


def shared_constant(constant: Any, dtype: Any = None) -> NkiTensor:
    """A shared-HBM tensor holding a numpy array (or the ``.npy`` file at a path)."""
    array = np.load(constant) if isinstance(constant, str) else np.asarray(constant)
    t = ndarray(array.shape, dtype or array.dtype, shared_hbm)
    t.write(array)
    return t


# --- buffers queries, misc -----------------------------------------------------------------------------------------
def is_hbm(buffer: Any) -> bool:
    """True for HBM buffers."""
    return not MemoryRegion(buffer).on_chip


def is_sbuf(buffer: Any) -> bool:
    """True for SBUF."""
    return MemoryRegion(buffer) is MemoryRegion.sbuf


def is_psum(buffer: Any) -> bool:
    """True for PSUM."""
    return MemoryRegion(buffer) is MemoryRegion.psum


def is_on_chip(buffer: Any) -> bool:
    """True for SBUF and PSUM."""
    return MemoryRegion(buffer).on_chip


def device_print(prefix: str, x: Any) -> None:
    """Print a tensor's values immediately (simulator behaviour)."""
    print(prefix, x._read() if isinstance(x, NkiTensor) else x)


@contextlib.contextmanager
def no_reorder() -> Iterator[None]:
    """Keep the block's instructions in program order (``nki.language.no_reorder``).

    The interpreter runs in program order anyway; the block's instructions are marked so that the cost model,
    when it reorders as the compiler does (``nki_cpu.cost.estimate(trace, order="critical_path")`` or
    ``"asap"``), keeps their order.
    Nested blocks are one block. A compiled loop (``fori_loop`` / ``while_loop``) inside the block is rejected, as
    the page says it is not supported there.
    """
    launch = state.current()
    if launch.no_reorder_block is not None:
        yield
        return
    launch.no_reorder_blocks += 1
    launch.no_reorder_block = launch.no_reorder_blocks
    try:
        yield
    finally:
        launch.no_reorder_block = None


# --- loops and launch queries --------------------------------------------------------------------------------------
def _ints(*args: Any) -> tuple[int, ...]:
    return tuple(int(a) for a in args)


def affine_range(start: int, stop: int | None = None, step: int = 1) -> builtins.range:
    """Alias of Python ``range`` (yields ints)."""
    if stop is None:
        return builtins.range(*_ints(start))
    return builtins.range(*_ints(start, stop, step))


sequential_range = affine_range
static_range = affine_range
range = affine_range


def fori_loop(lower: Any, upper: Any, body_fun: Callable[[Any], Any], step: int = 1) -> None:
    """Compiled loop: ``body_fun(i)`` for i in range(lower, upper, step), one body in the program, its later
    iterations recorded as repeats (see :mod:`nki_cpu.loops`).

    As in NKI 0.7 (nki.language.fori_loop, SDK 2.33), ``i`` is an ``NkiScalar`` (a ``VirtualRegister`` when a bound
    is one): usable as an offset and in +, -, * arithmetic, never as a Python int. Bounds are ints, registers or
    32-bit scalars (rule ``loop_bounds``); ``step`` is a positive trace-time int. A loop that runs zero times still
    traces its body once (checked, in ``Trace.program``, nothing written).
    """
    if not isinstance(step, builtins.int) or isinstance(step, builtins.bool) or step <= 0:
        checks.fail(f"fori_loop step must be a positive trace-time int, got {step!r}", checks.KernelTypeError)
    for name, bound in (("lower", lower), ("upper", upper)):
        _loop_bound("fori_loop", name, bound)
    as_register = any(isinstance(bound, VirtualRegister) for bound in (lower, upper))
    start = runtime_value(lower)
    values = builtins.range(start, runtime_value(upper), step)
    for i in loops.compiled_iterations(values, "fori_loop", start):
        body_fun(VirtualRegister(i) if as_register else NkiScalar(i))


def _loop_bound(instr: str, name: str, bound: Any) -> None:
    """A loop bound is an int, a ``VirtualRegister`` or an int32 ``NkiScalar`` (rule ``loop_bounds``)."""
    if isinstance(bound, NkiScalar):
        if bound.dtype != "int32":
            operands.rule(
                "loop_bounds",
                f"{instr} {name} must be a 32-bit value, got an {bound.dtype} NkiScalar (the trip-count comparison "
                "has no 64-bit form: nki.isa.scalar_load, SDK 2.33). Fix: load the bound from an nl.int32 tile",
            )
        return
    if isinstance(bound, VirtualRegister):
        return
    if isinstance(bound, builtins.bool) or not isinstance(bound, (builtins.int, np.integer)):
        operands.rule(
            "loop_bounds",
            f"{instr} {name} must be an int, a VirtualRegister or an int32 NkiScalar, got {bound!r}. Fix: round it "
            "on the host (a float bound is not truncated by the compiler)",
        )


class _Condition:
    """The register a ``while_loop`` tests next (the body's return value)."""

    def __init__(self, register: VirtualRegister) -> None:
        self.register = register

    def values(self) -> Iterator[VirtualRegister]:
        while runtime_value(self.register) != 0:
            yield _copy_register(self.register)


def _copy_register(register: VirtualRegister) -> VirtualRegister:
    """The body's ``r``: the condition passed by value (nki.language.while_loop)."""
    copy = VirtualRegister()
    copy.set(runtime_value(register), register.sources)
    return copy


def while_loop(init: Any, body_fun: Callable[[Any], Any]) -> None:
    """Compiled loop while a register is non-zero: ``r = init; while r != 0: r = body_fun(r)``.

    As ``fori_loop``: one body in the program (checked the same every iteration, later iterations recorded as
    repeats, traced once when ``init`` is zero), not inside ``nl.no_reorder()``. The body gets the condition as a
    ``VirtualRegister`` (by value) and returns the next condition register (nki.language.while_loop, v2.32.0 and
    latest).
    """
    if not isinstance(init, VirtualRegister):
        operands.rule(
            "loop_bounds",
            f"while_loop init must be a VirtualRegister, got {type(init).__name__}. Fix: r = nisa.register_alloc(); "
            "nisa.register_load(r, tile)",
        )
        init = VirtualRegister(runtime_value(init))
    condition = _Condition(init)
    for r in loops.compiled_iterations(condition.values(), "while_loop", _copy_register(init)):
        following = body_fun(r)
        if not isinstance(following, VirtualRegister):
            checks.fail(
                f"while_loop body_fun must return the next condition VirtualRegister, got {type(following).__name__}"
            )
        condition.register = following


def program_id(axis: int = 0) -> int:
    """Index of this program in the launch grid (0 for a plain launch)."""
    return state.current().program_id if axis == 0 else 0


def num_programs(axes: int = 0) -> int:
    """Programs in the launch grid along ``axes`` (1 for a plain launch)."""
    return state.current().num_programs if axes == 0 else 1


def program_ndim() -> int:
    """Launch-grid rank: 0 for ``kernel(args)``, 1 for ``kernel[n](args)``."""
    return state.current().program_ndim


# --- convenience ops ---------------------------------------------------------------------------------------------
def _result(x: NkiTensor, dtype: Any, shape: Sequence[int] | None = None) -> NkiTensor:
    return ndarray(tuple(shape) if shape is not None else x.shape, dtype or x.dtype, sbuf)


def _binary_convenience(op: opcodes.Op) -> Callable[..., Any]:
    def call(x: Any, y: Any, dtype: Any = None, **_: Any) -> Any:
        if isinstance(x, NkiTensor) and isinstance(y, NkiTensor):
            out = _result(x, dtype)
            nisa.tensor_tensor(out, x, y, op)
        elif isinstance(x, NkiTensor):
            out = _result(x, dtype)
            nisa.tensor_scalar(out, x, op, y)
        elif isinstance(y, NkiTensor):
            out = _result(y, dtype)
            nisa.tensor_scalar(out, y, op, x, reverse0=True)
        else:
            return op.binary(np.float32(x), np.float32(y)) if op.binary else None
        return out

    return call


def _unary_convenience(op: opcodes.Op) -> Callable[..., Any]:
    def call(x: Any, dtype: Any = None, **_: Any) -> Any:
        if not isinstance(x, NkiTensor):
            return op.unary(np.float32(x)) if op.unary else None
        out = _result(x, dtype)
        if op.bitvec:
            nisa.tensor_scalar(out, x, op, None)
        else:
            nisa.activation(out, op, x)
        return out

    return call


def _copy_convenience(x: NkiTensor, dtype: Any = None, **_: Any) -> NkiTensor:
    out = _result(x, dtype)
    nisa.tensor_copy(out, x)
    return out


for _op in opcodes.ALL_OPS.values():
    if _op.name == "copy":
        _op.convenience = _copy_convenience
    elif _op.binary is not None:
        _op.convenience = _binary_convenience(_op)
    else:
        _op.convenience = _unary_convenience(_op)


def load(src: NkiTensor, dtype: Any = None, **_: Any) -> NkiTensor:
    """A new SBUF tile with the HBM view's shape (dim 0 → partitions), converted to ``dtype`` if given."""
    out = ndarray(src.shape, dtype or src.dtype, sbuf)
    nisa.dma_copy(out, src)
    return out


def store(dst: NkiTensor, value: NkiTensor, **_: Any) -> None:
    """Copy an SBUF tile into an HBM view (equal element counts)."""
    nisa.dma_copy(dst, value)


def load_transpose2d(src: NkiTensor, dtype: Any = None, **_: Any) -> NkiTensor:
    """Load a 2-D HBM view transposed into a new SBUF tile (DMA transpose)."""
    out = ndarray((src.shape[1], src.shape[0]), src.dtype, sbuf)
    nisa.dma_transpose(out, src)
    return out if dtype is None or dtype == src.dtype else copy(out, dtype=dtype)


def matmul(x: NkiTensor, y: NkiTensor, transpose_x: Any = False, **_: Any) -> NkiTensor:
    """``x.T @ y`` (transpose_x=True) or ``x @ y`` into a new fp32 PSUM tile.

    Dimensions:
        transpose_x=True: x [K, M], y [K, N] → [M, N]. transpose_x=False: x [M, K] is transposed first.

    Args:
        x: SBUF tile.
        y: SBUF tile.
        transpose_x: whether x is already stored K-major.

    Returns:
        [M, N] fp32 PSUM tile.
    """
    stationary = x
    if not transpose_x:
        stationary = transpose(x)
        stationary = copy(stationary, dtype=x.dtype)
    out = ndarray((stationary.free_elems, y.free_elems), float32, psum)
    nisa.nc_matmul(out, stationary, y)
    return out


def transpose(x: NkiTensor, dtype: Any = None, **_: Any) -> NkiTensor:
    """2-D partition/free transpose into a new PSUM tile (PE from SBUF, VectorE otherwise; README)."""
    out = ndarray((x.free_elems, x.shape[0]), x.dtype, psum)
    nisa.nc_transpose(out, x)
    if dtype is not None and dtype != x.dtype:
        return copy(out, dtype=dtype)
    return out


def _reduce_shape(x: NkiTensor, axis: Any, keepdims: Any) -> tuple[list[int], tuple[int, ...]]:
    axes = sorted({int(a) % x.ndim for a in ((axis,) if isinstance(axis, (int, np.integer)) else axis)})
    if keepdims:
        shape = tuple(1 if d in axes else n for d, n in enumerate(x.shape))
    else:
        shape = tuple(n for d, n in enumerate(x.shape) if d not in axes)
        if len(shape) < 2:
            shape = (*shape, 1)
    return axes, shape


def _reduction(op: opcodes.Op) -> Callable[..., NkiTensor]:
    def call(x: NkiTensor, axis: Any, dtype: Any = None, keepdims: Any = False, **_: Any) -> NkiTensor:
        axes, shape = _reduce_shape(x, axis, keepdims)
        out = _result(x, dtype, shape)
        nisa.tensor_reduce(out, op, x, axes, keepdims=keepdims)
        return out

    return call


sum = _reduction(add)
max = _reduction(maximum)
min = _reduction(minimum)
prod = _reduction(multiply)
all = _reduction(logical_and)


def mean(x: NkiTensor, axis: Any, dtype: Any = None, keepdims: Any = False, **_: Any) -> NkiTensor:
    """Mean over trailing free axes (fp32 sum, then one scaling)."""
    axes, shape = _reduce_shape(x, axis, keepdims)
    total = ndarray(shape, float32, sbuf)
    nisa.tensor_reduce(total, add, x, axes, keepdims=keepdims)
    count = math.prod(x.shape[a] for a in axes)
    out = _result(x, dtype, shape)
    nisa.tensor_scalar(out, total, multiply, 1.0 / count)
    return out


def var(x: NkiTensor, axis: Any, dtype: Any = None, **_: Any) -> NkiTensor:
    """Population variance over trailing free axes (keepdims shape, like the NKI op)."""
    axes, _shape = _reduce_shape(x, axis, True)
    mu = mean(x, axes, dtype=float32, keepdims=True)
    centred = ndarray(x.shape, float32, sbuf)
    flat_mu = mu.reshape((mu.shape[0], 1)) if mu.free_elems == 1 else mu
    nisa.tensor_scalar(centred, x, subtract, flat_mu)
    nisa.tensor_tensor(centred, centred, centred, multiply)
    return mean(centred, axes, dtype=dtype or x.dtype, keepdims=True)


def softmax(x: NkiTensor, axis: Any = -1, dtype: Any = None, **_: Any) -> NkiTensor:
    """Softmax along the last free axis: negmax, exp with running sum, reciprocal, scale."""
    rows = x.shape[0]
    neg_max = ndarray((rows, 1), float32, sbuf)
    nisa.tensor_reduce(neg_max, maximum, x, [x.ndim - 1], negate=True, keepdims=True)
    exps = ndarray(x.shape, float32, sbuf)
    total = ndarray((rows, 1), float32, sbuf)
    nisa.activation(
        exps, exp, x, bias=neg_max, reduce_op=add, reduce_res=total, reduce_cmd=nisa.reduce_cmd.reset_reduce
    )
    nisa.reciprocal(total, total)
    out = _result(x, dtype)
    nisa.tensor_scalar(out, exps, multiply, total)
    return out


def rms_norm(
    x: NkiTensor,
    w: NkiTensor,
    axis: Any = -1,
    n: int | None = None,
    epsilon: float = 1e-6,
    dtype: Any = None,
    compute_dtype: Any = None,
    **_: Any,
) -> NkiTensor:
    """``x / sqrt(mean(x²) + ε) · w`` over the free axis (``n`` = element count, default the free size)."""
    rows = x.shape[0]
    count = n or x.free_elems
    squares = ndarray(x.shape, float32, sbuf)
    nisa.tensor_tensor(squares, x, x, multiply)
    total = ndarray((rows, 1), float32, sbuf)
    nisa.tensor_reduce(total, add, squares, list(builtins.range(1, x.ndim)))
    nisa.tensor_scalar(total, total, multiply, 1.0 / count, op1=add, operand1=epsilon)
    nisa.activation(total, rsqrt, total)
    normed = ndarray(x.shape, float32, sbuf)
    nisa.tensor_scalar(normed, x, multiply, total)
    weight = w if w.shape[0] == rows else broadcast_to(w, (rows, *w.shape[1:]))
    out = _result(x, dtype)
    nisa.tensor_tensor(out, normed, weight, multiply)
    return out


def where(condition: NkiTensor, x: Any, y: Any, dtype: Any = None, **_: Any) -> NkiTensor:
    """``x`` where ``condition`` is non-zero, else ``y`` (tiles or numbers)."""
    like = x if isinstance(x, NkiTensor) else (y if isinstance(y, NkiTensor) else condition)
    out = _result(like, dtype or like.dtype, condition.shape)
    if isinstance(y, NkiTensor):
        nisa.tensor_copy(out, y)
    else:
        nisa.memset(out, y)
    nisa.tensor_copy_predicated(out, x, condition)
    return out


def broadcast_to(x: NkiTensor, shape: Sequence[int], **_: Any) -> NkiTensor:
    """Expand size-1 dims of ``x`` to ``shape`` (same rank; partition broadcast runs on TensorE)."""
    shape = tuple(shape)
    if len(shape) != x.ndim:
        checks.fail(f"broadcast_to shape must have the rank of {x.shape}, got {tuple(shape)}")
    src = x
    if x.shape[0] == 1 and shape[0] > 1:
        ones_row = ndarray((1, shape[0]), float32 if x.dtype == float32 else x.dtype, sbuf)
        nisa.memset(ones_row, 1.0)
        spread = ndarray((shape[0], *x.shape[1:]), float32, psum)
        nisa.nc_matmul(spread, ones_row, x)
        src = spread
    view = src
    for d in builtins.range(1, len(shape)):
        if view.shape[d] == 1 and shape[d] > 1:
            view = view.broadcast(d, shape[d])
    out = ndarray(shape, x.dtype, sbuf)
    nisa.tensor_copy(out, view)
    return out


def expand_dims(x: NkiTensor, axis: int, **_: Any) -> NkiTensor:
    """View with a size-1 dim inserted at ``axis``."""
    return x.expand_dim(axis)


def dropout(x: NkiTensor, rate: float, dtype: Any = None, **_: Any) -> NkiTensor:
    """Zero elements with probability ``rate`` and scale the rest by 1/(1-rate) (numpy generator)."""
    keep = ndarray(x.shape, float32, sbuf)
    keep.write((_rng.random(x.shape) >= rate).astype(np.float32) / np.float32(1.0 - rate))
    out = _result(x, dtype)
    nisa.tensor_tensor(out, x, keep, multiply)
    return out


__all__ = [
    "FP32_MIN",
    "NKIObject",
    "NkiTensor",
    "abs",
    "abs_max",
    "abs_min",
    "add",
    "affine_range",
    "all",
    "arctan",
    "average",
    "bfloat16",
    "bitwise_and",
    "bitwise_or",
    "bitwise_xor",
    "bool",
    "bool_",
    "broadcast_to",
    "bypass",
    "ceil",
    "copy",
    "cos",
    "device_print",
    "divide",
    "dropout",
    "ds",
    "empty_like",
    "equal",
    "erf",
    "erf_dx",
    "exp",
    "expand_dims",
    "float4_e2m1fn_x4",
    "float8_e4m3",
    "float8_e4m3fn",
    "float8_e4m3fn_x4",
    "float8_e5m2",
    "float8_e5m2_x4",
    "float8_e8m0fnu",
    "float16",
    "float32",
    "floor",
    "fmod",
    "fori_loop",
    "full",
    "gelu",
    "gelu_apprx_sigmoid",
    "gelu_apprx_sigmoid_dx",
    "gelu_apprx_tanh",
    "gelu_dx",
    "greater",
    "greater_equal",
    "hbm",
    "int8",
    "int16",
    "int32",
    "int64",
    "invert",
    "is_hbm",
    "is_on_chip",
    "is_psum",
    "is_sbuf",
    "left_shift",
    "less",
    "less_equal",
    "load",
    "load_transpose2d",
    "log",
    "logical_and",
    "logical_not",
    "logical_or",
    "logical_xor",
    "matmul",
    "max",
    "maximum",
    "mean",
    "min",
    "minimum",
    "mish",
    "mod",
    "multiply",
    "ndarray",
    "negative",
    "no_reorder",
    "not_equal",
    "num_programs",
    "ones",
    "ones_like",
    "power",
    "prelu",
    "private_hbm",
    "prod",
    "program_id",
    "program_ndim",
    "psum",
    "rand",
    "random_seed",
    "range",
    "reciprocal",
    "relu",
    "right_shift",
    "rms_norm",
    "rsqrt",
    "sbuf",
    "sequential_range",
    "shared_constant",
    "shared_hbm",
    "shared_identity_matrix",
    "sigmoid",
    "sign",
    "silu",
    "silu_dx",
    "sin",
    "softmax",
    "softplus",
    "sqrt",
    "square",
    "static_range",
    "store",
    "subtract",
    "sum",
    "tan",
    "tanh",
    "tfloat32",
    "tile_size",
    "trunc",
    "uint8",
    "uint16",
    "uint32",
    "var",
    "where",
    "while_loop",
    "zeros",
    "zeros_like",
]
