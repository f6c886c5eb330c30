"""The packed-varlen rules (``gdn_ref.packed``): each reports its own id on the argument it names, chained tables
report only their first broken rule, and ``contract.Arguments`` is the ten arguments in ``ARGUMENTS`` order."""

from __future__ import annotations

import numpy as np
import pytest

from gdn_ref.contract import ARGUMENTS, Arguments, validate
from gdn_ref.packed import (
    CU_SEQLENS_RULES,
    LAYOUT_RULES,
    POOL_RULES,
    cu_seqlens_violations,
    layout_violations,
    packed_token_count,
    pool_row_violations,
    state_indices_violations,
)

HV, DK, DV = 2, 16, 8


def _tensors(tokens: int = 96, batch: int = 1) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros((batch, 1, tokens, DK), np.float32), np.zeros((batch, HV, tokens, DV), np.float32)


CU_SEQLENS = {
    "cu_seqlens.form": (np.array([0.0, 40.0, 96.0]), 1),
    "cu_seqlens.batch": (np.array([0, 40, 96]), 2),
    "cu_seqlens.start": (np.array([1, 40, 96]), 1),
    "cu_seqlens.increasing": (np.array([0, 40, 40, 96]), 1),
    "cu_seqlens.end": (np.array([0, 40, 95]), 1),
}


@pytest.mark.parametrize("rule_id", list(CU_SEQLENS))
def test_each_cu_seqlens_rule_names_cu_seqlens(rule_id: str) -> None:
    cu, batch = CU_SEQLENS[rule_id]
    found = cu_seqlens_violations(cu, batch, 96)
    assert [v.rule_id for v in found] == [rule_id]
    assert found[0].argument == "cu_seqlens" and found[0].fix


def test_cu_seqlens_rules_after_the_form_are_reported_together() -> None:
    found = cu_seqlens_violations(np.array([1, 1, 95]), 2, 96)
    assert [v.rule_id for v in found] == [r.id for r in CU_SEQLENS_RULES[1:]]
    assert cu_seqlens_violations(np.array([0, 40, 96]), 1, 96) == []


@pytest.mark.parametrize("indices", [[1.5, 3.0], ["3", "0"], [[3], [0]], [], [True, False]])
def test_state_indices_must_be_a_vector_of_integers(indices: object) -> None:
    assert [v.rule_id for v in state_indices_violations(indices)] == ["state_indices.form"]


def test_integer_state_indices_and_none_pass_their_form() -> None:
    assert state_indices_violations(np.array([3, 0])) == state_indices_violations(None) == []


POOL = {
    "state_indices.pool": (None, (3, 0)),
    "state_pool.shape": (np.zeros((4, HV, DK, DV + 1), np.float32), (3, 0)),
    "state_pool.rows": (np.zeros((4, HV, DK, DV), np.float32), None),
    "state_indices.count": (np.zeros((4, HV, DK, DV), np.float32), (3,)),
    "state_indices.range": (np.zeros((4, HV, DK, DV), np.float32), (3, 9)),
    "state_indices.distinct": (np.zeros((4, HV, DK, DV), np.float32), (1, 1)),
}


@pytest.mark.parametrize("rule_id", list(POOL))
def test_each_pool_rule_is_reported_alone(rule_id: str) -> None:
    query, value = _tensors()
    pool, rows = POOL[rule_id]
    found = layout_violations(query, value, "schur", pool, (1, 1), rows, padded=False)
    assert [v.rule_id for v in found] == [rule_id]


def test_pool_rules_wait_for_the_tensors_and_the_layout() -> None:
    query, value = _tensors()
    pool, rows = POOL["state_indices.range"]
    assert layout_violations(query, value, "schur", pool, (1, 1), rows, tensors_valid=False, padded=False) == []
    found = layout_violations(query, value, "schur", pool, (1, 1), rows)  # padded: 2 chunks cannot cover 96 tokens
    assert [v.rule_id for v in found] == ["varlen.cover"]
    assert [r.id for r in LAYOUT_RULES + POOL_RULES][-1] == "state_indices.distinct"


def test_a_layout_over_packed_tokens_passes() -> None:
    query, value = _tensors(tokens=256)
    pool = np.zeros((4, HV, DK, DV), np.float32)
    assert layout_violations(query, value, "schur", pool, (1, 1), (3, 0)) == []


def test_cu_seqlens_is_not_judged_against_a_broken_token_axis() -> None:
    query, value = _tensors()
    g = np.zeros((1, HV, 96), np.float32)
    found = validate(query[0], query, value, g, g)  # a 3-D query
    assert packed_token_count(query[0], found) is None
    assert packed_token_count(query, validate(query, query, value, g, g)) == 96


def test_pool_row_violations_name_the_pool_row_of_the_first_bad_value() -> None:
    rows_state = np.zeros((2, HV, DK, DV), np.float32)
    rows_state[1, 0, 2, 4] = np.inf
    (found,) = pool_row_violations(rows_state, (5, 3))
    assert found.rule_id == "recurrent_state.finite" and "pool row 3 (sequence 1)" in found.value
    (found,) = pool_row_violations(rows_state, None)
    assert "sequence 1, index [1, 0, 2, 4]" in found.value
    assert pool_row_violations(np.zeros_like(rows_state), (5, 3)) == []


def test_arguments_are_the_contract_arguments_in_order() -> None:
    query, value = _tensors(tokens=128)
    g = np.zeros((1, HV, 128), np.float32)
    call = Arguments(query, query, value, g, g, 0.5, "schur", None, 4, None)
    assert tuple(call.as_kwargs()) == ARGUMENTS
    assert call.astuple() == tuple(call.as_kwargs().values())
    assert call.violations() == validate(*call.astuple()) != []  # schur without a mask pack
    assert call.replace(algorithm="neumann").algorithm == "neumann" and call.algorithm == "schur"


@pytest.mark.parametrize("end", [95, 97])
def test_cu_seqlens_must_end_exactly_at_the_token_count(end: int) -> None:
    assert [v.rule_id for v in cu_seqlens_violations(np.array([0, 40, end]), 1, 96)] == ["cu_seqlens.end"]
