"""Reductions and scans along the free dims (VectorE): ``tensor_reduce``, ``tensor_scalar_reduce``,
``tensor_tensor_scan``, ``tensor_scalar_cumulative``, ``bn_stats``, ``bn_aggr``."""

from __future__ import annotations

from typing import Any

import numpy as np

from nki_cpu import checks, operands, state
from nki_cpu.cost.record import Engine
from nki_cpu.isa._emit import column_or_scalar, emit
from nki_cpu.isa._lanewise import (
    RC,
    apply,
    int_values,
    lane_attrs,
    lane_operands,
    lanes,
    on_chip,
    read_out,
    reduce_into_acc,
    require_ops,
    scalar_stage,
)
from nki_cpu.isa.enums import NkiInstruction
from nki_cpu.opcodes import Op, require_op
from nki_cpu.tensor import NkiTensor


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
    dst, data = on_chip(instr, dst=dst, data=data)
    checks.same_partitions(instr, "dst", dst, "data", data)
    axes = sorted({int(a) % data.ndim for a in ((axis,) if isinstance(axis, (int, np.integer)) else axis)})
    if not axes or axes[0] == 0 or axes != list(range(axes[0], data.ndim)):
        checks.fail(f"{instr} axis {axis} must be trailing free dims of data shape {data.shape}")
    kept = int(np.prod(data.shape[1 : axes[0]], dtype=np.int64))
    if dst.free_elems != kept:
        checks.fail(f"{instr} dst elements per partition {dst.free_elems} do not match the kept size {kept}")
    values = int_values(instr, "data", data) if op.bitvec else data._read_pf()
    values = values.reshape(data.partitions, kept, -1)
    with np.errstate(all="ignore"):
        result = op.reduce(values, axis=2)
    if negate:
        result = -result
    dst.write(result)
    return emit(instr, Engine.VECTOR, dst, [data], attrs=lane_attrs(op, data, dst))


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
    dst, data0, data1 = lane_operands(instr, dst, data0=data0, data1=data1, not_both_psum=True)
    op0, op1 = require_ops(instr, op0=op0, op1=op1)
    a, b = data0._read_pf(), data1._read_pf()
    r = np.broadcast_to(column_or_scalar(instr, "initial", initial, dst), (dst.partitions, 1)).reshape(-1)
    r = r.astype(np.float32)
    out = np.empty_like(a)
    for i in range(a.shape[1]):
        t = apply(op0, r, a[:, i], instr) if reverse0 else apply(op0, a[:, i], r, instr)
        r = apply(op1, b[:, i], t, instr) if reverse1 else apply(op1, t, b[:, i], instr)
        out[:, i] = r
    dst.write(out)
    return emit(instr, Engine.VECTOR, dst, [data0, data1, initial], attrs=lane_attrs(op0, data0, data1, dst))


def tensor_scalar_cumulative(
    dst: NkiTensor,
    src: NkiTensor,
    op0: Op,
    op1: Op,
    imm0: Any,
    imm1: Any = None,
    reduce_cmd: Any = RC.reset_reduce,
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
    dst, src = lane_operands(instr, dst, src=src)
    operands.float_dtype(instr, "src", src)
    op0, op1 = require_ops(instr, op0=op0, op1=op1)
    if op1.name not in ("add", "subtract", "multiply", "maximum", "minimum"):
        checks.fail(f"{instr} op1 must be add/subtract/multiply/maximum/minimum, got {op1!r}")
    values = apply(op0, src._read_pf(), column_or_scalar(instr, "imm0", imm0, dst), instr).astype(np.float32)
    acc = state.current().accumulator("vector")
    lns = lanes(dst)
    if reduce_cmd in (RC.reset_reduce, RC.reset, RC.idle):
        reg = np.full(dst.partitions, np.float32(op1.identity), dtype=np.float32)
    elif reduce_cmd == RC.load_reduce:
        reg = np.broadcast_to(column_or_scalar(instr, "imm1", imm1, dst), (dst.partitions, 1)).reshape(-1)
        reg = reg.astype(np.float32)
    else:
        reg = acc[lns].copy()
    out = np.empty_like(values)
    for i in range(values.shape[1]):
        reg = apply(op1, values[:, i], reg, instr).astype(np.float32)
        out[:, i] = reg
    acc[lns] = reg
    dst.write(out)
    return emit(instr, Engine.VECTOR, dst, [src, imm0, imm1], attrs=lane_attrs(op0, src, dst) | {"op1": op1.name})


def tensor_scalar_reduce(
    dst: NkiTensor,
    data: NkiTensor,
    op0: Op,
    operand0: Any,
    reduce_op: Op,
    reduce_res: NkiTensor | None = None,
    reverse0: bool = False,
    reduce_cmd: Any = RC.reset_reduce,
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
    dst, data = lane_operands(instr, dst, data=data)
    op0 = require_op(op0, instr, "op0")
    result = scalar_stage(instr, data._read_pf(), op0, operand0, reverse0, dst, "operand0")
    reduced = reduce_into_acc(instr, "vector", dst, result, reduce_op, reduce_cmd, reduce_init)
    dst.write(result)
    writes = read_out(instr, dst, reduce_res, reduced, check_column=True, negate=reduce_res_negate)
    return emit(instr, Engine.VECTOR, writes, [data, operand0], attrs=lane_attrs(op0, data, dst))


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
    dst, data = on_chip(instr, dst=dst, data=data)
    checks.same_partitions(instr, "dst", dst, "data", data)
    checks.at_most(instr, "data", "free size", data.free_elems, 512)
    x = data._read_pf().astype(np.float64)
    cols = []
    for half in (x[:, 0::2], x[:, 1::2]):
        n = half.shape[1]
        mean = half.mean(axis=1) if n else np.zeros(x.shape[0])
        cols += [np.full(x.shape[0], n), mean, ((half - mean[:, None]) ** 2).sum(axis=1)]
    dst.write(np.stack(cols, axis=1).astype(np.float32))
    return emit(instr, Engine.VECTOR, dst, [data], attrs=lane_attrs("bn_stats", data, dst))


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
    dst, data = on_chip(instr, dst=dst, data=data)
    x = data._read_pf().astype(np.float64).reshape(data.partitions, -1, 3)
    count, mean, m2 = x[..., 0], x[..., 1], x[..., 2]
    total = count.sum(axis=1)
    safe = np.where(total == 0, 1, total)
    mu = (count * mean).sum(axis=1) / safe
    var = (m2.sum(axis=1) + (count * (mean - mu[:, None]) ** 2).sum(axis=1)) / safe
    dst.write(np.stack([mu, var], axis=1).astype(np.float32))
    return emit(instr, Engine.VECTOR, dst, [data], attrs=lane_attrs("bn_aggr", data, dst))
