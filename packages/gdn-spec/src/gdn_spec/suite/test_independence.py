"""Batch and head independence: a batch equals its items run alone, and changing one value head's inputs
changes no other head's outputs (including heads that share its key head)."""

from __future__ import annotations

import numpy as np
import pytest

from gdn_ref.constants import ALGORITHM_NEUMANN
from gdn_spec.impl import Implementation
from gdn_spec.metrics import compare
from gdn_spec.regimes import Geometry, make_case

from ._support import assert_close, call_args, fixed_shape, run


def _geometry(impl: Implementation, algorithm: str, B: int) -> Geometry:
    Hk = 2 if algorithm == ALGORITHM_NEUMANN else 1  # schur: both value heads share one key head
    # Several lanes are the point (no shrink_lanes): above max_lanes the test is skipped naming the limit.
    return fixed_shape(impl.capabilities, Geometry(B, Hk, 2, 128, 32, 16))


_BATCHED = ("query", "key", "value", "g_log", "beta", "recurrent_state")


def _item(args: dict, b: int) -> dict:
    return {n: np.ascontiguousarray(x[b : b + 1]) if n in _BATCHED and x is not None else x for n, x in args.items()}


def test_batch_items_are_independent(gdn_impl: Implementation, gdn_algorithm: str, gdn_dtype: str) -> None:
    geometry = _geometry(gdn_impl, gdn_algorithm, 3)
    regime = "random" if gdn_algorithm == ALGORITHM_NEUMANN else "initial_state"
    case = make_case(regime, geometry, gdn_dtype, 21)
    out, state = run(gdn_impl, call_args(case, gdn_algorithm))
    for b in range(geometry.B):
        out_b, state_b = run(gdn_impl, _item(call_args(case, gdn_algorithm), b))
        errors = [
            compare("out", out[b : b + 1], out_b.astype(np.float64), gdn_dtype),
            compare("state", state[b : b + 1], state_b, gdn_dtype),
        ]
        assert_close(errors, f"batch item {b} in a batch of {geometry.B} vs alone")


@pytest.mark.parametrize("changed_head", [0, 1])
def test_value_heads_are_independent(
    gdn_impl: Implementation, gdn_algorithm: str, gdn_dtype: str, changed_head: int
) -> None:
    geometry = _geometry(gdn_impl, gdn_algorithm, 1)
    case = make_case("random", geometry, gdn_dtype, 22)
    base = call_args(case, gdn_algorithm)
    out, state = run(gdn_impl, base)
    other = call_args(case, gdn_algorithm)
    h = changed_head
    other["value"][:, h] = -other["value"][:, h] * 3  # a large, obvious change confined to head h
    other["g_log"][:, h] *= 0.1
    other["beta"][:, h] = 1.0 - other["beta"][:, h]
    out2, state2 = run(gdn_impl, other)
    keep = [i for i in range(geometry.Hv) if i != h]
    errors = [
        compare("out", out2[:, keep], out[:, keep].astype(np.float64), gdn_dtype),
        compare("state", state2[:, keep], state[:, keep], gdn_dtype),
    ]
    assert_close(errors, f"other heads after changing value head {h}")
    assert not np.array_equal(out2[:, h], out[:, h]), f"changing head {h}'s inputs did not change its output"
