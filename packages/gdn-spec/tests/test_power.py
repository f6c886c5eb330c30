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

from mutants import DECLARED_HEAD_DIMS, DECLARED_LIMITS, FLAWS

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


@pytest.fixture(scope="module")
def correct_whole_suite(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One whole-suite run of the mutants' correct base (declaring no head-dim limit), shared by the tests below."""
    return check("mutants:CORRECT", (), "", tmp_path_factory.mktemp("correct"))


def test_correct_base_passes_the_whole_suite(correct_whole_suite: dict) -> None:
    result = correct_whole_suite
    assert result["code"] == 0, result["output"]
    # Declaring no head-dim limit, every fixed-shape test runs at exactly the sizes it names (nothing substituted).
    assert result["summary"]["substituted"] == {}, result["summary"]["substituted"]


def _test_name(nodeid: str) -> str:
    """``test_module.py::test_name[params]`` of a test id, whatever directory pytest prefixed it with."""
    return nodeid.rsplit("/", 1)[-1]


# Per head-dim-limited kernel: the tests it skips that the correct base runs. Only the rejection of a transposed
# state needs Dk ≠ Dv, which a square-only kernel has no pair for; everything else runs at its nearest pair.
HEAD_DIM_SKIPS = {
    "square_heads_declared": {"test_rejection.py::test_rejects_invalid_call[schur-recurrent_state.shape]"},
    "head_dims_declared": set(),
}


@pytest.mark.parametrize("name", list(DECLARED_HEAD_DIMS))
def test_declared_head_dims_pass_the_whole_suite(name: str, correct_whole_suite: dict, tmp_path: Path) -> None:
    """The same head-dim-limited kernels that fail undeclared (FLAWS: *_undeclared) pass once they declare the
    limit: numerics is drawn inside it, and the fixed-shape tests run at the nearest supported head dims — every
    one the correct base runs, but for a test whose point needs a shape outside the limit (skipped naming the
    capability). Before, a fixed shape outside the limit was skipped: 59 run / 191 skipped for equal_head_dims."""
    result = check(f"mutants:{name}", (), "", tmp_path)
    assert result["code"] == 0, result["output"]
    summary, correct = result["summary"], correct_whole_suite["summary"]
    assert summary["areas"]["numerics"].get("passed", 0) > 0, result["output"]

    def skipped(s: dict) -> set[str]:
        return {_test_name(t) for t, outcome in s["outcomes"].items() if outcome == "skipped"}

    assert skipped(summary) - skipped(correct) == HEAD_DIM_SKIPS[name], result["output"]
    field = "equal_head_dims" if name.startswith("square") else "head_dims"
    # Those skips, and only those, give a head-dim capability as the reason — the one this kernel declares.
    named = {reason: n for reason, n in summary["skip_reasons"].items() if "head_dim" in reason}
    assert sum(named.values()) == len(HEAD_DIM_SKIPS[name]), summary["skip_reasons"]
    assert all(field in reason for reason in named), named
    # Most fixed-shape tests ran at other sizes than they name, each noted with the capability that moved them.
    substituted = summary["substituted"]
    assert sum(substituted.values()) > 100 and all(field in note for note in substituted), substituted


# Per size-limited kernel: tests above its declared limits that cannot be brought within them — for their S, or
# for the several lanes that are their point — each skipped naming the limit (some called such kernels above their
# limits before every call site checked them).
LIMIT_SKIPS = {
    "limited_seq200_lanes2": {
        "test_divisibility.py::test_sequence_length[schur-S256-accept]",
        "test_rejection.py::test_rejects_invalid_call[schur-heads.gqa_divisible]",
    },
    "limited_seq100_lanes1": {
        "test_divisibility.py::test_sequence_length[schur-S128-accept]",
        "test_independence.py::test_value_heads_are_independent[neumann-float32-0]",
        "test_aliasing.py::test_returned_state_is_the_supplied_object[float32-schur]",
        "test_numerics.py::test_matches_oracle[schur-float32-random]",
    },
    "limited_lanes1": {
        "test_independence.py::test_batch_items_are_independent[schur-float32]",
        "test_independence.py::test_value_heads_are_independent[neumann-float32-0]",
        "test_head_mapping.py::test_gqa_equals_repeated_key_heads[float32-Hk2-Hv4-schur]",
        "test_neumann.py::test_rejects_head_sharing[float32-neumann]",
        "test_rejection.py::test_rejects_invalid_call[schur-heads.gqa_divisible]",
        "test_rejection.py::test_rejects_invalid_call[neumann-neumann.no_gqa]",
    },
}

# Per size-limited kernel: tests whose lanes are incidental, which used to be skipped above max_lanes and now pass
# at fewer lanes (B, then the heads), the substitution noted on their report.
FEWER_LANES = {
    "limited_seq200_lanes2": {
        "test_neumann.py::test_accepts_equal_heads_without_state[float32-neumann]",
    },
    "limited_seq100_lanes1": {
        "test_mask_pack.py::test_neumann_needs_no_pack[float32-neumann]",
        "test_rejection.py::test_rejects_an_empty_launch[schur-tokens]",
        "test_rejection.py::test_rejects_invalid_call[neumann-seq.divisible]",
    },
    "limited_lanes1": {
        "test_rejection.py::test_rejects_invalid_call[schur-recurrent_state.shape]",
        "test_rejection.py::test_rejects_invalid_call[neumann-neumann.no_state]",
        "test_rejection.py::test_rejects_an_empty_launch[neumann-key_heads]",
        "test_dtypes.py::test_output_dtypes[schur-bfloat16-supplied]",
        "test_mask_pack.py::test_schur_rejects_bad_pack[one-entry-changed-schur]",
        "test_aliasing.py::test_supplied_state_updated_in_place[float32-schur]",
        "test_divisibility.py::test_sequence_length[schur-S192-reject]",
        "test_chunk_boundary.py::test_one_call_equals_two[float32-C5-first3-group2-model_gates-schur]",
        "test_neumann.py::test_rejects_supplied_state[float32-random-neumann]",
        "test_determinism.py::test_bitwise_repeatable[neumann-bfloat16]",
        "test_varlen.py::test_sequences_ending_inside_a_chunk_match_the_oracle[float32-zero-start-schur]",
    },
}


@pytest.mark.parametrize("name", list(DECLARED_LIMITS))
def test_declared_size_limits_are_never_exceeded(name: str, tmp_path: Path) -> None:
    """A correct kernel declaring max_seq_len / max_lanes / max_work, refusing any call above them (in a message
    naming no argument), passes the whole suite: every call site — fixed shapes, draws, rejection cases — stays
    within the declared limits, and what cannot is skipped naming the limit, never failed. Before, the
    divisibility, independence, neumann, aliasing, mask_pack, dtypes, numerics and rejection areas called such
    kernels above their limits and reported the refusal as the kernel's failure; then they skipped every test above
    max_lanes, where most run lane by lane at fewer lanes (FEWER_LANES; the one-lane kernel ran 48 of 250, now 188)."""
    result = check(f"mutants:{name}", (), "", tmp_path)
    summary = result["summary"]
    assert result["code"] == 0 and not summary["failures"], result["output"]
    assert summary["totals"].get("passed", 0) > 0, result["output"]
    assert "LIMIT BREACHED" not in result["output"], result["output"]
    outcomes = {_test_name(t): outcome for t, outcome in summary["outcomes"].items()}
    assert {t: outcomes.get(t) for t in LIMIT_SKIPS[name]} == dict.fromkeys(LIMIT_SKIPS[name], "skipped"), outcomes
    assert {t: outcomes.get(t) for t in FEWER_LANES[name]} == dict.fromkeys(FEWER_LANES[name], "passed"), outcomes
    # Each declared limit shows up as a skip reason, naming the size, the key and its declared value; the lane
    # substitutions are listed with the tests run at them.
    caps = DECLARED_LIMITS[name].gdn_spec_capabilities
    for key in ("max_seq_len", "max_lanes"):
        if key in caps:
            reasons = summary["skip_reasons"]
            assert any(f"exceeds its declared {key}={caps[key]}" in r for r in reasons), reasons
    lanes_note = f"exceeds its declared max_lanes={caps['max_lanes']}"
    assert any(note.startswith("ran at B=") and lanes_note in note for note in summary["substituted"]), summary


def test_a_one_lane_kernel_runs_the_rejection_area(tmp_path: Path) -> None:
    """Every rule holds lane by lane, so a kernel declaring max_lanes=1 gets its rule cases built from the base
    call at one lane (B = Hk = Hv = 1): all but the two whose violation itself needs two lanes or more (Hv = 3 over
    Hk = 2; neumann with Hk = 1, Hv = 2) run. Before, the base's two lanes skipped 69 of its 71 rejection tests."""
    result = check("mutants:limited_lanes1", ("rejection",), "", tmp_path)
    summary = result["summary"]
    assert result["code"] == 0 and "LIMIT BREACHED" not in result["output"], result["output"]
    counts = summary["areas"]["rejection"]
    assert counts.get("passed", 0) >= 65 and counts.get("skipped", 0) <= 2, counts
    skipped = {_test_name(t) for t, outcome in summary["outcomes"].items() if outcome == "skipped"}
    assert skipped == {
        "test_rejection.py::test_rejects_invalid_call[schur-heads.gqa_divisible]",
        "test_rejection.py::test_rejects_invalid_call[neumann-neumann.no_gqa]",
    }, summary["skip_reasons"]


def test_a_failure_at_substituted_head_dims_names_the_sizes_that_ran(tmp_path: Path) -> None:
    """A square-only kernel keeping the state as [Dv, Dk] fails the aliasing area at Dk = Dv = 16 (it was skipped
    there, at Dk = 32, Dv = 16): each failure message starts with the sizes run, the sizes the test names and the
    capability, so the report does not place the failure at a shape the kernel never ran. (Only the transposed
    values can be caught at Dk == Dv; a Dk/Dv size mix-up is invisible there, and harmless to such a kernel.)"""
    result = check("mutants:state_layout_vk", ("aliasing",), "", tmp_path)
    failures = result["summary"]["failures"]
    assert result["code"] != 0 and failures, result["output"]
    prefix = "[ran at Dk=16, Dv=16 instead of Dk=32, Dv=16: mutant:state_layout_vk: Dk=32 != Dv=16, and it declares "
    assert all(message.startswith(prefix + "equal_head_dims=True] ") for message in failures.values()), failures


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
