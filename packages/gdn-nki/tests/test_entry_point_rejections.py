"""Calls at the edges of the host entry points (issue 41): each is refused with a ``ContractError`` naming the
argument, its value, the rule and the fix — never a raw IndexError, a bare AssertionError or a silent wrong result
— and every buffer keeps its bytes."""

from __future__ import annotations

import numpy as np
import pytest

import gdn_nki
from decode_inputs import step_inputs
from rejection_checks import assert_refused

# --- decode_step: the indices' own rules are reported before any row is read from them (issue 41, item 1) ---

STEP_ROWS = np.array([[0, 1], [2, 3], [4, 5]], np.int32)  # N = 3 requests, T = 2


@pytest.mark.parametrize(
    ("change", "rule_id", "argument", "value"),
    [
        (dict(num_accepted_tokens=np.array([1, 2], np.int32)), "num_accepted_tokens.shape", "num_accepted_tokens",
         "shape (2,)"),
        (dict(num_accepted_tokens=np.array(1, np.int32)), "num_accepted_tokens.rank", "num_accepted_tokens",
         "shape ()"),
        (dict(num_accepted_tokens=np.ones((3, 1), np.int32)), "num_accepted_tokens.rank", "num_accepted_tokens",
         "shape (3, 1)"),
        (dict(state_indices=None), "state_indices.required", "state_indices", "None"),
        (dict(state_indices=np.array(0, np.int32)), "state_indices.rank", "state_indices", "shape ()"),
    ],
    ids=["accepted_short", "accepted_0d", "accepted_N_by_1", "indices_none", "indices_0d"],
)  # fmt: skip
def test_decode_step_refuses_malformed_indices_before_reading_rows(change, rule_id, argument, value) -> None:
    x = step_inputs(41, "float32", N=3, T=2, P=8)
    call = {"state_indices": STEP_ROWS, "num_accepted_tokens": np.array([1, 2, 2], np.int32), **change}
    assert_refused(
        lambda: gdn_nki.decode_step(x.query, x.key, x.value, x.pool, **call, **x.gates(False)),
        rule_id, argument, value, [x.pool, STEP_ROWS],
    )  # fmt: skip


def test_decode_step_refuses_zero_requests() -> None:
    x = step_inputs(42, "float32", N=3, T=2, P=8)
    empty = {name: a[:0] for name, a in (("query", x.query), ("key", x.key), ("value", x.value))}
    gates = {name: a[:0] for name, a in x.gates(False).items()}
    assert_refused(
        lambda: gdn_nki.decode_step(**empty, state_pool=x.pool, state_indices=STEP_ROWS[:0], **gates),
        "query.rank", "query", "shape (0, 2, 2, 32)", [x.pool],
    )  # fmt: skip
