"""The float64 oracle of the fused GDN decode block on state pools (issue 43, items 2–3).

One decode / verify step of a GatedDeltaNet layer, everything between the layer's input and its out_proj:
in_proj (hidden → q|k|v, z, b, a), the depthwise causal conv1d over q|k|v with its window from a conv-state pool row,
SiLU, the split into heads with GQA, the fused gating (g = −exp(A_log)·softplus(a + dt_bias), β = sigmoid(b)), the
gated delta rule with its state from a recurrent-state pool row (q and k L2-normalized, scale Dk^−0.5), and the
gated RMSNorm with z. Composed from gdn-ref's own conv (``causal_conv1d_decode_pool``), gating (``fused_gates``),
recurrence (``decode_steps``) and norm (``gated_rms_norm``) oracles, so the block and the separate kernels are held
to the same arithmetic.

Projection layout (Qwen3.5's separate projections, HF transformers ``Qwen3_5GatedDeltaNet``): ``w_qkv`` [hidden,
2·Hk·Dk + Hv·Dv] with q, k, v contiguous in that order, ``w_z`` [hidden, Hv·Dv], ``w_b`` and ``w_a`` [hidden, Hv].
Value head h reads key head h // (Hv / Hk) (HF's ``repeat_interleave``).

Rows: one index per request ([N]) or per token ([N, T]) names the same row in both pools; −1 is a padding request
whose output is zero and whose rows nobody writes; with [N, T] rows and ``num_accepted_tokens`` the request starts
from both pools' row ``[n, num_accepted_tokens[n] − 1]`` and writes the state after token t into row ``[n, t]``
(speculative rollback, as ``causal_conv1d_decode_pool`` does for the conv window).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .conv import causal_conv1d_decode_pool
from .decode import decode_steps, fused_gates, gated_rms_norm


def _start_rows(rows: np.ndarray, num_accepted_tokens: Any) -> np.ndarray:
    """The pool row each request reads: column 0, or ``num_accepted_tokens − 1`` with per-token rows."""
    if rows.ndim == 2 and num_accepted_tokens is not None:
        cols = np.asarray(num_accepted_tokens).astype(np.int64).reshape(-1) - 1
        return rows[np.arange(rows.shape[0]), cols]
    return rows.reshape(rows.shape[0], -1)[:, 0]


def gdn_block_decode_pool(
    hidden: np.ndarray,
    w_qkv: np.ndarray,
    w_z: np.ndarray,
    w_b: np.ndarray,
    w_a: np.ndarray,
    conv_weight: np.ndarray,
    conv_bias: np.ndarray | None,
    A_log: np.ndarray,
    dt_bias: np.ndarray,
    norm_weight: np.ndarray,
    conv_pool: np.ndarray,
    state_pool: np.ndarray,
    state_indices: Any,
    num_key_heads: int,
    num_accepted_tokens: Any = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One fused decode block step on the conv-state and recurrent-state pools, float64.

    Dimensions:
        N: requests. T: tokens each. E: hidden size. Hk, Hv: key and value heads. Dk, Dv: head dims.
        C = 2·Hk·Dk + Hv·Dv: conv channels. W: conv width. L >= W − 1: conv window. P: pool rows.

    Args:
        hidden (np.ndarray): [N, T, E] the layer's input (after its input norm).
        w_qkv (np.ndarray): [E, C]. w_z (np.ndarray): [E, Hv·Dv]. w_b, w_a (np.ndarray): [E, Hv].
        conv_weight (np.ndarray): [C, W]. conv_bias (np.ndarray | None): [C] or None.
        A_log, dt_bias (np.ndarray): [Hv].
        norm_weight (np.ndarray): [Dv].
        conv_pool (np.ndarray): [P, C, L] (not modified).
        state_pool (np.ndarray): [P, Hv, Dk, Dv] (not modified).
        state_indices: [N] or [N, T] rows into both pools; −1: padding.
        num_key_heads (int): Hk.
        num_accepted_tokens: [N] in [1, T], with [N, T] rows only.

    Returns:
        tuple: out [N, T, Hv·Dv] (the input of out_proj; zeros for padding requests), the conv pool after the step
        and the state pool after the step, all float64.

    Notes:
        The caller's pools are copied, never written: the returned pools are the step's result.
    """
    x = np.asarray(hidden, dtype=np.float64)
    n, t_len, _ = x.shape
    hv, dk, dv = np.shape(state_pool)[1:]
    hk = num_key_heads
    mixed = x @ np.asarray(w_qkv, dtype=np.float64)
    z = (x @ np.asarray(w_z, dtype=np.float64)).reshape(n, t_len, hv, dv)
    b = x @ np.asarray(w_b, dtype=np.float64)
    a = x @ np.asarray(w_a, dtype=np.float64)
    conv_out, conv_after = causal_conv1d_decode_pool(
        mixed, conv_weight, conv_bias, conv_pool, state_indices, num_accepted_tokens, activation="silu"
    )
    q = conv_out[..., : hk * dk].reshape(n, t_len, hk, dk)
    k = conv_out[..., hk * dk : 2 * hk * dk].reshape(n, t_len, hk, dk)
    v = conv_out[..., 2 * hk * dk :].reshape(n, t_len, hv, dv)
    q, k = (np.repeat(y, hv // hk, axis=2) for y in (q, k))
    g, beta = fused_gates(a, b, A_log, dt_bias)

    given = np.asarray(state_indices).astype(np.int64)
    per_token = given.ndim == 2
    rows = given.reshape(n, -1)
    starts = _start_rows(given, num_accepted_tokens)
    pool = np.asarray(state_pool, dtype=np.float64)
    live = starts >= 0
    out = np.zeros((n, t_len, hv * dv))
    state_after = pool.copy()
    if not live.any():
        return out, conv_after, state_after
    o, states = decode_steps(q[live], k[live], v[live], g[live], beta[live], dk**-0.5, pool[starts[live]], l2norm=True)
    out[live] = gated_rms_norm(o, z[live], norm_weight).reshape(-1, t_len, hv * dv)
    for i, req in enumerate(np.flatnonzero(live)):
        if per_token:
            for t in range(t_len):
                state_after[rows[req, t]] = states[i, t]
        else:
            state_after[rows[req, 0]] = states[i, -1]
    return out, conv_after, state_after
