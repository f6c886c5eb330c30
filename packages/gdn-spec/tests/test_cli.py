"""``gdn-spec check``'s verdict and messages: the exit code of a run that verified nothing."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from gdn_spec.cli import Summary, nothing_verified
from test_power import check


def test_a_run_whose_every_test_is_skipped_exits_5_saying_nothing_was_verified(tmp_path: Path) -> None:
    """gdn-ref's gdn_cte takes no cu_seqlens: its varlen area skips all 8 tests. That run used to exit 0, though
    the README promised non-zero "when nothing ran"; a run that verified something still exits 0."""
    skipped = check("gdn_ref:gdn_cte", ("varlen",), "", tmp_path)
    assert skipped["code"] == 5 and skipped["summary"]["totals"] == {"skipped": 8}, skipped["output"]
    line = "gdn-spec: nothing was verified: all 8 tests were skipped (8 × gdn-ref does not declare varlen"
    assert line in skipped["output"], skipped["output"]
    deselected = check("gdn_ref:gdn_cte", ("dtypes",), "no_such_test", tmp_path)
    assert deselected["code"] == 5, deselected["output"]
    assert "nothing was verified: no test ran (all 8 were deselected" in deselected["output"], deselected["output"]
    verified = check("gdn_ref:gdn_cte", ("dtypes",), "", tmp_path)
    assert verified["code"] == 0 and "nothing was verified" not in verified["output"], verified["output"]


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
