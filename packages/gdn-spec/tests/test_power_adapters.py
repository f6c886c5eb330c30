"""The suite's power over adapters and the CLI: a broken adapter (scale applied twice, heads repeated wrongly,
state transposed) fails the math profile; the correct glue around the same kernels passes the same runs; a leaky
varlen kernel fails the varlen area; a kernel writing a copy the adapter handed it fails naming the argument; -x
stops early and is reported; restrictions are reported as left out."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from adapter_kernels import BROKEN_ADAPTERS, POOL_MUTANTS
from gdn_spec.cli import parse_args
from gdn_spec.regimes import REGIMES
from mutants import LOST_CARRY_TOKENS
from test_power import check


@pytest.mark.parametrize("name", list(BROKEN_ADAPTERS))
def test_broken_adapter_is_caught(name: str, tmp_path: Path) -> None:
    _, areas, keyword = BROKEN_ADAPTERS[name]
    result = check(f"adapter_kernels:{name}", areas, keyword, tmp_path, extra=["--profile", "math"])
    assert result["code"] != 0, f"broken adapter {name} passed:\n{result['output']}"
    failed = {a for a, c in result["summary"]["areas"].items() if c.get("failed")}
    assert failed & set(areas), f"{name} failed in {failed}, expected {areas}:\n{result['output']}"
    assert result["summary"]["run"]["profile"] == "math"
    for message in result["summary"]["failures"].values():  # the assertion's message, not a traceback line
        assert "rel_rms" in message or "Hk=" in message, message


# The same kernels through the correct glue, over the same runs.
CORRECT_GLUE = [
    ("adapter_kernels:fla_style", "fla"),
    ("adapter_kernels:hf_style", "fla:scale=internal,gqa=repeat"),
]
RUNS = sorted({(areas, keyword) for _, areas, keyword in BROKEN_ADAPTERS.values()})


@pytest.mark.parametrize(("spec", "adapter"), CORRECT_GLUE)
@pytest.mark.parametrize(("areas", "keyword"), RUNS, ids=[f"{'+'.join(a)}[{k}]" for a, k in RUNS])
def test_correct_glue_passes_the_same_runs(spec: str, adapter: str, areas, keyword: str, tmp_path: Path) -> None:
    result = check(spec, areas, keyword, tmp_path, extra=["--adapter", adapter])
    assert result["code"] == 0, result["output"]
    summary = result["summary"]
    assert summary["totals"].get("passed", 0) > 0 and "fla adapter" in summary["run"]["via"]


TORCH = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
# (kernel, adapter arguments, what it gets wrong): issue 29's two classes, as numpy and torch kernels. Every short
# draw of the suite passed both (no draw reached 1024 tokens; a seq-first kernel never saw a partial chunk).
LONG_AND_RAGGED = [
    ("mutants:lost_carry", (), "lost_carry"),
    ("adapter_kernels:fla_lost_carry", ("--adapter", "fla"), "lost_carry"),
    ("adapter_kernels:fla_undecayed_tail", ("--adapter", "fla"), "undecayed_tail"),
    pytest.param(
        "adapter_kernels:torch_fla_lost_carry", ("--adapter", "fla-torch", "--device", "cpu"), "lost_carry", marks=TORCH
    ),
    pytest.param(
        "adapter_kernels:torch_fla_undecayed_tail",
        ("--adapter", "fla-torch", "--device", "cpu"),
        "undecayed_tail",
        marks=TORCH,
    ),
]


@pytest.mark.parametrize(("spec", "extra", "flaw"), LONG_AND_RAGGED)
def test_a_lost_carry_and_an_undecayed_ragged_tail_fail_the_math_profile(
    spec: str, extra: tuple[str, ...], flaw: str, tmp_path: Path
) -> None:
    """A kernel exact for 1024 tokens that then restarts from a zero state, and a seq-first kernel leaving the
    tokens of a partial last chunk undecayed, fail the numerics area under the math profile, each long-sequence
    failure naming the regime and the length (for a seq-first kernel, a length ending inside a chunk)."""
    result = check(spec, ("numerics",), "long", tmp_path, extra=(*extra, "--profile", "math"))
    failures = result["summary"]["failures"]
    assert result["code"] == 1 and failures, result["output"]
    long_failures = [m for t, m in failures.items() if "test_long_sequences_match_oracle" in t]
    assert long_failures, failures
    seq_first = "--adapter" in extra
    for message in long_failures:
        found = re.search(r"long sequence, (\w+), S=(\d+) tokens", message)
        assert found and found[1] in REGIMES, message
        length = int(found[2])
        assert length > 2 * LOST_CARRY_TOKENS and (length % 64 != 0) == seq_first, message


@pytest.mark.parametrize(
    ("spec", "extra"),
    [
        ("adapter_kernels:fla_style", ("--adapter", "fla")),
        pytest.param("adapter_kernels:torch_fla_style", ("--adapter", "fla-torch", "--device", "cpu"), marks=TORCH),
    ],
)
def test_correct_kernels_pass_the_long_and_ragged_draws(spec: str, extra: tuple[str, ...], tmp_path: Path) -> None:
    """The correct seq-first kernel passes the whole numerics area: its short draws end inside chunks too."""
    result = check(spec, ("numerics",), "", tmp_path, extra=(*extra, "--profile", "math"))
    assert result["code"] == 0, result["output"]
    outcomes = result["summary"]["outcomes"]
    assert sum(o == "passed" for t, o in outcomes.items() if "test_long_sequences" in t) == 10, outcomes


def test_varlen_area(tmp_path: Path) -> None:
    good = check("adapter_kernels:fla_style", ("varlen",), "", tmp_path, extra=["--adapter", "fla:varlen=yes"])
    assert good["code"] == 0 and good["summary"]["verdicts"] == {"varlen": "passed"}, good["output"]
    leaky = check("adapter_kernels:leaky_varlen", ("varlen",), "", tmp_path, extra=["--adapter", "fla:varlen=yes"])
    assert leaky["code"] != 0 and leaky["summary"]["verdicts"] == {"varlen": "failed"}, leaky["output"]
    undeclared = check("adapter_kernels:fla_style", ("varlen",), "", tmp_path, extra=["--adapter", "fla"])
    assert undeclared["summary"]["verdicts"] == {"varlen": "skipped"}, undeclared["output"]


# A seq-first pool kernel declaring every serving keyword (SGLang's pool-native call, plus gdn-nki's keywords).
POOL_ADAPTER = "varlen=yes,pool=state_indices,bucket=yes,checkpoints=yes,read_rows=yes"
SERVING_TESTS = ("test_serving_layouts", "test_a_sequence_is_bit_identical", "test_checkpoints_equal",
                 "test_sequences_start_from_their_read_rows")  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "extra"),
    [
        ("adapter_kernels:pool_style", ("--adapter", f"fla:{POOL_ADAPTER}")),
        ("adapter_kernels:v_first_pool_style", ("--adapter", f"fla:{POOL_ADAPTER},state=vk")),
        pytest.param(
            "adapter_kernels:torch_pool_style",
            ("--adapter", f"fla-torch:{POOL_ADAPTER}", "--device", "cpu"),
            marks=TORCH,
        ),
    ],
)
def test_a_pool_kernel_runs_the_serving_checks(spec: str, extra: tuple[str, ...], tmp_path: Path) -> None:
    """Through a pool adapter, the serving checks run (none skipped) and a correct pool kernel passes them, its
    pool in either layout (a [P, H, V, K] pool is handed over contiguous and every row carried back exactly)."""
    result = check(spec, ("varlen",), "serving or bit_identical or checkpoints or read_rows", tmp_path, extra=extra)
    assert result["code"] == 0 and result["summary"]["verdicts"] == {"varlen": "passed"}, result["output"]
    outcomes = result["summary"]["outcomes"]
    for name in SERVING_TESTS:
        ran = [o for t, o in outcomes.items() if name in t]
        assert ran and set(ran) == {"passed"}, f"{name}: {ran}\n{result['output']}"


def test_a_pool_read_in_the_other_layout_fails_at_square_heads(tmp_path: Path) -> None:
    """A kernel reading SGLang's V-major pool ([P, H, V, K], adapter ``state=vk``) as K-major passes every shape
    rule at Dk = Dv: the square-heads serving check catches it by its values, and passes the correct V-major
    kernel."""
    extra = ["--adapter", f"fla:{POOL_ADAPTER},state=vk"]
    test = "test_pool_rows_keep_their_layout_at_square_heads"
    good = check("adapter_kernels:v_first_pool_style", ("varlen",), test, tmp_path, extra=extra)
    assert good["code"] == 0 and good["summary"]["verdicts"] == {"varlen": "passed"}, good["output"]
    assert {o for t, o in good["summary"]["outcomes"].items() if test in t} == {"passed"}, good["output"]
    bad = check("adapter_kernels:pool_reads_v_first_as_k_major", ("varlen",), test, tmp_path, extra=extra)
    assert bad["code"] != 0 and bad["summary"]["verdicts"] == {"varlen": "failed"}, bad["output"]
    failures = bad["summary"]["failures"]
    assert failures and all(test in t and "Dk = Dv" in m and "> tol" in m for t, m in failures.items()), failures


@pytest.mark.parametrize("name", list(POOL_MUTANTS))
def test_a_flawed_pool_kernel_fails_the_serving_checks(name: str, tmp_path: Path) -> None:
    """A pool kernel storing a row-less sequence into pool[-1] (a row no call names), and one ignoring
    read_indices, fail the serving check that holds their flaw: the adapter hands over the whole pool and the
    rows, so what the kernel does to any row is what the suite judges (a gather of the named rows would hide the
    first)."""
    _, test, phrase = POOL_MUTANTS[name]
    result = check(f"adapter_kernels:{name}", ("varlen",), test, tmp_path, extra=["--adapter", f"fla:{POOL_ADAPTER}"])
    assert result["code"] != 0 and result["summary"]["verdicts"] == {"varlen": "failed"}, result["output"]
    failures = result["summary"]["failures"]
    assert failures and all(test in t and phrase in m for t, m in failures.items()), failures


@pytest.mark.parametrize(
    ("spec", "adapter", "shown"),
    [
        ("adapter_kernels:writes_initial_state", "fla", "`initial_state` (the suite's `recurrent_state`, renamed"),
        ("mutants:new_state_nans_supplied", None, "`recurrent_state`: a supplied `recurrent_state` is read only"),
    ],
)
def test_a_written_state_is_named_as_the_kernel_calls_it(
    spec: str, adapter: str | None, shown: str, tmp_path: Path
) -> None:
    """A seq-first kernel writing its input state was told it changed `recurrent_state`, a name it does not have:
    the adapter names the kernel's arguments (seqfirst.kernel_names) and the message uses those names."""
    extra = ["--adapter", adapter] if adapter else []
    result = check(spec, ("aliasing",), "incoming", tmp_path, extra=extra)
    failures = result["summary"]["failures"]
    assert result["code"] == 1 and len(failures) == 2, result["output"]
    for message in failures.values():
        assert message.startswith(f"Failed: the call changed the caller's {shown}"), message


# (correct kernel, the same writing one argument in place, adapter arguments, the argument as the kernel calls it)
CONVERTED_WRITES = [
    ("hf_style", "hf_writes_query", ("--adapter", "fla:scale=internal,gqa=repeat"), "`query`: the inputs are read"),
    ("v_first_style", "v_first_writes_initial_state", ("--adapter", "fla:state=vk"), "`initial_state` (the suite's"),
    pytest.param(
        "torch_hf_style",
        "torch_hf_writes_query",
        ("--adapter", "hf-torch:gqa=repeat", "--device", "cpu"),
        "`query`: the inputs are read",
        marks=pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed"),
    ),
]


@pytest.mark.parametrize(("correct", "mutant", "extra", "shown"), CONVERTED_WRITES)
def test_a_written_copy_fails_the_suite_and_the_correct_kernel_passes(
    correct: str, mutant: str, extra: tuple[str, ...], shown: str, tmp_path: Path
) -> None:
    """At the suite's own shapes these adapters hand the kernel copies (repeated key heads, a transposed state): a
    kernel writing one passed, as the write never reached the arrays the suite compares."""
    good = check(f"adapter_kernels:{correct}", ("aliasing",), "incoming", tmp_path, extra=extra)
    assert good["code"] == 0 and good["summary"]["verdicts"] == {"aliasing": "passed"}, good["output"]
    bad = check(f"adapter_kernels:{mutant}", ("aliasing",), "incoming", tmp_path, extra=extra)
    failures = bad["summary"]["failures"]
    assert bad["code"] == 1 and len(failures) == 2, bad["output"]  # float32 and bfloat16
    for message in failures.values():
        assert message.startswith(f"Failed: the call changed the caller's {shown}"), message


def test_math_profile_skips_api_promises_never_passes_them(tmp_path: Path) -> None:
    result = check("adapter_kernels:fla_style", ("rejection", "dtypes"), "", tmp_path, extra=["--adapter", "fla"])
    assert result["summary"]["verdicts"] == {"dtypes": "skipped", "rejection": "skipped"}, result["output"]
    assert all("profile 'math' leaves out" in reason for reason in result["summary"]["skip_reasons"])
    assert "left out of this run" in result["output"] and "--area: aliasing" in result["output"]


def test_stop_at_first_failure_is_honoured_and_reported(tmp_path: Path) -> None:
    result = check("mutants:scale_twice", ("numerics",), "float32", tmp_path, extra=["--", "-x"])
    assert result["code"] == 1 and result["summary"]["totals"].get("failed") == 1, result["output"]
    assert "did not run (stopped early" in result["output"]


@pytest.mark.parametrize("argv", [["check", "m:f", "-x"], ["check", "m:f", "--", "-x"], ["check", "-x", "m:f"]])
def test_unknown_arguments_go_to_pytest(argv: list[str]) -> None:
    args = parse_args(argv)
    assert args.impl == "m:f" and args.pytest_args == ["-x"]


@pytest.mark.parametrize("argv", [["check", "m:f", "--area", "bogus"], ["check", "m:f", "--profile", "bogus"]])
def test_bad_choices_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args(argv)
    assert info.value.code == 2 and "invalid choice" in capsys.readouterr().err
