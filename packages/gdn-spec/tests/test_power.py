"""The suite's power: every deliberately broken implementation fails it in the expected area, and the correct
ones (the mutants' unbroken base and gdn-ref's gdn_cte) pass the same quick runs.

Each run is a subprocess of ``gdn-spec check`` with the ``quick`` Hypothesis profile, restricted to the
expected area (and a -k filter for numerics) so the whole file stays well under a minute on 2 cores.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mutants import DECLARED_HEAD_DIMS, FLAWS

HERE = Path(__file__).parent


def check(
    spec: str,
    areas: tuple[str, ...] = (),
    keyword: str = "",
    tmp_path: Path | None = None,
    extra: tuple = (),
    cwd: Path | None = None,
) -> dict:
    """Run ``gdn-spec check`` in a subprocess (``extra``: more CLI arguments; ``cwd``: where it runs, default
    pytest's); return exit code, JSON, output."""
    out = (tmp_path or HERE) / f"summary-{spec.replace(':', '-')}.json"
    cmd = [sys.executable, "-m", "gdn_spec.cli", "check", spec, "--hypothesis", "quick", "--json", str(out)]
    for area in areas:
        cmd += ["--area", area]
    if keyword:
        cmd += ["-k", keyword]
    cmd += list(extra)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    env.pop("PYTEST_XDIST_WORKER", None)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False, cwd=cwd)
    summary = json.loads(out.read_text()) if out.exists() else {}
    return {"code": proc.returncode, "summary": summary, "output": proc.stdout[-3000:] + proc.stderr[-3000:]}


@pytest.mark.parametrize("name", list(FLAWS))
def test_mutant_is_caught(name: str, tmp_path: Path) -> None:
    _, areas, keyword = FLAWS[name]
    result = check(f"mutants:{name}", areas, keyword, tmp_path)
    assert result["code"] != 0, f"mutant {name} passed the suite:\n{result['output']}"
    failed_areas = {a for a, counts in result["summary"]["areas"].items() if counts.get("failed")}
    assert failed_areas & set(areas), f"{name} failed in {failed_areas}, expected {areas}:\n{result['output']}"


# The exact runs the mutants fail, deduplicated: a correct implementation must pass every one of them.
RUNS = sorted({(areas, keyword) for _, areas, keyword in FLAWS.values()})


@pytest.mark.parametrize("spec", ["mutants:CORRECT", "gdn_ref:gdn_cte"])
@pytest.mark.parametrize(("areas", "keyword"), RUNS, ids=[f"{'+'.join(a)}[{k}]" for a, k in RUNS])
def test_correct_implementations_pass_the_same_runs(
    spec: str, areas: tuple[str, ...], keyword: str, tmp_path: Path
) -> None:
    if spec == "gdn_ref:gdn_cte" and "varlen" in areas:
        pytest.skip("gdn-ref's gdn_cte takes no cu_seqlens (the mutants' base does)")
    result = check(spec, areas, keyword, tmp_path)
    assert result["code"] == 0, result["output"]
    assert result["summary"]["totals"].get("passed", 0) > 0


def test_correct_base_passes_the_whole_suite(tmp_path: Path) -> None:
    result = check("mutants:CORRECT", (), "", tmp_path)
    assert result["code"] == 0, result["output"]


@pytest.mark.parametrize("name", list(DECLARED_HEAD_DIMS))
def test_declared_head_dims_pass_the_whole_suite(name: str, tmp_path: Path) -> None:
    """The same head-dim-limited kernels that fail undeclared (FLAWS: *_undeclared) pass once they declare the
    limit: numerics is drawn inside it, and whatever lies outside is skipped naming the capability."""
    result = check(f"mutants:{name}", (), "", tmp_path)
    assert result["code"] == 0, result["output"]
    summary = result["summary"]
    assert summary["areas"]["numerics"].get("passed", 0) > 0, result["output"]
    field = "equal_head_dims" if name.startswith("square") else "head_dims"
    assert any(field in reason for reason in summary["skip_reasons"]), summary["skip_reasons"]


@pytest.mark.parametrize(
    ("name", "failing", "fine"),
    [("varlen_leak", "output", "final state"), ("varlen_states_rolled", "final state", "output")],
)
def test_varlen_failure_names_the_sequence_and_the_quantity_that_failed(
    name: str, failing: str, fine: str, tmp_path: Path
) -> None:
    """A leak into the next packed document can be decayed out of that document's final state (rel_rms exactly 0)
    while its output is wrong: the message must lead with the sequence and the quantity out of bounds, with its
    figures against the bounds, and mention the other only as within bounds."""
    result = check(f"mutants:{name}", ("varlen",), "float32 and zero-start", tmp_path)
    failures = result["summary"]["failures"]
    assert len(failures) == 2, result["output"]  # both varlen tests
    for message in failures.values():
        assert re.search(rf"sequence 1 \(tokens \d+\.\.\d+\): {failing} out of bounds, rel_rms \S+ > tol", message), (
            message
        )
        assert f"{fine} out of bounds" not in message and f"[{fine} within bounds, rel_rms" in message, message


@pytest.mark.parametrize("spec", ["gdn_ref:gdn_cte", "mutants:CORRECT", "mutants:warns_on_huge_gates"])
def test_huge_gates_run_free_of_runtime_warnings(spec: str, tmp_path: Path) -> None:
    """Gates down to fp32's lowest: the regime, the oracle, the condition measurement, the metrics and gdn-ref's
    chunked form raise no numpy RuntimeWarning (overflow / invalid) — a warning is an error here. The kernel that
    computes an overflowing e^(−g) must fail the same run, or the check could not see a warning at all."""
    result = check(
        spec, ("numerics",), "huge_gates", tmp_path, extra=("--hypothesis", "ci", "-W", "error::RuntimeWarning")
    )
    if spec == "mutants:warns_on_huge_gates":
        assert result["code"] != 0 and "overflow encountered" in result["output"], result["output"]
        return
    assert result["code"] == 0, result["output"]
    assert result["summary"]["totals"].get("passed", 0) == 4, result["output"]  # 2 algorithms × 2 dtypes


def test_every_area_has_a_mutant() -> None:
    covered = {a for _, areas, _ in FLAWS.values() for a in areas}
    expected = {"numerics", "head_mapping", "aliasing", "rejection", "divisibility", "neumann", "dtypes", "varlen"}
    assert expected <= covered and len(FLAWS) >= 10


NO_IMPL_RUN = """
import sys, pytest
import gdn_spec.impl
gdn_spec.impl.registered = lambda: {}  # as if no kernel package had registered an entry point
sys.exit(pytest.main(["--pyargs", "gdn_spec.suite.test_dtypes", "-q", "-rs", "-p", "no:cacheprovider"]))
"""


def test_without_an_implementation_the_suite_skips_with_a_reason(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("GDN_SPEC_IMPL", "PYTEST_XDIST_WORKER")}
    proc = subprocess.run(
        [sys.executable, "-c", NO_IMPL_RUN],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no GDN implementation requested" in proc.stdout and "passed" not in proc.stdout


def test_the_registered_entry_point_is_found_without_a_flag(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("GDN_SPEC_IMPL", "PYTEST_XDIST_WORKER")}
    cmd = [sys.executable, "-m", "pytest", "--pyargs", "gdn_spec.suite.test_dtypes", "-q", "-p", "no:cacheprovider"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, check=False)
    if "several GDN implementations are registered" in proc.stdout + proc.stderr:
        assert proc.returncode != 0  # ambiguity must be an error, never a silent pick
    else:
        assert proc.returncode == 0 and "passed" in proc.stdout, proc.stdout + proc.stderr


def test_areas_are_named_when_run_outside_the_repository(tmp_path: Path) -> None:
    """A user runs ``gdn-spec check`` from their own project: pytest then ids the suite's tests by name only
    ("::test_x", no file), and every test used to land in an area called "other", counted by a bare name that two
    areas can share."""
    got = check("gdn_ref:gdn_cte", ("head_mapping", "determinism"), tmp_path=tmp_path, cwd=tmp_path)
    assert got["code"] == 0, got["output"]
    assert set(got["summary"]["areas"]) == {"head_mapping", "determinism"}, got["output"]
