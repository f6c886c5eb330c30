"""The barrier benchmark schedules one launch at every barrier cost and marks the rows the fitted cost slows by
more than the target."""

from __future__ import annotations

from types import ModuleType

import pytest

from bench_scripts import load_bench
from nki_cpu.cost.figures import LOOP_BARRIER_NS

pytestmark = pytest.mark.nki_cpu_only  # the bench reads nki-cpu's traces into its cost model


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_bench("bench_barrier")


def test_a_looping_launch_pays_each_boundary_at_most_once(bench) -> None:
    """Decode of 20 requests (one loop iteration of 16, the rest unrolled): two boundaries, each costing at most
    the barrier on the makespan, the costs in the order of the barriers; the same launch again, the same digest."""
    name = "decode N=20 T=1, 1/1 heads"
    row = bench.measure(name, bench.SMOKE_ROWS[name])
    us = row.makespan_us
    assert row.boundaries == 2
    assert us["0"] == us["low"] < us["fitted"] < us["high"]
    assert us["fitted"] - us["0"] <= row.boundaries * LOOP_BARRIER_NS / 1e3 + 1e-6
    assert row.static_instructions < row.instructions, "no compiled loop ran"
    assert bench.measure(name, bench.SMOKE_ROWS[name]).digest == row.digest


def test_rows_over_the_target_are_marked(bench) -> None:
    times = {"0": 100.0, "low": 100.0, "fitted": 105.5, "high": 112.0}
    over = bench.Row("over", times, 2, 10, 20, "abc", 0.0)
    under = bench.Row("under", {**times, "fitted": 104.9}, 2, 10, 20, "abc", 0.0)
    lines = bench.table([over, under]).splitlines()
    assert "| over | 2 | 100.0 | 100.0 | 105.5 | 112.0 | +5.5% ! |" in lines[-2]
    assert "| under | 2 | 100.0 | 100.0 | 104.9 | 112.0 | +4.9% |" in lines[-1]
