"""GpSimd instructions: ``iota``, ``affine_select``, ``tensor_partition_reduce`` (SBUF only, never PSUM)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from nki_cpu import checks, operands
from nki_cpu.cost.record import Engine
from nki_cpu.isa._emit import emit, unit_stride
from nki_cpu.isa.enums import NkiInstruction
from nki_cpu.opcodes import Op, equal, require_op
from nki_cpu.tensor import NkiTensor

MAX_PATTERN_DIMS = 4


def _affine_values(
    instr: str, dst: NkiTensor, pattern: Sequence[Sequence[int]], offset: int, multiplier: int
) -> np.ndarray:
    """``offset + p·multiplier + Σ step_k·i_k`` as int64, shape (P, F)."""
    pairs = [(int(p[0]), int(p[1])) for p in pattern]
    if not pairs or len(pairs) > MAX_PATTERN_DIMS:
        checks.fail(f"{instr} pattern needs 1..{MAX_PATTERN_DIMS} [step, num] pairs, got {len(pairs)}")
    total = math.prod(n for _, n in pairs)
    if total != dst.free_elems:
        checks.fail(f"{instr} pattern element count {total} does not match dst elements per partition {dst.free_elems}")
    free = np.zeros([n for _, n in pairs], dtype=np.int64)
    for k, (step, n) in enumerate(pairs):
        shape = [1] * len(pairs)
        shape[k] = n
        free = free + (np.arange(n, dtype=np.int64) * step).reshape(shape)
    lanes = np.arange(dst.partitions, dtype=np.int64)[:, None] * int(multiplier)
    return int(offset) + lanes + free.reshape(1, -1)


def iota(
    dst: NkiTensor,
    pattern: Sequence[Sequence[int]],
    offset: int = 0,
    channel_multiplier: int = 0,
    name: str | None = None,
) -> NkiInstruction:
    """``dst[p, i...] = offset + p·channel_multiplier + Σ step_k·i_k``, computed as int32 then converted.

    Dimensions:
        P partitions (≤128); Π num of the pattern = dst elements per partition.

    Args:
        dst: [P, F...] SBUF, any dtype (may be an ``.ap()`` view).
        pattern: 1–4 ``[step, num]`` pairs over the free dims only.
        offset: start value.
        channel_multiplier: per-partition increment.
        name: debug label.

    Returns:
        The instruction handle.
    """
    instr = "iota"
    dst = operands.compute_operand(instr, "dst", dst, checks.SBUF_ONLY)
    values = _affine_values(instr, dst, pattern, offset, channel_multiplier).astype(np.int32)
    dst.write(values if dst.dtype.kind in "iu" else values.astype(np.float32))
    return emit(
        instr, Engine.GPSIMD, dst, [], attrs={"op": "iota", "psum_input": False, "unit_stride": unit_stride(dst)}
    )


def affine_select(
    dst: NkiTensor,
    pattern: Sequence[Sequence[int]],
    channel_multiplier: int,
    on_true_tile: NkiTensor,
    on_false_value: float,
    cmp_op: Op = equal,
    offset: int = 0,
    name: str | None = None,
) -> NkiInstruction:
    """Keep ``on_true_tile`` where ``cmp_op(offset + p·channel_multiplier + Σ step·i, 0)``, else ``on_false_value``.

    Dimensions:
        P partitions (≤128), F elements per partition (= Π num of the pattern).

    Args:
        dst: [P, F...] SBUF.
        pattern: ``[step, num]`` pairs over the free dims (negative steps allowed).
        channel_multiplier: per-partition coefficient.
        on_true_tile: [P, F...] SBUF.
        on_false_value: fp32 number (``0.0``, ``FP32_MIN``...).
        cmp_op: comparison token (``nl.equal``, ``nl.greater_equal``...).
        offset: constant term.
        name: debug label.

    Returns:
        The instruction handle.

    Notes:
        Selected values pass through fp32 when dtypes differ (exact for same-dtype floats).
    """
    instr = "affine_select"
    cmp_op = require_op(cmp_op, instr, "cmp_op")
    dst = operands.compute_operand(instr, "dst", dst, checks.SBUF_ONLY)
    on_true_tile = operands.compute_operand(instr, "on_true_tile", on_true_tile, checks.SBUF_ONLY)
    checks.lanewise(instr, dst, on_true_tile=on_true_tile)
    affine = _affine_values(instr, dst, pattern, offset, channel_multiplier)
    keep = np.asarray(cmp_op.binary(affine, 0)) != 0 if cmp_op.binary else None
    if keep is None:
        checks.fail(f"{instr} cmp_op {cmp_op!r} is not a comparison")
    result = np.where(keep, on_true_tile._read_pf(), np.float32(on_false_value)).astype(np.float32)
    dst.write(result)
    return emit(
        instr,
        Engine.GPSIMD,
        dst,
        [on_true_tile],
        attrs={"op": cmp_op.name, "psum_input": False, "unit_stride": unit_stride(dst, on_true_tile)},
    )


def tensor_partition_reduce(dst: NkiTensor, op: Op, data: NkiTensor, name: str | None = None) -> NkiInstruction:
    """Reduce across partitions: data [P, F...] → dst [1, F...].

    Args:
        dst: [1, F...] SBUF.
        op: ``nl.add``, ``nl.average``, ``nl.maximum``, ``nl.bitwise_or``, ``nl.bitwise_and``.
        data: [P, F...] SBUF.
        name: debug label.

    Returns:
        The instruction handle.
    """
    instr = "tensor_partition_reduce"
    op = require_op(op, instr, "op")
    dst = operands.compute_operand(instr, "dst", dst, checks.SBUF_ONLY)
    data = operands.compute_operand(instr, "data", data, checks.SBUF_ONLY)
    checks.same_free(instr, "dst", dst, "data", data)
    if dst.shape[0] != 1:
        checks.fail(f"{instr} dst partition dimension {dst.shape[0]} must be 1")
    values = data._read().reshape(data.partitions, -1).astype(np.int64) if op.bitvec else data._read_pf()
    result = op.reduce(values, axis=0)
    if op.name == "average":
        result = result / np.float32(data.partitions)
    dst.write(np.asarray(result).reshape(1, -1))
    return emit(
        instr, Engine.GPSIMD, dst, [data], attrs={"op": op.name, "psum_input": False, "unit_stride": unit_stride(data)}
    )
