"""The kernels-validated table: verdicts per area (a skipped area is never shown as passed), worst error, and
the README section it replaces."""

from __future__ import annotations

from pathlib import Path

import pytest

from gdn_spec.validated import BEGIN, END, render, write_section

WORST = {"ratio": 0.25, "dtype": "bfloat16", "output": "out", "regime": "collinear_keys", "rel_rms": 2.5e-3}


def _summary(areas: dict, label: str) -> dict:
    totals: dict[str, int] = {}
    for counts in areas.values():
        for outcome, n in counts.items():
            totals[outcome] = totals.get(outcome, 0) + n
    run = {"label": label, "spec": "m:f", "via": "hf-torch adapter", "profile": "math", "seconds": 12.0}
    return {"run": run, "areas": areas, "totals": totals, "worst": {"bfloat16/schur/out": WORST}}


def test_render_verdicts_and_worst_error() -> None:
    good = _summary({"numerics": {"passed": 34, "skipped": 6}, "rejection": {"skipped": 52}}, "good")
    bad = _summary({"numerics": {"passed": 30, "failed": 4}}, "bad")
    bad["failures"] = {"gdn_spec/suite/test_numerics.py::test_matches_oracle[schur-float32-document_resets]": "inf"}
    table = render([good, bad])
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")}
    assert "passed 34 (+6 skipped)" in rows["numerics"] and "**FAILED** 4/34" in rows["numerics"]
    assert "skipped 52" in rows["rejection"] and "passed" not in rows["rejection"]
    assert "- #2: `test_matches_oracle[schur-float32-document_resets]`" in table
    assert "0.25 (bfloat16 out, collinear_keys" in table and "hf-torch adapter" in table and "12 s" in table


def test_conv_rows_in_the_table() -> None:
    """A conv-family run (``gdn-spec check --family conv``) adds its areas as rows; other kernels show — there."""
    conv = _summary({"conv_decode": {"passed": 4, "skipped": 2}}, "HF causal_conv1d_update")
    conv["run"]["profile"], conv["worst"] = "conv", {}
    table = render([_summary({"numerics": {"passed": 3}}, "prefill kernel"), conv])
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")}
    assert rows["conv_decode"].split("|")[2:4] == [" — ", " passed 4 (+2 skipped) "]
    assert rows["numerics"].split("|")[2:4] == [" passed 3 ", " — "]
    assert "| 2 | HF causal_conv1d_update (`m:f`) | hf-torch adapter | conv | 4 | 0 | 2 | — |" in table


def test_render_says_what_produced_each_run() -> None:
    """A run recorded with versions names them; one from before versions were recorded shows no line."""
    recorded = _summary({"numerics": {"passed": 1}}, "new")
    recorded["run"]["kernel"] = {"spec": "my_pkg:f", "module": "my_pkg", "package": "my-pkg", "version": "1.2.0"}
    recorded["run"]["versions"] = {"gdn-spec": "0.1.0", "python": "3.11.9", "numpy": "2.2.6", "torch": "2.5.1"}
    table = render([_summary({"numerics": {"passed": 1}}, "old"), recorded])
    assert "- #2: my_pkg (my-pkg 1.2.0); gdn-spec 0.1.0 on Python 3.11.9, numpy 2.2.6, torch 2.5.1" in table
    assert "- #1:" not in table.split("Produced by:")[1]


def test_write_section_replaces_only_the_marked_part(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{BEGIN}\nold table\n{END}\noutro\n")
    write_section(readme, "new table")
    assert readme.read_text() == f"intro\n{BEGIN}\nnew table\n{END}\noutro\n"
    readme.write_text("no markers")
    with pytest.raises(SystemExit):
        write_section(readme, "x")
