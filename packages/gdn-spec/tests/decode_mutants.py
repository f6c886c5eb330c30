"""Deliberately broken decode kernels (``decode_step``'s signature): the decode family must fail every one.

Each is the same small float64 decode step behind the documented shell — ``gdn_ref.contract.validate_step``
checks, padding rows skipped, the pool updated in place only after the step completed — with exactly one thing
changed. ``CORRECT`` is the unbroken version, which must pass the same runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from gdn_ref.contract import ContractError, validate_step
from gdn_ref.decode import decode_steps, fused_gates

CAPS = {"name": "decode mutant"}


def _gates(call: dict[str, Any], flaw: str | None) -> tuple[np.ndarray, np.ndarray]:
    if call.get("g_log") is not None:
        return call["g_log"].astype(np.float64), call["beta"].astype(np.float64)
    a, b, A_log, dt_bias = (call[name].astype(np.float64) for name in ("a", "b", "A_log", "dt_bias"))
    if flaw == "gate_without_softplus":
        return -np.exp(A_log) * (a + dt_bias), 1.0 / (1.0 + np.exp(-b))
    g, beta = fused_gates(a, b, A_log, dt_bias)
    return (-g if flaw == "gate_sign" else g), beta


def _check_values(call: dict[str, Any], read: np.ndarray) -> None:
    """What the shell checks besides ``validate_step``: a writable pool, gates in their domains and finite pool
    rows to be read (each error names the argument)."""
    if not call["state_pool"].flags.writeable:
        raise ValueError("state_pool is read-only; it is updated in place")
    if call.get("g_log") is not None and not (call["g_log"] <= 0).all():
        raise ValueError("g_log must be a log-decay <= 0")
    if call.get("beta") is not None and not ((call["beta"] >= 0) & (call["beta"] <= 1)).all():
        raise ValueError("beta must be in [0, 1]")
    if not np.isfinite(call["state_pool"][read[read >= 0]]).all():
        raise ValueError("state_pool: a row to be read holds NaN or Inf")


def step(flaw: str | None = None) -> Callable[..., tuple[np.ndarray, np.ndarray]]:
    """A decode kernel with one named flaw (None: correct)."""

    def decode_step(query, key, value, state_pool, state_indices, num_accepted_tokens=None, *, g_log=None,
                    beta=None, a=None, b=None, A_log=None, dt_bias=None, scale=None, use_qk_l2norm=False):  # fmt: skip
        call = dict(query=query, key=key, value=value, g_log=g_log, beta=beta, a=a, b=b, A_log=A_log,
                    dt_bias=dt_bias, state_pool=state_pool, state_indices=state_indices,
                    num_accepted_tokens=num_accepted_tokens)  # fmt: skip
        scale = query.shape[-1] ** -0.5 if scale is None else scale
        violations = validate_step(call, scale, use_qk_l2norm)
        if violations:
            raise ContractError(violations)
        n = query.shape[0]
        rows = np.asarray(state_indices).reshape(n, -1).astype(np.int64)
        column = np.zeros(n, np.int64) if num_accepted_tokens is None else np.asarray(num_accepted_tokens) - 1
        if flaw == "writes_before_checking":  # a shell that starts writing before every check has passed
            state_pool[rows[rows >= 0][:1]] = 0.0
        _check_values(call, rows[np.arange(n), column])
        if flaw == "accepted_off_by_one":
            column = np.minimum(column + 1, rows.shape[1] - 1)
        read = rows[np.arange(n), column]
        live = read >= 0 if flaw != "padding_as_last_row" else np.ones(n, bool)
        g, bt = _gates(call, flaw)
        heads = np.arange(value.shape[2]) // (value.shape[2] // query.shape[2])
        q, k = query[:, :, heads], key[:, :, heads]
        out = np.zeros(value.shape, np.float64)
        o, states = decode_steps(q[live], k[live], value[live], g[live], bt[live], scale, state_pool[read[live]],
                                 l2norm=use_qk_l2norm)  # fmt: skip
        out[live] = o
        if flaw == "drops_last_update":
            previous = np.concatenate([state_pool[read[live]][:, None].astype(np.float64), states[:, :-1]], axis=1)
            states = np.concatenate([states[:, :-1], previous[:, -1:]], axis=1)
        writes = rows[live]
        if rows.shape[1] == 1:
            state_pool[writes[:, 0]] = states[:, -1]
        else:
            state_pool[writes.reshape(-1)] = states.reshape(-1, *states.shape[2:])
        if flaw == "writes_unnamed_row":
            unnamed = np.setdiff1d(np.arange(state_pool.shape[0]), rows[rows >= 0])
            state_pool[unnamed[0]] = states[0, -1]
        return out.astype(query.dtype), state_pool

    decode_step.gdn_spec_decode_capabilities = CAPS
    return decode_step


CORRECT = step()
# flaw -> (the area its run is restricted to, a -k filter): each must fail there.
FLAWS = {
    "padding_as_last_row": ("decode_pool", "padding"),
    "writes_unnamed_row": ("decode_pool", "named_rows"),
    "accepted_off_by_one": ("decode_speculative", ""),
    "gate_sign": ("decode_numerics", "fused"),
    "gate_without_softplus": ("decode_numerics", "fused"),
    "drops_last_update": ("decode_numerics", "random"),
    "writes_before_checking": ("decode_rejection", ""),
}
globals().update({name: step(name) for name in FLAWS})
