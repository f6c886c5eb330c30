"""Hardware limits, raised as ``AssertionError`` in the real simulator's message style.

Messages read ``"<instruction> <operand> <what> <value> exceeds maximum <limit>"`` (the official simulator's style: NKI CPU simulator guide, v2.31–v2.33; docs/nki-sources.md §1.4) or, for
non-numeric rules, ``"<instruction> <operand> <rule>, got <value>"``. Every function either returns silently or
raises; none of them changes state.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

from nki_cpu import dtypes, state
from nki_cpu.tensor import NkiTensor

PMAX = 128  # partitions per SBUF/PSUM operand (nl.tile_size.pmax)
GEMM_STATIONARY_FMAX = 128  # nl.tile_size.gemm_stationary_fmax
GEMM_MOVING_FMAX = 512  # nl.tile_size.gemm_moving_fmax (Trn2)
PSUM_BANK_BYTES = 2048  # one PSUM bank per partition (nl.tile_size.psum_bank_fmax_bytes)
VECTOR_TRANSPOSE_MAX = 32  # VectorE nc_transpose block (ISA ``nc_transpose``, v2.33.0; docs/nki-sources.md §3.5)

ON_CHIP = frozenset({"sbuf", "psum"})
SBUF_ONLY = frozenset({"sbuf"})
PSUM_ONLY = frozenset({"psum"})
HBM_OR_SBUF = frozenset({"hbm", "sbuf"})


# The documented constraints nki-cpu enforces by name (README, "What is enforced"). ``simulate(kernel,
# relax={...})`` turns named rules into RuntimeWarnings for one launch: switchable, never silent.
RULES = frozenset(
    {
        "gpsimd_tensor_scalar",  # GpSimd runs tensor_scalar only for rsqrt
        "scalar_tensor_scalar_ops",  # trn2 ScalarE tensor_scalar: (multiply, add), (multiply, -), (add, -)
        "fp32_scalar_operands",  # tensor_scalar operand tiles and activation's scale tile are float32
        "activation_reduce_add",  # activation's reduce_op is nl.add
        "activation_engine",  # activation on GpSimd only on NeuronCore-v4 (Trn3) and newer
        "tensor_tensor_engine",  # tensor_tensor runs on the vector or GpSimd engine
        "psum_bank",  # a PSUM tile one instruction writes stays inside one 2 KiB bank per partition (v2/v3)
        "accumulation_groups",  # at most 8 matmul accumulation groups outstanding
        "lnc_grid",  # kernel[n]: n is the LNC degree, 1 or 2
        "buffer_strings",  # buffers are nl.* objects, not strings (NKI 0.3.0+)
        "pe_tiling",  # nc_matmul tiling mode: both tile_position and tile_size, aligned, inside the PE array
        "indirect_transpose",  # no dma_transpose of a src addressed at run time (nl.ds run-time start, offsets)
        "ap_scalar_offset_view",  # .ap(scalar_offset= / vector_offset=) only on a whole allocation, not on a view
        "loop_in_no_reorder",  # no compiled loop (fori_loop / while_loop) inside an nl.no_reorder() block
    }
)


def fail(message: str) -> None:
    """Raise the simulator-style error."""
    raise AssertionError(message)


def rule(name: str, message: str, relaxed: frozenset[str] | None = None) -> None:
    """A documented rule is violated: raise, or warn when the running launch (or ``relaxed``) relaxes ``name``."""
    if name in (state.current().relaxed if relaxed is None else relaxed):
        warnings.warn(f"{message} (rule {name!r} relaxed for this launch)", RuntimeWarning, stacklevel=3)
        return
    fail(message)


def tensor(instr: str, name: str, value: Any) -> NkiTensor:
    """``value`` must be an NkiTensor."""
    if not isinstance(value, NkiTensor):
        fail(f"{instr} {name} must be a tensor, got {type(value).__name__}")
    return value


def buffer(instr: str, name: str, t: NkiTensor, allowed: Iterable[str]) -> None:
    """``t`` must live in one of ``allowed`` (``"hbm"``, ``"sbuf"``, ``"psum"``)."""
    if t.storage.kind not in allowed:
        allowed = frozenset(allowed)
        fail(f"{instr} {name} must be in {'/'.join(sorted(allowed))}, got {t.buffer.kind}")


def partitions(instr: str, name: str, t: NkiTensor) -> None:
    """An on-chip operand spans at most 128 partitions."""
    if t.storage.on_chip and t.shape[0] > PMAX:
        fail(f"{instr} {name} partition dimension {t.shape[0]} exceeds maximum {PMAX}")


def compute_operand(instr: str, name: str, t: Any, allowed: Iterable[str] = ON_CHIP) -> NkiTensor:
    """Tensor in an allowed on-chip buffer, ≤128 partitions, not indirect."""
    t = tensor(instr, name, t)
    buffer(instr, name, t, allowed)
    partitions(instr, name, t)
    if t.ndim < 1:
        fail(f"{instr} {name} must have a partition dim, got shape {t.shape}")
    return t


def same_partitions(instr: str, a_name: str, a: NkiTensor, b_name: str, b: NkiTensor) -> None:
    """Lane-wise instructions map partition i to partition i: counts must match."""
    if a.shape[0] != b.shape[0]:
        fail(
            f"{instr} {b_name} partition dimension {b.shape[0]} does not match {a_name} partition dimension "
            f"{a.shape[0]}"
        )


def same_free(instr: str, a_name: str, a: NkiTensor, b_name: str, b: NkiTensor) -> None:
    """Same number of elements per partition (shapes may differ)."""
    if a.free_elems != b.free_elems:
        fail(
            f"{instr} {b_name} elements per partition {b.free_elems} do not match {a_name} elements per partition "
            f"{a.free_elems}"
        )


def lanewise(instr: str, dst: NkiTensor, **inputs: NkiTensor) -> None:
    """Each input has dst's partition count and elements per partition."""
    for name, t in inputs.items():
        same_partitions(instr, "dst", dst, name, t)
        same_free(instr, "dst", dst, name, t)


def scalar_column(instr: str, name: str, t: NkiTensor, dst: NkiTensor) -> None:
    """A per-partition scalar operand: (P, 1) with dst's partition count."""
    compute_operand(instr, name, t)
    same_partitions(instr, "dst", dst, name, t)
    if t.free_elems != 1:
        fail(f"{instr} {name} must have 1 element per partition (a (P,1) tile), got shape {t.shape}")


def not_both_psum(instr: str, a_name: str, a: NkiTensor, b_name: str, b: NkiTensor) -> None:
    """At most one input of a two-input lane-wise instruction may be in PSUM."""
    if a.buffer.kind == "psum" and b.buffer.kind == "psum":
        fail(f"{instr} {a_name} and {b_name} cannot both be in psum")


def element_count(instr: str, dst: NkiTensor, src: NkiTensor) -> None:
    """DMA-style element-count match."""
    if dst.size != src.size:
        fail(
            f"{instr} dst element count {dst.size} ({dst.shape}) does not match src element count {src.size} "
            f"({src.shape})"
        )


def same_dtype(instr: str, a_name: str, a: NkiTensor, b_name: str, b: NkiTensor) -> None:
    """Bit-exact instructions need equal dtypes."""
    if a.dtype != b.dtype:
        fail(f"{instr} {b_name} dtype {dtypes.name(b.dtype)} must equal {a_name} dtype {dtypes.name(a.dtype)}")


def at_most(instr: str, name: str, what: str, value: int, limit: int) -> None:
    """``value`` ≤ ``limit``."""
    if value > limit:
        fail(f"{instr} {name} {what} {value} exceeds maximum {limit}")


def psum_bank(instr: str, name: str, t: NkiTensor) -> None:
    """A PSUM tile one instruction writes fits one 2 KiB bank per partition and does not straddle two banks.

    ``nl.tile_size.psum_bank_fmax_bytes`` = 2048 and ``nc_matmul``'s moving free size ≤ 512 on NeuronCore-v2/v3
    (ISA ``nc_matmul`` / ``tile_size`` pages, v2.33.0); NeuronCore-v4 matmuls may span all 8 banks, so the rule
    applies to gen2/gen3 targets only.
    """
    from nki_cpu.isa.enums import get_nc_version  # late: the isa package imports this module

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


def capacity(buffer_name: str, live: int, cap: int, requested: int) -> None:
    """Live on-chip bytes per partition stay within the buffer's capacity."""
    if live > cap:
        fail(
            f"{buffer_name} allocation of {requested} bytes per partition: live {buffer_name} usage {live} bytes per "
            f"partition exceeds maximum {cap}"
        )


def float_dtype(instr: str, name: str, t: NkiTensor) -> None:
    """Operand must be a floating-point tensor."""
    if not dtypes.is_float(t.dtype):
        fail(f"{instr} {name} must have a float dtype, got {dtypes.name(t.dtype)}")
