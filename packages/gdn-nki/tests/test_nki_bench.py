"""The kernel benchmark script runs end to end on a small plan and judges its targets from what it measured."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from bench_scripts import load_bench
from gdn_spec.metrics import TOLERANCES

# The modules that issue a stage's instructions (the bench looks through the helpers to the line that called them)
KERNEL_STAGE_FILES = frozenset(
    {"lanes.py", "constant_tiles.py", "chunks.py", "hbm.py", "operands.py", "schur.py", "neumann.py", "transition.py",
     "state.py", "products.py", "chain.py", "output.py"}
)  # fmt: skip
pytestmark = pytest.mark.nki_cpu_only  # the bench reads nki-cpu's traces into its cost model


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_bench("bench_kernel")


def test_bench_writes_table_json_and_traces(bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    small_varlen = ["--varlen-lengths", "37", "200", "--varlen-heads", "1", "2", "--short-prompts", "50", "50", "50"]
    small_checkpoints = ["--checkpoint-seq-len", "512", "--checkpoint-every", "256", "--checkpoint-heads", "1", "1"]
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
            "--one-lane-fp32-seq-lens",
            "2048",
            "--long-error-seq-len",
            "256",
            *small_varlen,
            *small_checkpoints,
        ]
    )
    printed = capsys.readouterr().out
    assert "| 1 lane | 2048 | schur | bf16 |" in printed and "| 1 lane | 128 | neumann | bf16 |" in printed
    data = json.loads((tmp_path / "bench_kernel.json").read_text())
    assert {(r["seq_len"], r["algorithm"], r["dtype"]) for r in data["rows"]} == {
        *((s, a, "bfloat16") for s in (128, 2048) for a in ("schur", "neumann")),
        *((2048, a, "float32") for a in ("schur", "neumann")),
    }
    for row in data["rows"]:
        assert row["time_us"] > 0 and row["instructions"] > 0
        assert 0 < row["busy_share"]["pe"] <= 1
        for output in ("out", "state"):  # the benchmarked run must also be correct, at its dtype's bound
            bound = TOLERANCES[row["dtype"]][output].rel_rms  # the random regime's condition widens nothing
            assert row[f"rel_rms_{output}"] <= bound, (row["seq_len"], row["algorithm"], row["dtype"], output)
        assert row["pe_us_per_chunk"] == pytest.approx(row["pe_busy_us"] / row["chunks"])
        assert row["pe_busy_us"] == pytest.approx(row["busy_share"]["pe"] * row["time_us"])
        assert 0 < row["dependency_bound_us"] <= row["time_us"], "a lower bound on the makespan"
        # ... and on the makespan of any order of the same instructions, the compiler's included
        assert row["dependency_bound_us"] <= row["compiler_order_us"]
        # the floor is at least the dependency bound and at most every order's makespan
        assert row["dependency_bound_us"] <= row["floor_us"] <= min(row["time_us"], row["compiler_order_us"])
        assert row["floor_binding"] in {"dependencies", "pe", "vector", "scalar", "gpsimd", "dma"}
        assert 0 < row["compiler_order_pe_share"] <= 1
        if row["seq_len"] == 2048:
            # the critical path's charges sum to the makespan
            assert sum(step["us"] for step in row["critical_path"]) == pytest.approx(row["time_us"])
            assert {step["cause"] for step in row["critical_path"]} <= {
                "data",
                "queue",
                "start",
            }  # the PE breakdown adds up to at least the PE time per chunk (more when
            # matmuls on disjoint PE tiles overlap: the PE time counts them once, the breakdown each)
            assert sum(kind["us_per_chunk"] for kind in row["pe_kinds"]) >= row["pe_us_per_chunk"] - 1e-6
            assert sum(kind["share"] for kind in row["pe_kinds"]) == pytest.approx(1.0)
            assert all(k["instruction_us_per_chunk"] >= k["us_per_chunk"] * (1 - 1e-9) for k in row["pe_kinds"])
            # the per-line breakdown: PE lines add up to the PE time, every line is a kernel line, not a helper's
            pe_lines = [e for e in row["sites"] if e["engine"] == "pe"]
            assert sum(e["us_per_chunk"] for e in pe_lines) == pytest.approx(row["pe_us_per_chunk"])
            assert all(e["site"].split(":")[0] in KERNEL_STAGE_FILES for e in row["sites"])
        else:
            assert row["pe_kinds"] == [] and row["critical_path"] == [] and row["sites"] == []
    for target in data["targets"]:
        if not target["measured"]:  # only a target at an S this plan did not run
            assert "S = 8192" in target["name"] and not target["met"], target["name"]
            continue
        within = (
            v <= target["threshold"] if target["at_most"] else v >= target["threshold"] for _, v in target["measured"]
        )
        assert target["met"] == all(within), target["name"]
    assert sum("(issue 12)" in target["name"] for target in data["targets"]) == 3  # the PE-share target retired
    assert not any("PE busy >= 80" in target["name"] for target in data["targets"])
    bucket_targets = [target for target in data["targets"] if "(issue 32)" in target["name"]]
    assert [len(target["measured"]) for target in bucket_targets] == [2, 1], "both varlen rows, the checkpoint row"
    for stem in ("S2048_schur", "S2048_neumann", "S2048_schur_fp32", "S2048_neumann_fp32"):
        trace = json.loads((tmp_path / f"bench_kernel_trace_{stem}.json").read_text())
        assert trace["traceEvents"], f"empty Perfetto trace for {stem}"
        if importlib.util.find_spec("matplotlib") is not None:
            png = (tmp_path / f"bench_kernel_timeline_{stem}.png").read_bytes()
            assert png.startswith(b"\x89PNG"), f"no PNG timeline for {stem}"
    long_errors = data["long_errors"]
    assert {(e["dtype"], e["regime"], e["output"]) for e in long_errors} == {
        (d, r, o) for d in ("bfloat16", "float32") for r in ("zero_gate", "model_gates") for o in ("out", "state")
    }
    assert all(e["geometry"]["S"] == 256 and e["ok"] for e in long_errors)
    report = (tmp_path / "bench_kernel.md").read_text()
    assert report.startswith("# gdn_cte kernel") and "## What the makespan waits on" in report
    varlen, short = data["varlen"]
    assert short["lengths"] == [50, 50, 50] and short["bucket"] == [1024, 4]
    assert varlen["bucket_bit_identical"] and short["bucket_bit_identical"], "the bucketed form reproduces varlen"
    (checkpoints,) = data["checkpoints"]
    assert checkpoints["seq_len"] == 512 and checkpoints["checkpoints_exact"], "checkpoints = truncated prefills"
    assert checkpoints["checkpoint_cost"] == pytest.approx(
        checkpoints["time_checkpoints_us"] / checkpoints["time_bucket_us"] - 1
    )
    assert checkpoints["static_checkpoints"] > checkpoints["static_bucket"] > 0
    assert "| 3 × 50 | 1/2 |" in printed
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


def test_static_growth_target_compares_the_longest_s_with_the_trace_length(bench: ModuleType) -> None:
    def cell(lanes: int, seq_len: int, static: int, dtype: str = "bfloat16") -> object:
        return bench.Row(
            layout=f"{lanes} lanes", seq_len=seq_len, algorithm="schur", heads=f"{lanes}/{lanes}", lanes=lanes,
            instructions=static, time_us=1.0, tokens_per_s=1.0, busy_share={}, rel_rms_out=0.0, rel_rms_state=0.0,
            interpret_s=0.0, cost_target="trn2", static_instructions=static, dtype=dtype,
        )  # fmt: skip

    base = bench.TRACE_SEQ_LEN
    flat = bench.static_growth_target([cell(8, base, 1000), cell(8, 4 * base, 1040), cell(8, 128, 90)])
    assert flat.measured == [("8 lanes schur", pytest.approx(1.04))] and flat.met
    grown = bench.static_growth_target([cell(8, base, 1000), cell(8, 4 * base, 4000), cell(8, 4 * base, 1, "float32")])
    assert grown.measured == [("8 lanes schur", pytest.approx(4.0))] and not grown.met
    assert not bench.static_growth_target([cell(8, 4 * base, 4000)]).met, "no base cell: nothing measured, not met"
