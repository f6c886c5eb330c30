"""What the entry-point rejection tests share: the one assertion of a refused call (a ``ContractError`` naming the
argument, the value, the rule and the fix, with every buffer keeping its bytes), small packed batches and pools,
and a clean bucket configuration."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import gdn_nki
from gdn_ref.contract import ContractError
from gdn_spec.regimes import Geometry
from nki_inputs import case

HK, HV, DK, DV = 1, 2, 32, 16
C = gdn_nki.CHUNK_BY_ALGORITHM["schur"]
TENSORS = ("query", "key", "value", "g_log", "beta")


def packed_tensors(total: int, seed: int) -> dict[str, np.ndarray]:
    """Head-major q, k, v, g_log, beta of ``total`` tokens: any cut of them by cu_seqlens is a packed batch."""
    c = case("float32", Geometry(B=1, Hk=HK, Hv=HV, S=total, Dk=DK, Dv=DV), seed)
    return {name: c.kernel[name].copy() for name in TENSORS}


def random_pool(rows: int, seed: int) -> np.ndarray:
    """A state pool of ``rows`` rows of seeded normal values."""
    return np.random.default_rng(seed).standard_normal((rows, HV, DK, DV)).astype(np.float32)


@pytest.fixture
def no_buckets():
    """No configured bucket before the test and after it (``configure_buckets`` is process-wide)."""
    gdn_nki.configure_buckets([])
    yield
    gdn_nki.configure_buckets([])


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
