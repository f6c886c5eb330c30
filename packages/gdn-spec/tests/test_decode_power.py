"""The decode family's power: every broken decode kernel of ``decode_mutants`` fails it in the expected area,
and the unbroken one passes the same runs (``gdn-spec check`` subprocesses, the ``quick`` Hypothesis profile)."""

from __future__ import annotations

from pathlib import Path

import pytest

from decode_mutants import FLAWS
from test_power import check

RUNS = sorted(set(FLAWS.values()))


@pytest.mark.parametrize("name", list(FLAWS))
def test_decode_mutant_is_caught(name: str, tmp_path: Path) -> None:
    area, keyword = FLAWS[name]
    result = check(f"decode_mutants:{name}", (area,), keyword, tmp_path)
    assert result["code"] == 1, f"decode mutant {name} passed the family:\n{result['output']}"
    assert result["summary"]["areas"][area].get("failed"), f"{name} did not fail in {area}:\n{result['output']}"


@pytest.mark.parametrize(("area", "keyword"), RUNS, ids=[f"{a}-{k or 'all'}" for a, k in RUNS])
def test_correct_decode_kernel_passes_the_mutants_runs(area: str, keyword: str, tmp_path: Path) -> None:
    result = check("decode_mutants:CORRECT", (area,), keyword, tmp_path)
    assert result["code"] == 0, result["output"]
    assert result["summary"]["run"]["family"] == "decode"


def test_a_decode_kernel_runs_only_the_decode_areas(tmp_path: Path) -> None:
    """Auto-detected from its gdn_spec_decode_capabilities: a prefill area asked of a decode kernel verifies
    nothing (exit 5), and a prefill kernel forced into the decode family fails (it gets decode_step's arguments)."""
    result = check("decode_mutants:CORRECT", ("shapes",), "", tmp_path)
    assert result["code"] == 5, result["output"]  # the prefill area collected nothing for a decode kernel
    forced = check("mutants:CORRECT", (), "", tmp_path, extra=("--family", "decode", "--area", "decode_shapes"))
    assert forced["code"] == 1, forced["output"]
