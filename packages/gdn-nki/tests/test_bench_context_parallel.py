"""The context-parallel bench: its correction kernel (the modelled finish of a continued rank) computes o + p S₀ and
M S₀ + L, and its smoke run measures both ways to finish and writes both tables."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import nki_cpu
from example_scripts import load_bench

pytestmark = pytest.mark.nki_cpu_only  # the bench reads nki-cpu's traces into its cost model


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_bench("bench_context_parallel")


@pytest.mark.parametrize("tokens", [384, 4096], ids=["one-token-per-partition", "sixteen"])
def test_the_correction_kernel_is_o_plus_p_s0_and_m_s0_plus_l(bench: ModuleType, tokens: int) -> None:
    operands = bench.correction_inputs(tokens, value_heads=2, head_dim=64, seed=1)
    corrected, state = nki_cpu.simulate(bench.output_correction)(*operands)
    readout, out, entry, transition, local = (np.asarray(x, np.float64) for x in operands)
    want_out = out + readout @ entry  # float64, per head and token
    want_state = transition @ entry + local
    # one rounding to bf16 (2⁻⁹ relative) on top of fp32 sums of bf16 products of S₀'s split halves (≤ 2⁻¹⁶ each)
    assert np.all(np.abs(np.asarray(corrected, np.float64) - want_out) <= 2**-8 * np.abs(want_out) + 1e-3)
    np.testing.assert_allclose(np.asarray(state, np.float64), want_state, rtol=1e-5, atol=1e-5)


def test_the_smoke_run_measures_both_finishes(bench: ModuleType, tmp_path: Path) -> None:
    bench.main(["--smoke", "--out", str(tmp_path)])
    text = (tmp_path / "bench_context_parallel.md").read_text()
    finishing = [line for line in text.splitlines() if line.startswith("| 128 |") or line.startswith("| 512 |")]
    assert len(finishing) == 2
    for line in finishing:
        cells = [c.strip() for c in line.strip("|").split("|")]
        pass_a, pass_b, correction, second = (float(c.replace(",", "")) for c in cells[1:5])
        assert pass_a == pass_b == second > 0 and correction > 0
        assert float(cells[5].replace(",", "")) == pytest.approx(pass_a + pass_b + correction, abs=0.15)
    assert "a model" in text and "| 4,096 | 2 |" in text
