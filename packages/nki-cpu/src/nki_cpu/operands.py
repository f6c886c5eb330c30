"""Checks on instruction operands and the running launch's rules: the part of :mod:`nki_cpu.checks` that needs
the tensor type or the launch state. Every failure is raised through :mod:`nki_cpu.checks`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from nki_cpu import checks, dtypes, state
from nki_cpu.checks import ON_CHIP, PSUM_BANK_BYTES
from nki_cpu.target import get_nc_version
from nki_cpu.tensor import NkiTensor


def rule(name: str, message: str) -> None:
    """A documented rule is violated: raise, or warn when the running launch relaxes ``name``."""
    checks.rule(name, message, state.current().relaxed)


def tensor(instr: str, name: str, value: Any) -> NkiTensor:
    """``value`` must be an NkiTensor."""
    if not isinstance(value, NkiTensor):
        checks.fail(f"{instr} {name} must be a tensor, got {type(value).__name__}")
    return value


def compute_operand(instr: str, name: str, t: Any, allowed: Iterable[str] = ON_CHIP) -> NkiTensor:
    """Tensor in an allowed on-chip buffer, ≤128 partitions, not indirect."""
    t = tensor(instr, name, t)
    checks.buffer(instr, name, t, allowed)
    checks.partitions(instr, name, t)
    in_bounds(instr, name, t)
    if t.ndim < 1:
        checks.fail(f"{instr} {name} must have a partition dim, got shape {t.shape}")
    return t


def scalar_column(instr: str, name: str, t: NkiTensor, dst: NkiTensor) -> None:
    """A per-partition scalar operand: (P, 1) with dst's partition count."""
    compute_operand(instr, name, t)
    checks.same_partitions(instr, "dst", dst, name, t)
    if t.free_elems != 1:
        checks.fail(f"{instr} {name} must have 1 element per partition (a (P,1) tile), got shape {t.shape}")


def same_dtype(instr: str, a_name: str, a: NkiTensor, b_name: str, b: NkiTensor) -> None:
    """Bit-exact instructions need equal dtypes."""
    if a.dtype != b.dtype:
        checks.fail(f"{instr} {b_name} dtype {dtypes.name(b.dtype)} must equal {a_name} dtype {dtypes.name(a.dtype)}")


def psum_bank(instr: str, name: str, t: NkiTensor) -> None:
    """A PSUM tile one instruction writes fits one 2 KiB bank per partition and does not straddle two banks.

    ``nl.tile_size.psum_bank_fmax_bytes`` = 2048 and ``nc_matmul``'s moving free size ≤ 512 on NeuronCore-v2/v3
    (ISA ``nc_matmul`` / ``tile_size`` pages, v2.33.0); NeuronCore-v4 matmuls may span all 8 banks, so the rule
    applies to gen2/gen3 targets only.
    """
    if get_nc_version().value >= 4:
        return
    region = t.region()
    lo, hi = region.byte_range
    if hi - lo > PSUM_BANK_BYTES:
        rule(
            "psum_bank",
            f"{instr} {name} bytes per partition {hi - lo} exceeds maximum {PSUM_BANK_BYTES} (one PSUM bank)",
        )
    elif lo // PSUM_BANK_BYTES != (hi - 1) // PSUM_BANK_BYTES:
        rule(
            "psum_bank",
            f"{instr} {name} byte range [{lo}, {hi}) per partition crosses a {PSUM_BANK_BYTES}-byte PSUM bank",
        )


def fp32_operand(instr: str, name: str, value: Any) -> None:
    """A tile given where the ISA wants an fp32 scalar operand (tensor_scalar operands, activation scale)."""
    if isinstance(value, NkiTensor) and value.dtype != dtypes.float32:
        rule(
            "fp32_scalar_operands",
            f"{instr} {name} dtype {dtypes.name(value.dtype)} must be float32 (a [P, 1] float32 tile or a Python "
            "number)",
        )


def float_dtype(instr: str, name: str, t: NkiTensor) -> None:
    """Operand must be a floating-point tensor."""
    if not dtypes.is_float(t.dtype):
        checks.fail(f"{instr} {name} must have a float dtype, got {dtypes.name(t.dtype)}")


def in_bounds(instr: str, name: str, t: NkiTensor) -> None:
    """A view addressed at run time lies inside its tensor (rule ``dynamic_out_of_bounds``; a DMA with
    ``oob_mode.skip`` checks it itself)."""
    if t.runtime is not None and t.runtime.any_out_of_bounds and not state.current().dry_run:
        checks.rule(
            "dynamic_out_of_bounds",
            f"{instr} {name} run-time index must address elements inside the tensor {t.storage.shape}, got an index "
            "outside it. Fix: keep the index in range, or pass oob_mode=nisa.oob_mode.skip to a DMA to skip it",
            state.current().relaxed,
            checks.OutOfBoundsError,
        )
