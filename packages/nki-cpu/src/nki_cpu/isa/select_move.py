"""Selects and moves on the lanes (VectorE unless pinned): ``range_select``, ``select_reduce``,
``tensor_copy_predicated``, ``memset``, ``nc_stream_shuffle``."""

from __future__ import annotations

from typing import Any

import numpy as np

from nki_cpu import checks, dtypes, operands
from nki_cpu.cost.record import Engine
from nki_cpu.isa._emit import column_or_scalar, emit, engine_buffers, resolve_engine, unit_stride
from nki_cpu.isa._lanewise import (
    FP32_MIN,
    RC,
    apply,
    lane_attrs,
    lane_operands,
    on_chip,
    read_out,
    reduce_into_acc,
    require_ops,
)
from nki_cpu.isa.enums import NkiInstruction, engine
from nki_cpu.opcodes import Op, maximum
from nki_cpu.tensor import NkiTensor


def range_select(
    dst: NkiTensor,
    on_true_tile: NkiTensor,
    comp_op0: Op,
    comp_op1: Op,
    bound0: Any,
    bound1: Any,
    reduce_cmd: Any = RC.reset_reduce,
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
    dst, on_true_tile = lane_operands(instr, dst, on_true_tile=on_true_tile)
    c0, c1 = require_ops(instr, comp_op0=comp_op0, comp_op1=comp_op1)
    idx = (np.float32(range_start) + np.arange(dst.free_elems, dtype=np.float32))[None, :]
    keep = (apply(c0, idx, column_or_scalar(instr, "bound0", bound0, dst), instr) != 0) & (
        apply(c1, idx, column_or_scalar(instr, "bound1", bound1, dst), instr) != 0
    )
    result = np.where(keep, on_true_tile._read_pf(), np.float32(on_false_value)).astype(np.float32)
    reduced = reduce_into_acc(instr, "vector", dst, result, reduce_op or maximum, reduce_cmd)
    dst.write(result)
    writes = read_out(instr, dst, reduce_res, reduced)
    return emit(
        instr,
        Engine.VECTOR,
        writes,
        [on_true_tile, bound0, bound1],
        attrs=lane_attrs("range_select", on_true_tile, dst),
    )


def select_reduce(
    dst: NkiTensor,
    predicate: NkiTensor,
    on_true: NkiTensor,
    on_false: Any,
    reduce_res: NkiTensor | None = None,
    reduce_cmd: Any = RC.idle,
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
    dst, predicate, on_true = lane_operands(instr, dst, predicate=predicate, on_true=on_true)
    pred = _predicate(dst, predicate, reverse_pred)
    result = np.where(pred, on_true._read_pf(), column_or_scalar(instr, "on_false", on_false, dst)).astype(np.float32)
    reduced = None
    if reduce_cmd != RC.idle:
        reduced = reduce_into_acc(instr, "vector", dst, result, reduce_op or maximum, reduce_cmd)
    dst.write(result)
    writes = read_out(instr, dst, reduce_res, reduced)
    return emit(instr, Engine.VECTOR, writes, [predicate, on_true, on_false], attrs=lane_attrs("select", on_true, dst))


def _predicate(dst: NkiTensor, predicate: NkiTensor, reverse: bool) -> np.ndarray:
    """The predicate as booleans ``(P, F)`` (non-zero = true), inverted when ``reverse``."""
    pred = predicate._read().reshape(dst.partitions, -1) != 0
    return ~pred if reverse else pred


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
    dst, predicate = lane_operands(instr, dst, predicate=predicate)
    pred = _predicate(dst, predicate, reverse_pred)
    current = dst._read().reshape(dst.partitions, -1)
    if isinstance(src, NkiTensor):
        (src,) = on_chip(instr, src=src)
        checks.lanewise(instr, dst, src=src)
        new = src._read().reshape(dst.partitions, -1)
        new = new if src.dtype == dst.dtype else dtypes.round_to(dtypes.to_f32(new), dst.dtype)
    else:
        new = dtypes.round_to(np.full(current.shape, src, dtype=np.float32), dst.dtype)
    dst.write_raw(np.where(pred, new, current))
    return emit(instr, Engine.VECTOR, dst, [src, predicate, dst], attrs=lane_attrs("copy_predicated", predicate, dst))


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
    (dst,) = on_chip(instr, dst=dst)
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
    dst, src = on_chip(instr, dst=dst, src=src)
    checks.same_free(instr, "dst", dst, "src", src)
    operands.same_dtype(instr, "src", src, "dst", dst)
    mask = list(shuffle_mask)
    values = src._read().reshape(src.partitions, -1)
    out = dst._read().reshape(dst.partitions, -1)
    for j in range(dst.partitions):
        m = int(mask[j % 32])
        if m == 255:
            continue
        source = (j // 32) * 32 + m
        if source >= src.partitions:
            checks.fail(f"{instr} shuffle_mask[{j % 32}]={m} selects src partition {source} of {src.partitions}")
        out[j] = values[source]
    dst.write_raw(out)
    return emit(instr, Engine.VECTOR, dst, [src], attrs=lane_attrs("shuffle", src, dst))
