"""Every documented rule has a violation builder, and each builder's call breaks exactly its rule."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from gdn_ref.contract import RULES
from gdn_spec.contract import BASE_GEOMETRY, MISSING_BUILDERS, RULE_CASES, check_inputs, valid_call
from gdn_spec.impl import Capabilities
from gdn_spec.suite._support import call_geometry, supported

PAIRS = [(a, c) for c in RULE_CASES for a in c.algorithms]


def test_every_rule_has_exactly_one_case() -> None:
    assert MISSING_BUILDERS == ()
    assert [c.id for c in RULE_CASES] == [r.id for r in RULES]


@pytest.mark.parametrize("algorithm", ["schur", "neumann"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_valid_call_is_valid(algorithm: str, dtype: str) -> None:
    assert check_inputs(**valid_call(algorithm, dtype)) == []


@pytest.mark.parametrize(("algorithm", "case"), PAIRS, ids=[f"{a}-{c.id}" for a, c in PAIRS])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_builder_breaks_exactly_its_rule(algorithm: str, case, dtype: str) -> None:
    base = valid_call(algorithm, dtype)
    before = {n: x.tobytes() for n, x in base.items() if isinstance(x, np.ndarray)}
    bad = case.build(base)
    flagged = {v.rule_id for v in check_inputs(**bad)}
    assert flagged == {case.id} | case.also
    assert case.violation(bad).argument in (*case.rule.arguments, "query", "recurrent_state")
    assert all(base[n].tobytes() == b for n, b in before.items()), "a builder modified the valid call"


@pytest.mark.parametrize(("algorithm", "case"), PAIRS, ids=[f"{a}-{c.id}" for a, c in PAIRS])
def test_needs_unequal_head_dims_marks_exactly_the_builders_a_square_call_defeats(algorithm: str, case) -> None:
    """A kernel declaring equal_head_dims gets its rejection cases built from a Dk == Dv call: every builder must
    still break its rule there, except the ones marked needs_unequal_head_dims (which the suite then skips)."""
    square = replace(BASE_GEOMETRY[algorithm], Dk=16, Dv=16)
    bad = case.build(valid_call(algorithm, "float32", square))
    broken = case.id in {v.rule_id for v in check_inputs(**bad)}
    assert broken != case.needs_unequal_head_dims, (case.id, case.needs_unequal_head_dims)


# Rule cases whose violating call itself has two lanes or more (Hv = 3 over Hk = 2; neumann with Hk = 1, Hv = 2):
# the suite skips them for a one-lane kernel (test_rejection._require_violation_fits).
NEEDS_LANES = {"heads.gqa_divisible": 3, "neumann.no_gqa": 2}


@pytest.mark.parametrize(("algorithm", "case"), PAIRS, ids=[f"{a}-{c.id}" for a, c in PAIRS])
@pytest.mark.parametrize("max_lanes", [1, 2])
def test_every_builder_still_breaks_exactly_its_rule_at_fewer_lanes(algorithm: str, case, max_lanes: int) -> None:
    """A kernel declaring max_lanes gets its rejection cases built from the base call at fewer lanes (the suite's
    ``supported(..., shrink_lanes=True)``): each builder must still break exactly its rule there — one that stopped
    breaking it would be passed by a kernel accepting the call — unless its violation needs more lanes than
    declared, which the suite skips."""
    caps = Capabilities.from_mapping({"max_lanes": max_lanes}, "k")
    base = supported(caps, BASE_GEOMETRY[algorithm], shrink_lanes=True)
    assert base.lanes <= max_lanes and base.Hv % base.Hk == 0, base
    bad = case.build(valid_call(algorithm, "float32", base))
    geometry = call_geometry(bad)
    if geometry is not None and geometry.lanes > max_lanes:
        assert NEEDS_LANES.get(case.id, 0) > max_lanes, (case.id, geometry)
        return
    assert case.id not in NEEDS_LANES or NEEDS_LANES[case.id] <= max_lanes, (case.id, geometry)
    assert {v.rule_id for v in check_inputs(**bad)} == {case.id} | case.also, case.id


def test_violation_message_names_argument_value_rule_and_fix() -> None:
    bad = next(c for c in RULE_CASES if c.id == "beta.dtype").build(valid_call())
    (violation,) = check_inputs(**bad)
    text = str(violation)
    assert "`beta`" in text and "float16" in text and "[beta.dtype]" in text and "Fix:" in text
