"""Shared plumbing of the lane-wise instruction families (VectorE / ScalarE / GpSimd).

Every lane-wise instruction reads all of its inputs before writing ``dst`` (in-place calls are routine), computes
in fp32 (bit-vector ops on raw integers) and rounds once into ``dst.dtype``. Free dims are flattened per partition:
inputs need ``dst``'s partition count and elements per partition, not its shape.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nki_cpu import checks, dtypes, operands, state
from nki_cpu.cost.record import Engine
from nki_cpu.isa._emit import column_or_scalar, unit_stride
from nki_cpu.isa.enums import reduce_cmd
from nki_cpu.opcodes import Op, require_op
from nki_cpu.tensor import NkiTensor

RC = reduce_cmd
FP32_MIN = float(np.finfo(np.float32).min)
LANE_ENGINES = (Engine.VECTOR, Engine.SCALAR, Engine.GPSIMD)


def on_chip(instr: str, **tiles: Any) -> tuple[NkiTensor, ...]:
    """``checks.compute_operand`` on each named operand, in the order given; the checked tensors in that order."""
    return tuple(operands.compute_operand(instr, name, t) for name, t in tiles.items())


def lane_operands(instr: str, dst: Any, *, not_both_psum: bool = False, **inputs: Any) -> tuple[NkiTensor, ...]:
    """The lane-wise preamble: ``(dst, *inputs)`` checked on chip, each input with dst's partitions and elements
    per partition; with ``not_both_psum`` the (two) inputs may not both be in PSUM."""
    checked = on_chip(instr, dst=dst, **inputs)
    named = dict(zip(inputs, checked[1:], strict=True))
    checks.lanewise(instr, checked[0], **named)
    if not_both_psum:
        (a_name, a), (b_name, b) = named.items()
        checks.not_both_psum(instr, a_name, a, b_name, b)
    return checked


def require_ops(instr: str, **ops: Any) -> tuple[Op, ...]:
    """``require_op`` on each named operator argument, in the order given."""
    return tuple(require_op(op, instr, name) for name, op in ops.items())


def lane_attrs(op: Op | str, *ts: Any) -> dict[str, Any]:
    """The record attrs of a lane-wise instruction: op name, any PSUM operand, unit innermost stride."""
    name = op.name if isinstance(op, Op) else op
    psum = any(isinstance(t, NkiTensor) and t.buffer.kind == "psum" for t in ts)
    return {"op": name, "psum_input": psum, "unit_stride": unit_stride(*ts)}


def apply(op: Op, lhs: Any, rhs: Any, instr: str) -> np.ndarray:
    """``lhs op rhs`` for a binary ALU operator, floating-point warnings off."""
    if op.binary is None:
        checks.fail(f"{instr} op {op!r} is not a binary ALU operator")
    with np.errstate(all="ignore"):
        return np.asarray(op.binary(lhs, rhs))


def apply_unary(op: Op, x: np.ndarray, instr: str) -> np.ndarray:
    """``op(x)`` for a unary operator / activation function (fp32 for float input)."""
    if op.unary is None:
        checks.fail(f"{instr} op {op!r} is not a unary operator / activation function")
    with np.errstate(all="ignore"):
        return np.asarray(op.unary(x), dtype=np.float32 if x.dtype.kind == "f" else None)


def int_values(instr: str, name: str, t: NkiTensor) -> np.ndarray:
    """An integer operand of a bit-vector op as int64 ``(P, F)``."""
    if not dtypes.is_int(t.dtype):
        checks.fail(f"{instr} {name} must have an integer dtype for a bit-vector op, got {dtypes.name(t.dtype)}")
    return t._read().reshape(t.partitions, -1).astype(np.int64)


def lanes(dst: NkiTensor) -> slice:
    """The accumulator lanes (absolute partitions) ``dst`` covers."""
    p0 = dst.region().partitions[0] if dst.buffer.on_chip else 0
    return slice(p0, p0 + dst.partitions)


def scalar_stage(
    instr: str, values: np.ndarray, op: Op | None, operand: Any, reverse: bool, dst: NkiTensor, slot: str
) -> np.ndarray:
    """``values op operand`` (``operand op values`` when reversed) with a number or ``(P, 1)`` operand."""
    if op is None:
        if operand is not None:
            checks.fail(f"{instr} {slot} given without its op")
        return values
    op = require_op(op, instr, f"op for {slot}")
    if op.binary is None:
        if operand not in (None, 0, 0.0):
            checks.fail(f"{instr} unary op {op!r} takes {slot}=None or 0, got {operand!r}")
        return apply_unary(op, values, instr)
    if op.bitvec:
        if isinstance(operand, NkiTensor):
            operands.scalar_column(instr, slot, operand, dst)
            rhs: Any = int_values(instr, slot, operand)
        else:
            rhs = np.int64(int(operand))
    else:
        rhs = column_or_scalar(instr, slot, operand, dst)
    return apply(op, rhs, values, instr) if reverse else apply(op, values, rhs, instr)


def reduce_into_acc(
    instr: str, acc_name: str, dst: NkiTensor, values: np.ndarray, reduce_op: Any, cmd: Any, init: Any = None
) -> np.ndarray:
    """Apply ``cmd`` to the engine's per-lane accumulators with ``reduce_op`` over ``values`` (P, F)."""
    op = require_op(reduce_op, instr, "reduce_op")
    acc = state.current().accumulator(acc_name)
    lns = lanes(dst)
    identity = np.float32(op.identity if op.identity is not None else 0.0)
    if cmd in (RC.reset, RC.reset_reduce):
        acc[lns] = identity
    elif cmd == RC.load_reduce:
        acc[lns] = column_or_scalar(instr, "reduce_init", init, dst).reshape(-1) if init is not None else identity
    if cmd in (RC.reduce, RC.reset_reduce, RC.load_reduce):
        with np.errstate(all="ignore"):
            part = op.reduce(values.astype(np.float32), axis=1).astype(np.float32)
            acc[lns] = apply(op, acc[lns], part, instr)
    return acc[lns].copy()


def read_out(
    instr: str,
    dst: NkiTensor,
    reduce_res: NkiTensor | None,
    reduced: np.ndarray | None,
    acc_name: str = "vector",
    *,
    check_column: bool = False,
    negate: bool = False,
) -> list[NkiTensor]:
    """Write the reduction into ``reduce_res`` (after ``dst``); the instruction's written tensors.

    Args:
        instr: instruction name.
        dst: the main destination (already written).
        reduce_res: optional [P, 1] tile receiving the reduction.
        reduced: this instruction's per-lane reduction, or None to read the ``acc_name`` registers as they are.
        acc_name: accumulator engine for the read-out of unchanged registers.
        check_column: check that reduce_res is a ``(P, 1)`` tile first.
        negate: write ``-reduced``.
    """
    writes = [dst]
    if reduce_res is not None:
        if reduced is None:
            reduced = state.current().accumulator(acc_name)[lanes(dst)].copy()
        if check_column:
            operands.scalar_column(instr, "reduce_res", reduce_res, dst)
        reduce_res.write((-reduced if negate else reduced).reshape(-1, 1))
        writes.append(reduce_res)
    return writes
