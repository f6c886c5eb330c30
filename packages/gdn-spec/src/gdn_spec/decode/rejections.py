"""Invalid decode calls, one per rule of ``gdn_ref.contract.validate_step`` and the host's value checks: each
built from a valid call (``valid_call``), with the argument its rejection must name.

The suite's ``test_decode_rejection`` makes each call; ``tests/test_decode_family.py`` checks each breaks the rule
it names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .capabilities import DecodeCapabilities
from .cases import Addressing, DecodeGeometry, make_decode_case


@dataclass(frozen=True)
class DecodeRejection:
    """One invalid call: built from a valid one, the argument its rejection must name, what the kernel must
    support for the call to mean anything (a capability flag, or a gating form)."""

    id: str
    argument: str
    build: Callable[[dict[str, Any]], dict[str, Any]]
    needs: tuple[str, ...] = ()
    fused: bool = False


def _set(name: str, where: tuple, value: Any) -> Callable[[dict], dict]:
    def build(call: dict) -> dict:
        call[name][where] = value
        return call

    return build


def _replace(name: str, make: Callable[[dict], Any]) -> Callable[[dict], dict]:
    def build(call: dict) -> dict:
        call[name] = make(call)
        return call

    return build


def _read_only_pool(call: dict) -> dict:
    call["state_pool"].flags.writeable = False
    return call


def _first_index(call: dict, value: int) -> dict:
    call["state_indices"].reshape(-1)[0] = value
    return call


def _duplicate(call: dict) -> dict:
    rows = call["state_indices"].reshape(call["state_indices"].shape[0], -1)
    rows[1, 0] = rows[0, 0]
    return call


def _fused_gate_nan(call: dict) -> dict:
    """exp(A_log) overflows to inf and softplus(a + dt_bias) underflows to 0: g = -inf·0 = NaN."""
    call["A_log"][0] = 100.0
    call["a"][0, 0, 0] = -200.0
    return call


def _both_gates(call: dict) -> dict:
    call["g_log"] = np.full_like(call["a"], -0.1)
    call["beta"] = np.full_like(call["a"], 0.5)
    return call


def _no_gates(call: dict) -> dict:
    for name in ("g_log", "beta", "a", "b", "A_log", "dt_bias"):
        call.pop(name, None)
    return call


def _nan_in_read_row(call: dict) -> dict:
    row = call["state_indices"].reshape(call["state_indices"].shape[0], -1)[0, 0]
    call["state_pool"][row, 0, 0, 0] = np.nan
    return call


CASES = (
    DecodeRejection("index_past_pool", "state_indices", lambda c: _first_index(c, c["state_pool"].shape[0])),
    DecodeRejection("index_below_padding", "state_indices", lambda c: _first_index(c, -2)),
    DecodeRejection("duplicate_live_rows", "state_indices", _duplicate),
    DecodeRejection("mixed_padding_row", "state_indices", _set("state_indices", (0, 0), -1), ("per_token_states",)),
    DecodeRejection(
        "accepted_zero", "num_accepted_tokens", _set("num_accepted_tokens", (0,), 0), ("num_accepted_tokens",)
    ),
    DecodeRejection(
        "accepted_above_T",
        "num_accepted_tokens",
        lambda c: _set("num_accepted_tokens", (0,), c["query"].shape[1] + 1)(c),
        ("num_accepted_tokens",),
    ),
    DecodeRejection(
        "index_dtype", "state_indices", _replace("state_indices", lambda c: c["state_indices"].astype(np.float32))
    ),
    DecodeRejection("nan_query", "query", _set("query", (0, 0, 0, 0), np.nan)),
    DecodeRejection("inf_value", "value", _set("value", (0, 0, 0, 0), np.inf)),
    DecodeRejection("positive_g_log", "g_log", _set("g_log", (0, 0, 0), 0.5)),
    DecodeRejection("beta_above_one", "beta", _set("beta", (0, 0, 0), 1.5)),
    DecodeRejection("fused_gate_nan", "A_log", _fused_gate_nan, fused=True),
    DecodeRejection("both_gating_forms", "g_log", _both_gates, fused=True),
    DecodeRejection("no_gates", "g_log", _no_gates),
    DecodeRejection("pool_dtype", "state_pool", _replace("state_pool", lambda c: c["state_pool"].astype(np.float64))),
    DecodeRejection(
        "pool_heads", "state_pool", _replace("state_pool", lambda c: np.ascontiguousarray(c["state_pool"][:, :-1]))
    ),
    DecodeRejection(
        "pool_transposed",
        "state_pool",
        _replace("state_pool", lambda c: np.ascontiguousarray(np.swapaxes(c["state_pool"], -1, -2))),
    ),
    DecodeRejection("pool_read_only", "state_pool", _read_only_pool),
    DecodeRejection("nan_in_read_row", "state_pool", _nan_in_read_row),
    DecodeRejection(
        "key_heads_mismatch",
        "key",
        _replace("key", lambda c: np.ascontiguousarray(np.concatenate([c["key"], c["key"][:, :, :1]], axis=2))),
    ),
)


def valid_call(caps: DecodeCapabilities, case: DecodeRejection, geometry: DecodeGeometry) -> dict[str, Any]:
    """The valid call ``case`` breaks: the addressing and gating it needs, at ``geometry`` (T = 2 for the
    per-token cases), fresh arrays."""
    per_token = "per_token_states" in case.needs or "num_accepted_tokens" in case.needs
    addressing = Addressing(per_token=per_token, accepted="num_accepted_tokens" in case.needs)
    tokens = 2 if per_token else 1
    gating = "fused" if case.fused else "precomputed"
    built = make_decode_case("random", replace(geometry, T=tokens), caps.dtypes[0], 41, addressing=addressing,
                             gating=gating)  # fmt: skip
    return {name: x.copy() if isinstance(x, np.ndarray) else x for name, x in built.call.items()}


__all__ = ["CASES", "DecodeRejection", "valid_call"]
