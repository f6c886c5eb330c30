"""Run-time integers: ``scalar_load`` / ``scalar_store`` (``NkiScalar``) and the virtual-register instructions.

A value loaded from a tile exists only on the device: the kernel's Python gets an ``NkiScalar`` or a
``VirtualRegister`` it can use as an offset or a loop bound but never read (``nki_cpu.scalar``). Each load and
store is an instruction with a record, so the cost model charges it and orders it after the instruction that wrote
its source; the loaded value remembers its register (a ``Region`` of buffer ``"register"``), and an instruction
addressed by it reads that register, so it is ordered after the load.

Pages: ``nki.isa.scalar_load`` / ``scalar_store`` (SDK 2.33 and latest: a 1x1 ``nl.int32`` / ``nl.int64`` tile in
SBUF or HBM), ``nki.isa.register_alloc`` / ``register_move`` / ``register_load`` / ``register_store`` and
``nki.isa.VirtualRegister`` (v2.29.1-v2.33.0: an optional integer initial value; a one-element tensor, shape [1] or
[1, 1], in HBM or SBUF, up to 32 bits).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nki_cpu import checks, dtypes, operands, state
from nki_cpu.cost.record import Engine, InstructionRecord, Region
from nki_cpu.isa._emit import _static_operand
from nki_cpu.scalar import NkiScalar, VirtualRegister, runtime_value

# The engine nki-cpu charges a register load/store to (the pages do not say which sequencer executes it;
# README known unknown 25).
REGISTER_ENGINE = Engine.GPSIMD
SCALAR_DTYPES = ("int32", "int64")


def _register_region() -> Region:
    """A fresh register as the cost model sees it: its own 'allocation', so dependencies on it are exact."""
    return Region(state.next_storage_id(), "register", (0, 1), (0, 4))


def _record(opcode: str, src: Any, dst: Any, dtype: np.dtype) -> None:
    """One record: a 1-element transfer between a tile and a register (either side a Region or a tensor)."""
    reads = (src if isinstance(src, Region) else src.region(),)
    if not isinstance(src, Region):  # a tile addressed at run time also reads the registers addressing it
        reads += tuple(src.runtime_reads())
    writes = (dst if isinstance(dst, Region) else dst.region(),)
    # The program text's operands: a tile addressed at run time without its resolved address (``_static_operand``),
    # so a compiled loop's body and the fingerprint see one instruction whatever the iteration's index.
    forms = tuple(("register",) if isinstance(x, Region) else _static_operand(x) for x in (src, dst))
    rec = InstructionRecord(
        opcode=opcode,
        engine=REGISTER_ENGINE,
        partitions=1,
        free_elems=1,
        dtypes=(dtypes.name(dtype),),
        nbytes=dtype.itemsize,
        reads=reads,
        writes=writes,
        operands=forms,
    )
    state.current().record(rec)


def _one_element(instr: str, name: str, t: Any, shapes: tuple[tuple[int, ...], ...], rule: str, form: str) -> Any:
    """``t`` is a tensor in SBUF or HBM of one of ``shapes`` (rule ``rule``)."""
    t = operands.tensor(instr, name, t)
    if t.buffer.kind not in checks.HBM_OR_SBUF or t.shape not in shapes:
        operands.rule(
            rule,
            f"{instr} {name} must be {form} in SBUF or HBM, got shape {t.shape} in {t.buffer.kind}. Fix: copy the "
            "value into such a tile first (nisa.dma_copy / nisa.tensor_copy)",
        )
    return t


def scalar_load(src: Any) -> NkiScalar:
    """Load a 1x1 ``nl.int32`` / ``nl.int64`` tile (SBUF or HBM) into a run-time scalar of the tile's width.

    Args:
        src: a (1, 1) int32/int64 tensor in SBUF or HBM (rule ``scalar_load_source``).

    Returns:
        An ``NkiScalar``: usable as an offset, a loop bound (int32) and in ``+ - *``; never readable by Python.
    """
    instr = "scalar_load"
    src = _one_element(instr, "src", src, ((1, 1),), "scalar_load_source", "a 1x1 (shape (1, 1)) tile")
    if src.dtype.name not in SCALAR_DTYPES:
        operands.rule(
            "scalar_load_source",
            f"{instr} src dtype must be nl.int32 or nl.int64, got {dtypes.name(src.dtype)}. Fix: load from a "
            "[1, 1] nl.int32 (or nl.int64) tile; unsigned dtypes are not accepted",
        )
    register = _register_region()
    _record(instr, src, register, src.dtype)
    value = int(src._read().reshape(-1)[0])
    return NkiScalar(value, src.dtype.name if src.dtype.name in SCALAR_DTYPES else "int32", (register,))


def scalar_store(dst: Any, value: NkiScalar) -> None:
    """Write a run-time scalar to a 1x1 tile of the same width (a Python int is not accepted)."""
    instr = "scalar_store"
    if not isinstance(value, NkiScalar):
        checks.fail(
            f"scalar_store value must be an NkiScalar, got {value!r}. Fix: nisa.memset for a constant",
            checks.KernelTypeError,
        )
    dst = _one_element(instr, "dst", dst, ((1, 1),), "scalar_load_source", "a 1x1 (shape (1, 1)) tile")
    if dst.dtype.name != value.dtype:
        checks.fail(
            f"scalar_store dst must be a 1x1 {value.dtype} tile (the scalar's width), got {dst.dtype.name} "
            f"{tuple(dst.shape)}",
            checks.KernelTypeError,
        )
    dst.write(np.full(dst.shape, runtime_value(value), dtype=dst.dtype))
    _record(instr, value.sources[0] if value.sources else _register_region(), dst, dst.dtype)


def register_alloc(x: Any = None) -> VirtualRegister:
    """A virtual register, optionally set to the compile-time integer ``x`` (rule ``register_alloc_value``).

    A tensor is not accepted (the page takes None or an integer): load one with ``register_load``.
    """
    if x is not None and (isinstance(x, bool) or not isinstance(x, (int, np.integer))):
        operands.rule(
            "register_alloc_value",
            f"register_alloc x must be None or a compile-time int, got {type(x).__name__}. Fix: "
            "r = nisa.register_alloc(); nisa.register_load(r, tile) for a value in memory",
        )
        return VirtualRegister(runtime_value(x) if not hasattr(x, "shape") else _tile_value(x))
    return VirtualRegister(0 if x is None else int(x))


def register_move(dst: VirtualRegister, src: Any) -> None:
    """``dst = src``: a compile-time int or another register (no memory access, no record)."""
    if not isinstance(dst, VirtualRegister):
        checks.fail(f"register_move dst must be a VirtualRegister, got {type(dst).__name__}")
    if isinstance(src, VirtualRegister):
        dst.set(runtime_value(src), src.sources)
    elif isinstance(src, (int, np.integer)) and not isinstance(src, bool):
        dst.set(int(src))
    else:
        checks.fail(f"register_move src must be a compile-time int or a VirtualRegister, got {type(src).__name__}")


def _tile_value(src: Any) -> int:
    flat = src._read().reshape(-1)
    return int(flat[0])


def register_load(dst: VirtualRegister, src: Any) -> None:
    """Load a register from a one-element tensor (shape [1] or [1, 1], SBUF or HBM, ≤ 32 bits)."""
    instr = "register_load"
    if not isinstance(dst, VirtualRegister):
        checks.fail(f"{instr} dst must be a VirtualRegister, got {type(dst).__name__}")
    src = _one_element(
        instr, "src", src, ((1,), (1, 1)), "register_load_source", "a one-element tensor ([1] or [1, 1])"
    )
    if src.itemsize > 4 or src.dtype.kind not in "iuf":
        operands.rule(
            "register_load_source",
            f"{instr} src dtype must be a 32-bit or narrower number, got {dtypes.name(src.dtype)}",
        )
    register = _register_region()
    _record(instr, src, register, src.dtype)
    dst.set(_tile_value(src), (register,))


def register_store(dst: Any, src: VirtualRegister) -> None:
    """Store a register into a one-element tensor (shape [1] or [1, 1], SBUF or HBM)."""
    instr = "register_store"
    if not isinstance(src, VirtualRegister):
        checks.fail(f"{instr} src must be a VirtualRegister, got {type(src).__name__}")
    dst = _one_element(
        instr, "dst", dst, ((1,), (1, 1)), "register_load_source", "a one-element tensor ([1] or [1, 1])"
    )
    dst.write(np.full(dst.shape, runtime_value(src), dtype=np.int64))
    _record(instr, src.sources[0] if src.sources else _register_region(), dst, dst.dtype)


__all__ = ["register_alloc", "register_load", "register_move", "register_store", "scalar_load", "scalar_store"]
