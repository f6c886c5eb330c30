"""Every rule violation nki-cpu reports goes through this module: one exception hierarchy, one message grammar.

Messages read ``"<instruction> <operand> <what> <value> exceeds maximum <limit>"`` (the official simulator's
style: NKI CPU simulator guide, v2.31–v2.33; docs/nki-sources.md §1.4) or, for non-numeric rules,
``"<instruction> <operand> <rule>, got <value>"``. Every function either returns silently or raises; none of them
changes state.

A leaf module: it imports no other nki-cpu module, so every layer (tensors, launch state, loops, instructions) can
report through it. The checks that need the tensor type or the running launch live in :mod:`nki_cpu.operands`.
The hardware limits the checks compare against have their one home here.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any, NoReturn

PMAX = 128  # partitions per SBUF/PSUM operand (nl.tile_size.pmax)
GEMM_STATIONARY_FMAX = 128  # nl.tile_size.gemm_stationary_fmax
GEMM_MOVING_FMAX = 512  # nl.tile_size.gemm_moving_fmax (Trn2)
PSUM_BANK_BYTES = 2048  # one PSUM bank per partition (nl.tile_size.psum_bank_fmax_bytes; docs/nki-sources.md §2.9)
PSUM_BANKS = 8  # PSUM banks per partition (docs/nki-sources.md §2.9, §4.1)
PSUM_BYTES_PER_PARTITION = PSUM_BANK_BYTES * PSUM_BANKS
# Trn2 SBUF per partition usable by kernels: 224 KiB − 16 KiB − 8 B (NKILIB constant, docs/nki-sources.md §2.9, for
# sbuf_fmax_bytes / total_available_sbuf_size on v3).
SBUF_BYTES_PER_PARTITION = 224 * 1024 - 16 * 1024 - 8
VECTOR_TRANSPOSE_MAX = 32  # VectorE nc_transpose block (ISA ``nc_transpose``, v2.33.0; docs/nki-sources.md §3.5)

ON_CHIP = frozenset({"sbuf", "psum"})
SBUF_ONLY = frozenset({"sbuf"})
PSUM_ONLY = frozenset({"psum"})
HBM_OR_SBUF = frozenset({"hbm", "sbuf"})


class NkiValidationError(AssertionError):
    """A kernel broke a hardware or API rule (``nisa.NkiValidationError``).

    An ``AssertionError``, as the official simulator raises; the subclasses below add the Python type a caller may
    already expect for that kind of mistake.
    """


class RuleViolationError(NkiValidationError):
    """A named, documented rule of ``RULES`` was broken (``rule`` is its name; relaxable per launch)."""

    def __init__(self, message: str, rule: str) -> None:
        super().__init__(message)
        self.rule = rule


class OutOfBoundsError(NkiValidationError, IndexError):
    """An index or view reaches outside its tensor."""


class SealedValueError(NkiValidationError, TypeError):
    """Kernel Python asked for a value that exists only on the device at run time."""


class KernelTypeError(NkiValidationError, TypeError):
    """A kernel passed an argument of a kind the API does not take (a float loop step, a Python int to
    ``scalar_store``, scalars of two widths)."""


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
        "live_registers",  # at most 64 scalar registers live at once per engine sequencer (registers_live)
        "buffer_strings",  # buffers are nl.* objects, not strings (NKI 0.3.0+)
        "pe_tiling",  # nc_matmul tiling mode: both tile_position and tile_size, aligned, inside the PE array
        "indirect_transpose",  # no dma_transpose of a src addressed at run time (nl.ds run-time start, offsets)
        "ap_scalar_offset_view",  # .ap(scalar_offset= / vector_offset=) only on a whole allocation, not on a view
        "loop_in_no_reorder",  # no compiled loop (fori_loop / while_loop) inside an nl.no_reorder() block
        # Run-time values (README, "Run-time values"): device data never reaches the kernel's Python.
        "device_data",  # tile.read()/.np()/.read_f32()/.lanes()/.storage.raw inside a kernel
        "runtime_scalars",  # int()/bool()/index/branch/.value of an NkiScalar or VirtualRegister; a run-time .offset
        "register_alloc_value",  # register_alloc(x): x is None or a compile-time int
        "scalar_load_source",  # scalar_load / scalar_store: a (1, 1) int32/int64 tile in SBUF or HBM
        "register_load_source",  # register_load / register_store: a one-element tensor in SBUF or HBM, <= 32 bits
        "loop_bounds",  # fori_loop bounds are ints or 32-bit run-time values (no floats, bools or int64 scalars)
        "dynamic_index_count",  # at most one run-time index per view (ds start, scalar_offset, vector_offset)
        "dynamic_partition_start",  # no run-time start on the partition dim of an SBUF/PSUM tensor (ds or .ap)
        "indirect_dim_reslice",  # the dim a run-time index addresses is not sliced again
        "onchip_offset_int32",  # a run-time offset on an SBUF/PSUM tensor is nl.int32
        "vector_offset_form",  # vector_offset: an integer SBUF index tile, addressing an HBM tensor
        "dynamic_dge_mode",  # a DMA addressed at run time needs swdge/hwdge; a vector-offset gather/scatter swdge
        "dynamic_out_of_bounds",  # a run-time index outside its tensor fails (a DMA with oob_mode.skip skips it)
        "unique_scatter_indices",  # dma_compute scatters each row once
        "runtime_view_dtype",  # no .view(dtype) / .ap(dtype=) of a view addressed at run time
        "dma_compute_static_address",  # dma_compute operands at compile-time addresses (unless vector_offset)
        "dma_compute_unique_indices",  # dma_compute(unique_indices=False) is not supported
    }
)


def fail(message: str, kind: type[NkiValidationError] = NkiValidationError) -> NoReturn:
    """Raise the simulator-style error (``kind``: a class of the hierarchy above)."""
    raise kind(message)


def rule(name: str, message: str, relaxed: Iterable[str], kind: type[NkiValidationError] = RuleViolationError) -> None:
    """Documented rule ``name`` is violated: raise, or warn when ``relaxed`` (the running launch's
    ``simulate(relax=...)`` set) names it. Callers inside a launch use :func:`nki_cpu.operands.rule`."""
    if name not in RULES:
        raise KeyError(f"nki-cpu: {name!r} is not a rule of checks.RULES")
    if name in relaxed:
        warnings.warn(f"{message} (rule {name!r} relaxed for this launch)", RuntimeWarning, stacklevel=3)
        return
    if kind is RuleViolationError:
        raise RuleViolationError(message, name)
    error = kind(message)
    error.rule = name  # type: ignore[attr-defined]
    raise error


def buffer(instr: str, name: str, t: Any, allowed: Iterable[str]) -> None:
    """``t`` must live in one of ``allowed`` (``"hbm"``, ``"sbuf"``, ``"psum"``)."""
    if t.storage.kind not in allowed:
        allowed = frozenset(allowed)
        fail(f"{instr} {name} must be in {'/'.join(sorted(allowed))}, got {t.buffer.kind}")


def partitions(instr: str, name: str, t: Any) -> None:
    """An on-chip operand spans at most 128 partitions."""
    if t.storage.on_chip and t.shape[0] > PMAX:
        fail(f"{instr} {name} partition dimension {t.shape[0]} exceeds maximum {PMAX}")


def same_partitions(instr: str, a_name: str, a: Any, b_name: str, b: Any) -> None:
    """Lane-wise instructions map partition i to partition i: counts must match."""
    if a.shape[0] != b.shape[0]:
        fail(
            f"{instr} {b_name} partition dimension {b.shape[0]} does not match {a_name} partition dimension "
            f"{a.shape[0]}"
        )


def same_free(instr: str, a_name: str, a: Any, b_name: str, b: Any) -> None:
    """Same number of elements per partition (shapes may differ)."""
    if a.free_elems != b.free_elems:
        fail(
            f"{instr} {b_name} elements per partition {b.free_elems} do not match {a_name} elements per partition "
            f"{a.free_elems}"
        )


def lanewise(instr: str, dst: Any, **inputs: Any) -> None:
    """Each input has dst's partition count and elements per partition."""
    for name, t in inputs.items():
        same_partitions(instr, "dst", dst, name, t)
        same_free(instr, "dst", dst, name, t)


def not_both_psum(instr: str, a_name: str, a: Any, b_name: str, b: Any) -> None:
    """At most one input of a two-input lane-wise instruction may be in PSUM."""
    if a.buffer.kind == "psum" and b.buffer.kind == "psum":
        fail(f"{instr} {a_name} and {b_name} cannot both be in psum")


def element_count(instr: str, dst: Any, src: Any) -> None:
    """DMA-style element-count match."""
    if dst.size != src.size:
        fail(
            f"{instr} dst element count {dst.size} ({dst.shape}) does not match src element count {src.size} "
            f"({src.shape})"
        )


def at_most(instr: str, name: str, what: str, value: int, limit: int) -> None:
    """``value`` ≤ ``limit``."""
    if value > limit:
        fail(f"{instr} {name} {what} {value} exceeds maximum {limit}")


def capacity(buffer_name: str, live: int, cap: int, requested: int) -> None:
    """Live on-chip bytes per partition stay within the buffer's capacity."""
    if live > cap:
        fail(
            f"{buffer_name} allocation of {requested} bytes per partition: live {buffer_name} usage {live} bytes per "
            f"partition exceeds maximum {cap}"
        )
