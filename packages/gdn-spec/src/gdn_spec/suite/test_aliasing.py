"""Aliasing of ``recurrent_state``: supplied, it IS the returned state, updated in place from its own contents;
omitted, the implementation starts from zeros and returns a fresh float32 array."""

from __future__ import annotations

import numpy as np
import pytest

from gdn_ref.constants import ALGORITHM_NEUMANN, ALGORITHM_SCHUR
from gdn_spec.contract import BASE_GEOMETRY
from gdn_spec.impl import Implementation
from gdn_spec.metrics import compare
from gdn_spec.regimes import make_case

from ..oracle import errors_vs_oracle, oracle
from ._support import assert_close, call_args, fixed_shape, run

SCHUR = pytest.mark.parametrize("gdn_algorithm", [ALGORITHM_SCHUR])  # neumann supports only the omitted form
# Object identity and in-place writes are API promises; the state's values (in and out) are checked in every profile.
IN_PLACE = pytest.mark.gdn_requires("in_place_state")


def _state_case(impl: Implementation, dtype: str, seed: int = 7):
    return make_case(
        "initial_state", fixed_shape(impl.capabilities, BASE_GEOMETRY[ALGORITHM_SCHUR], shrink_lanes=True), dtype, seed
    )


@SCHUR
@IN_PLACE
def test_returned_state_is_the_supplied_object(gdn_impl: Implementation, gdn_algorithm: str, gdn_dtype: str) -> None:
    args = call_args(_state_case(gdn_impl, gdn_dtype), gdn_algorithm)
    buffer = args["recurrent_state"]
    _, state = gdn_impl(**args)
    assert state is buffer, "the returned state must be the supplied recurrent_state object (aliased), not a copy"


@SCHUR
@IN_PLACE
def test_supplied_state_updated_in_place(gdn_impl: Implementation, gdn_algorithm: str, gdn_dtype: str) -> None:
    case = _state_case(gdn_impl, gdn_dtype)
    args = call_args(case, gdn_algorithm)
    buffer = args["recurrent_state"]
    run(gdn_impl, args)
    _, ref_state = oracle(case)
    assert_close([compare("state", buffer, ref_state, gdn_dtype)], "caller's buffer after the call")


@SCHUR
def test_incoming_contents_are_the_initial_state(gdn_impl: Implementation, gdn_algorithm: str, gdn_dtype: str) -> None:
    case = _state_case(gdn_impl, gdn_dtype, seed=8)
    out, state = run(gdn_impl, call_args(case, gdn_algorithm))
    assert_close(errors_vs_oracle(case, out, np.array(state)), "nonzero incoming state")


@IN_PLACE
@pytest.mark.parametrize("gdn_algorithm", [ALGORITHM_SCHUR, ALGORITHM_NEUMANN])
def test_omitted_state_starts_from_zero_in_a_fresh_array(
    gdn_impl: Implementation, gdn_algorithm: str, gdn_dtype: str
) -> None:
    case = make_case(
        "random", fixed_shape(gdn_impl.capabilities, BASE_GEOMETRY[gdn_algorithm], shrink_lanes=True), gdn_dtype, 9
    )
    args = call_args(case, gdn_algorithm)
    out, state = run(gdn_impl, args)
    assert state.dtype == np.float32, f"omitted-state output must be float32, got {state.dtype}"
    inputs = [x for x in args.values() if isinstance(x, np.ndarray)]
    assert not any(np.shares_memory(state, x) for x in inputs), "the fresh state must not alias an input"
    assert_close(errors_vs_oracle(case, out, state), "omitted state (zeros start)")
    first = state.copy()
    _, second = run(gdn_impl, call_args(case, gdn_algorithm))
    assert second is not state, "each call with an omitted state must return a new array"
    assert np.array_equal(state, first), "a later call changed the state array returned by an earlier one"


@SCHUR
def test_supplied_zeros_equal_omitted(gdn_impl: Implementation, gdn_algorithm: str, gdn_dtype: str) -> None:
    geometry = fixed_shape(gdn_impl.capabilities, BASE_GEOMETRY[gdn_algorithm], shrink_lanes=True)
    case = make_case("random", geometry, gdn_dtype, 10)
    out_omitted, state_omitted = run(gdn_impl, call_args(case, gdn_algorithm))
    zeros = make_case("random", geometry, gdn_dtype, 10, supply_state=True)
    out_zeros, state_zeros = run(gdn_impl, call_args(zeros, gdn_algorithm))
    errors = [
        compare("out", out_zeros, out_omitted.astype(np.float64), gdn_dtype),
        compare("state", state_zeros, state_omitted, gdn_dtype),
    ]
    assert_close(errors, "supplied zero state vs omitted")
