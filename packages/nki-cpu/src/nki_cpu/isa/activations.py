"""Activation instructions: ``activation`` / ``activation_reduce`` (ScalarE) and ``exponential`` (VectorE)."""

from __future__ import annotations

from typing import Any

import numpy as np

from nki_cpu import dtypes, operands
from nki_cpu.cost.record import Engine
from nki_cpu.isa._emit import column_or_scalar, compute_into, emit, engine_buffers, resolve_engine
from nki_cpu.isa._lanewise import RC, apply_unary, lane_attrs, lane_operands, read_out, reduce_into_acc
from nki_cpu.isa.enums import NkiInstruction, engine
from nki_cpu.opcodes import Op, add, require_op
from nki_cpu.target import get_nc_version
from nki_cpu.tensor import NkiTensor


def activation(
    dst: NkiTensor,
    op: Op,
    data: NkiTensor,
    bias: Any = None,
    scale: Any = 1.0,
    reduce_op: Op | None = None,
    reduce_res: NkiTensor | None = None,
    reduce_cmd: Any = RC.idle,
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
        engine: scalar (default) or gpsimd (NeuronCore-v4 and newer).
        name: debug label.

    Returns:
        The instruction handle.

    Notes:
        With ``reduce_res`` and ``reduce_cmd=idle`` the registers are read out unchanged (README, known unknown 15).
        ``reduce_res`` is written after ``dst``, so aliasing them keeps the reduction.
    """
    instr = "activation"
    op = require_op(op, instr, "op")
    dst, data = lane_operands(instr, dst, data=data)
    if reduce_op is not None and require_op(reduce_op, instr, "reduce_op").name != "add":
        operands.rule(
            "activation_reduce_add",
            f"{instr} reduce_op {require_op(reduce_op, instr, 'reduce_op').name} is not allowed (reduce_op must be "
            "nl.add; reduce with nisa.tensor_reduce instead)",
        )
    operands.fp32_operand(instr, "scale", scale)
    eng = resolve_engine(instr, engine, Engine.SCALAR, (Engine.SCALAR, Engine.GPSIMD))
    if eng is Engine.GPSIMD and get_nc_version().value <= 3:
        operands.rule(
            "activation_engine",
            f"{instr} engine gpsimd is not available on this target (NeuronCore-v4 and newer only); use the scalar "
            "engine",
        )
    engine_buffers(instr, eng, dst=dst, data=data)
    unit_scale = isinstance(scale, (int, float)) and not isinstance(scale, bool) and scale == 1.0
    plain = unit_scale and bias is None and data.dtype in dtypes.EXACT_IN_F32
    x = data._lanes() if plain else data._peek_pf()  # lanes: converted to fp32 on the fly by compute_into
    if not unit_scale:
        x = x * column_or_scalar(instr, "scale", scale, dst)  # x·1 is exact: skipped for the default scale
    if bias is not None:
        x = x + column_or_scalar(instr, "bias", bias, dst)
    no_reduce = reduce_res is None and reduce_op is None and reduce_cmd == RC.idle
    if no_reduce and compute_into(dst, op.unary_ufunc, x):
        return emit(instr, eng, [dst], [data, bias, scale], attrs=lane_attrs(op, data, dst) | {"reduce": False})
    result = apply_unary(op, x.astype(np.float32, copy=False), instr)
    reduced = None
    if reduce_op is not None or reduce_cmd != RC.idle:
        reduced = reduce_into_acc(instr, "scalar", dst, result, reduce_op or add, reduce_cmd)
    dst.write(result)
    writes = read_out(instr, dst, reduce_res, reduced, "scalar", check_column=True)
    attrs = lane_attrs(op, data, dst) | {"reduce": reduce_res is not None}
    return emit(instr, eng, writes, [data, bias, scale], attrs=attrs)


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
        reduce_cmd=RC.reset_reduce,
        name=name,
    )


def exponential(
    dst: NkiTensor,
    src: NkiTensor,
    max_value: Any = 0.0,
    reduce_res: NkiTensor | None = None,
    reduce_cmd: Any = RC.idle,
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
    dst, src = lane_operands(instr, dst, src=src)
    with np.errstate(all="ignore"):
        result = np.exp(src._read_pf() - column_or_scalar(instr, "max_value", max_value, dst)).astype(np.float32)
    reduced = None
    if reduce_cmd != RC.idle:
        reduced = reduce_into_acc(instr, "vector", dst, result, add, reduce_cmd, reduce_init)
    dst.write(result)
    writes = read_out(instr, dst, reduce_res, reduced)
    return emit(instr, Engine.VECTOR, writes, [src, max_value], attrs=lane_attrs("exp", src, dst))
