"""Shared plumbing of the instruction modules: operand values, engine resolution, one record per instruction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from nki_cpu import checks, dtypes, operands, state
from nki_cpu.cost.record import Engine, InstructionRecord
from nki_cpu.isa.enums import NkiInstruction, engine
from nki_cpu.tensor import NkiTensor

ENGINE_OF = {
    engine.tensor: Engine.PE,
    engine.vector: Engine.VECTOR,
    engine.scalar: Engine.SCALAR,
    engine.gpsimd: Engine.GPSIMD,
    engine.dma: Engine.DMA,
    engine.sync: Engine.DMA,
}


def resolve_engine(instr: str, requested: Any, default: Engine, allowed: Sequence[Engine]) -> Engine:
    """Map an ``engine=`` argument to a record engine; ``unknown``/None → ``default``."""
    if requested is None or requested == engine.unknown:
        return default
    if not isinstance(requested, engine):
        checks.fail(f"{instr} engine must be a nisa.engine member, got {requested!r}")
    eng = ENGINE_OF[requested]
    if eng not in allowed:
        checks.fail(f"{instr} cannot run on engine {requested.name}")
    return eng


def engine_buffers(instr: str, eng: Engine, **operands: NkiTensor | None) -> None:
    """GpSimd reaches SBUF only (never PSUM)."""
    if eng is Engine.GPSIMD:
        for name, t in operands.items():
            if isinstance(t, NkiTensor) and t.buffer.kind == "psum":
                checks.fail(f"{instr} {name} in psum is not accessible from the gpsimd engine")


def column_or_scalar(instr: str, name: str, value: Any, dst: NkiTensor) -> np.ndarray | np.float32:
    """A per-partition operand as fp32, broadcastable against ``(P, F)``: Python number or ``(P,1)`` tile."""
    if isinstance(value, NkiTensor):
        operands.scalar_column(instr, name, value, dst)
        return value._read_pf()
    if isinstance(value, (int, float, np.integer, np.floating, bool)):
        return np.float32(value)
    checks.fail(f"{instr} {name} must be a number or a (P,1) tensor, got {type(value).__name__}")


_F32_SIGNATURES = {1: (np.float32, np.float32), 2: (np.float32, np.float32, np.float32)}


def compute_into(dst: NkiTensor, ufunc: np.ufunc | None, *operands: Any) -> bool:
    """``dst = ufunc(*operands)`` computed in fp32 straight into dst's storage; False when the fast path is off.

    Args:
        dst: destination view (float dtype, not indirect, for the fast path).
        ufunc: the numpy ufunc of the operator, or None.
        operands: arrays shaped ``(P, F)`` (full tiles) or ``(P, 1)`` (per-partition columns) of a float dtype
            that converts exactly to fp32 (``dtypes.EXACT_IN_F32``: converted on the fly), or fp32 scalars.

    Returns:
        True when the result was written; False when the caller must take the general path (no ufunc, integer
        or indirect dst, non-fp32 operands).

    Notes:
        Same values as computing an fp32 array and rounding it once into dst (``out=`` with ``dtype=float32``
        computes in fp32 and casts with numpy's own RNE conversion), but without the intermediate array. numpy
        resolves memory overlap between inputs and ``out``, so in-place calls still read every input first.
    """
    if ufunc is None or dst.dtype.kind in "iu" or dst._row_offsets is not None:
        return False
    shape = dst.shape
    full = dst.size
    args = []
    for x in operands:
        if isinstance(x, np.ndarray):
            if x.dtype not in dtypes.EXACT_IN_F32:
                return False
            if x.size == full:
                x = x.reshape(shape)
            elif x.ndim == 2 and x.shape == (shape[0], 1):
                if len(shape) != 2:
                    x = x.reshape((shape[0],) + (1,) * (len(shape) - 1))
            else:
                return False
        elif not isinstance(x, np.float32):
            return False
        args.append(x)
    with np.errstate(all="ignore"):
        ufunc(*args, out=dst._np(), signature=_F32_SIGNATURES[ufunc.nin], casting="unsafe")
    return True


def unit_stride(*ts: NkiTensor | None) -> bool:
    """True when every operand's innermost free dim is unit-stride (or size 1)."""
    for t in ts:
        if isinstance(t, NkiTensor) and t.ndim > 1 and t.shape[-1] > 1 and t.strides[-1] != 1:
            return False
    return True


def emit(
    opcode: str,
    eng: Engine,
    dst: NkiTensor | Sequence[NkiTensor],
    inputs: Sequence[Any],
    *,
    partitions: int | None = None,
    free_elems: int | None = None,
    nbytes: int | None = None,
    queue: int = 0,
    attrs: dict[str, Any] | None = None,
) -> NkiInstruction:
    """Append the instruction's record to the active trace and return its handle.

    Args:
        opcode: instruction name.
        eng: engine it runs on.
        dst: written tensor(s).
        inputs: read operands (non-tensors are ignored).
        partitions: defaults to dst's partition count.
        free_elems: defaults to the first tensor input's elements per partition (dst's if none).
        nbytes: defaults to the bytes written.
        queue: DMA queue index.
        attrs: instruction-specific facts for the cost model.
    """
    dsts = [dst] if isinstance(dst, NkiTensor) else [d for d in dst if isinstance(d, NkiTensor)]
    if eng is not Engine.PE:  # TensorE checks its PSUM dst before writing (tensor_engine.py)
        for d in dsts:
            if d.storage.kind == "psum":
                operands.psum_bank(opcode, "dst", d)
    ins = [t for t in inputs if isinstance(t, NkiTensor)]
    main = dsts[0]
    rec = InstructionRecord(
        opcode=opcode,
        engine=eng,
        partitions=main.partitions if partitions is None else partitions,
        free_elems=(ins[0].free_elems if ins else main.free_elems) if free_elems is None else free_elems,
        dtypes=tuple(dtypes.name(t.dtype) for t in [*ins, *dsts]),
        nbytes=sum(d.size * d.itemsize for d in dsts) if nbytes is None else nbytes,
        reads=tuple(t.region() for t in ins) + tuple(r for t in [*ins, *dsts] for r in t.runtime_reads()),
        writes=tuple(d.region() for d in dsts),
        queue=queue,
        attrs=dict(attrs or {}),
        operands=tuple(_static_operand(t) for t in [*ins, *dsts])
        + tuple(v for v in inputs if isinstance(v, (int, float, np.integer, np.floating))),
    )
    state.current().record(rec)
    return NkiInstruction(opcode, rec.index)


def _static_operand(t: NkiTensor) -> tuple[Any, ...]:
    """An operand as the program text holds it: its allocation and layout, the offset only when it is static."""
    return (
        t.storage.id,
        t.dtype,
        t.shape,
        t.strides,
        "runtime" if t.runtime_start or t._row_offsets is not None else t._offset,
    )
