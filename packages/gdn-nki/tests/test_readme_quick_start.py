"""The root README's quick start runs as written and computes the gated delta rule: a user's first paste must work."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from gdn_ref.recurrent import recurrent
from gdn_spec.metrics import compare

README = Path(__file__).resolve().parents[3] / "README.md"


def quick_start_code() -> str:
    """The python block of the README's "Using the kernel" section."""
    section = README.read_text().split("## Using the kernel\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1, f"expected one python block in README.md's 'Using the kernel', found {len(blocks)}"
    return blocks[0]


def test_readme_quick_start_runs_and_matches_the_oracle() -> None:
    names: dict = {}
    exec(compile(quick_start_code(), f"{README}: Using the kernel", "exec"), names)
    q, k, v, g_log, beta = (names[n].astype(np.float64) for n in ("q", "k", "v", "g_log", "beta"))
    ref_out, ref_state = recurrent(q, k, v, g_log, beta, scale=names["Dk"] ** -0.5)  # the example starts from zero
    for error in (
        compare("out", names["out"], ref_out, "float32"),
        compare("state", names["state"], ref_state, "float32"),
    ):
        assert error.ok, error
