"""Per-instruction durations from the documented cost formulas (docs/nki-sources.md §4.2, §4.4, §4.5).

Each family has one short function returning engine cycles (compute) or a (latency, transfer) pair in ns (DMA);
:func:`duration_ns` dispatches on the opcode and converts with the executing engine's clock.

Notes:
    Record attrs read here (all optional, with the stated fallback):
    - nc_matmul: ``stationary_free`` (128), ``moving_free`` (free_elems), ``fp32`` (from dtypes),
      ``is_transpose`` (False), ``onezero`` (False: ``is_stationary_onezero or is_moving_onezero``).
    - nc_transpose (PE): ``data_partitions`` (from nbytes / (partitions · itemsize)).
    - vector/scalar ops: ``op`` / ``op0`` / ``op1`` (opcode names), ``unit_stride`` (True), ``psum_input``
      (from the read regions), ``reduce_res`` (False), ``value`` (memset), ``num_valid_indices`` /
      ``num_elem_per_idx`` (local_gather), ``n`` / ``k`` (topk).
    - DMA: ``contiguous_bytes`` (nbytes / partitions), ``transpose`` (opcode == dma_transpose), ``src``
      ("hbm"), ``dge_mode`` ("unknown").
    MIN_II is applied as a floor to every Vector/Scalar/GpSimd instruction (§4.2: the minimum initiation interval
    of the engine), also where the LEGACY table omits it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

from nki_cpu.cost.figures import Figures
from nki_cpu.cost.record import Engine, InstructionRecord

TWO_BYTE_FLOATS = frozenset({"bfloat16", "float16"})
FP32_PE_DTYPES = frozenset({"float32"})  # tf32 runs at the bf16 rate (TRN2/HW §4.1: "79 bf16/fp16/tf32")
ITEMSIZE = {"float32": 4, "tfloat32": 4, "int32": 4, "uint32": 4, "bfloat16": 2, "float16": 2, "int16": 2}


def opcode_name(record: InstructionRecord) -> str:
    """Return the bare instruction name (``"nisa.tensor_copy"`` → ``"tensor_copy"``)."""
    return record.opcode.rsplit(".", 1)[-1]


def _itemsize(dtype: str) -> int:
    return ITEMSIZE.get(dtype, 1 if "8" in dtype else 4)


def _reads_psum(record: InstructionRecord) -> bool:
    if "psum_input" in record.attrs:
        return bool(record.attrs["psum_input"])
    return any(r.buffer == "psum" for r in record.reads)


def _touches_psum(record: InstructionRecord) -> bool:
    return _reads_psum(record) or any(w.buffer == "psum" for w in record.writes)


def _all_two_byte(record: InstructionRecord) -> bool:
    return bool(record.dtypes) and all(d in TWO_BYTE_FLOATS for d in record.dtypes)


def _ops(record: InstructionRecord) -> set[str]:
    names = (record.attrs.get(key) for key in ("op", "op0", "op1"))
    return {str(n).rsplit(".", 1)[-1] for n in names if n is not None}


def _floor(cycles: float, figures: Figures) -> float:
    return max(float(figures.min_ii_cycles), cycles)


# --- TensorE -----------------------------------------------------------------------------------------------------


def matmul_cycles(record: InstructionRecord, figures: Figures) -> float:
    """PE cycles of ``nc_matmul``: ``max(min(64, N_stat), N_mov)``, ×4 for fp32 (LEGACY §3.3, §4.5).

    Notes:
        fp32 with a 0/1 hint runs ×2 (ISA ``is_*_onezero``); transpose mode uses the generation's fp32 transpose
        factor and the Trn3 background-transpose speed-up. fp8 ``double_row`` costs the same as bf16 (ISA §3.3).
    """
    attrs = record.attrs
    n_stat = int(attrs.get("stationary_free", 128))
    n_mov = int(attrs.get("moving_free", record.free_elems))
    cycles = float(max(min(figures.mm_init_latency_cycles, n_stat), n_mov))
    fp32 = bool(attrs.get("fp32", any(d in FP32_PE_DTYPES for d in record.dtypes[:-1])))
    if attrs.get("is_transpose", False):
        factor = figures.pe_fp32_transpose_factor if fp32 else 1
        return cycles * factor / figures.pe_transpose_speedup
    if fp32:
        cycles *= figures.pe_fp32_onezero_factor if attrs.get("onezero", False) else figures.pe_fp32_factor
    return cycles


def pe_transpose_cycles(record: InstructionRecord, figures: Figures) -> float:
    """PE cycles of ``nc_transpose`` on TensorE: ``max(P, min(64, F))`` (LEGACY §3.5), P×F the input tile.

    Notes:
        This is the matmul formula with the data as stationary (``N_stat = F``) and the identity as moving
        (``N_mov = P``), so records in that form (``stationary_free``/``moving_free``) are read directly; otherwise
        P comes from ``data_partitions`` or nbytes / (partitions · itemsize) and F from ``free_elems``.
    """
    attrs = record.attrs
    out_dtype = record.dtypes[-1] if record.dtypes else "bfloat16"
    if "moving_free" in attrs and "stationary_free" in attrs:
        data_p, data_f = int(attrs["moving_free"]), int(attrs["stationary_free"])
    else:
        data_p = attrs.get("data_partitions", record.nbytes // max(1, record.partitions * _itemsize(out_dtype)))
        data_f = record.free_elems
    cycles = float(max(int(data_p), min(figures.mm_init_latency_cycles, data_f)))
    if attrs.get("fp32", out_dtype in FP32_PE_DTYPES):
        cycles *= figures.pe_fp32_transpose_factor
    return cycles / figures.pe_transpose_speedup


# --- Vector / Scalar / GpSimd streaming ops -----------------------------------------------------------------------


def copy_like_speedup(record: InstructionRecord, figures: Figures) -> float:
    """Perf-mode divisor of tensor_copy / tensor_scalar (TRN2 §4.2, TRN3 §4.2).

    Returns:
        VectorE (v3+): 4 for 2-byte float in/out, SBUF only, unit stride; 2 if strided or one side PSUM; else 1.
        ScalarE (Trn3): 2 for 2-byte floats. Anything else: 1.
    """
    if not _all_two_byte(record):
        return 1.0
    if record.engine is Engine.SCALAR:
        return figures.scalar_2byte_speedup
    if record.engine is not Engine.VECTOR or not figures.vector_perf_modes:
        return 1.0
    fast = record.attrs.get("unit_stride", True) and not _touches_psum(record)
    return 4.0 if fast else 2.0


def copy_like_cycles(record: InstructionRecord, figures: Figures) -> float:
    """``tensor_copy`` / ``tensor_scalar``: ``max(MIN_II, N)`` over the perf-mode divisor (LEGACY §4.5).

    Notes:
        GpSimd ``rsqrt`` is 4× slower than ScalarE (SHARED §4.5).
    """
    n = record.free_elems / copy_like_speedup(record, figures)
    if record.engine is Engine.GPSIMD and "rsqrt" in _ops(record):
        n *= 4
    return _floor(n, figures)


def tensor_tensor_cycles(record: InstructionRecord, figures: Figures) -> float:
    """``tensor_tensor``: ``N`` on the fast path, else ``2N`` VectorE cycles (LEGACY §3.6, TRN2 §4.2).

    Notes:
        Fast path: one input in PSUM, or both SBUF with 2-byte float dtypes (v3+: any op; v2: add/multiply/subtract
        with unit stride). Other engines (GpSimd integer path, ScalarE) stream at ``N``.
    """
    n = record.free_elems
    if record.engine is not Engine.VECTOR:
        return _floor(n, figures)
    psum_reads = sum(r.buffer == "psum" for r in record.reads)
    fast = psum_reads == 1
    if not fast and psum_reads == 0 and _all_two_byte(record):
        legacy_ok = _ops(record) <= {"add", "multiply", "subtract"} and record.attrs.get("unit_stride", True)
        fast = figures.vector_perf_modes or legacy_ok
    return _floor(n if fast else 2 * n, figures)


def scalar_tensor_tensor_cycles(record: InstructionRecord, figures: Figures) -> float:
    """``scalar_tensor_tensor``: ``N`` if bf16 and (subtract, multiply) with N even, else ``2N`` (LEGACY §3.8)."""
    n = record.free_elems
    attrs = record.attrs
    ops = (str(attrs.get("op0", "")).rsplit(".", 1)[-1], str(attrs.get("op1", "")).rsplit(".", 1)[-1])
    inputs_bf16 = bool(record.dtypes) and all(d == "bfloat16" for d in record.dtypes[:-1])
    fast = inputs_bf16 and ops == ("subtract", "multiply") and n % 2 == 0
    return _floor(n if fast else 2 * n, figures)


def activation_cycles(record: InstructionRecord, figures: Figures) -> float:
    """``activation`` family: ``max(MIN_II, N)``, ``+ 64`` when the accumulator is read out (LEGACY §3.10)."""
    cycles = _floor(record.free_elems, figures)
    if opcode_name(record) == "activation_reduce" or record.attrs.get("reduce_res", False):
        cycles += figures.acc_readout_cycles
    return cycles


def reduce_readout_cycles(record: InstructionRecord, figures: Figures) -> float:
    """``tensor_scalar_reduce``: ``max(MIN_II, N) + MIN_II`` (LEGACY §3.19)."""
    return _floor(record.free_elems, figures) + figures.min_ii_cycles


def reciprocal_cycles(record: InstructionRecord, figures: Figures) -> float:
    """``reciprocal``: ``max(MIN_II, 8N)`` on VectorE, ``max(MIN_II, N)`` elsewhere (SHARED/LEGACY §3.20)."""
    factor = 8 if record.engine is Engine.VECTOR else 1
    return _floor(factor * record.free_elems, figures)


def tensor_reduce_cycles(record: InstructionRecord, figures: Figures) -> float:
    """``tensor_reduce``: ``N/2`` for bf16 in/out with add or max, else ``N`` (LEGACY §3.16)."""
    n = record.free_elems
    fast = bool(record.dtypes) and all(d == "bfloat16" for d in record.dtypes) and _ops(record) <= {"add", "maximum"}
    return _floor(n / 2 if fast else n, figures)


def memset_cycles(record: InstructionRecord, figures: Figures) -> float:
    """``memset``: ``N/2`` for zero into bf16/fp16, else ``N`` (LEGACY §3.11)."""
    n = record.free_elems
    fast = record.attrs.get("value", None) == 0 and _all_two_byte(record)
    return _floor(n / 2 if fast else n, figures)


def predicated_copy_cycles(record: InstructionRecord, figures: Figures) -> float:
    """``tensor_copy_predicated``: ``N`` if an input is in PSUM, else ``2N`` (LEGACY §3.15)."""
    n = record.free_elems
    return _floor(n if _reads_psum(record) else 2 * n, figures)


def gpsimd_pattern_cycles(record: InstructionRecord, figures: Figures) -> float:
    """``iota`` / ``affine_select`` (and undocumented GpSimd pattern ops): ``150 + N`` (LEGACY §3.12, §3.13)."""
    return _floor(figures.gpsimd_start_cycles + record.free_elems, figures)


def local_gather_cycles(record: InstructionRecord, figures: Figures) -> float:
    """``local_gather``: ``150 + nvi·k / C``, ``C = ((28 + 4k) / 4k) / min(4 / dtype_bytes, k)`` (LEGACY §4.5)."""
    k = int(record.attrs.get("num_elem_per_idx", 1))
    nvi = int(record.attrs.get("num_valid_indices", max(1, record.free_elems // max(1, k))))
    dtype_bytes = _itemsize(record.dtypes[0]) if record.dtypes else 4
    c = ((28 + 4 * k) / (4 * k)) / min(4 / dtype_bytes, k)
    return _floor(figures.gpsimd_start_cycles + nvi * k / c, figures)


def topk_cycles(record: InstructionRecord, figures: Figures) -> float:
    """``topk``: ``4n + K`` per partition (ISA 0.6.0 §4.5)."""
    n = int(record.attrs.get("n", record.free_elems))
    k = int(record.attrs.get("k", 8))
    return _floor(4 * n + k, figures)


def exponential_cycles(record: InstructionRecord, figures: Figures) -> float:
    """``exponential`` (v4 VectorE): ``max(MIN_II, N)`` divided by the 4× VectorE exp speed-up (TRN3 §4.2)."""
    return _floor(record.free_elems / figures.vector_exponential_speedup, figures)


def _scaled(factor: float) -> Callable[[InstructionRecord, Figures], float]:
    def cycles(record: InstructionRecord, figures: Figures) -> float:
        return _floor(factor * record.free_elems, figures)

    cycles.__doc__ = f"``max(MIN_II, {factor:g}·N)`` engine cycles."
    return cycles


def streaming_cycles(record: InstructionRecord, figures: Figures) -> float:
    """Default for a Vector/Scalar/GpSimd instruction: ``max(MIN_II, N)`` (§4.2 streaming model)."""
    return _floor(record.free_elems, figures)


def nc_transpose_cycles(record: InstructionRecord, figures: Figures) -> float:
    """``nc_transpose``: the PE formula on TensorE, ``max(MIN_II, N)`` on VectorE (LEGACY §3.5)."""
    if record.engine is Engine.PE:
        return pe_transpose_cycles(record, figures)
    return streaming_cycles(record, figures)


COMPUTE_CYCLES: dict[str, Callable[[InstructionRecord, Figures], float]] = {
    "nc_matmul": matmul_cycles,
    "nc_transpose": nc_transpose_cycles,
    "activation": activation_cycles,
    "activation_reduce": activation_cycles,
    "activate2": activation_cycles,
    "tensor_scalar": copy_like_cycles,
    "tensor_copy": copy_like_cycles,
    "tensor_tensor": tensor_tensor_cycles,
    "scalar_tensor_tensor": scalar_tensor_tensor_cycles,
    "tensor_tensor_scan": _scaled(2),  # LEGACY §3.17
    "tensor_reduce": tensor_reduce_cycles,
    "tensor_scalar_reduce": reduce_readout_cycles,
    "tensor_scalar_cumulative": streaming_cycles,  # undocumented; one input stream like tensor_scalar (INFER)
    "tensor_copy_predicated": predicated_copy_cycles,
    "reciprocal": reciprocal_cycles,
    "bn_aggr": _scaled(13 / 3),  # LEGACY §3.20
    "memset": memset_cycles,
    "iota": gpsimd_pattern_cycles,
    "affine_select": gpsimd_pattern_cycles,
    "tensor_partition_reduce": gpsimd_pattern_cycles,  # undocumented GpSimd op: start + stream (INFER)
    "local_gather": local_gather_cycles,
    "topk": topk_cycles,
    "exponential": exponential_cycles,
}


def compute_cycles(record: InstructionRecord, figures: Figures) -> float:
    """Engine cycles of a compute instruction (PE/Vector/Scalar/GpSimd) by its family formula.

    Notes:
        Documented ``max(MIN_II, N)`` ops without an entry (range_select, bn_stats, max8, nc_stream_shuffle, …)
        and unknown opcodes fall back to :func:`streaming_cycles`; unknown PE opcodes to :func:`matmul_cycles`.
    """
    formula = COMPUTE_CYCLES.get(opcode_name(record))
    if formula is None:
        formula = matmul_cycles if record.engine is Engine.PE else streaming_cycles
    return formula(record, figures) + figures.issue_overhead_cycles.get(record.engine, 0)


# --- DMA ---------------------------------------------------------------------------------------------------------


def dma_efficiency(run_bytes: float, figures: Figures) -> float:
    """Fraction of peak DMA bandwidth for contiguous runs of ``run_bytes`` (DMA/DMABW §4.4 curve).

    Notes:
        Linear interpolation in log2(bytes) between the figure points; clamped at both ends.
    """
    points = figures.dma_efficiency_points
    if run_bytes <= points[0][0]:
        return points[0][1] * max(run_bytes, 1) / points[0][0]
    for (b0, e0), (b1, e1) in itertools.pairwise(points):
        if run_bytes <= b1:
            t = (math.log2(run_bytes) - math.log2(b0)) / (math.log2(b1) - math.log2(b0))
            return e0 + t * (e1 - e0)
    return points[-1][1]


def dma_engines_used(partitions: int, figures: Figures) -> int:
    """DMA engines serving a transfer over ``partitions`` partitions: ``min(16, ceil(P/8))`` (DMA §4.4)."""
    return max(1, min(figures.dma_engines, math.ceil(max(1, partitions) / figures.dma_partitions_per_engine)))


def dma_bandwidth(record: InstructionRecord, figures: Figures) -> float:
    """Effective bandwidth in bytes/ns of one DMA instruction (engines × BW × efficiency × transpose factor).

    Notes:
        A transpose's element-sized runs are the transpose engine's business: its efficiency is taken at the bytes
        per partition of the tile and the documented transpose factor (≤90% / ≤50% of copy BW) applied on top.
    """
    partitions = max(1, record.partitions)
    transpose = record.attrs.get("transpose", opcode_name(record) == "dma_transpose")
    run = record.nbytes / partitions if transpose else float(record.attrs.get("contiguous_bytes", 0) or 0)
    run = run or record.nbytes / partitions
    bandwidth = dma_engines_used(partitions, figures) * figures.dma_bw_per_engine * dma_efficiency(run, figures)
    if transpose:
        from_hbm = record.attrs.get("src", "hbm") == "hbm"
        bandwidth *= figures.dma_transpose_hbm_factor if from_hbm else figures.dma_transpose_sbuf_factor
    return bandwidth


def dma_times(record: InstructionRecord, figures: Figures) -> tuple[float, float]:
    """Fixed latency and transfer time (ns) of a DMA instruction (INFER formula of DMA §4.4).

    Returns:
        ``(latency_ns, transfer_ns)``: ``T_fixed`` (+0.6 µs with ``dge_mode="hwdge"``) and
        ``bytes / (min(16, ceil(P/8)) · BW_engine · eff(run))``.
    """
    latency = figures.dma_fixed_latency_ns
    if str(record.attrs.get("dge_mode", "unknown")).rsplit(".", 1)[-1] == "hwdge":
        latency += figures.dma_hwdge_extra_ns
    return latency, record.nbytes / dma_bandwidth(record, figures)


def duration_ns(record: InstructionRecord, figures: Figures) -> float:
    """Duration in ns of one instruction on its engine.

    Args:
        record: the executed instruction.
        figures: hardware figures of the target generation.

    Returns:
        Compute: formula cycles / engine clock. DMA: fixed latency + transfer time (the scheduler overlaps the
        latency of back-to-back transfers on a queue; see ``scheduler``).
    """
    if record.engine is Engine.DMA:
        latency, transfer = dma_times(record, figures)
        return latency + transfer
    return figures.cycles_to_ns(compute_cycles(record, figures), record.engine)
