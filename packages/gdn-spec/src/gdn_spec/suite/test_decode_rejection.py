"""Rejection of invalid decode calls (``gdn_spec.decode.rejections``): the call must raise, name the argument, and
leave every buffer — the state pool above all — with its bytes."""

from __future__ import annotations

import re

import pytest

from gdn_spec.decode.rejections import CASES, DecodeRejection, valid_call
from gdn_spec.impl import Implementation

from ._decode_support import base_geometry, caps_of, require
from ._support import changed, snapshot

pytestmark = pytest.mark.gdn_requires("validation")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_rejects_invalid_call(gdn_impl: Implementation, case: DecodeRejection) -> None:
    caps = caps_of(gdn_impl)
    require(*(caps.lacks(need) for need in case.needs), caps.lacks("gating", "fused" if case.fused else "precomputed"))
    bad = case.build(valid_call(caps, case, base_geometry(caps)))
    argument = gdn_impl.argument_name(case.argument)
    before = snapshot(bad)
    with pytest.raises(Exception) as info:  # any exception type is a rejection; the message is checked
        gdn_impl(**bad)
    message = str(info.value)
    assert re.search(rf"\b{re.escape(argument)}\b", message), (
        f"[{case.id}] the rejection must name `{argument}`: {type(info.value).__name__}: {message!r}"
    )
    assert not changed(before, bad), f"[{case.id}] the rejected call modified {changed(before, bad)}"
