"""Neumann's extra restrictions: Hk == Hv (no head sharing) and only the omitted recurrent_state form."""

from __future__ import annotations

import numpy as np
import pytest

from gdn_ref.constants import ALGORITHM_NEUMANN
from gdn_spec.impl import Implementation
from gdn_spec.regimes import Geometry, make_case

from ..oracle import errors_vs_oracle
from ._support import assert_close, call_args, changed, fixed_shape, run, snapshot

NEUMANN = pytest.mark.parametrize("gdn_algorithm", [ALGORITHM_NEUMANN])


def _assert_rejected(impl: Implementation, args: dict, argument: str) -> None:
    before = snapshot(args)
    with pytest.raises(Exception) as info:  # any exception type; the message is checked
        impl(**args)
    assert argument in str(info.value), f"the rejection must name `{argument}`: {info.value}"
    assert not changed(before, args), f"rejected call modified {changed(before, args)}"


@NEUMANN
@pytest.mark.gdn_requires("validation")
def test_rejects_head_sharing(gdn_impl: Implementation, gdn_algorithm: str, gdn_dtype: str) -> None:
    # Two value heads on one key head are the point: fewer lanes would be Hk == Hv, a valid call (skipped instead).
    geometry = fixed_shape(gdn_impl.capabilities, Geometry(1, 1, 2, 64, 32, 16))
    args = call_args(make_case("random", geometry, gdn_dtype, 3), gdn_algorithm)
    _assert_rejected(gdn_impl, args, "value")


@NEUMANN
@pytest.mark.gdn_requires("validation")
@pytest.mark.parametrize("contents", ["zeros", "random"])
def test_rejects_supplied_state(gdn_impl: Implementation, gdn_algorithm: str, gdn_dtype: str, contents: str) -> None:
    regime = "initial_state" if contents == "random" else "random"
    geometry = fixed_shape(gdn_impl.capabilities, Geometry(1, 2, 2, 64, 32, 16), shrink_lanes=True)
    case = make_case(regime, geometry, gdn_dtype, 4, supply_state=True)
    args = call_args(case, gdn_algorithm)
    _assert_rejected(gdn_impl, args, "recurrent_state")


@NEUMANN
def test_accepts_equal_heads_without_state(gdn_impl: Implementation, gdn_algorithm: str, gdn_dtype: str) -> None:
    case = make_case(
        "random", fixed_shape(gdn_impl.capabilities, Geometry(2, 2, 2, 128, 32, 16), shrink_lanes=True), gdn_dtype, 5
    )
    out, state = run(gdn_impl, call_args(case, gdn_algorithm))
    assert_close(errors_vs_oracle(case, out, np.asarray(state)), "neumann Hk == Hv, omitted state")
