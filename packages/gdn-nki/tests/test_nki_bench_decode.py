"""The decode benchmark measures one launch end to end and derives its floors from what the launch moved."""

from __future__ import annotations

from types import ModuleType

import pytest

from bench_scripts import load_bench

pytestmark = pytest.mark.nki_cpu_only  # the bench reads nki-cpu's traces into its cost model


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_bench("bench_decode")


def test_one_cell_at_qwen3_next_heads(bench) -> None:
    row = bench.measure(1, 1, keep_every_token=False)
    state_bytes = 2 * bench.VALUE_HEADS * bench.HEAD_DIM**2 * 4  # one pool row read and written
    assert state_bytes <= row.bytes_moved < 1.1 * state_bytes  # the state dominates a decode step's traffic
    assert row.hbm_floor_us == pytest.approx(row.bytes_moved / (2.9e12 / 8) * 1e6)
    assert row.makespan_us >= row.model_floor_us >= row.hbm_floor_us  # no schedule beats its floors
    assert "| 1 | 1 | [N] |" in bench.table([row])


def test_keeping_every_token_writes_every_token(bench) -> None:
    plain, kept = bench.measure(1, 2, keep_every_token=False), bench.measure(1, 2, keep_every_token=True)
    row_bytes = bench.VALUE_HEADS * bench.HEAD_DIM**2 * 4
    # one more state row written, and one more int32 index read
    assert kept.bytes_moved - plain.bytes_moved == row_bytes + 4


def test_the_launch_grid_rows_split_gdn_tkg_over_two_programs(bench) -> None:
    one, two = bench.measure_grid("gdn_tkg", 2, 1), bench.measure_grid("gdn_tkg", 2, 2)
    state_bytes = 2 * bench.VALUE_HEADS * bench.HEAD_DIM**2 * 4  # one batch row's state read and written
    # both programs together move the launch's bytes once (each its own row), and the slowest one is faster
    assert 2 * state_bytes <= two.bytes_moved < one.bytes_moved + state_bytes / 8
    assert two.makespan_us < 0.75 * one.makespan_us
    assert two.hbm_floor_us == pytest.approx(two.bytes_moved / (2 * 2.9e12 / 8) * 1e6)
    assert "| gdn_tkg | 2 | 2 |" in bench.grid_table([two])
