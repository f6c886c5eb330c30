"""Hardware figures per NeuronCore generation: the one table the cost model reads.

Every constant cites its source tag from ``docs/nki-sources.md`` (§0 lists the tags): ARCH, TRN2, TRN3, HW, DMA,
DMABW, DGE, PERF, SHARED, ISA, LEGACY. "KU n" refers to item n of the document's *Known unknowns* (§6); where a
figure is one of them, the comment says which value was chosen and why. "INFER" marks a value derived from the
documented ones rather than stated. One constant is fitted to a published timing: ``LOOP_BARRIER_NS``, to the
one measurement AWS publishes of a compiled loop's barrier (``cost.loop_fit``); no other was fitted to anything.

Dimensions:
    Clocks in GHz (= cycles per ns), bandwidths in bytes per ns, latencies in ns or in engine cycles as named,
    memory sizes in bytes (per partition unless named ``*_total``).
"""

from __future__ import annotations

from dataclasses import dataclass

from nki_cpu.cost.record import Engine

KIB = 1024
MIB = 1024 * KIB

# DMA efficiency versus contiguous bytes per descriptor (DMA/DMABW, §4.4): "<256 B severely overhead-bound;
# 256 B–2 KiB improving; ≥2 KiB near peak; ≥4 KiB saturates". The doc gives the shape, not numbers: the points
# below are our reading of it (INFER), interpolated linearly in log2(bytes) and shared by all generations.
DMA_EFFICIENCY_POINTS: tuple[tuple[int, float], ...] = (
    (32, 0.05),
    (64, 0.10),
    (128, 0.20),
    (256, 0.40),  # "severely overhead-bound" below this point
    (512, 0.60),
    (1024, 0.75),
    (2048, 0.90),  # "near peak"
    (4096, 1.00),  # "saturates"
)
# DMA queues the cost model spreads DMA instructions over (round-robin in program order): DMA §4.4 "16 queues per
# engine (in-order within a queue)"; a transfer's descriptors sit in one queue on each engine it uses, so a
# kernel has at most 16 independent in-order DMA streams (INFER; the compiler's real assignment is not documented).
DMA_QUEUES = 16  # DMA §4.4 "16 queues per engine"
# A compiled loop's drain and barrier (LOOPS §4.7: "ends every iteration ... with a drain and a barrier across all
# engines"): its fixed cost beyond waiting for every engine to finish. Fitted (``cost.loop_fit``) to the page's one
# measurement (trn1, NKI 0.6.0: 17.9 µs per fori_loop iteration, 10.2 µs per tile at four tiles an iteration):
# 3.97 µs brings both within 0.1 % (each alone: 3.98 / 3.94 µs). Plausible range 0 – 10.4 µs (the drain alone;
# the page's whole fori_loop − unrolled difference). KU 25: the same ns on every generation (no Trn2/Trn3 figure).
LOOP_BARRIER_NS = 3970.0  # LOOPS §4.7, fitted (cost.loop_fit; KU 25)


@dataclass(frozen=True)
class Figures:
    """Hardware figures of one NeuronCore generation.

    Notes:
        Instances are immutable; derive variants with ``dataclasses.replace`` (tests do this to switch off
        latencies). Clocks are per engine; cycles from the per-instruction formulas are converted with the clock of
        the engine that executes the instruction.
    """

    name: str
    nc_version: int
    clock_ghz: dict[Engine, float]
    min_ii_cycles: int
    mm_init_latency_cycles: int
    pe_fp32_factor: int
    pe_fp32_onezero_factor: int
    pe_fp32_transpose_factor: int
    pe_transpose_speedup: float
    gpsimd_start_cycles: int
    acc_readout_cycles: int
    issue_overhead_cycles: dict[Engine, int]
    dependency_latency_cycles: dict[Engine, int]
    vector_perf_modes: bool
    vector_exponential_speedup: float
    scalar_2byte_speedup: float
    dma_engines: int
    dma_partitions_per_engine: int
    dma_bw_per_engine: float
    dma_fixed_latency_ns: float
    dma_hwdge_extra_ns: float
    dma_transpose_hbm_factor: float
    dma_transpose_sbuf_factor: float
    sbuf_bytes_per_partition: int
    psum_bytes_per_partition: int
    dma_efficiency_points: tuple[tuple[int, float], ...] = DMA_EFFICIENCY_POINTS
    dma_queues: int = DMA_QUEUES  # DMA §4.4; queues DMA instructions are assigned to round-robin (scheduler)
    partitions: int = 128  # ARCH §4.1 PE array 128×128, 128 SBUF partitions
    # Smallest PE tile of nc_matmul's tiling mode (matmuls on disjoint tiles may overlap in time).
    pe_tile_quantum: int = 32  # ISA §3.3 "Tiling mode" v2.33.0: 4×32 row/column tiles from NeuronCore-v3
    # Fixed cost of a compiled loop's drain and barrier across all engines, after the last instruction before it
    # ended (scheduler, "Compiled loops"); LOOPS §4.7, fitted (LOOP_BARRIER_NS).
    loop_barrier_ns: float = LOOP_BARRIER_NS

    def clock(self, engine: Engine) -> float:
        """Return the clock of ``engine`` in GHz (cycles per ns); DMA has none and returns 1.0."""
        return self.clock_ghz.get(engine, 1.0)

    def cycles_to_ns(self, cycles: float, engine: Engine) -> float:
        """Convert ``cycles`` of ``engine`` to nanoseconds."""
        return cycles / self.clock(engine)


# Engine-independent choices for the NC-v2-era figures that newer docs no longer publish (KU 10). We keep the
# LEGACY values on every generation, in cycles of the executing engine, because no newer number exists; the
# faster Trn2/Trn3 paths enter only through the documented perf modes.
LEGACY_MIN_II = 64  # LEGACY §4.2/§4.5 "MIN_II ≈ 64 engine cycles" (KU 10: kept for Trn2/Trn3)
LEGACY_MM_INIT_LATENCY = 64  # PERF/LEGACY §4.2 "MM_INIT_LATENCY=64", also the 64 in the nc_matmul formula (KU 10)
LEGACY_GPSIMD_START = 150  # LEGACY §3.12/§4.5 "150 + N" for iota/affine_select (KU 10: kept)
LEGACY_ACC_READOUT = 64  # LEGACY §3.10 "+~MIN_II (≈64 cycles, ActReadAccumulator)"
# Dependent-instruction latency: PERF measured dependent 1-element ScalarE instructions every ~264 cycles on v2,
# whereas the throughput formula gives MIN_II = 64 for them; the 200-cycle difference is the producer→consumer
# latency (semaphore + pipeline drain) we charge to every dependency (INFER from PERF; KU 10 "fixed instruction
# overhead": chosen as a dependency latency, not as engine occupancy, because the LEGACY formulas are
# back-to-back initiation intervals that already include issue).
LEGACY_DEPENDENCY_LATENCY = 264 - LEGACY_MIN_II  # PERF (see above)
# No documented extra occupancy per instruction beyond MIN_II (the LEGACY formulas are IIs): zero everywhere.
NO_ISSUE_OVERHEAD = dict.fromkeys(Engine, 0)  # LEGACY §4.5 formulas are initiation intervals (KU 10)
COMPUTE_DEPENDENCY_LATENCY = {
    Engine.PE: LEGACY_MM_INIT_LATENCY,  # INFER: a matmul result is visible after the PE pipeline fill (PERF)
    Engine.VECTOR: LEGACY_DEPENDENCY_LATENCY,
    Engine.SCALAR: LEGACY_DEPENDENCY_LATENCY,
    Engine.GPSIMD: LEGACY_DEPENDENCY_LATENCY,
    Engine.DMA: 0,  # the DMA semaphore latency is part of dma_fixed_latency_ns
}
DMA_FIXED_LATENCY_NS = 1300.0  # DMABW §4.4 "~1300 ns descriptor/semaphore-to-start"; low end of "1.3–2 µs"
DMA_HWDGE_EXTRA_NS = 600.0  # TRN2/DGE §4.4 "HWDGE ≈600 ns per DMA instruction", "+0.6 µs (hwdge)"
DMA_TRANSPOSE_HBM = 0.9  # TRN2 §3.2/§4.4 "HBM→SBUF ≤90% of copy BW"
DMA_TRANSPOSE_SBUF = 0.5  # TRN2 §3.2/§4.4 "SBUF→SBUF ≤50%"
PSUM_PER_PARTITION = 16 * KIB  # ARCH/TRN2/TRN3/MIG §4.1 "128 × 16 KiB = 8 banks × 2 KiB", all generations

TRN1 = Figures(
    name="trn1",
    pe_tile_quantum=64,  # ISA §3.3 tiling mode: 2×64 row/column tiles on NeuronCore-v2 (4×32 from v3)
    nc_version=2,  # ISA §1.2 nc_version.gen2
    clock_ghz={
        Engine.PE: 2.8,  # ARCH §4.1 TensorE clock
        Engine.VECTOR: 1.12,  # ARCH §4.1 VectorE clock
        Engine.SCALAR: 1.4,  # ARCH §4.1 ScalarE clock
        Engine.GPSIMD: 1.4,  # ARCH §4.1 GpSimdE clock
    },
    min_ii_cycles=LEGACY_MIN_II,
    mm_init_latency_cycles=LEGACY_MM_INIT_LATENCY,
    pe_fp32_factor=4,  # LEGACY §3.3 "×4 if fp32"
    pe_fp32_onezero_factor=2,  # ISA §3.3 is_*_onezero "up to 2× faster fp32 matmul" ⇒ 4/2
    pe_fp32_transpose_factor=4,  # ARCH: v2 has no transpose mode, an fp32 PE transpose is an fp32 matmul
    pe_transpose_speedup=1.0,  # TRN3 §4.2: background transpose is new in Trn3
    gpsimd_start_cycles=LEGACY_GPSIMD_START,
    acc_readout_cycles=LEGACY_ACC_READOUT,
    issue_overhead_cycles=NO_ISSUE_OVERHEAD,
    dependency_latency_cycles=COMPUTE_DEPENDENCY_LATENCY,
    vector_perf_modes=False,  # ARCH: the perf modes are a Trn2 (v3) feature (§4.2)
    vector_exponential_speedup=1.0,  # ISA §3.20: exponential is v4 only
    scalar_2byte_speedup=1.0,  # TRN3 §4.2: the ScalarE 2× mode is a Trn3 feature
    dma_engines=16,  # DMA §4.1 "16 DMA engines / NC"
    dma_partitions_per_engine=8,  # DMA §4.4 "each engine typically serves 8 partitions (128/16)"
    dma_bw_per_engine=17.0,  # DMA §4.1 bandwidth guide, 17 B/ns (KU 11: newest table, treated as peak)
    dma_fixed_latency_ns=DMA_FIXED_LATENCY_NS,
    dma_hwdge_extra_ns=DMA_HWDGE_EXTRA_NS,  # v2 has no HW DGE; kept so a record asking for it is not free
    dma_transpose_hbm_factor=DMA_TRANSPOSE_HBM,
    dma_transpose_sbuf_factor=DMA_TRANSPOSE_SBUF,
    sbuf_bytes_per_partition=192 * KIB,  # ARCH §4.1 "24 MiB = 128 × 192 KiB"
    psum_bytes_per_partition=PSUM_PER_PARTITION,
)

TRN2 = Figures(
    name="trn2",
    nc_version=3,  # ISA §1.2 nc_version.gen3
    clock_ghz={
        Engine.PE: 2.4,  # TRN2 §4.1 TensorE clock
        Engine.VECTOR: 0.96,  # TRN2 §4.1 VectorE clock
        Engine.SCALAR: 1.2,  # TRN2 §4.1 ScalarE clock
        Engine.GPSIMD: 1.2,  # TRN2 §4.1 GpSimdE clock
    },
    min_ii_cycles=LEGACY_MIN_II,
    mm_init_latency_cycles=LEGACY_MM_INIT_LATENCY,
    pe_fp32_factor=4,  # LEGACY §3.3 + TRN2/HW §4.1 "79 bf16 vs 20 fp32 TFLOPS" (¼ rate)
    pe_fp32_onezero_factor=2,  # ISA §3.3 is_*_onezero "up to 2× faster fp32 matmul"
    pe_fp32_transpose_factor=2,  # ISA §3.3 is_transpose (v3+) "2× faster fp32 transposes" ⇒ 4/2
    pe_transpose_speedup=1.0,  # TRN3 §4.2: background transpose is new in Trn3
    gpsimd_start_cycles=LEGACY_GPSIMD_START,
    acc_readout_cycles=LEGACY_ACC_READOUT,
    issue_overhead_cycles=NO_ISSUE_OVERHEAD,
    dependency_latency_cycles=COMPUTE_DEPENDENCY_LATENCY,
    vector_perf_modes=True,  # TRN2 §4.2 VectorE perf modes (KU 12: fp32 streams at 1 elem/partition/cycle)
    vector_exponential_speedup=1.0,  # ISA §3.20: no VectorE exponential on v3 (v4 only)
    scalar_2byte_speedup=1.0,  # TRN3 §4.2: the ScalarE 2× bf16/fp16 mode is documented for Trn3 only
    dma_engines=16,  # DMA §4.1
    dma_partitions_per_engine=8,  # DMA §4.4
    dma_bw_per_engine=23.0,  # DMA §4.1 bandwidth guide 23 B/ns (KU 11: newest table, treated as peak)
    dma_fixed_latency_ns=DMA_FIXED_LATENCY_NS,
    dma_hwdge_extra_ns=DMA_HWDGE_EXTRA_NS,
    dma_transpose_hbm_factor=DMA_TRANSPOSE_HBM,
    dma_transpose_sbuf_factor=DMA_TRANSPOSE_SBUF,
    sbuf_bytes_per_partition=224 * KIB,  # TRN2 §4.1 "28 MiB = 128 × 224 KiB"
    psum_bytes_per_partition=PSUM_PER_PARTITION,
)

TRN3 = Figures(
    name="trn3",
    nc_version=4,  # ISA §1.2 nc_version.gen4
    clock_ghz={
        Engine.PE: 2.4,  # TRN3 §4.1 TensorE clock
        Engine.VECTOR: 1.2,  # TRN3 §4.1 VectorE clock
        Engine.SCALAR: 1.2,  # TRN3 §4.1 ScalarE clock
        Engine.GPSIMD: 1.2,  # TRN3 §4.1 GpSimdE clock
    },
    min_ii_cycles=LEGACY_MIN_II,
    mm_init_latency_cycles=LEGACY_MM_INIT_LATENCY,
    pe_fp32_factor=4,  # TRN3/HW §4.1 "79 bf16 vs 20 fp32 TFLOPS" (¼ rate)
    pe_fp32_onezero_factor=2,  # ISA §3.3
    pe_fp32_transpose_factor=2,  # ISA §3.3 transpose mode (v3+)
    pe_transpose_speedup=2.0,  # TRN3 §4.2 "background transpose … ≈2× on transpose chains" (INFER: halve PE time)
    gpsimd_start_cycles=LEGACY_GPSIMD_START,
    acc_readout_cycles=LEGACY_ACC_READOUT,
    issue_overhead_cycles=NO_ISSUE_OVERHEAD,
    dependency_latency_cycles=COMPUTE_DEPENDENCY_LATENCY,
    vector_perf_modes=True,  # TRN3 §4.1 VectorE "512 bf16/fp16/fp8" as Trn2: same perf modes assumed (INFER)
    vector_exponential_speedup=4.0,  # TRN3 §4.2 "VectorE exponential 4× ScalarE exp"
    scalar_2byte_speedup=2.0,  # TRN3 §4.2 "ScalarE 2× for bf16/fp16 tensor_scalar/tensor_copy"
    dma_engines=16,  # DMA §4.1
    dma_partitions_per_engine=8,  # DMA §4.4
    dma_bw_per_engine=33.0,  # DMA §4.1 bandwidth guide 33 B/ns (KU 11)
    dma_fixed_latency_ns=DMA_FIXED_LATENCY_NS,
    dma_hwdge_extra_ns=DMA_HWDGE_EXTRA_NS,
    dma_transpose_hbm_factor=DMA_TRANSPOSE_HBM,
    dma_transpose_sbuf_factor=DMA_TRANSPOSE_SBUF,
    sbuf_bytes_per_partition=256 * KIB,  # TRN3 §4.1 "32 MiB = 128 × 256 KiB"
    psum_bytes_per_partition=PSUM_PER_PARTITION,
)

FIGURES: dict[str, Figures] = {"trn1": TRN1, "trn2": TRN2, "trn3": TRN3}
DEFAULT_TARGET = "trn2"


def get_figures(target: str = DEFAULT_TARGET) -> Figures:
    """Return the figures of a target generation.

    Args:
        target: ``"trn2"`` (default), ``"trn3"`` or ``"trn1"``; also accepts ``"gen2"``/``"gen3"``/``"gen4"``.

    Returns:
        The :class:`Figures` of that generation.

    Notes:
        Raises ``ValueError`` naming the known targets for anything else.
    """
    key = target.lower()
    key = {"gen2": "trn1", "gen3": "trn2", "gen4": "trn3"}.get(key, key)
    if key not in FIGURES:
        raise ValueError(f"unknown target {target!r}; known targets: {', '.join(sorted(FIGURES))}")
    return FIGURES[key]
