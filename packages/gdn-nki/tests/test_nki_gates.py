"""The kernel's decays for every g_log <= 0: huge and -inf gates mid-chunk, alternating and runs of strong gates.

Both algorithms and both compute dtypes must stay within gdn-spec's tolerance table against the fp64 oracle, and
the state of a reset lane must carry nothing from before the reset.
"""

from __future__ import annotations

import numpy as np
import pytest

import gdn_nki
from gdn_spec.regimes import Geometry
from nki_inputs import case, errors, kernel_kwargs, oracle, run

GEOMETRY = Geometry(B=1, Hk=2, Hv=2, S=256, Dk=32, Dv=16)
# (token index, g) per pattern: mid-chunk for both chunk lengths (64 and 128)
PATTERNS = {
    "one_huge": [(40, -1e7), (170, -1e30)],
    "fp32_lowest_and_1e4": [(70, float(np.finfo(np.float32).min)), (150, -1e4)],
    "resets": [(45, -np.inf), (130, -np.inf), (131, -np.inf)],
    "alternating": [(t, -1e4) for t in range(10, 120, 2)],
    "run_of_88": [(t, -88.0) for t in range(20, 100)],
}


def _case(dtype: str, pattern: str, algorithm: str):
    c = case(dtype, GEOMETRY, seed=21, regime="initial_state" if algorithm == "schur" else "random")
    for t, g in PATTERNS[pattern]:
        c.kernel["g_log"][..., t] = g
        c.oracle["g_log"][..., t] = g
    return c


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("algorithm", ["schur", "neumann"])
@pytest.mark.parametrize("pattern", sorted(PATTERNS))
def test_strong_gates_anywhere_match_the_oracle(pattern: str, algorithm: str, dtype: str) -> None:
    c = _case(dtype, pattern, algorithm)
    out, state = run(c, algorithm)
    found = errors(out, state, *oracle(c), dtype)
    assert all(e.ok for e in found), f"{pattern} {algorithm} {dtype}: {found}"
    if dtype == "float32":  # far inside the table: the decays themselves carry no error beyond rounding
        assert all(e.rel_rms < 1e-6 for e in found), f"{pattern} {algorithm}: {found}"


def test_reset_forgets_the_state_before_it() -> None:
    """Everything before the last -inf gate reaches the final state multiplied by an exact 0."""
    c = _case("float32", "resets", "schur")
    _, state = run(c, "schur")
    other = kernel_kwargs(c, "schur")
    other["recurrent_state"] = 1e3 * np.ones_like(other["recurrent_state"])  # a different start, then reset
    other["value"][:, :, :131] = -3.0 * other["value"][:, :, :131]  # and different writes before the reset
    _, state_other = gdn_nki.simulate(**other)
    np.testing.assert_array_equal(state, state_other)
