"""Helpers of the decode family's modules (``test_decode_*``): drawing shapes and addressing within what a decode
kernel declares, calling it, and checking the pool."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import strategies as st

from ..decode.capabilities import DecodeCapabilities
from ..decode.cases import Addressing, DecodeCase, DecodeGeometry
from ..impl import Implementation
from ..regimes import EQUAL_HEAD_GEOMETRIES, HEAD_GEOMETRIES
from ._support import changed, snapshot

# Decode is O(T) per request: a few requests of a few tokens cover every code path (padding among them, GQA,
# head dims with a partial tile) at simulator speed.
MAX_REQUESTS = 3
MAX_TOKENS = 4
DECODE_HEAD_DIMS = (16, 64, 100, 128)
# The sizes of fixed-shape tests: two key heads shared by four value heads, Dk ≠ Dv (a transposed state shows).
BASE = DecodeGeometry(N=3, T=1, Hk=2, Hv=4, Dk=32, Dv=16)


def caps_of(impl: Implementation) -> DecodeCapabilities:
    caps = impl.capabilities
    assert isinstance(caps, DecodeCapabilities), "a decode-family test ran for a prefill kernel"
    return caps


def require(*reasons: str | None) -> None:
    """Skip with the first reason given (a capability the test needs and the kernel does not declare)."""
    for reason in reasons:
        if reason:
            pytest.skip(reason)


def base_geometry(caps: DecodeCapabilities, tokens: int = 1, requests: int = BASE.N) -> DecodeGeometry:
    """The fixed-shape test's sizes within the declared support (Hk == Hv without GQA, fewer requests above
    max_requests); skipped when T is above max_tokens."""
    if not caps.allows_tokens(tokens):
        pytest.skip(f"T={tokens}: {caps.declaring('max_tokens')}")
    hk = BASE.Hk if caps.gqa else BASE.Hv
    n = min(requests, caps.max_requests or requests)
    return DecodeGeometry(N=n, T=tokens, Hk=hk, Hv=BASE.Hv, Dk=BASE.Dk, Dv=BASE.Dv)


@st.composite
def decode_shapes(draw: st.DrawFn, caps: DecodeCapabilities, *, min_tokens: int = 1) -> DecodeGeometry:
    """A decode call's sizes within the declared support."""
    top = min(MAX_TOKENS, caps.max_tokens or MAX_TOKENS)
    if not (caps.final_state_only or caps.per_token_states):  # no addressing form carries T > 1
        top = 1
    hk, hv = draw(st.sampled_from(HEAD_GEOMETRIES if caps.gqa else EQUAL_HEAD_GEOMETRIES))
    return DecodeGeometry(
        N=draw(st.integers(1, min(MAX_REQUESTS, caps.max_requests or MAX_REQUESTS))),
        T=draw(st.integers(min(min_tokens, top), top)),
        Hk=hk,
        Hv=hv,
        Dk=draw(st.sampled_from(DECODE_HEAD_DIMS)),
        Dv=draw(st.sampled_from(DECODE_HEAD_DIMS)),
    )


@st.composite
def addressings(draw: st.DrawFn, caps: DecodeCapabilities, geometry: DecodeGeometry) -> Addressing:
    """An addressing of the pool the kernel declares: per-token rows (and num_accepted_tokens) where it can,
    required for T > 1 when it takes no [N] indices there; padding requests where it can, one live one kept."""
    per_token = caps.per_token_states and (draw(st.booleans()) or (geometry.T > 1 and not caps.final_state_only))
    accepted = per_token and caps.num_accepted_tokens and draw(st.booleans())
    padding = draw(st.integers(0, geometry.N - 1)) if caps.padding else 0
    return Addressing(per_token=per_token, accepted=accepted, padding=padding)


def unsupported_call(caps: DecodeCapabilities, geometry: DecodeGeometry, addressing: Addressing) -> str | None:
    """Why a fixed call is outside the declared support, or None."""
    if geometry.T > 1 and not addressing.per_token and not caps.final_state_only:
        return f"T={geometry.T} with [N] indices: {caps.declaring('final_state_only')}"
    checks = (
        (addressing.per_token, "per_token_states"),
        (addressing.accepted, "num_accepted_tokens"),
        (addressing.padding, "padding"),
    )
    return next((caps.declaring(key) for needed, key in checks if needed and not getattr(caps, key)), None)


def call_of(case: DecodeCase) -> dict[str, Any]:
    """Fresh copies of the case's keyword arguments (every call starts from the case's values)."""
    return {name: x.copy() if isinstance(x, np.ndarray) else x for name, x in case.call.items()}


def run_decode(impl: Implementation, call: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Call the decode kernel; return (out, the pool after the call).

    Every call checks that the inputs are as they were (the pool too, for a kernel whose adapter returns a new
    pool) and, for an in-place kernel, that the pool returned is the caller's object.
    """
    caps = caps_of(impl)
    writable = {"state_pool"} if caps.state_in_place else set()
    before = {name: data for name, data in snapshot(call).items() if name not in writable}
    result = impl(**call)
    for name in changed(before, call):
        shown = impl.argument_name(name)
        pytest.fail(f"the call changed the caller's `{shown}`: the inputs are read only", pytrace=False)
    if not isinstance(result, tuple) or len(result) != 2:
        pytest.fail(f"a decode step returns (out, state_pool); got {type(result).__name__}", pytrace=False)
    out, pool = result
    if caps.state_in_place and pool is not call["state_pool"]:
        pytest.fail("the pool returned is not the caller's state_pool: it is updated in place and returned "
                    f"({caps.declaring('state_in_place')})", pytrace=False)  # fmt: skip
    return np.asarray(out), np.asarray(pool)


def untouched_rows_changed(case: DecodeCase, pool: np.ndarray) -> list[int]:
    """The pool rows no live request names whose bytes changed."""
    written = set(case.written_rows().tolist())
    return [r for r in range(pool.shape[0]) if r not in written and pool[r].tobytes() != case.pool_before[r].tobytes()]
