"""The kernel benchmark script runs end to end on a small plan and judges its targets from what it measured."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_kernel.py"
pytestmark = pytest.mark.nki_cpu_only  # the bench reads nki-cpu's traces into its cost model


def _load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_kernel", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return _load_bench()


def test_bench_writes_table_json_and_traces(bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    small_varlen = ["--varlen-lengths", "37", "200", "--varlen-heads", "1", "2"]
    bench.main(
        [
            "--out",
            str(tmp_path),
            "--seq-lens",
            "128",
            "2048",
            "--qwen-seq-lens",
            "--skip-accuracy",
            "--scale-lanes",
            *small_varlen,
        ]
    )
    printed = capsys.readouterr().out
    assert "| 1 lane | 2048 | schur |" in printed and "| 1 lane | 128 | neumann |" in printed
    data = json.loads((tmp_path / "bench_kernel.json").read_text())
    assert {(r["seq_len"], r["algorithm"]) for r in data["rows"]} == {
        (s, a) for s in (128, 2048) for a in ("schur", "neumann")
    }
    for row in data["rows"]:
        assert row["time_us"] > 0 and row["instructions"] > 0
        assert 0 < row["busy_share"]["pe"] <= 1
        assert row["rel_rms_out"] < 1e-2, "the benchmarked run must also be correct"
    for target in data["targets"]:
        assert target["measured"], target["name"]
        assert target["met"] == all(value >= target["threshold"] for _, value in target["measured"])
    for algorithm in ("schur", "neumann"):
        trace = json.loads((tmp_path / f"bench_kernel_trace_S2048_{algorithm}.json").read_text())
        assert trace["traceEvents"], f"empty Perfetto trace for {algorithm}"
    assert (tmp_path / "bench_kernel.md").read_text().startswith("# gdn_cte kernel")
    (varlen,) = data["varlen"]
    assert varlen["lengths"] == [37, 200] and varlen["lanes"] == 4 and varlen["padded_tokens"] == 384
    assert varlen["bit_identical"], "one launch must reproduce the separate launches exactly"
    assert varlen["time_separate_us"] == pytest.approx(sum(varlen["separate_us"]))
    assert varlen["speedup"] == pytest.approx(varlen["time_separate_us"] / varlen["time_one_launch_us"])


def test_speedup_is_neumann_time_over_schur_time(bench: ModuleType) -> None:
    rows = bench.perf_rows((128,), (), None)
    schur, neumann = (next(r for r in rows if r.algorithm == a) for a in ("schur", "neumann"))
    assert schur.speedup == pytest.approx(neumann.time_us / schur.time_us)
    assert neumann.speedup is None


def test_scale_matrix_runs_cells_within_the_budget_and_says_why_not_for_the_others(bench: ModuleType) -> None:
    cells = bench.scale_rows((1, 2), (128, 1024), max_instructions=1000, fp32_seq_lens=())
    ran = {(c.lanes, c.seq_len, c.algorithm) for c in cells if isinstance(c, bench.Row)}
    skipped = [c for c in cells if isinstance(c, bench.Skipped)]
    assert len(cells) == 2 * 2 * 2 + 1, "every cell, run or not, and the capacity corner (fp32, largest group)"
    assert ran >= {(1, 128, "schur"), (1, 128, "neumann"), (2, 128, "schur")}
    assert skipped and all(c.estimated_instructions > 1000 and "not run" in c.reason for c in skipped)
    for row in (c for c in cells if isinstance(c, bench.Row)):
        assert row.instructions <= 1000 and row.static_instructions <= row.instructions
        assert 0 < row.psum_high_water <= 16384 and 0 < row.sbuf_high_water <= 212984
    table = bench.scale_table(cells)
    assert table.count("\n") == len(cells) + 1 and "not run" in table
