"""The float64 token-by-token oracle of the gated delta rule: the semantics every other path is checked against."""

from __future__ import annotations

import numpy as np


def value_head_to_key_head(num_key_heads: int, num_value_heads: int) -> np.ndarray:
    """Key/query head read by each value head: value head h reads key head h // (Hv // Hk).

    Args:
        num_key_heads (int): Hk.
        num_value_heads (int): Hv, a multiple of Hk.

    Returns:
        np.ndarray: [Hv] int64, the key head index of every value head.
    """
    if num_value_heads % num_key_heads:
        raise ValueError(f"Hv={num_value_heads} must be a multiple of Hk={num_key_heads}")
    return np.arange(num_value_heads) // (num_value_heads // num_key_heads)


def recurrent(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    g_log: np.ndarray,
    beta: np.ndarray,
    scale: float = 1.0,
    initial_state: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Gated delta rule, one token at a time, in float64.

    Dimensions:
        B: batch. Hk: key/query heads. Hv: value heads (a multiple of Hk). S: tokens. Dk, Dv: head dims.

    Args:
        query (np.ndarray): [B, Hk, S, Dk], any float dtype.
        key (np.ndarray): [B, Hk, S, Dk], any float dtype.
        value (np.ndarray): [B, Hv, S, Dv], any float dtype.
        g_log (np.ndarray): [B, Hv, S], per-token log-decay (≤ 0).
        beta (np.ndarray): [B, Hv, S], per-token update strength.
        scale (float): multiplies every output (the same as pre-scaling q).
        initial_state (np.ndarray | None): [B, Hv, Dk, Dv] state before token 0; None means zeros.

    Returns:
        tuple[np.ndarray, np.ndarray]: out [B, Hv, S, Dv] float64 and the final state [B, Hv, Dk, Dv] float64.

    Notes:
        Per value head h (reading key head h // (Hv//Hk)) and token t, with S a [Dk, Dv] matrix:

            S   ← exp(g_t) · S                 decay first
            u_t = β_t · (v_t − Sᵀ k_t)         the delta uses the DECAYED state
            S   ← S + k_t u_tᵀ                 rank-1 write
            o_t = scale · Sᵀ q_t               read AFTER the write (causal including the diagonal)

        No input is modified: every array is converted to a fresh float64 copy first.
    """
    B, Hk, S, Dk = query.shape
    Hv, Dv = value.shape[1], value.shape[3]
    key_head = value_head_to_key_head(Hk, Hv)
    # Repeat the shared key/query heads per value head; clarity over memory in the oracle.
    q = np.asarray(query, dtype=np.float64)[:, key_head]  # [B, Hv, S, Dk]
    k = np.asarray(key, dtype=np.float64)[:, key_head]
    v = np.asarray(value, dtype=np.float64)
    alpha = np.exp(np.asarray(g_log, dtype=np.float64))  # [B, Hv, S]
    b = np.asarray(beta, dtype=np.float64)

    state = np.zeros((B, Hv, Dk, Dv)) if initial_state is None else np.array(initial_state, dtype=np.float64)
    out = np.empty((B, Hv, S, Dv))
    for t in range(S):
        k_t, q_t = k[:, :, t, None, :], q[:, :, t, None, :]  # row vectors [B, Hv, 1, Dk]
        state *= alpha[:, :, t, None, None]  # S ← α_t S
        u_t = b[:, :, t, None] * (v[:, :, t] - (k_t @ state)[:, :, 0])  # u_t = β_t (v_t − Sᵀk_t)
        state += k_t.swapaxes(-1, -2) * u_t[:, :, None, :]  # S ← S + k_t u_tᵀ
        out[:, :, t] = scale * (q_t @ state)[:, :, 0]  # o_t = scale · Sᵀq_t
    return out, state
