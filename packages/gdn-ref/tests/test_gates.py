"""Decays for every g_log <= 0: huge and -inf gates mid-chunk, alternating and long runs of strong gates.

The chunked form must match the float64 oracle within fp32 rounding however the gates are placed: a decay is the
exponential of a sum of exactly the gates it spans, never a difference of two prefix sums (which a huge gate
earlier in the chunk would swamp, and which is NaN after a -inf).
"""

from __future__ import annotations

import numpy as np
import pytest

from gdn_ref import chunked, gdn_cte, recurrent
from gdn_ref.chunked import LOG_DECAY_FLOOR
from ref_inputs import assert_close, make_inputs

# Gate patterns a serving stack produces (issue 8): one strong gate mid-chunk, a document reset by -inf between
# packed documents, alternating strong/normal gates, and runs of gates at the edge of fp32's exp range.
PATTERNS = {
    "one_huge_mid_chunk": lambda g: g.__setitem__((..., 60), -1e7),
    "fp32_lowest_mid_chunk": lambda g: g.__setitem__((..., 70), np.finfo(np.float32).min),
    "minus_1e4_each_chunk": lambda g: g.__setitem__((..., slice(50, None, 128)), -1e4),
    "document_resets": lambda g: g.__setitem__((..., [45, 200, 201]), -np.inf),
    "alternating": lambda g: g.__setitem__((..., slice(None, None, 2)), -1e4),
    "runs_of_88": lambda g: g.__setitem__((..., slice(10, 90)), -88.0),
}


@pytest.mark.parametrize("algorithm", ["schur", "neumann"])
@pytest.mark.parametrize("pattern", sorted(PATTERNS))
def test_strong_gates_anywhere_match_the_oracle(algorithm: str, pattern: str) -> None:
    x = make_inputs(81, S=320, with_state=algorithm == "schur")
    PATTERNS[pattern](x.g_log)
    ref_out, ref_state = recurrent(*x.args())
    out, state = chunked(*x.args(), algorithm=algorithm, compute_dtype=np.float32)
    assert_close(out, ref_out, 1e-6, 1e-5, f"{pattern} out")
    assert_close(state, ref_state, 1e-6, 1e-5, f"{pattern} state")


def test_reset_makes_the_state_forget_everything_before_it() -> None:
    """A -inf gate mid-chunk: from it on, outputs and state are those of a fresh start there (nothing carried)."""
    x = make_inputs(82, S=256, Hk=1, Hv=1)
    x.g_log[..., 100] = -np.inf
    out, state = chunked(*x.args(), algorithm="schur", compute_dtype=np.float32)
    second = [a[:, :, 100:] for a in (x.query, x.key, x.value, x.g_log, x.beta)]
    fresh_out, fresh = recurrent(*second, x.scale, None)
    assert_close(out[:, :, 100:], fresh_out, 1e-6, 1e-5, "out after the reset")
    assert_close(state, fresh, 1e-6, 1e-5, "state")


def test_floor_changes_no_decay() -> None:
    """The floor is exact: e^floor is 0 in fp32 and fp64, like e^-inf."""
    for dtype in (np.float32, np.float64):
        assert np.exp(dtype(LOG_DECAY_FLOOR)) == 0.0


def test_positive_gate_is_not_capped_by_the_chunked_form() -> None:
    """Out of contract for gdn_cte (rejected there), but the chunked form itself still computes the sum."""
    x = make_inputs(83, S=128, with_state=False)
    x.g_log[...] = 0.05
    ref_out, _ = recurrent(*x.args())
    out, _ = chunked(*x.args(), algorithm="schur", compute_dtype=np.float64)
    assert_close(out, ref_out, 1e-10, 1e-9, "g = +0.05")


def test_host_gdn_cte_matches_the_oracle_with_resets() -> None:
    from gdn_ref import build_mask_pack

    x = make_inputs(84, S=256).astype(np.float32)
    x.g_log[..., [3, 130]] = -np.inf
    state = x.initial_state.copy()
    ref_out, ref_state = recurrent(*x.args())
    out, _ = gdn_cte(x.query, x.key, x.value, x.g_log, x.beta, x.scale, "schur", build_mask_pack(), 8, state)
    assert_close(out, ref_out, 1e-5, 1e-4, "out")
    assert_close(state, ref_state, 1e-5, 1e-4, "state")
