"""``gdn-spec check``'s verdict and messages: the exit code of a run that verified nothing, what produced a report
(versions of the suite, the kernel's package and the runtime), and the fix for a kernel module in the current
directory that a console script cannot import."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from gdn_spec.cli import Summary, format_summary, main, nothing_verified
from gdn_spec.conv.checks import CHECKS as CONV_CHECKS
from gdn_spec.impl import ImplementationError, load
from gdn_spec.provenance import describe_kernel, kernel_provenance
from test_power import check


def test_a_run_whose_every_test_is_skipped_exits_5_saying_nothing_was_verified(tmp_path: Path) -> None:
    """gdn-ref's gdn_cte takes no cu_seqlens: its varlen area skips every test. That run used to exit 0, though
    the README promised non-zero "when nothing ran"; a run that verified something still exits 0."""
    skipped = check("gdn_ref:gdn_cte", ("varlen",), "", tmp_path)
    n = skipped["summary"].get("totals", {}).get("skipped", 0)  # the varlen area's size, which grows with the suite
    assert n > 0 and skipped["code"] == 5 and skipped["summary"]["totals"] == {"skipped": n}, skipped["output"]
    line = f"gdn-spec: nothing was verified: all {n} tests were skipped ({n} × gdn-ref does not declare varlen"
    assert line in skipped["output"], skipped["output"]
    deselected = check("gdn_ref:gdn_cte", ("dtypes",), "no_such_test", tmp_path)
    assert deselected["code"] == 5, deselected["output"]
    assert "nothing was verified: no test ran (all 8 were deselected" in deselected["output"], deselected["output"]
    verified = check("gdn_ref:gdn_cte", ("dtypes",), "", tmp_path)
    assert verified["code"] == 0 and "nothing was verified" not in verified["output"], verified["output"]
    # The JSON records the exit code the user saw, 5 included (it used to be written before 5 was decided).
    assert skipped["summary"]["run"]["exit_code"] == 5, skipped["summary"]["run"]
    assert skipped["summary"]["run"]["nothing_verified"].startswith(f"nothing was verified: all {n} tests were skipped")
    assert (verified["summary"]["run"]["exit_code"], verified["summary"]["run"]["nothing_verified"]) == (0, "")


def test_the_report_names_the_suite_the_kernel_its_package_and_the_runtime(tmp_path: Path) -> None:
    """A report pasted into an issue must say what produced it. Expected values come from this interpreter's
    metadata (the check subprocess runs the same executable), not from gdn-spec's own code."""
    result = check("gdn_ref:gdn_cte", ("dtypes",), "", tmp_path, extra=["--label", "oracle"])
    run = result["summary"]["run"]
    assert result["code"] == 0 and run["exit_code"] == 0, result["output"]
    gdn_ref_version = importlib.metadata.version("gdn-ref")
    assert run["kernel"] == {
        "spec": "gdn_ref:gdn_cte",
        "module": "gdn_ref",
        "package": "gdn-ref",
        "version": gdn_ref_version,
    }
    assert (run["adapter"], run["via"], run["hypothesis"]) == ("", "", "quick")
    expected = {
        "gdn-spec": importlib.metadata.version("gdn-spec"),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
    assert run["versions"] == expected  # no torch: nothing on this path imports it
    assert f"  kernel:  gdn_ref (gdn-ref {gdn_ref_version})" in result["output"], result["output"]
    runtime = f"gdn-spec {expected['gdn-spec']} on Python {expected['python']}, numpy {expected['numpy']}"
    assert f"  suite:   {runtime}" in result["output"], result["output"]
    assert "  examples: Hypothesis profile quick (2 examples per drawn test: a smoke run" in result["output"]


def test_a_plain_pytest_run_names_them_in_its_header(tmp_path: Path) -> None:
    """Run as ``pytest --pyargs gdn_spec.suite`` (no gdn-spec check summary), pytest's header says the same."""
    cmd = [sys.executable, "-m", "pytest", "--pyargs", "gdn_spec.suite.test_dtypes", "--gdn-impl", "gdn_ref:gdn_cte"]
    cmd += ["--collect-only", "-p", "no:cacheprovider", "-p", "no:randomly"]
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300, check=False)
    gdn_ref_version = importlib.metadata.version("gdn-ref")
    kernel = f"gdn-spec: kernel gdn_ref (gdn-ref {gdn_ref_version}), called directly, profile api"
    runtime = f"gdn-spec: gdn-spec {importlib.metadata.version('gdn-spec')} on Python {platform.python_version()}"
    assert kernel in proc.stdout and runtime in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_the_report_names_the_adapter_it_was_asked_for() -> None:
    run = {"profile": "math", "adapter": "fla:scale=internal", "via": "fla adapter (scale=internal), torch 2.5 cpu"}
    text = format_summary(Summary(run=run), "k")
    assert "  via:     fla adapter (scale=internal), torch 2.5 cpu (--adapter fla:scale=internal)" in text


@pytest.mark.parametrize("profile", ["api", "math"])
def test_a_decode_run_names_the_decode_contract_not_gdn_cte(profile: str) -> None:
    decode = format_summary(Summary(run={"profile": profile, "family": "decode"}), "k")
    prefill = format_summary(Summary(run={"profile": profile, "family": "prefill"}), "k")
    assert "decode" in decode.split("profile:")[1].splitlines()[0]
    assert "gdn_cte" not in decode
    assert decode.split("profile:")[1].splitlines()[0] != prefill.split("profile:")[1].splitlines()[0]


def test_a_kernel_no_installed_package_provides_is_said_so() -> None:
    """mutants.py is a file of the tests directory on PYTHONPATH: no distribution provides it."""
    kernel = kernel_provenance("mutants:CORRECT")
    assert kernel == {"spec": "mutants:CORRECT", "module": "mutants", "package": "", "version": ""}
    assert describe_kernel(kernel) == "mutants (no installed package provides it)"
    nested = kernel_provenance("gdn_spec.adapters.seqfirst:wrap_seq_first")  # a submodule: its top-level package
    assert (nested["package"], nested["version"]) == ("gdn-spec", importlib.metadata.version("gdn-spec"))


@pytest.mark.parametrize("imports_torch", [False, True])
def test_torch_is_named_only_when_the_run_imported_it(imports_torch: bool) -> None:
    """Checked in a fresh interpreter: this one may have imported torch for other tests."""
    if imports_torch:
        torch_version = pytest.importorskip("torch").__version__
    code = "import json; from gdn_spec.provenance import runtime_versions; print(json.dumps(runtime_versions()))"
    if imports_torch:
        code = "import torch; " + code
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    versions = json.loads(proc.stdout)
    assert ("torch" in versions) == imports_torch, versions
    if imports_torch:
        assert versions["torch"] == torch_version


def test_nothing_verified_means_no_pass_and_no_failure() -> None:
    def summary(*outcomes: str) -> Summary:
        reasons = Counter({"why": outcomes.count("skipped")})
        return Summary(outcomes={f"t{i}": o for i, o in enumerate(outcomes)}, skip_reasons=reasons)

    assert nothing_verified(summary("passed", "skipped")) is None
    assert nothing_verified(summary("failed", "skipped")) is None  # the failure is the verdict (exit 1)
    assert nothing_verified(summary("skipped", "skipped")) == (
        "nothing was verified: all 2 tests were skipped (2 × why; the reasons are above)"
    )
    assert nothing_verified(summary()) == "nothing was verified: no test was collected"


def test_collected_tests_that_did_not_run_are_not_called_uncollected() -> None:
    """Tests collected but not run (``--collect-only``) were reported as "no test was collected", and in the
    summary as "stopped early: -x / --maxfail"; with -k, as "all 4 were deselected" though 4 others were kept."""
    listed = Summary(collected=8, collect_only=True)
    assert nothing_verified(listed) == (
        "nothing was verified: 8 collected tests did not run (--collect-only: listed, not run)"
    )
    assert "8 collected tests did not run (--collect-only: listed, not run)" in format_summary(listed, "k")
    assert "stopped early" not in format_summary(listed, "k")
    kept = Summary(collected=4, deselected=4, collect_only=True)
    assert nothing_verified(kept) == (
        "nothing was verified: 4 collected tests did not run (--collect-only: listed, not run); 4 more were deselected"
    )
    assert nothing_verified(Summary(deselected=4)) == (
        "nothing was verified: no test ran (all 4 were deselected, see above)"
    )
    stopped = Summary(outcomes={"t0": "failed"}, collected=3)
    assert "2 collected tests did not run (stopped early: -x / --maxfail)" in format_summary(stopped, "k")


def test_collect_only_says_the_tests_were_listed_not_run(tmp_path: Path) -> None:
    result = check("gdn_ref:gdn_cte", ("dtypes",), "", tmp_path, extra=["--collect-only"])
    assert result["code"] == 5, result["output"]
    assert "gdn-spec: nothing was verified: 8 collected tests did not run (--collect-only" in result["output"]
    assert "no test was collected" not in result["output"], result["output"]


FIX = "run with PYTHONPATH=. (PYTHONPATH=. gdn-spec check {spec})"


@pytest.fixture
def console_script_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The current directory is tmp_path and, as under a console script, not on sys.path."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p and Path(p).resolve() != tmp_path.resolve()])
    return tmp_path


def test_a_module_in_the_current_directory_gets_the_pythonpath_fix(
    console_script_cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Run from the kernel's directory without PYTHONPATH, the error said only "No module named 'mykernel'"."""
    (console_script_cwd / "here_kernel.py").write_text("def gdn_cte(**call):\n    raise AssertionError\n")
    (console_script_cwd / "here_pkg").mkdir()
    for spec, found in (("here_kernel:gdn_cte", "./here_kernel.py"), ("here_pkg.kernels:gdn_cte", "./here_pkg")):
        with pytest.raises(ImplementationError) as info:
            load(spec)
        message = str(info.value)
        assert f"No module named '{spec.split('.')[0].split(':')[0]}'" in message, message
        assert f"; {found} is in the current directory, which is not on sys.path for console scripts" in message
        assert message.endswith(FIX.format(spec=spec)), message
    assert main(["check", "here_kernel:gdn_cte"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and FIX.format(spec="here_kernel:gdn_cte") in err, err


def test_no_pythonpath_fix_where_it_would_not_help(console_script_cwd: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not for a module that is not here, nor, with the current directory on sys.path, for one that is here but
    imports a missing dependency (the error names the dependency)."""
    (console_script_cwd / "elsewhere_kernel_xyz").mkdir()  # not the module's name
    with pytest.raises(ImplementationError) as info:
        load("nowhere_kernel_xyz:f")
    assert "No module named 'nowhere_kernel_xyz'" in str(info.value) and "PYTHONPATH" not in str(info.value)
    (console_script_cwd / "on_path_kernel.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(console_script_cwd))
    with pytest.raises(ImplementationError) as info:
        load("on_path_kernel:f")
    assert "no_such_dependency_xyz" in str(info.value) and "PYTHONPATH" not in str(info.value)


def test_help_says_how_to_check_a_kernel_of_the_current_directory(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["check", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "PYTHONPATH=. gdn-spec check my_kernel:gdn_cte (the current directory is not on sys.path" in out, out


def test_a_module_failing_at_import_is_one_line_and_exit_2(
    console_script_cwd: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A kernel module raising anything but ImportError at import gave a raw traceback and exit 1 (the code of a
    failed kernel): now the ImportError's one line — the module and the exception — and its exit code 2."""
    (console_script_cwd / "raising_kernel.py").write_text("raise RuntimeError('no device found')\n")
    monkeypatch.syspath_prepend(str(console_script_cwd))
    assert main(["check", "raising_kernel:gdn_cte"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "gdn-spec: cannot import 'raising_kernel' for 'raising_kernel:gdn_cte': importing it raised RuntimeError: "
        "no device found\n"
    ), err


@pytest.mark.parametrize(
    ("spec", "extra", "expected"),
    [
        ("mutants:returns_three_items", (), "gdn_cte must return (out, final_state); got a tuple of 3 items"),
        ("adapter_kernels:fla_returns_three", ("--adapter", "fla"), "returns (o, final_state); got a tuple of 3 items"),
    ],
)
def test_a_wrong_arity_return_is_reported_with_its_length(
    spec: str, extra: tuple[str, ...], expected: str, tmp_path: Path
) -> None:
    """A 3-tuple was reported as "got tuple", which reads as the right type."""
    result = check(spec, ("determinism",), "", tmp_path, extra=extra)
    failures = result["summary"]["failures"]
    assert result["code"] == 1 and failures, result["output"]
    assert all(expected in message for message in failures.values()), failures


def test_the_conv_family_writes_the_suites_summary(tmp_path: Path) -> None:
    """``gdn-spec check`` on a conv kernel (found by its declared capabilities) runs the conv family and writes the
    summary the validated table is made from: one area per form, each check a test; a planted bug fails its run."""
    decode = check("conv_kernels:oracle_decode", (), "", tmp_path, extra=["--label", "oracle conv"])
    assert decode["code"] == 0, decode["output"]
    summary = decode["summary"]
    every = len(CONV_CHECKS)  # the oracle declares every form: each of the family's checks runs and passes
    assert summary["areas"] == {"conv_decode": {"passed": every}} and summary["totals"] == {"passed": every}
    assert (summary["run"]["family"], summary["run"]["profile"], summary["run"]["label"]) == (
        "conv",
        "conv",
        "oracle conv",
    )
    assert summary["run"]["exit_code"] == 0 and "conv_decode" in decode["output"]
    prefill = check("conv_kernels:oracle_prefill", (), "", tmp_path)
    assert prefill["code"] == 0 and set(prefill["summary"]["areas"]) == {"conv_prefill"}, prefill["output"]
    assert not prefill["summary"]["areas"]["conv_prefill"].get("failed"), prefill["output"]
    partial = check("conv_kernels:numbers_only", (), "", tmp_path)  # a skipped check is never counted as passed
    # it declares no form beyond the numbers: the four checks of those pass, every form's check is skipped
    assert partial["code"] == 0 and partial["summary"]["areas"] == {"conv_decode": {"passed": 4, "skipped": every - 4}}
    assert len(partial["summary"]["skip_reasons"]) == every - 4, partial["output"]
    crashing = check("conv_kernels:no_varlen_call", (), "", tmp_path)  # a kernel raising fails its check only
    assert crashing["code"] == 1 and crashing["summary"]["areas"] == {
        "conv_decode": {"passed": every - 1, "failed": 1}
    }, crashing["output"]
    assert "raised TypeError" in crashing["output"], crashing["output"]
    bad = check("conv_kernels:padding_written", (), "", tmp_path, extra=["--family", "conv"])
    assert bad["code"] == 1 and bad["summary"]["areas"]["conv_decode"].get("failed"), bad["output"]
    assert any("padding" in nodeid for nodeid in bad["summary"]["failures"]), bad["summary"]["failures"]
    assert bad["summary"]["run"]["exit_code"] == 1


def test_a_conv_run_refuses_a_prefill_adapter(tmp_path: Path) -> None:
    result = check("conv_kernels:oracle_decode", (), "", tmp_path, extra=["--family", "conv", "--adapter", "hf-torch"])
    assert result["code"] == 2 and "not a conv adapter" in result["output"], result["output"]
