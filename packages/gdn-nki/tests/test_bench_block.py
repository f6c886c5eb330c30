"""The fused decode block's benchmark: the block against its separate parts and its floors, at Qwen3-Next's shapes
in nki-cpu's Trn2 cost model (issue 43 items 3 and 8)."""

from __future__ import annotations

import pytest

from example_scripts import load_bench

pytestmark = pytest.mark.nki_cpu_only  # the bench reads nki-cpu's traces into its cost model


@pytest.fixture(scope="module")
def bench():
    return load_bench("bench_block")


@pytest.fixture(scope="module")
def row_n8(bench):
    return bench.measure(8)


def test_the_fused_block_is_below_the_sum_of_its_parts_at_n8(bench, row_n8) -> None:
    # Issue 43's target: the block at or below its parts, the four separate kernels each measured alone at the same
    # N. The stricter baseline (the in_proj and the norm at their HBM floors, the conv and the decode measured) is
    # reported, not asserted: 0.5 % over it at N = 8 since the conv alone got faster (PERFORMANCE.md, "Fused
    # decode block"); within 1 % of it is the bound kept here, so a slower block still fails.
    assert row_n8.fused_us < row_n8.separate_us
    assert row_n8.fused_us <= 1.01 * row_n8.baseline_us
    assert row_n8.baseline_us == pytest.approx(
        bench.IN_PROJ_FLOOR_US + row_n8.conv_us + row_n8.decode_us + row_n8.norm_floor_us
    )


def test_the_fused_floor_counts_the_in_proj_weights(bench, row_n8) -> None:
    weights = bench.HIDDEN * (bench.CHANNELS + bench.VALUE_HEADS * bench.HEAD_DIM + 2 * bench.VALUE_HEADS) * 2
    states = 2 * 8 * bench.VALUE_HEADS * bench.HEAD_DIM**2 * 4  # each request's state row read and written
    assert weights + states <= row_n8.fused_mib * 2**20 < 1.05 * (weights + states)
    assert weights / bench.HBM_BYTES_PER_NS / 1e3 == pytest.approx(bench.IN_PROJ_FLOOR_US, abs=0.05)
    assert row_n8.fused_us >= row_n8.fused_model_floor_us >= row_n8.hbm_floor_us  # no schedule beats its floors


def test_verification_rows_keep_every_token_state(bench) -> None:
    plain, verify = bench.measure(1), bench.measure(1, tokens=2)
    row_bytes = bench.VALUE_HEADS * bench.HEAD_DIM**2 * 4
    # [N, T] rows: the state after each token written (one more row), besides the second token's projections
    assert (verify.fused_mib - plain.fused_mib) * 2**20 >= row_bytes
    assert verify.norm_floor_us == pytest.approx(2 * plain.norm_floor_us)
    assert "| 1 | 2 |" in bench.table([verify])
