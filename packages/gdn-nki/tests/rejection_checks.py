"""The one assertion of a refused call at a host or torch entry point: a ``ContractError`` naming the argument, the
value, the rule and the fix, with every buffer keeping its bytes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from gdn_ref.contract import ContractError


def assert_refused(
    call: Callable[[], Any], rule_id: str, argument: str, value: str, buffers: list[np.ndarray]
) -> ContractError:
    """``call()`` raises a ContractError whose violation ``rule_id`` names ``argument`` and ``value``, with a rule
    and a fix in its message, and every array of ``buffers`` keeps its bytes."""
    before = [b.tobytes() for b in buffers]
    with pytest.raises(ContractError) as info:
        call()
    found = [v for v in info.value.violations if v.rule_id == rule_id]
    assert found, f"expected [{rule_id}], got {[v.rule_id for v in info.value.violations]}: {info.value}"
    message = str(info.value)
    assert f"`{argument}`" in message and found[0].argument == argument, message
    assert value in found[0].value, f"the value {value!r} is not in {found[0].value!r}"
    assert f"[{rule_id}] {found[0].rule}" in message and f"Fix: {found[0].fix}" in message, message
    assert [b.tobytes() for b in buffers] == before, "a rejected call changed a buffer"
    return info.value
