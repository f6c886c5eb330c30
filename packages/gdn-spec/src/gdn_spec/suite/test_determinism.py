"""Determinism: the same call twice gives bit-identical outputs and states."""

from __future__ import annotations

import numpy as np

from gdn_ref.constants import ALGORITHM_NEUMANN
from gdn_spec.impl import Implementation
from gdn_spec.regimes import Geometry, make_case

from ._support import call_args, fixed_shape, run


def test_bitwise_repeatable(gdn_impl: Implementation, gdn_algorithm: str, gdn_dtype: str) -> None:
    Hk = 4 if gdn_algorithm == ALGORITHM_NEUMANN else 2
    geometry = fixed_shape(gdn_impl.capabilities, Geometry(2, Hk, 4, 256, 64, 32), shrink_lanes=True)
    regime = "random" if gdn_algorithm == ALGORITHM_NEUMANN else "initial_state"
    case = make_case(regime, geometry, gdn_dtype, 31)
    out1, state1 = run(gdn_impl, call_args(case, gdn_algorithm, group_size=1))
    out2, state2 = run(gdn_impl, call_args(case, gdn_algorithm, group_size=1))
    # Compared into plain bools first: pytest would otherwise diff the two byte strings to explain a failure,
    # which takes minutes at this size.
    same_out = out1.tobytes() == out2.tobytes()
    same_state = np.asarray(state1).tobytes() == np.asarray(state2).tobytes()
    assert same_out, "out differs between two identical calls"
    assert same_state, "state differs between two identical calls"
