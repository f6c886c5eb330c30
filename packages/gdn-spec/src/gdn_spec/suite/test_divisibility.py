"""Divisibility: each algorithm enforces only its own S multiple (schur 128, neumann 64).

S = 192 is the telling case: a multiple of 64 but not of 128, so neumann must ACCEPT it (and compute it right)
and schur must REJECT it. An implementation declaring ``any_seq_len`` must accept and compute every length here.
"""

from __future__ import annotations

import pytest

from gdn_ref.constants import ALGORITHM_NEUMANN, ALGORITHM_SCHUR
from gdn_spec.impl import Implementation
from gdn_spec.regimes import Geometry, make_case

from ..oracle import errors_vs_oracle
from ._support import assert_close, call_args, changed, fixed_shape, run, snapshot

# (algorithm, S, accepted): each algorithm's own multiples, the other's multiple, and an odd length.
CASES = [
    (ALGORITHM_SCHUR, 128, True),
    (ALGORITHM_SCHUR, 256, True),
    (ALGORITHM_SCHUR, 192, False),
    (ALGORITHM_SCHUR, 64, False),
    (ALGORITHM_SCHUR, 130, False),
    (ALGORITHM_NEUMANN, 64, True),
    (ALGORITHM_NEUMANN, 192, True),
    (ALGORITHM_NEUMANN, 96, False),
    (ALGORITHM_NEUMANN, 65, False),
]


@pytest.mark.parametrize(
    ("gdn_algorithm", "S", "accepted"),
    [pytest.param(*c, marks=() if c[2] else pytest.mark.gdn_requires("validation")) for c in CASES],
    ids=[f"{a}-S{s}-{'accept' if ok else 'reject'}" for a, s, ok in CASES],
)
def test_sequence_length(gdn_impl: Implementation, gdn_algorithm: str, S: int, accepted: bool) -> None:
    dtype = gdn_impl.capabilities.dtypes[0]
    # Rejected lengths too: above max_seq_len the kernel may refuse the call for its own limit, not the S rule.
    geometry = fixed_shape(gdn_impl.capabilities, Geometry(1, 2, 2, S, 32, 32), shrink_lanes=True)
    case = make_case("random", geometry, dtype, S, supply_state=gdn_algorithm == ALGORITHM_SCHUR)
    args = call_args(case, gdn_algorithm)
    if accepted or gdn_impl.capabilities.any_seq_len:  # a kernel taking any S must compute this one right
        out, state = run(gdn_impl, args)
        assert_close(errors_vs_oracle(case, out, state), f"{gdn_algorithm} S={S}")
        return
    before = snapshot(args)
    with pytest.raises(Exception) as info:  # any exception type is a rejection; the message is checked
        gdn_impl(**args)
    assert "query" in str(info.value), f"rejection of S={S} must name `query`: {info.value}"
    assert not changed(before, args), f"rejected call modified {changed(before, args)}"
