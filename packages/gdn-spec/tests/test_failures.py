"""The one-line failure message of ``gdn-spec check`` (summary and --json): what a kernel's author can act on is
kept whole, the advice to edit the installed suite and pytest's operand reprs are dropped, a cut says how much."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from gdn_spec.failures import FAILURE_CHARS, cap, failure_message
from test_power import check


def report(message: str) -> SimpleNamespace:
    """A failed report as pytest builds it: the crash message is what the summary reads."""
    return SimpleNamespace(longrepr=SimpleNamespace(reprcrash=SimpleNamespace(message=message)))


NUMERICS = (
    "Failed: random Geometry(B=1, Hk=2, Hv=2, S=128, Dk=16, Dv=16) group_size=1 seed=0: out: rel_rms=7.500e-01 "
    "(tol 2.0e-04) max_abs=2.476e-01 max_rel=7.500e-01 (tol 2.0e-03) FAIL; state: rel_rms=2.625e-08 (tol 2.0e-04) "
    "max_abs=2.945e-08 max_rel=3.358e-08 (tol 2.0e-03) ok"
)
HYPOTHESIS_TAIL = (
    "\nFailing test case: check(\n    shape=(Geometry(B=1, Hk=2, Hv=2, S=128, Dk=16, Dv=16), 1),\n    seed=0,\n"
    "    supply=False,\n)\n\nYou can reproduce this test case by temporarily adding @reproduce_failure('6.170.27', "
    "b'AEEAQQFBAUEAQQBBAEEAAA==') as a decorator on your test function"
)


def test_hypothesis_advice_to_edit_the_test_is_dropped_and_the_example_kept_on_one_line() -> None:
    message = failure_message(report(NUMERICS + HYPOTHESIS_TAIL))
    assert message == (
        NUMERICS + " | Failing test case: check(shape=(Geometry(B=1, Hk=2, Hv=2, S=128, Dk=16, Dv=16), 1), seed=0, "
        "supply=False)"
    )
    older = "Falsifying example: check(\n    seed=3,\n)\nYou can reproduce this example by temporarily adding x"
    assert failure_message(report("Failed: boom\n" + older)) == "Failed: boom | Falsifying example: check(seed=3)"
    seeded = "Failed: boom\nYou can reproduce this failure by adding @seed(123) to this test."
    assert failure_message(report(seeded)) == "Failed: boom"


def test_a_short_comparison_keeps_pytests_explanation() -> None:
    """A shape mismatch shows both shapes (before, everything after the message was dropped)."""
    crash = (
        "AssertionError: out shape (2, 6, 256, 15), expected [B, Hv, S, Dv] = (2, 6, 256, 16)\n"
        "assert (2, 6, 256, 15) == (2, 6, 256, 16)\n  \n  At index 3 diff: 15 != 16\n  Use -v to get more diff"
    )
    assert failure_message(report(crash)) == (
        "AssertionError: out shape (2, 6, 256, 15), expected [B, Hv, S, Dv] = (2, 6, 256, 16) | "
        "assert (2, 6, 256, 15) == (2, 6, 256, 16) | At index 3 diff: 15 != 16"
    )
    bare = "AssertionError: assert 3 == 4"  # an assertion without a message: the comparison is all there is
    assert failure_message(report(bare)) == "assert 3 == 4"


def test_the_summary_is_the_same_when_pytest_prints_its_full_diff() -> None:
    """Under -v, or whenever the CI environment variable is set, pytest follows the comparison with a line-by-line
    diff of both operands instead of its "Use -v" hint; the summary drops it either way (it used to keep it in CI
    only, so one test's expected message differed between CI and a developer's machine)."""
    message = "AssertionError: out shape (2, 6, 256, 15), expected [B, Hv, S, Dv] = (2, 6, 256, 16)\n"
    comparison = "assert (2, 6, 256, 15) == (2, 6, 256, 16)\n  \n  At index 3 diff: 15 != 16\n  \n"
    full_diff = (
        "  Full diff: (-: missing in left side, +: extra in left side)\n    (\n        2,\n        6,\n        256,\n"
        "  -     16,\n  ?      ^\n  +     15,\n  ?      ^\n    )"
    )
    hint = "  Use -v to get more diff"
    assert failure_message(report(message + comparison + full_diff)) == failure_message(
        report(message + comparison + hint)
    )
    assert failure_message(report(message + comparison + full_diff)).endswith("| At index 3 diff: 15 != 16")


def test_operand_reprs_and_non_comparisons_are_dropped() -> None:
    crash = (
        "AssertionError: [query.rank] rejection must name the argument `query`: 'gdn_cte: invalid input'\n"
        "assert None\n +  where None = <function search at 0x7f00ea1319e0>('\\\\bquery\\\\b', 'gdn_cte: invalid input')"
    )
    expected = "AssertionError: [query.rank] rejection must name the argument `query`: 'gdn_cte: invalid input'"
    assert failure_message(report(crash)) == expected
    arrays = "AssertionError: out differs\nassert array([" + "0.1, " * 200 + "]) == array([...])"
    assert failure_message(report(arrays)) == "AssertionError: out differs"


def test_a_three_sequence_varlen_failure_keeps_every_sequences_figures() -> None:
    """The red-team's leaky varlen kernel: 690 characters, cut at 600 before (sequence 2's figures lost)."""
    sequence = (
        "sequence {i} (tokens {a}..{b}): output out of bounds, rel_rms 4.413e-01 > tol 1.0e-02, max_rel 9.012e-01 > "
        "tol 4.0e-02 (max_abs 4.242e-01); final state out of bounds, rel_rms 1.159e+00 > tol 1.0e-02, max_rel "
        "9.482e-01 > tol 4.0e-02 (max_abs 8.820e-01)"
    )
    parts = [sequence.format(i=i, a=a, b=b) for i, (a, b) in enumerate([(0, 128), (128, 512), (512, 768)])]
    crash = "Failed: 3 of 3 packed sequences differ from its own call: " + " | ".join(parts)
    assert len(crash) > 600 and failure_message(report(crash)) == crash


def test_a_cut_ends_at_a_part_boundary_and_says_how_much_was_cut() -> None:
    message = " | ".join(f"part {i}: " + "x" * 50 for i in range(200))
    assert len(message) > FAILURE_CHARS
    got = failure_message(report(message))
    kept, cut = re.fullmatch(r"(.*)\[\.\.\. (\d+) more characters cut\]", got).groups()
    assert len(got) <= FAILURE_CHARS and kept.endswith("x | ") and len(kept) + int(cut) == len(message), got
    one_piece = "RuntimeError: " + "1.0 " * 2000  # no part boundary at all: cut at a space, still counted
    got = cap(one_piece, 500)
    kept, cut = re.fullmatch(r"(.*)\[\.\.\. (\d+) more characters cut\]", got).groups()
    assert len(got) <= 500 and kept.endswith(" ") and len(kept) + int(cut) == len(one_piece), got


CUT = re.compile(r"(.*)\[\.\.\. (\d+) more characters cut\]", re.DOTALL)


@settings(max_examples=500, database=None, derandomize=True)
@given(
    message=st.lists(st.sampled_from(["x", "y" * 30, " ", " | ", "; ", "1.0 "]), max_size=40).map("".join),
    limit=st.integers(0, 400),
)
def test_a_cut_message_is_within_the_limit_and_counts_exactly(message: str, limit: int) -> None:
    """At any limit: never longer than it; the kept text a prefix of the message and the count exactly the rest.
    Below about 40 characters ``cap('y' * 100, 30)`` returned 118, and a part with no space to cut at gained a
    space the message did not have, so the count was one short."""
    got = cap(message, limit)
    assert len(got) <= limit, (len(got), got)
    if len(message) <= limit:
        assert got == message
        return
    match = CUT.fullmatch(got)
    if match is None:  # no room even for the note: the message's first ``limit`` characters
        assert got == message[:limit] and limit < len(f"[... {len(message)} more characters cut]"), got
        return
    kept, count = match.group(1), int(match.group(2))
    assert message.startswith(kept) and len(kept) + count == len(message), (kept, count, len(message))


def test_a_cut_without_a_space_keeps_what_fits() -> None:
    assert cap("y" * 100, 30) == "y[... 99 more characters cut]"
    assert cap("y" * 100, 60) == "y" * 31 + "[... 69 more characters cut]"
    assert cap("y" * 100, 10) == "y" * 10  # no room for the note


def test_the_sizes_a_test_ran_at_stay_in_front() -> None:
    note = "[ran at Dk=16, Dv=16 instead of Dk=32, Dv=16: k: Dk=32 != Dv=16, and it declares equal_head_dims=True] "
    crash = note + "AssertionError: out dtype float32, expected bfloat16\nassert dtype('float32') == dtype(bfloat16)"
    assert failure_message(report(crash)) == (
        note + "AssertionError: out dtype float32, expected bfloat16 | assert dtype('float32') == dtype(bfloat16)"
    )


def test_a_shape_failure_names_the_expected_shape(tmp_path: Path) -> None:
    """End to end: a kernel losing one value column fails the shapes area with both shapes in its message (the
    summary used to show only "out shape (2, 6, 256, 15)")."""
    result = check("mutants:out_short_dv", ("shapes",), "schur and float32 and omitted and Dk64", tmp_path)
    (message,) = result["summary"]["failures"].values()
    assert message.startswith("AssertionError: out shape (2, 6, 256, 15), expected [B, Hv, S, Dv] = (2, 6, 256, 16)")
    assert message.endswith("| assert (2, 6, 256, 15) == (2, 6, 256, 16) | At index 3 diff: 15 != 16"), message
