"""Element-wise lane-wise instructions: ``tensor_tensor``, ``tensor_scalar``, ``scalar_tensor_tensor``,
``tensor_copy``, ``reciprocal`` (semantics shared by every lane-wise family: ``_lanewise``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from nki_cpu import dtypes, operands
from nki_cpu.cost.record import Engine
from nki_cpu.isa._emit import compute_into, emit, engine_buffers, resolve_engine
from nki_cpu.isa._lanewise import (
    LANE_ENGINES,
    RC,
    apply,
    int_values,
    lane_attrs,
    lane_operands,
    reduce_into_acc,
    require_ops,
    scalar_stage,
)
from nki_cpu.isa.enums import NkiInstruction, engine
from nki_cpu.opcodes import Op, require_op
from nki_cpu.target import get_nc_version
from nki_cpu.tensor import NkiTensor


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
    dst, data1, data2 = lane_operands(instr, dst, data1=data1, data2=data2, not_both_psum=True)
    all_int = all(dtypes.is_int(t.dtype) and t.itemsize == 4 for t in (dst, data1, data2))
    any_psum = any(t.buffer.kind == "psum" for t in (dst, data1, data2))
    default = Engine.GPSIMD if (op.name == "power" or all_int) and not any_psum else Engine.VECTOR
    eng = resolve_engine(instr, engine, default, LANE_ENGINES)
    if eng is Engine.SCALAR:
        operands.rule("tensor_tensor_engine", f"{instr} engine scalar is not allowed (vector or gpsimd)")
    engine_buffers(instr, eng, dst=dst, data1=data1, data2=data2)
    if op.bitvec or (all_int and eng is Engine.GPSIMD):
        result = apply(op, int_values(instr, "data1", data1), int_values(instr, "data2", data2), instr)
        dst.write(result)
    else:
        lhs, rhs = data1._lanes(), data2._lanes()  # converted to fp32 on the fly by compute_into
        if not compute_into(dst, op.binary_ufunc, lhs, rhs):
            dst.write(apply(op, dtypes.to_f32(lhs), dtypes.to_f32(rhs), instr))
    return emit(instr, eng, dst, [data1, data2], attrs=lane_attrs(op, data1, data2, dst))


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
    values = data._lanes()  # converted to fp32 on the fly
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
    dst, data = lane_operands(instr, dst, data=data)
    eng = resolve_engine(instr, engine, Engine.VECTOR, LANE_ENGINES)
    engine_buffers(instr, eng, dst=dst, data=data)
    op0 = require_op(op0, instr, "op0")
    _tensor_scalar_rules(instr, eng, op0, op1, operand0, operand1)
    if not _tensor_scalar_into(dst, data, op0, operand0, reverse0, op1, operand1, reverse1):
        values: np.ndarray = int_values(instr, "data", data) if op0.bitvec else data._peek_pf()
        values = scalar_stage(instr, values, op0, operand0, reverse0, dst, "operand0")
        values = scalar_stage(instr, values, op1, operand1, reverse1, dst, "operand1")
        dst.write(values)
    attrs = lane_attrs(op0, data, dst)
    attrs["op1"] = op1.name if isinstance(op1, Op) else None
    return emit(instr, eng, dst, [data, operand0, operand1], attrs=attrs)


# Operator pairs the trn2 (NeuronCore-v3) Scalar engine runs as tensor_scalar (ISA tensor_scalar, v2.33.0); v4
# supports tensor_scalar natively.
SCALAR_ENGINE_PAIRS = frozenset({("multiply", "add"), ("multiply", None), ("add", None)})


def _tensor_scalar_rules(instr: str, eng: Engine, op0: Op, op1: Any, operand0: Any, operand1: Any) -> None:
    """The documented engine and operand constraints of ``tensor_scalar`` (README, "What is enforced")."""
    op1_name = op1.name if isinstance(op1, Op) else None
    if eng is Engine.GPSIMD and (op0.name != "rsqrt" or op1 is not None):
        operands.rule(
            "gpsimd_tensor_scalar",
            f"{instr} engine gpsimd op0={op0.name} op1={op1_name} is not allowed (gpsimd runs tensor_scalar only "
            "for op0=rsqrt, op1=None); use the vector or scalar engine",
        )
    if eng is Engine.SCALAR and get_nc_version().value <= 3 and (op0.name, op1_name) not in SCALAR_ENGINE_PAIRS:
        operands.rule(
            "scalar_tensor_scalar_ops",
            f"{instr} engine scalar op0={op0.name} op1={op1_name} is not supported on this target (scalar engine "
            "pairs: (multiply, add), (multiply, None), (add, None))",
        )
    if not op0.bitvec:
        operands.fp32_operand(instr, "operand0", operand0)
        operands.fp32_operand(instr, "operand1", operand1)


def scalar_tensor_tensor(
    dst: NkiTensor,
    data: NkiTensor,
    op0: Op,
    operand0: Any,
    op1: Op,
    operand1: NkiTensor,
    reverse0: bool = False,
    reverse1: bool = False,
    reduce_cmd: Any = RC.reset_reduce,
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
    dst, data, operand1 = lane_operands(instr, dst, data=data, operand1=operand1, not_both_psum=True)
    op0, op1 = require_ops(instr, op0=op0, op1=op1)
    t = scalar_stage(instr, data._read_pf(), op0, operand0, reverse0, dst, "operand0")
    other = operand1._read_pf()
    result = apply(op1, other, t, instr) if reverse1 else apply(op1, t, other, instr)
    reduced = reduce_into_acc(instr, "vector", dst, result, reduce_op, reduce_cmd) if reduce_op is not None else None
    dst.write(result)
    if reduce_res is not None and reduced is not None:
        operands.scalar_column(instr, "reduce_res", reduce_res, dst)
        reduce_res.write(reduced.reshape(-1, 1))
    return emit(
        instr,
        Engine.VECTOR,
        [dst, reduce_res] if reduce_res is not None else dst,
        [data, operand0, operand1],
        attrs=lane_attrs(op0, data, operand1, dst) | {"op1": op1.name},
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
    dst, src = lane_operands(instr, dst, src=src)
    eng = resolve_engine(instr, engine, Engine.VECTOR, LANE_ENGINES)
    engine_buffers(instr, eng, dst=dst, src=src)
    if dst.dtype == src.dtype:
        dst.write_raw(src._np().reshape(src.partitions, -1))  # overlap-safe numpy assignment, no extra copy
    else:
        dst.write(src._peek_pf())
    return emit(instr, eng, dst, [src], attrs=lane_attrs("copy", src, dst))


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
    dst, data = lane_operands(instr, dst, data=data)
    with np.errstate(all="ignore"):
        dst.write(np.float32(1.0) / data._read_pf())
    return emit(instr, Engine.VECTOR, dst, [data], attrs=lane_attrs("reciprocal", data, dst))
