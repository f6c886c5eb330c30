"""Per-instruction durations against hand arithmetic from docs/nki-sources.md §4.1/§4.2/§4.4/§4.5.

Every expected value is written as the documented formula with the documented clock, not taken from the code.
"""

from __future__ import annotations

import math

import pytest

from nki_cpu.cost import TRN1, TRN2, TRN3, Engine, InstructionRecord, Region, duration_ns
from nki_cpu.cost.durations import dma_efficiency, dma_times

BF16, FP32 = "bfloat16", "float32"
PE_GHZ, DVE_GHZ, ACT_GHZ, POOL_GHZ = 2.4, 0.96, 1.2, 1.2  # Trn2 clocks, §4.1
MIN_II = 64  # §4.2 / §4.5


def sbuf(sid: int = 1) -> Region:
    return Region(sid, "sbuf", (0, 128), (0, 4096))


def psum(sid: int = 2) -> Region:
    return Region(sid, "psum", (0, 128), (0, 2048))


def rec(opcode, engine, n, dtypes, *, p=128, reads=None, writes=None, nbytes=0, **attrs) -> InstructionRecord:
    return InstructionRecord(
        opcode=opcode,
        engine=engine,
        partitions=p,
        free_elems=n,
        dtypes=dtypes,
        nbytes=nbytes,
        reads=tuple(reads if reads is not None else (sbuf(1),)),
        writes=tuple(writes if writes is not None else (sbuf(3),)),
        attrs=attrs,
    )


def matmul(n_stat, n_mov, dtype=BF16, **attrs) -> InstructionRecord:
    return rec(
        "nc_matmul",
        Engine.PE,
        n_mov,
        (dtype, dtype, FP32),
        writes=(psum(),),
        stationary_free=n_stat,
        moving_free=n_mov,
        **attrs,
    )


# --- TensorE -------------------------------------------------------------------------------------------------------


def test_matmul_bf16_full_tile_is_one_moving_column_per_cycle():
    # max(min(64, 128), 512) = 512 PE cycles at 2.4 GHz
    assert duration_ns(matmul(128, 512), TRN2) == pytest.approx(512 / PE_GHZ)


def test_matmul_fp32_is_quarter_rate():
    # 4 × max(min(64, 128), 512)
    assert duration_ns(matmul(128, 512, FP32), TRN2) == pytest.approx(4 * 512 / PE_GHZ)


def test_matmul_short_moving_is_bound_by_init_latency():
    # max(min(64, 128), 16) = 64
    assert duration_ns(matmul(128, 16), TRN2) == pytest.approx(64 / PE_GHZ)


def test_matmul_short_stationary_and_moving():
    # max(min(64, 32), 16) = 32
    assert duration_ns(matmul(32, 16), TRN2) == pytest.approx(32 / PE_GHZ)


def test_matmul_fp32_onezero_hint_halves_the_fp32_penalty():
    # fp32 ×4 becomes ×2 with is_*_onezero ("up to 2× faster fp32 matmul", ISA §3.3)
    assert duration_ns(matmul(128, 512, FP32, onezero=True), TRN2) == pytest.approx(2 * 512 / PE_GHZ)


def test_matmul_tf32_runs_at_bf16_rate():
    # 79 TFLOPS for bf16/fp16/tf32 alike (§4.1)
    assert duration_ns(matmul(128, 512, "tfloat32"), TRN2) == pytest.approx(512 / PE_GHZ)


def test_pe_transpose_full_tile():
    # input 128×128 bf16: max(P=128, min(64, F=128)) = 128
    record = rec("nc_transpose", Engine.PE, 128, (BF16, BF16), nbytes=128 * 128 * 2, writes=(psum(),))
    assert duration_ns(record, TRN2) == pytest.approx(128 / PE_GHZ)


def test_pe_transpose_input_partitions_derived_from_bytes():
    # input 32×128 bf16 → dst 128×32 (record.partitions = 128, N = 128): max(32, min(64, 128)) = 64
    record = rec("nc_transpose", Engine.PE, 128, (BF16, BF16), nbytes=128 * 32 * 2, writes=(psum(),))
    assert duration_ns(record, TRN2) == pytest.approx(64 / PE_GHZ)


def test_pe_transpose_fp32_uses_transpose_mode_factor():
    # Trn2 transpose mode: fp32 "2× faster" than the ¼-rate fp32 matmul ⇒ ×2; Trn1 (no transpose mode) ×4
    record = rec("nc_transpose", Engine.PE, 128, (FP32, FP32), nbytes=128 * 128 * 4, writes=(psum(),))
    assert duration_ns(record, TRN2) == pytest.approx(2 * 128 / PE_GHZ)
    assert duration_ns(record, TRN1) == pytest.approx(4 * 128 / 2.8)


def test_vector_transpose_is_streaming():
    record = rec("nc_transpose", Engine.VECTOR, 32, (BF16, BF16), p=32)
    assert duration_ns(record, TRN2) == pytest.approx(max(MIN_II, 32) / DVE_GHZ)


# --- ScalarE / VectorE / GpSimdE -------------------------------------------------------------------------------------


def test_activation_streams_one_element_per_cycle():
    assert duration_ns(rec("activation", Engine.SCALAR, 512, (BF16, BF16)), TRN2) == pytest.approx(512 / ACT_GHZ)


def test_activation_small_is_min_ii():
    assert duration_ns(rec("activation", Engine.SCALAR, 16, (BF16, BF16)), TRN2) == pytest.approx(MIN_II / ACT_GHZ)


def test_activation_with_reduce_res_adds_readout():
    # max(MIN_II, N) + MIN_II
    record = rec("activation", Engine.SCALAR, 512, (BF16, BF16), reduce_res=True)
    assert duration_ns(record, TRN2) == pytest.approx((512 + 64) / ACT_GHZ)
    record = rec("activation_reduce", Engine.SCALAR, 512, (BF16, BF16))
    assert duration_ns(record, TRN2) == pytest.approx((512 + 64) / ACT_GHZ)


def test_trn2_vector_copy_perf_mode_4x_sbuf_bf16():
    # tensor_copy SBUF→SBUF bf16 unit stride: 4× ⇒ max(64, 512/4) = 128 cycles
    record = rec("tensor_copy", Engine.VECTOR, 512, (BF16, BF16))
    assert duration_ns(record, TRN2) == pytest.approx(128 / DVE_GHZ)


def test_trn2_vector_copy_perf_mode_2x_from_psum_or_strided():
    from_psum = rec("tensor_copy", Engine.VECTOR, 512, (BF16, BF16), reads=(psum(),))
    strided = rec("tensor_scalar", Engine.VECTOR, 512, (BF16, BF16), unit_stride=False)
    assert duration_ns(from_psum, TRN2) == pytest.approx(256 / DVE_GHZ)
    assert duration_ns(strided, TRN2) == pytest.approx(256 / DVE_GHZ)


def test_psum_fp32_eviction_to_bf16_has_no_perf_mode():
    # dtypes are not all bf16/fp16 ⇒ max(MIN_II, N)
    record = rec("tensor_copy", Engine.VECTOR, 512, (FP32, BF16), reads=(psum(),))
    assert duration_ns(record, TRN2) == pytest.approx(512 / DVE_GHZ)


def test_trn1_has_no_vector_perf_mode():
    record = rec("tensor_copy", Engine.VECTOR, 512, (BF16, BF16))
    assert duration_ns(record, TRN1) == pytest.approx(512 / 1.12)


def test_tensor_tensor_fp32_sbuf_is_two_passes():
    record = rec("tensor_tensor", Engine.VECTOR, 512, (FP32, FP32, FP32), reads=(sbuf(1), sbuf(4)))
    assert duration_ns(record, TRN2) == pytest.approx(2 * 512 / DVE_GHZ)


def test_tensor_tensor_one_psum_input_is_one_pass():
    record = rec("tensor_tensor", Engine.VECTOR, 512, (FP32, FP32, FP32), reads=(psum(), sbuf(4)))
    assert duration_ns(record, TRN2) == pytest.approx(512 / DVE_GHZ)


def test_tensor_tensor_bf16_sbuf_is_one_pass_on_trn2():
    record = rec("tensor_tensor", Engine.VECTOR, 512, (BF16, BF16, BF16), reads=(sbuf(1), sbuf(4)), op="maximum")
    assert duration_ns(record, TRN2) == pytest.approx(512 / DVE_GHZ)
    # NC-v2 grants the fast path only to add/multiply/subtract
    assert duration_ns(record, TRN1) == pytest.approx(2 * 512 / 1.12)


def test_scalar_tensor_tensor_fast_and_slow():
    fast = rec("scalar_tensor_tensor", Engine.VECTOR, 512, (BF16, BF16, BF16), op0="subtract", op1="multiply")
    slow = rec("scalar_tensor_tensor", Engine.VECTOR, 512, (FP32, FP32, FP32), op0="subtract", op1="add")
    assert duration_ns(fast, TRN2) == pytest.approx(512 / DVE_GHZ)
    assert duration_ns(slow, TRN2) == pytest.approx(2 * 512 / DVE_GHZ)


def test_reciprocal_vector_is_eight_cycles_per_element():
    assert duration_ns(rec("reciprocal", Engine.VECTOR, 512, (FP32, FP32)), TRN2) == pytest.approx(8 * 512 / DVE_GHZ)


def test_tensor_reduce_bf16_add_is_half():
    record = rec("tensor_reduce", Engine.VECTOR, 512, (BF16, BF16), op="add")
    assert duration_ns(record, TRN2) == pytest.approx(256 / DVE_GHZ)
    record = rec("tensor_reduce", Engine.VECTOR, 512, (FP32, FP32), op="add")
    assert duration_ns(record, TRN2) == pytest.approx(512 / DVE_GHZ)


def test_tensor_tensor_scan_and_scalar_reduce():
    scan = rec("tensor_tensor_scan", Engine.VECTOR, 512, (FP32, FP32, FP32))
    reduce = rec("tensor_scalar_reduce", Engine.VECTOR, 512, (FP32, FP32))
    assert duration_ns(scan, TRN2) == pytest.approx(2 * 512 / DVE_GHZ)
    assert duration_ns(reduce, TRN2) == pytest.approx((512 + 64) / DVE_GHZ)


def test_memset_zero_bf16_is_half():
    assert duration_ns(rec("memset", Engine.VECTOR, 512, (BF16,), value=0), TRN2) == pytest.approx(256 / DVE_GHZ)
    assert duration_ns(rec("memset", Engine.VECTOR, 512, (BF16,), value=1.0), TRN2) == pytest.approx(512 / DVE_GHZ)


def test_iota_and_affine_select_pay_gpsimd_start():
    # 150 + N GpSimd cycles
    assert duration_ns(rec("iota", Engine.GPSIMD, 128, ("int32",)), TRN2) == pytest.approx((150 + 128) / POOL_GHZ)
    record = rec("affine_select", Engine.GPSIMD, 512, (FP32, FP32))
    assert duration_ns(record, TRN2) == pytest.approx((150 + 512) / POOL_GHZ)


def test_bn_aggr_and_predicated_copy():
    assert duration_ns(rec("bn_aggr", Engine.VECTOR, 96, (FP32, FP32)), TRN2) == pytest.approx(13 * 96 / 3 / DVE_GHZ)
    both_sbuf = rec("tensor_copy_predicated", Engine.VECTOR, 512, (FP32, FP32), reads=(sbuf(1), sbuf(4)))
    assert duration_ns(both_sbuf, TRN2) == pytest.approx(2 * 512 / DVE_GHZ)


def test_unknown_opcode_falls_back_to_streaming():
    record = rec("nisa.some_future_op", Engine.GPSIMD, 1000, (FP32, FP32))
    assert duration_ns(record, TRN2) == pytest.approx(1000 / POOL_GHZ)


# --- Trn3 where its figures differ ------------------------------------------------------------------------------------


def test_trn3_vector_clock_is_faster():
    record = rec("tensor_tensor", Engine.VECTOR, 512, (FP32, FP32, FP32), reads=(sbuf(1), sbuf(4)))
    assert duration_ns(record, TRN3) == pytest.approx(2 * 512 / 1.2)


def test_trn3_scalar_two_byte_copy_is_2x():
    record = rec("tensor_copy", Engine.SCALAR, 512, (BF16, BF16))
    assert duration_ns(record, TRN3) == pytest.approx(256 / 1.2)
    assert duration_ns(record, TRN2) == pytest.approx(512 / ACT_GHZ)


def test_trn3_vector_exponential_is_4x():
    record = rec("exponential", Engine.VECTOR, 512, (FP32, FP32))
    assert duration_ns(record, TRN3) == pytest.approx(128 / 1.2)


def test_trn3_background_transpose_halves_pe_transpose():
    record = rec("nc_transpose", Engine.PE, 128, (BF16, BF16), nbytes=128 * 128 * 2, writes=(psum(),))
    assert duration_ns(record, TRN3) == pytest.approx(128 / 2.4 / 2)


def test_trn2_and_trn3_matmul_agree():
    # same PE clock (2.4 GHz) and rate on both
    assert duration_ns(matmul(128, 512), TRN3) == pytest.approx(duration_ns(matmul(128, 512), TRN2))


# --- DMA -----------------------------------------------------------------------------------------------------------


def dma(p, nbytes, contiguous, **attrs) -> InstructionRecord:
    return rec(
        "dma_copy",
        Engine.DMA,
        nbytes // max(1, p),
        (BF16, BF16),
        p=p,
        nbytes=nbytes,
        reads=(Region(9, "hbm", (0, 1), (0, nbytes)),),
        writes=(sbuf(3),),
        contiguous_bytes=contiguous,
        **attrs,
    )


def test_dma_full_partitions_saturated_runs():
    # 128 partitions ⇒ min(16, ceil(128/8)) = 16 engines × 23 B/ns; 4 KiB runs saturate; + 1300 ns fixed
    nbytes = 128 * 4096
    assert duration_ns(dma(128, nbytes, 4096), TRN2) == pytest.approx(1300 + nbytes / (16 * 23))


def test_dma_single_engine_matches_documented_measurement():
    # DMA §4.4: one engine moved 32 KiB HBM→SBUF in 1416 ns; our transfer term is 32768 / 23 = 1424.7 ns
    latency, transfer = dma_times(dma(8, 32 * 1024, 4096), TRN2)
    assert latency == pytest.approx(1300)
    assert transfer == pytest.approx(32 * 1024 / 23)
    assert abs(transfer - 1416) / 1416 < 0.01


def test_dma_few_partitions_use_one_engine():
    # P = 4 rows ⇒ ceil(4/8) = 1 engine
    _, transfer = dma_times(dma(4, 4 * 8192, 8192), TRN2)
    assert transfer == pytest.approx(4 * 8192 / 23)


def test_dma_transpose_bandwidth_factors():
    nbytes = 128 * 4096
    _, hbm = dma_times(dma(128, nbytes, 4096, transpose=True, src="hbm"), TRN2)
    _, on_chip = dma_times(dma(128, nbytes, 4096, transpose=True, src="sbuf"), TRN2)
    assert hbm == pytest.approx(nbytes / (16 * 23 * 0.9))
    assert on_chip == pytest.approx(nbytes / (16 * 23 * 0.5))


def test_dma_hwdge_adds_600ns():
    latency, _ = dma_times(dma(128, 128 * 4096, 4096, dge_mode="hwdge"), TRN2)
    assert latency == pytest.approx(1300 + 600)


def test_dma_trn3_bandwidth():
    nbytes = 128 * 4096
    assert duration_ns(dma(128, nbytes, 4096), TRN3) == pytest.approx(1300 + nbytes / (16 * 33))


def test_dma_efficiency_curve_shape():
    # §4.4: severely overhead-bound below 256 B, near peak from 2 KiB, saturated from 4 KiB, monotone
    sizes = [16, 64, 128, 256, 384, 512, 1024, 2048, 3000, 4096, 65536]
    effs = [dma_efficiency(b, TRN2) for b in sizes]
    assert effs == sorted(effs)
    assert dma_efficiency(128, TRN2) < 0.5
    assert dma_efficiency(2048, TRN2) >= 0.85
    assert dma_efficiency(4096, TRN2) == 1.0
    assert dma_efficiency(1 << 20, TRN2) == 1.0
    assert all(0 < e <= 1 and math.isfinite(e) for e in effs)


def test_small_runs_are_slower_than_large_runs_for_the_same_bytes():
    nbytes = 128 * 4096
    _, small_runs = dma_times(dma(128, nbytes, 64), TRN2)
    _, large_runs = dma_times(dma(128, nbytes, 4096), TRN2)
    assert small_runs > 4 * large_runs


def test_pe_transpose_in_matmul_form():
    # the interpreter records data (P=32, F=128) as stationary_free=F, moving_free=P: max(32, min(64, 128)) = 64
    record = rec(
        "nc_transpose",
        Engine.PE,
        32,
        (BF16, BF16),
        p=32,
        writes=(psum(),),
        stationary_free=128,
        moving_free=32,
        is_transpose=True,
    )
    assert duration_ns(record, TRN2) == pytest.approx(64 / PE_GHZ)


def test_dma_transpose_ignores_element_sized_runs():
    # a transpose moves element-sized runs; the doc prices it as ≤90% of the copy bandwidth of the same tile
    nbytes = 128 * 4096
    _, transfer = dma_times(dma(128, nbytes, 2, transpose=True, src="hbm"), TRN2)
    assert transfer == pytest.approx(nbytes / (16 * 23 * 0.9))
