"""VectorE / ScalarE lane-wise instructions (element-wise, scalar-broadcast, copies, activations, reductions, scans).

Every instruction reads all of its inputs before writing ``dst`` (in-place calls are routine), computes in fp32
(bit-vector ops on raw integers) and rounds once into ``dst.dtype``. Free dims are flattened per partition: inputs
need ``dst``'s partition count and elements per partition, not its shape.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nki_cpu import checks, dtypes, state
from nki_cpu.cost.record import Engine
from nki_cpu.isa._emit import column_or_scalar, compute_into, emit, engine_buffers, resolve_engine, unit_stride
from nki_cpu.isa.enums import NkiInstruction, engine, reduce_cmd
from nki_cpu.opcodes import Op, require_op
from nki_cpu.tensor import NkiTensor

_RC = reduce_cmd
FP32_MIN = float(np.finfo(np.float32).min)
_LANE_ENGINES = (Engine.VECTOR, Engine.SCALAR, Engine.GPSIMD)


def _attrs(op: Op | str, *ts: Any) -> dict[str, Any]:
    name = op.name if isinstance(op, Op) else op
    psum = any(isinstance(t, NkiTensor) and t.buffer.kind == "psum" for t in ts)
    return {"op": name, "psum_input": psum, "unit_stride": unit_stride(*ts)}


def _apply(op: Op, lhs: Any, rhs: Any, instr: str) -> np.ndarray:
    if op.binary is None:
        checks.fail(f"{instr} op {op!r} is not a binary ALU operator")
    with np.errstate(all="ignore"):
        return np.asarray(op.binary(lhs, rhs))


def _apply_unary(op: Op, x: np.ndarray, instr: str) -> np.ndarray:
    if op.unary is None:
        checks.fail(f"{instr} op {op!r} is not a unary operator / activation function")
    with np.errstate(all="ignore"):
        return np.asarray(op.unary(x), dtype=np.float32 if x.dtype.kind == "f" else None)


def _int_values(instr: str, name: str, t: NkiTensor) -> np.ndarray:
    if not dtypes.is_int(t.dtype):
        checks.fail(f"{instr} {name} must have an integer dtype for a bit-vector op, got {dtypes.name(t.dtype)}")
    return t.read().reshape(t.partitions, -1).astype(np.int64)


def _lanes(dst: NkiTensor) -> slice:
    p0 = dst.region().partitions[0] if dst.buffer.on_chip else 0
    return slice(p0, p0 + dst.partitions)


def tensor_tensor(
    dst: NkiTensor, data1: NkiTensor, data2: NkiTensor, op: Op, engine: Any = engine.unknown, name: str | None = None
) -> NkiInstruction:
    """Element-wise ``dst = data1 op data2``.

    Dimensions:
        P partitions (≤128), F elements per partition (free dims flattened).

    Args:
        dst: [P, F...] SBUF/PSUM, any dtype.
        data1: [P, F...] SBUF/PSUM, left-hand operand.
        data2: [P, F...] SBUF/PSUM, right-hand operand; not both inputs in PSUM.
        op: ALU operator token (``nl.add``, ``nl.multiply``, ``nl.maximum``, comparisons, bit-vector ops...).
        engine: vector (default), gpsimd (SBUF only); ``nl.power`` and all-int32 defaults to gpsimd.
        name: debug label.

    Returns:
        The instruction handle.

    Notes:
        Arithmetic ops run in fp32; bit-vector ops on raw integers; all-int32/uint32 operands on GpSimd use exact
        integer arithmetic.
    """
    instr = "tensor_tensor"
    op = require_op(op, instr, "op")
    dst = checks.compute_operand(instr, "dst", dst)
    data1 = checks.compute_operand(instr, "data1", data1)
    data2 = checks.compute_operand(instr, "data2", data2)
    checks.lanewise(instr, dst, data1=data1, data2=data2)
    checks.not_both_psum(instr, "data1", data1, "data2", data2)
    all_int = all(dtypes.is_int(t.dtype) and t.itemsize == 4 for t in (dst, data1, data2))
    any_psum = any(t.buffer.kind == "psum" for t in (dst, data1, data2))
    default = Engine.GPSIMD if (op.name == "power" or all_int) and not any_psum else Engine.VECTOR
    eng = resolve_engine(instr, engine, default, _LANE_ENGINES)
    engine_buffers(instr, eng, dst=dst, data1=data1, data2=data2)
    if op.bitvec or (all_int and eng is Engine.GPSIMD):
        result = _apply(op, _int_values(instr, "data1", data1), _int_values(instr, "data2", data2), instr)
        dst.write(result)
    else:
        lhs, rhs = data1.lanes(), data2.lanes()  # converted to fp32 on the fly by compute_into
        if not compute_into(dst, op.binary_ufunc, lhs, rhs):
            dst.write(_apply(op, dtypes.to_f32(lhs), dtypes.to_f32(rhs), instr))
    return emit(instr, eng, dst, [data1, data2], attrs=_attrs(op, data1, data2, dst))


def _scalar_stage(
    instr: str, values: np.ndarray, op: Op | None, operand: Any, reverse: bool, dst: NkiTensor, slot: str
) -> np.ndarray:
    if op is None:
        if operand is not None:
            checks.fail(f"{instr} {slot} given without its op")
        return values
    op = require_op(op, instr, f"op for {slot}")
    if op.binary is None:
        if operand not in (None, 0, 0.0):
            checks.fail(f"{instr} unary op {op!r} takes {slot}=None or 0, got {operand!r}")
        return _apply_unary(op, values, instr)
    if op.bitvec:
        if isinstance(operand, NkiTensor):
            checks.scalar_column(instr, slot, operand, dst)
            rhs: Any = _int_values(instr, slot, operand)
        else:
            rhs = np.int64(int(operand))
    else:
        rhs = column_or_scalar(instr, slot, operand, dst)
    return _apply(op, rhs, values, instr) if reverse else _apply(op, values, rhs, instr)


def _scalar_operand(value: Any) -> np.ndarray | np.float32 | None:
    """A plain number as fp32, or a direct fp32 [P, 1] tile as a (shared) array; None for anything else."""
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        return np.float32(value)
    return None


def _tensor_scalar_into(
    dst: NkiTensor, data: NkiTensor, op0: Op, operand0: Any, reverse0: bool, op1: Any, operand1: Any, reverse1: bool
) -> bool:
    """Fast path of ``tensor_scalar``: binary ufunc stages with number operands, the last one written into dst."""
    if op0.binary_ufunc is None or (op1 is None and operand1 is not None):
        return False
    if op1 is not None and (not isinstance(op1, Op) or op1.binary_ufunc is None):
        return False
    rhs0 = _scalar_operand(operand0)
    rhs1 = _scalar_operand(operand1) if op1 is not None else np.float32(0)
    if rhs0 is None or rhs1 is None:
        return False
    if data.dtype not in dtypes.EXACT_IN_F32:
        return False
    values = data.lanes()  # converted to fp32 on the fly
    if op1 is None:
        return compute_into(dst, op0.binary_ufunc, *((rhs0, values) if reverse0 else (values, rhs0)))
    with np.errstate(all="ignore"):
        args = (rhs0, values) if reverse0 else (values, rhs0)
        mid = op0.binary_ufunc(*args, signature=(np.float32,) * 3, casting="unsafe")
    return compute_into(dst, op1.binary_ufunc, *((rhs1, mid) if reverse1 else (mid, rhs1)))


def tensor_scalar(
    dst: NkiTensor,
    data: NkiTensor,
    op0: Op,
    operand0: Any,
    reverse0: bool = False,
    op1: Op | None = None,
    operand1: Any = None,
    reverse1: bool = False,
    engine: Any = engine.unknown,
    name: str | None = None,
) -> NkiInstruction:
    """``t = data op0 operand0``; ``dst = t op1 operand1`` with per-partition or constant operands.

    Dimensions:
        P partitions (≤128), F elements per partition.

    Args:
        dst: [P, F...] SBUF/PSUM.
        data: [P, F...] SBUF/PSUM.
        op0: ALU operator (unary ops such as ``nl.rsqrt`` take ``operand0=None``).
        operand0: Python number or [P, 1] tile broadcast along the free dims.
        reverse0: compute ``operand0 op0 data`` instead.
        op1: optional second operator.
        operand1: its operand (number or [P, 1] tile).
        reverse1: compute ``operand1 op1 t`` instead.
        engine: vector (default), scalar, gpsimd.
        name: debug label.

    Returns:
        The instruction handle.
    """
    instr = "tensor_scalar"
    dst = checks.compute_operand(instr, "dst", dst)
    data = checks.compute_operand(instr, "data", data)
    checks.lanewise(instr, dst, data=data)
    eng = resolve_engine(instr, engine, Engine.VECTOR, _LANE_ENGINES)
    engine_buffers(instr, eng, dst=dst, data=data)
    op0 = require_op(op0, instr, "op0")
    if not _tensor_scalar_into(dst, data, op0, operand0, reverse0, op1, operand1, reverse1):
        values: np.ndarray = _int_values(instr, "data", data) if op0.bitvec else data.peek_pf()
        values = _scalar_stage(instr, values, op0, operand0, reverse0, dst, "operand0")
        values = _scalar_stage(instr, values, op1, operand1, reverse1, dst, "operand1")
        dst.write(values)
    attrs = _attrs(op0, data, dst)
    attrs["op1"] = op1.name if isinstance(op1, Op) else None
    return emit(instr, eng, dst, [data, operand0, operand1], attrs=attrs)


def scalar_tensor_tensor(
    dst: NkiTensor,
    data: NkiTensor,
    op0: Op,
    operand0: Any,
    op1: Op,
    operand1: NkiTensor,
    reverse0: bool = False,
    reverse1: bool = False,
    reduce_cmd: Any = _RC.reset_reduce,
    reduce_op: Op | None = None,
    reduce_res: NkiTensor | None = None,
    name: str | None = None,
) -> NkiInstruction:
    """``dst = (data op0 operand0) op1 operand1`` with a per-partition scalar and a full second tile.

    Dimensions:
        P partitions (≤128), F elements per partition.

    Args:
        dst: [P, F...] SBUF/PSUM.
        data: [P, F...] SBUF/PSUM.
        op0: arithmetic operator applied with operand0.
        operand0: number or [P, 1] tile.
        op1: arithmetic operator applied with operand1.
        operand1: [P, F...] tile; not in PSUM together with data.
        reverse0: ``operand0 op0 data``.
        reverse1: ``operand1 op1 (...)``.
        reduce_cmd: accumulator command for the optional reduction (2.33).
        reduce_op: optional reduction over the free dims of the result.
        reduce_res: optional [P, 1] tile receiving the reduction.
        name: debug label.

    Returns:
        The instruction handle.
    """
    instr = "scalar_tensor_tensor"
    dst = checks.compute_operand(instr, "dst", dst)
    data = checks.compute_operand(instr, "data", data)
    operand1 = checks.compute_operand(instr, "operand1", operand1)
    checks.lanewise(instr, dst, data=data, operand1=operand1)
    checks.not_both_psum(instr, "data", data, "operand1", operand1)
    op0 = require_op(op0, instr, "op0")
    op1 = require_op(op1, instr, "op1")
    t = _scalar_stage(instr, data.read_pf(), op0, operand0, reverse0, dst, "operand0")
    other = operand1.read_pf()
    result = _apply(op1, other, t, instr) if reverse1 else _apply(op1, t, other, instr)
    reduced = _reduce_into_acc(instr, "vector", dst, result, reduce_op, reduce_cmd) if reduce_op is not None else None
    dst.write(result)
    if reduce_res is not None and reduced is not None:
        checks.scalar_column(instr, "reduce_res", reduce_res, dst)
        reduce_res.write(reduced.reshape(-1, 1))
    return emit(
        instr,
        Engine.VECTOR,
        [dst, reduce_res] if reduce_res is not None else dst,
        [data, operand0, operand1],
        attrs=_attrs(op0, data, operand1, dst) | {"op1": op1.name},
    )


def tensor_copy(
    dst: NkiTensor, src: NkiTensor, engine: Any = engine.unknown, name: str | None = None
) -> NkiInstruction:
    """``dst = src`` lane-wise (bit-exact for equal dtypes, else via fp32 with one rounding).

    Dimensions:
        P partitions (≤128), F elements per partition.

    Args:
        dst: [P, F...] SBUF/PSUM (GpSimd: SBUF only).
        src: [P, F...] SBUF/PSUM.
        engine: vector (default), scalar, gpsimd.
        name: debug label.

    Returns:
        The instruction handle.
    """
    instr = "tensor_copy"
    dst = checks.compute_operand(instr, "dst", dst)
    src = checks.compute_operand(instr, "src", src)
    checks.lanewise(instr, dst, src=src)
    eng = resolve_engine(instr, engine, Engine.VECTOR, _LANE_ENGINES)
    engine_buffers(instr, eng, dst=dst, src=src)
    if dst.dtype == src.dtype:
        dst.write_raw(src.np().reshape(src.partitions, -1))  # overlap-safe numpy assignment, no extra copy
    else:
        dst.write(src.peek_pf())
    return emit(instr, eng, dst, [src], attrs=_attrs("copy", src, dst))


def _reduce_into_acc(
    instr: str, acc_name: str, dst: NkiTensor, values: np.ndarray, reduce_op: Any, cmd: Any, init: Any = None
) -> np.ndarray:
    """Apply ``cmd`` to the engine's per-lane accumulators with ``reduce_op`` over ``values`` (P, F)."""
    op = require_op(reduce_op, instr, "reduce_op")
    acc = state.current().accumulator(acc_name)
    lanes = _lanes(dst)
    identity = np.float32(op.identity if op.identity is not None else 0.0)
    if cmd in (_RC.reset, _RC.reset_reduce):
        acc[lanes] = identity
    elif cmd == _RC.load_reduce:
        acc[lanes] = column_or_scalar(instr, "reduce_init", init, dst).reshape(-1) if init is not None else identity
    if cmd in (_RC.reduce, _RC.reset_reduce, _RC.load_reduce):
        with np.errstate(all="ignore"):
            part = op.reduce(values.astype(np.float32), axis=1).astype(np.float32)
            acc[lanes] = _apply(op, acc[lanes], part, instr)
    return acc[lanes].copy()


def activation(
    dst: NkiTensor,
    op: Op,
    data: NkiTensor,
    bias: Any = None,
    scale: Any = 1.0,
    reduce_op: Op | None = None,
    reduce_res: NkiTensor | None = None,
    reduce_cmd: Any = _RC.idle,
    engine: Any = engine.scalar,
    name: str | None = None,
) -> NkiInstruction:
    """``dst = op(data · scale + bias)`` on ScalarE, optionally summing each lane into its accumulator.

    Dimensions:
        P partitions (≤128), F elements per partition.

    Args:
        dst: [P, F...] SBUF/PSUM.
        op: activation function token (``nl.exp``, ``nl.copy``, ``nl.tanh``, ``nl.rsqrt``...).
        data: [P, F...] SBUF/PSUM.
        bias: None, number, or [P, 1] tile (a PSUM column view is fine).
        scale: number or [P, 1] tile.
        reduce_op: ``nl.add`` for the accumulator reduction.
        reduce_res: [P, 1] tile receiving the accumulator after the instruction.
        reduce_cmd: idle / reset / reduce / reset_reduce for the ScalarE accumulators.
        engine: scalar (default) or gpsimd.
        name: debug label.

    Returns:
        The instruction handle.

    Notes:
        With ``reduce_res`` and ``reduce_cmd=idle`` the registers are read out unchanged (README, known unknown 15).
        ``reduce_res`` is written after ``dst``, so aliasing them keeps the reduction.
    """
    instr = "activation"
    op = require_op(op, instr, "op")
    dst = checks.compute_operand(instr, "dst", dst)
    data = checks.compute_operand(instr, "data", data)
    checks.lanewise(instr, dst, data=data)
    eng = resolve_engine(instr, engine, Engine.SCALAR, (Engine.SCALAR, Engine.GPSIMD))
    engine_buffers(instr, eng, dst=dst, data=data)
    unit_scale = isinstance(scale, (int, float)) and not isinstance(scale, bool) and scale == 1.0
    plain = unit_scale and bias is None and data.dtype in dtypes.EXACT_IN_F32
    x = data.lanes() if plain else data.peek_pf()  # lanes: converted to fp32 on the fly by compute_into
    if not unit_scale:
        x = x * column_or_scalar(instr, "scale", scale, dst)  # x·1 is exact: skipped for the default scale
    if bias is not None:
        x = x + column_or_scalar(instr, "bias", bias, dst)
    no_reduce = reduce_res is None and reduce_op is None and reduce_cmd == _RC.idle
    if no_reduce and compute_into(dst, op.unary_ufunc, x):
        return emit(instr, eng, [dst], [data, bias, scale], attrs=_attrs(op, data, dst) | {"reduce": False})
    result = _apply_unary(op, x.astype(np.float32, copy=False), instr)
    reduced = None
    if reduce_op is not None or reduce_cmd != _RC.idle:
        reduced = _reduce_into_acc(instr, "scalar", dst, result, reduce_op or _add_op(), reduce_cmd)
    elif reduce_res is not None:
        reduced = state.current().accumulator("scalar")[_lanes(dst)].copy()
    dst.write(result)
    writes = [dst]
    if reduce_res is not None:
        checks.scalar_column(instr, "reduce_res", reduce_res, dst)
        reduce_res.write(np.asarray(reduced).reshape(-1, 1))
        writes.append(reduce_res)
    attrs = _attrs(op, data, dst) | {"reduce": reduce_res is not None}
    return emit(instr, eng, writes, [data, bias, scale], attrs=attrs)


def _add_op() -> Op:
    from nki_cpu.opcodes import add

    return add


def activation_reduce(
    dst: NkiTensor,
    op: Op,
    data: NkiTensor,
    reduce_op: Op,
    reduce_res: NkiTensor,
    bias: Any = None,
    scale: Any = 1.0,
    name: str | None = None,
) -> NkiInstruction:
    """``activation`` with ``reduce_cmd=reset_reduce`` and the per-lane sum read out into ``reduce_res`` [P, 1]."""
    return activation(
        dst,
        op,
        data,
        bias=bias,
        scale=scale,
        reduce_op=reduce_op,
        reduce_res=reduce_res,
        reduce_cmd=_RC.reset_reduce,
        name=name,
    )


def memset(dst: NkiTensor, value: Any, engine: Any = engine.unknown, name: str | None = None) -> NkiInstruction:
    """Fill ``dst`` with one constant.

    Args:
        dst: [P, F...] SBUF/PSUM (GpSimd: SBUF only); a float ``value`` on an integer dst is an error.
        value: compile-time number (``0.0``, ``1.0``, ``-float('inf')``, ints).
        engine: vector (default) or gpsimd.
        name: debug label.

    Returns:
        The instruction handle.
    """
    instr = "memset"
    dst = checks.compute_operand(instr, "dst", dst)
    eng = resolve_engine(instr, engine, Engine.VECTOR, (Engine.VECTOR, Engine.GPSIMD, Engine.SCALAR))
    engine_buffers(instr, eng, dst=dst)
    if dtypes.is_int(dst.dtype) and isinstance(value, float) and not float(value).is_integer():
        checks.fail(f"{instr} value {value!r} is a float but dst dtype is {dtypes.name(dst.dtype)}")
    fill = np.full(dst.shape, value, dtype=np.int64 if dtypes.is_int(dst.dtype) else np.float32)
    dst.write(fill)
    return emit(
        instr,
        eng,
        dst,
        [],
        attrs={"op": "memset", "psum_input": False, "unit_stride": unit_stride(dst), "value": float(value)},
    )


def tensor_reduce(
    dst: NkiTensor,
    op: Op,
    data: NkiTensor,
    axis: Any,
    negate: bool = False,
    keepdims: bool = False,
    name: str | None = None,
) -> NkiInstruction:
    """Reduce trailing free axes of ``data`` with ``op`` (fp32; bit-vector ops on integers).

    Dimensions:
        data [P, d1, ..., dn]; axis = trailing dims ending at dn (never 0).

    Args:
        dst: [P, kept...] SBUF/PSUM with elements per partition = product of the kept free dims.
        op: reduction operator (add, multiply, maximum, minimum, subtract (left fold), bitwise/logical ops).
        data: [P, ...] SBUF/PSUM.
        axis: int, tuple or list of dims.
        negate: multiply the result by -1 (arithmetic only).
        keepdims: only changes the nominal shape.
        name: debug label.

    Returns:
        The instruction handle.
    """
    instr = "tensor_reduce"
    op = require_op(op, instr, "op")
    dst = checks.compute_operand(instr, "dst", dst)
    data = checks.compute_operand(instr, "data", data)
    checks.same_partitions(instr, "dst", dst, "data", data)
    axes = sorted({int(a) % data.ndim for a in ((axis,) if isinstance(axis, (int, np.integer)) else axis)})
    if not axes or axes[0] == 0 or axes != list(range(axes[0], data.ndim)):
        checks.fail(f"{instr} axis {axis} must be trailing free dims of data shape {data.shape}")
    kept = int(np.prod(data.shape[1 : axes[0]], dtype=np.int64))
    if dst.free_elems != kept:
        checks.fail(f"{instr} dst elements per partition {dst.free_elems} do not match the kept size {kept}")
    values = _int_values(instr, "data", data) if op.bitvec else data.read_pf()
    values = values.reshape(data.partitions, kept, -1)
    with np.errstate(all="ignore"):
        result = op.reduce(values, axis=2)
    if negate:
        result = -result
    dst.write(result)
    return emit(instr, Engine.VECTOR, dst, [data], attrs=_attrs(op, data, dst))


def tensor_tensor_scan(
    dst: NkiTensor,
    data0: NkiTensor,
    data1: NkiTensor,
    initial: Any,
    op0: Op,
    op1: Op,
    reverse0: bool = False,
    reverse1: bool = False,
    name: str | None = None,
) -> NkiInstruction:
    """Per-partition scan ``r[i] = op1(op0(data0[i], r[i-1]), data1[i])`` with ``r[-1] = initial``.

    Args:
        dst: [P, F...] SBUF/PSUM.
        data0: [P, F...]; reverse0 makes it op0's right-hand operand.
        data1: [P, F...]; reverse1 makes it op1's left-hand operand. Not both inputs in PSUM.
        initial: number or [P, 1] tile.
        op0: first operator.
        op1: second operator.
        reverse0: swap op0's operands.
        reverse1: swap op1's operands.
        name: debug label.

    Returns:
        The instruction handle.
    """
    instr = "tensor_tensor_scan"
    dst = checks.compute_operand(instr, "dst", dst)
    data0 = checks.compute_operand(instr, "data0", data0)
    data1 = checks.compute_operand(instr, "data1", data1)
    checks.lanewise(instr, dst, data0=data0, data1=data1)
    checks.not_both_psum(instr, "data0", data0, "data1", data1)
    op0 = require_op(op0, instr, "op0")
    op1 = require_op(op1, instr, "op1")
    a, b = data0.read_pf(), data1.read_pf()
    r = np.broadcast_to(column_or_scalar(instr, "initial", initial, dst), (dst.partitions, 1)).reshape(-1)
    r = r.astype(np.float32)
    out = np.empty_like(a)
    for i in range(a.shape[1]):
        t = _apply(op0, r, a[:, i], instr) if reverse0 else _apply(op0, a[:, i], r, instr)
        r = _apply(op1, b[:, i], t, instr) if reverse1 else _apply(op1, t, b[:, i], instr)
        out[:, i] = r
    dst.write(out)
    return emit(instr, Engine.VECTOR, dst, [data0, data1, initial], attrs=_attrs(op0, data0, data1, dst))


def tensor_scalar_cumulative(
    dst: NkiTensor,
    src: NkiTensor,
    op0: Op,
    op1: Op,
    imm0: Any,
    imm1: Any = None,
    reduce_cmd: Any = _RC.reset_reduce,
    name: str | None = None,
) -> NkiInstruction:
    """Running scan per partition: ``reg = op1(op0(src[i], imm0), reg); dst[i] = reg``.

    Args:
        dst: [P, F...] SBUF/PSUM.
        src: [P, F...] SBUF/PSUM, float dtype.
        op0: arithmetic operator applied with imm0.
        op1: add / subtract / multiply / maximum / minimum (new value is the left operand).
        imm0: number or [P, 1] tile.
        imm1: start value for ``reduce_cmd=load_reduce``.
        reduce_cmd: reset_reduce (identity of op1), reduce (continue the VectorE accumulator), load_reduce (imm1).
        name: debug label.

    Returns:
        The instruction handle.
    """
    instr = "tensor_scalar_cumulative"
    dst = checks.compute_operand(instr, "dst", dst)
    src = checks.compute_operand(instr, "src", src)
    checks.lanewise(instr, dst, src=src)
    checks.float_dtype(instr, "src", src)
    op0 = require_op(op0, instr, "op0")
    op1 = require_op(op1, instr, "op1")
    if op1.name not in ("add", "subtract", "multiply", "maximum", "minimum"):
        checks.fail(f"{instr} op1 must be add/subtract/multiply/maximum/minimum, got {op1!r}")
    values = _apply(op0, src.read_pf(), column_or_scalar(instr, "imm0", imm0, dst), instr).astype(np.float32)
    acc = state.current().accumulator("vector")
    lanes = _lanes(dst)
    if reduce_cmd in (_RC.reset_reduce, _RC.reset, _RC.idle):
        reg = np.full(dst.partitions, np.float32(op1.identity), dtype=np.float32)
    elif reduce_cmd == _RC.load_reduce:
        reg = np.broadcast_to(column_or_scalar(instr, "imm1", imm1, dst), (dst.partitions, 1)).reshape(-1)
        reg = reg.astype(np.float32)
    else:
        reg = acc[lanes].copy()
    out = np.empty_like(values)
    for i in range(values.shape[1]):
        reg = _apply(op1, values[:, i], reg, instr).astype(np.float32)
        out[:, i] = reg
    acc[lanes] = reg
    dst.write(out)
    return emit(instr, Engine.VECTOR, dst, [src, imm0, imm1], attrs=_attrs(op0, src, dst) | {"op1": op1.name})


def tensor_scalar_reduce(
    dst: NkiTensor,
    data: NkiTensor,
    op0: Op,
    operand0: Any,
    reduce_op: Op,
    reduce_res: NkiTensor | None = None,
    reverse0: bool = False,
    reduce_cmd: Any = _RC.reset_reduce,
    reduce_init: Any = None,
    reduce_res_negate: bool = False,
    name: str | None = None,
) -> NkiInstruction:
    """``dst = data op0 operand0`` plus ``reduce_op`` over all free dims into the VectorE accumulators / reduce_res.

    Args:
        dst: [P, F...] SBUF/PSUM.
        data: [P, F...] SBUF/PSUM.
        op0: arithmetic operator.
        operand0: number or [P, 1] tile.
        reduce_op: add / multiply / maximum / minimum.
        reduce_res: optional [P, 1] tile receiving the (optionally negated) reduction.
        reverse0: ``operand0 op0 data``.
        reduce_cmd: accumulator command.
        reduce_init: start value for load_reduce.
        reduce_res_negate: negate the read-out.
        name: debug label.

    Returns:
        The instruction handle.
    """
    instr = "tensor_scalar_reduce"
    dst = checks.compute_operand(instr, "dst", dst)
    data = checks.compute_operand(instr, "data", data)
    checks.lanewise(instr, dst, data=data)
    op0 = require_op(op0, instr, "op0")
    result = _scalar_stage(instr, data.read_pf(), op0, operand0, reverse0, dst, "operand0")
    reduced = _reduce_into_acc(instr, "vector", dst, result, reduce_op, reduce_cmd, reduce_init)
    dst.write(result)
    writes = [dst]
    if reduce_res is not None:
        checks.scalar_column(instr, "reduce_res", reduce_res, dst)
        reduce_res.write((-reduced if reduce_res_negate else reduced).reshape(-1, 1))
        writes.append(reduce_res)
    return emit(instr, Engine.VECTOR, writes, [data, operand0], attrs=_attrs(op0, data, dst))


def reciprocal(dst: NkiTensor, data: NkiTensor, name: str | None = None) -> NkiInstruction:
    """``dst = 1 / data`` on VectorE in fp32.

    Args:
        dst: [P, F...] SBUF/PSUM.
        data: [P, F...] SBUF/PSUM.
        name: debug label.

    Returns:
        The instruction handle.
    """
    instr = "reciprocal"
    dst = checks.compute_operand(instr, "dst", dst)
    data = checks.compute_operand(instr, "data", data)
    checks.lanewise(instr, dst, data=data)
    with np.errstate(all="ignore"):
        dst.write(np.float32(1.0) / data.read_pf())
    return emit(instr, Engine.VECTOR, dst, [data], attrs=_attrs("reciprocal", data, dst))


def exponential(
    dst: NkiTensor,
    src: NkiTensor,
    max_value: Any = 0.0,
    reduce_res: NkiTensor | None = None,
    reduce_cmd: Any = _RC.idle,
    reduce_init: Any = 0.0,
    name: str | None = None,
) -> NkiInstruction:
    """``dst = exp(src - max_value)`` on VectorE (Trn3), with an optional running sum.

    Args:
        dst: [P, F...] SBUF/PSUM.
        src: [P, F...] SBUF/PSUM.
        max_value: number or [P, 1] tile subtracted first.
        reduce_res: optional [P, 1] tile receiving the per-lane sum.
        reduce_cmd: accumulator command.
        reduce_init: start value for load_reduce.
        name: debug label.

    Returns:
        The instruction handle.
    """
    instr = "exponential"
    dst = checks.compute_operand(instr, "dst", dst)
    src = checks.compute_operand(instr, "src", src)
    checks.lanewise(instr, dst, src=src)
    with np.errstate(all="ignore"):
        result = np.exp(src.read_pf() - column_or_scalar(instr, "max_value", max_value, dst)).astype(np.float32)
    reduced = None
    if reduce_cmd != _RC.idle:
        reduced = _reduce_into_acc(instr, "vector", dst, result, _add_op(), reduce_cmd, reduce_init)
    dst.write(result)
    writes = [dst]
    if reduce_res is not None:
        if reduced is None:
            reduced = state.current().accumulator("vector")[_lanes(dst)].copy()
        reduce_res.write(reduced.reshape(-1, 1))
        writes.append(reduce_res)
    return emit(instr, Engine.VECTOR, writes, [src, max_value], attrs=_attrs("exp", src, dst))


def range_select(
    dst: NkiTensor,
    on_true_tile: NkiTensor,
    comp_op0: Op,
    comp_op1: Op,
    bound0: Any,
    bound1: Any,
    reduce_cmd: Any = _RC.reset_reduce,
    reduce_res: NkiTensor | None = None,
    reduce_op: Op | None = None,
    range_start: float = 0,
    on_false_value: float = FP32_MIN,
    name: str | None = None,
) -> NkiInstruction:
    """Keep ``on_true_tile`` where ``comp_op0(idx, bound0) and comp_op1(idx, bound1)``, idx = range_start + i.

    Args:
        dst: [P, F...] SBUF/PSUM.
        on_true_tile: [P, F...] float tile.
        comp_op0: comparison operator.
        comp_op1: comparison operator.
        bound0: [P, 1] tile or number.
        bound1: [P, 1] tile or number.
        reduce_cmd: accumulator command for the max-reduction.
        reduce_res: optional [P, 1] tile receiving the reduction.
        reduce_op: reduction operator (``nl.maximum`` by default).
        range_start: index of the first free element.
        on_false_value: value for rejected elements (FP32_MIN).
        name: debug label.

    Returns:
        The instruction handle.
    """
    instr = "range_select"
    dst = checks.compute_operand(instr, "dst", dst)
    on_true_tile = checks.compute_operand(instr, "on_true_tile", on_true_tile)
    checks.lanewise(instr, dst, on_true_tile=on_true_tile)
    c0, c1 = require_op(comp_op0, instr, "comp_op0"), require_op(comp_op1, instr, "comp_op1")
    idx = (np.float32(range_start) + np.arange(dst.free_elems, dtype=np.float32))[None, :]
    keep = (_apply(c0, idx, column_or_scalar(instr, "bound0", bound0, dst), instr) != 0) & (
        _apply(c1, idx, column_or_scalar(instr, "bound1", bound1, dst), instr) != 0
    )
    result = np.where(keep, on_true_tile.read_pf(), np.float32(on_false_value)).astype(np.float32)
    from nki_cpu.opcodes import maximum

    reduced = _reduce_into_acc(instr, "vector", dst, result, reduce_op or maximum, reduce_cmd)
    dst.write(result)
    writes = [dst]
    if reduce_res is not None:
        reduce_res.write(reduced.reshape(-1, 1))
        writes.append(reduce_res)
    return emit(
        instr, Engine.VECTOR, writes, [on_true_tile, bound0, bound1], attrs=_attrs("range_select", on_true_tile, dst)
    )


def select_reduce(
    dst: NkiTensor,
    predicate: NkiTensor,
    on_true: NkiTensor,
    on_false: Any,
    reduce_res: NkiTensor | None = None,
    reduce_cmd: Any = _RC.idle,
    reduce_op: Op | None = None,
    reverse_pred: bool = False,
    name: str | None = None,
) -> NkiInstruction:
    """``dst = where(predicate, on_true, on_false)`` with an optional max-reduction.

    Args:
        dst: [P, F...] SBUF/PSUM.
        predicate: [P, F...] integer tile (non-zero = true; inverted by reverse_pred).
        on_true: [P, F...] tile.
        on_false: number or [P, 1] tile.
        reduce_res: optional [P, 1] tile.
        reduce_cmd: accumulator command.
        reduce_op: reduction operator (``nl.maximum`` default).
        reverse_pred: invert the predicate.
        name: debug label.

    Returns:
        The instruction handle.
    """
    instr = "select_reduce"
    dst = checks.compute_operand(instr, "dst", dst)
    predicate = checks.compute_operand(instr, "predicate", predicate)
    on_true = checks.compute_operand(instr, "on_true", on_true)
    checks.lanewise(instr, dst, predicate=predicate, on_true=on_true)
    pred = predicate.read().reshape(dst.partitions, -1) != 0
    if reverse_pred:
        pred = ~pred
    result = np.where(pred, on_true.read_pf(), column_or_scalar(instr, "on_false", on_false, dst)).astype(np.float32)
    reduced = None
    if reduce_cmd != _RC.idle:
        from nki_cpu.opcodes import maximum

        reduced = _reduce_into_acc(instr, "vector", dst, result, reduce_op or maximum, reduce_cmd)
    dst.write(result)
    writes = [dst]
    if reduce_res is not None:
        if reduced is None:
            reduced = state.current().accumulator("vector")[_lanes(dst)].copy()
        reduce_res.write(reduced.reshape(-1, 1))
        writes.append(reduce_res)
    return emit(instr, Engine.VECTOR, writes, [predicate, on_true, on_false], attrs=_attrs("select", on_true, dst))


def tensor_copy_predicated(
    dst: NkiTensor, src: Any, predicate: NkiTensor, reverse_pred: bool = False, name: str | None = None
) -> NkiInstruction:
    """Copy ``src`` (tile or number) into ``dst`` where ``predicate`` is non-zero; elsewhere dst keeps its value.

    Args:
        dst: [P, F...] SBUF/PSUM.
        src: [P, F...] tile (same dtype as dst) or number.
        predicate: [P, F...] integer tile (any rank with equal elements per partition).
        reverse_pred: invert the predicate.
        name: debug label.

    Returns:
        The instruction handle.
    """
    instr = "tensor_copy_predicated"
    dst = checks.compute_operand(instr, "dst", dst)
    predicate = checks.compute_operand(instr, "predicate", predicate)
    checks.lanewise(instr, dst, predicate=predicate)
    pred = predicate.read().reshape(dst.partitions, -1) != 0
    if reverse_pred:
        pred = ~pred
    current = dst.read().reshape(dst.partitions, -1)
    if isinstance(src, NkiTensor):
        checks.compute_operand(instr, "src", src)
        checks.lanewise(instr, dst, src=src)
        new = src.read().reshape(dst.partitions, -1)
        new = new if src.dtype == dst.dtype else dtypes.round_to(dtypes.to_f32(new), dst.dtype)
    else:
        new = dtypes.round_to(np.full(current.shape, src, dtype=np.float32), dst.dtype)
    dst.write_raw(np.where(pred, new, current))
    return emit(instr, Engine.VECTOR, dst, [src, predicate, dst], attrs=_attrs("copy_predicated", predicate, dst))


def bn_stats(dst: NkiTensor, data: NkiTensor, name: str | None = None) -> NkiInstruction:
    """Per partition (count, mean, var·count) of the even-indexed then the odd-indexed elements → 6 values.

    Args:
        dst: [P, 6] SBUF/PSUM.
        data: [P, F...] with F ≤ 512.
        name: debug label.

    Returns:
        The instruction handle.
    """
    instr = "bn_stats"
    dst = checks.compute_operand(instr, "dst", dst)
    data = checks.compute_operand(instr, "data", data)
    checks.same_partitions(instr, "dst", dst, "data", data)
    checks.at_most(instr, "data", "free size", data.free_elems, 512)
    x = data.read_pf().astype(np.float64)
    cols = []
    for half in (x[:, 0::2], x[:, 1::2]):
        n = half.shape[1]
        mean = half.mean(axis=1) if n else np.zeros(x.shape[0])
        cols += [np.full(x.shape[0], n), mean, ((half - mean[:, None]) ** 2).sum(axis=1)]
    dst.write(np.stack(cols, axis=1).astype(np.float32))
    return emit(instr, Engine.VECTOR, dst, [data], attrs=_attrs("bn_stats", data, dst))


def bn_aggr(dst: NkiTensor, data: NkiTensor, name: str | None = None) -> NkiInstruction:
    """Aggregate (count, mean, var·count) triples per partition into (mean, variance).

    Args:
        dst: [P, 2] SBUF/PSUM.
        data: [P, 3k] triples.
        name: debug label.

    Returns:
        The instruction handle.
    """
    instr = "bn_aggr"
    dst = checks.compute_operand(instr, "dst", dst)
    data = checks.compute_operand(instr, "data", data)
    x = data.read_pf().astype(np.float64).reshape(data.partitions, -1, 3)
    count, mean, m2 = x[..., 0], x[..., 1], x[..., 2]
    total = count.sum(axis=1)
    safe = np.where(total == 0, 1, total)
    mu = (count * mean).sum(axis=1) / safe
    var = (m2.sum(axis=1) + (count * (mean - mu[:, None]) ** 2).sum(axis=1)) / safe
    dst.write(np.stack([mu, var], axis=1).astype(np.float32))
    return emit(instr, Engine.VECTOR, dst, [data], attrs=_attrs("bn_aggr", data, dst))


def nc_stream_shuffle(dst: NkiTensor, src: NkiTensor, shuffle_mask: Any, name: str | None = None) -> NkiInstruction:
    """Cross-partition move inside 32-partition quadrants: dst partition j ← src partition ``mask[j % 32]``.

    Args:
        dst: [P, F...] SBUF/PSUM.
        src: [Ps, F...] same dtype and elements per partition.
        shuffle_mask: 32 ints; 255 leaves the dst partition unchanged.
        name: debug label.

    Returns:
        The instruction handle.
    """
    instr = "nc_stream_shuffle"
    dst = checks.compute_operand(instr, "dst", dst)
    src = checks.compute_operand(instr, "src", src)
    checks.same_free(instr, "dst", dst, "src", src)
    checks.same_dtype(instr, "src", src, "dst", dst)
    mask = list(shuffle_mask)
    values = src.read().reshape(src.partitions, -1)
    out = dst.read().reshape(dst.partitions, -1)
    for j in range(dst.partitions):
        m = int(mask[j % 32])
        if m == 255:
            continue
        source = (j // 32) * 32 + m
        if source >= src.partitions:
            checks.fail(f"{instr} shuffle_mask[{j % 32}]={m} selects src partition {source} of {src.partitions}")
        out[j] = values[source]
    dst.write_raw(out)
    return emit(instr, Engine.VECTOR, dst, [src], attrs=_attrs("shuffle", src, dst))
