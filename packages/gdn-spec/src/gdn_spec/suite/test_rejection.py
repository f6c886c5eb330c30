"""Rejection of every invalid input: one case per documented rule (gdn_spec.contract.RULE_CASES).

The call must raise, the message must name the offending argument, and nothing may be written: the
recurrent_state buffer and every other input keep their bytes.
"""

from __future__ import annotations

import re

import pytest

from gdn_spec.contract import RULE_CASES, RuleCase, valid_call
from gdn_spec.impl import Implementation

from ._support import changed, snapshot

pytestmark = pytest.mark.gdn_requires("validation")

PAIRS = [(algorithm, case) for case in RULE_CASES for algorithm in case.algorithms]


@pytest.mark.parametrize(("gdn_algorithm", "case"), PAIRS, ids=[f"{a}-{c.id}" for a, c in PAIRS])
def test_rejects_invalid_call(gdn_impl: Implementation, gdn_algorithm: str, case: RuleCase) -> None:
    caps = gdn_impl.capabilities
    if case.host_only and not caps.content_checks:
        pytest.skip(f"{caps.name} declares content_checks=False; [{case.id}] needs the tensor contents")
    if case.id in caps.inexpressible_rules:
        pytest.skip(f"[{case.id}] cannot be expressed through the adapter {gdn_impl.via!r}")
    bad = case.build(valid_call(gdn_algorithm, caps.dtypes[0], seed=41))
    argument = case.violation(bad).argument
    before = snapshot(bad)
    with pytest.raises(Exception) as info:  # any exception type is a rejection; the message is checked
        gdn_impl(**bad)
    message = str(info.value)
    assert re.search(rf"\b{re.escape(argument)}\b", message), (
        f"[{case.id}] rejection must name the argument `{argument}`: {message!r}"
    )
    assert not changed(before, bad), f"[{case.id}] rejected call modified {changed(before, bad)}"
