"""Rejection of every invalid input: one case per documented rule (gdn_spec.contract.RULE_CASES).

The call must raise, the message must name the offending argument, and nothing may be written: the
recurrent_state buffer and every other input keep their bytes.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from gdn_spec.contract import BASE_GEOMETRY, RULE_CASES, RuleCase, check_inputs, valid_call
from gdn_spec.impl import Capabilities, Implementation

from ._support import call_geometry, changed, fixed_shape, require_call_supported, snapshot, supported

pytestmark = pytest.mark.gdn_requires("validation")

PAIRS = [(algorithm, case) for case in RULE_CASES for algorithm in case.algorithms]


@pytest.mark.parametrize(("gdn_algorithm", "case"), PAIRS, ids=[f"{a}-{c.id}" for a, c in PAIRS])
def test_rejects_invalid_call(gdn_impl: Implementation, gdn_algorithm: str, case: RuleCase) -> None:
    caps = gdn_impl.capabilities
    if case.host_only and not caps.content_checks:
        pytest.skip(f"{caps.name} declares content_checks=False; [{case.id}] needs the tensor contents")
    if case.id in caps.inexpressible_rules:
        pytest.skip(f"[{case.id}] cannot be expressed through the adapter {gdn_impl.via!r}")
    # The valid call is at head dims the kernel supports, so the case is refused for its rule, not for the base
    # call's head dims. A rule about head dims is still built as written (head_dim.max: Dv = 160; dq_eq_dk: a
    # query of Dk/2): the call breaks the contract whatever the kernel declares, and a narrower support can only
    # add reasons to refuse it — the refusal must still name the argument. Its lanes are incidental too: every rule
    # holds lane by lane, so a few-lane kernel gets the base at fewer lanes (a case whose violation needs more lanes
    # than it declares is skipped below; tests/test_contract.py checks each case still breaks its rule there).
    base = BASE_GEOMETRY[gdn_algorithm]
    geometry = fixed_shape(caps, base, shrink_lanes=True)
    if case.needs_unequal_head_dims and geometry.Dk == geometry.Dv:
        declared = ", ".join(
            f"{key}={getattr(caps, key)!r}"
            for key in ("max_head_dim", "head_dims", "equal_head_dims")
            if getattr(caps, key) not in (None, False)
        )
        pytest.skip(
            f"[{case.id}] needs a call with Dk ≠ Dv (a transposed Dk == Dv state keeps its shape); {caps.name} "
            f"supports none ({declared})"
        )
    valid = valid_call(gdn_algorithm, caps.dtypes[0], geometry, seed=41)
    bad = case.build(valid)
    _require_violation_fits(caps, case, bad)
    argument = case.violation(bad).argument
    before = snapshot(bad)
    with pytest.raises(Exception) as info:  # any exception type is a rejection; the message is checked
        gdn_impl(**bad)
    message = str(info.value)
    assert re.search(rf"\b{re.escape(argument)}\b", message), (
        f"[{case.id}] rejection must name the argument `{argument}`: {message!r}"
    )
    assert not changed(before, bad), f"[{case.id}] rejected call modified {changed(before, bad)}"


def _require_violation_fits(caps: Capabilities, case: RuleCase, bad: dict) -> None:
    """Skip a rule case whose violating call grows past a declared size limit (heads.gqa_divisible's Hv = 3 above
    max_lanes=2, seq.divisible's S = 192 above max_seq_len=128): the kernel may refuse it for that limit, not the
    rule, and the suite never calls a kernel above what it declares. A head-dim rule's call is still made (see
    above); a rank violation has no sizes, and holds no more elements than the valid call it is built from."""
    geometry = call_geometry(bad)
    reason = None if geometry is None else caps.too_large(geometry)
    if reason:
        pytest.skip(f"[{case.id}] the violating call is above a declared limit: {reason}")


# Launch sizes with an empty axis: every tensor carrying the axis has size 0 along it. The call must be refused
# with an error naming an argument — not crash on the empty size (e.g. Hv // Hk with Hk = 0).
EMPTY_AXES = {"batch": {"B": 0}, "key_heads": {"Hk": 0}, "tokens": {"S": 0}}
_AXIS_OF = {"B": 0, "Hk": 1, "S": 2}


def _emptied(call: dict, sizes: dict[str, int]) -> dict:
    out = dict(call)
    for size_name in sizes:
        axis = _AXIS_OF[size_name]
        for name in ("query", "key", "value", "g_log", "beta", "recurrent_state"):
            x = call.get(name)
            if x is None or (size_name == "S" and name == "recurrent_state"):
                continue
            if size_name == "Hk" and name not in ("query", "key"):
                continue
            index = [slice(None)] * x.ndim
            index[axis] = slice(0, 0)
            out[name] = np.ascontiguousarray(x[tuple(index)])
    return out


@pytest.mark.parametrize("axis", list(EMPTY_AXES))
def test_rejects_an_empty_launch(gdn_impl: Implementation, gdn_algorithm: str, axis: str) -> None:
    geometry = supported(gdn_impl.capabilities, BASE_GEOMETRY[gdn_algorithm], shrink_lanes=True)
    valid = valid_call(gdn_algorithm, gdn_impl.capabilities.dtypes[0], geometry, seed=43)
    bad = _emptied(valid, EMPTY_AXES[axis])
    # Judged on the call made, not the base it is cut from: no tokens is within any max_seq_len.
    require_call_supported(gdn_impl.capabilities, bad)
    expected = {v.argument for v in check_inputs(**bad)}
    assert expected, f"an empty {axis} axis must break a rule"
    before = snapshot(bad)
    with pytest.raises(Exception) as info:
        gdn_impl(**bad)
    message = str(info.value)
    assert any(re.search(rf"\b{re.escape(a)}\b", message) for a in expected), (
        f"an empty {axis} axis must be refused naming one of {sorted(expected)}, got {type(info.value).__name__}: "
        f"{message!r}"
    )
    assert not changed(before, bad)
