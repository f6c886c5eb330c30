"""The float64 decode oracle: one fused ``gdn_tkg`` step and a T-token step from a state, in ONE place.

Every formula a decode kernel folds around the recurrence is defined here once — the gate fusion, the q/k
L2 norm with its eps, the gated RMSNorm of the output — and the recurrence itself is ``recurrent.recurrent``
run one token at a time, so decode and prefill can never disagree about the math.

Sources (SDK 2.33 "GDN TKG Kernel API Reference", nkilib.experimental.gdn; Hugging Face transformers 5.24
``modeling_qwen3_next.py``: ``Qwen3NextGatedDeltaNet.forward``, ``l2norm``, ``Qwen3NextRMSNormGated``):

- g = −exp(A_log) · softplus(a + dt_bias), β = sigmoid(b) (both pages);
- l2norm(x) = x · rsqrt(Σx² + 1e-6) (HF's ``l2norm(..., eps=1e-6)``; the AWS page names l2norm without an eps,
  and AWS's public test of the kernel uses 1e-6);
- the output is scaled by Dk^-0.5 (HF divides q by sqrt(Dk); the AWS page takes no ``scale``);
- RMSNormGated(o, z) = o · rsqrt(mean(o²) + 1e-6) · norm_weight · silu(z) (HF's class with the config's
  ``rms_norm_eps``, 1e-6 in every Qwen3-Next config; HF rounds o to the input dtype between the norm and the
  weight, a kernel computing in fp32 rounds once at the end).
"""

from __future__ import annotations

import numpy as np

from .activations import log_decay64, sigmoid64
from .recurrent import recurrent

L2NORM_EPS = 1e-6
RMS_NORM_EPS = 1e-6


def l2_normalize(x: np.ndarray, eps: float = L2NORM_EPS) -> np.ndarray:
    """``x · rsqrt(Σ x² + eps)`` over the last axis, in float64."""
    x = np.asarray(x, dtype=np.float64)
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


def fused_gates(a: np.ndarray, b: np.ndarray, A_log: np.ndarray, dt_bias: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The log-decay and update strength a fused-gating kernel computes, in float64.

    Args:
        a (np.ndarray): [..., Hv] raw gate input (pre-softplus).
        b (np.ndarray): [..., Hv] raw beta (pre-sigmoid).
        A_log (np.ndarray): [Hv] per-value-head log decay coefficient.
        dt_bias (np.ndarray): [Hv] per-value-head softplus bias.

    Returns:
        tuple[np.ndarray, np.ndarray]: g = −exp(A_log)·softplus(a + dt_bias) and β = sigmoid(b), shaped like a.
    """
    x = np.asarray(a, dtype=np.float64) + np.asarray(dt_bias, dtype=np.float64)
    return log_decay64(x, A_log), sigmoid64(b)


def gated_rms_norm(out: np.ndarray, z: np.ndarray, weight: np.ndarray, eps: float = RMS_NORM_EPS) -> np.ndarray:
    """``out · rsqrt(mean(out²) + eps) · weight · silu(z)`` over the last axis (Qwen3NextRMSNormGated), float64."""
    o = np.asarray(out, dtype=np.float64)
    zz = np.asarray(z, dtype=np.float64)
    normed = o / np.sqrt(np.mean(o * o, axis=-1, keepdims=True) + eps)
    return normed * np.asarray(weight, dtype=np.float64) * (zz / (1.0 + np.exp(-zz)))


def decode_steps(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    g_log: np.ndarray,
    beta: np.ndarray,
    scale: float,
    state: np.ndarray,
    *,
    l2norm: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """T tokens per request from each request's state, one token at a time, keeping the state after every token.

    Dimensions:
        N: requests. T: new tokens per request. Hk, Hv: key and value heads (Hv a multiple of Hk).

    Args:
        query, key (np.ndarray): [N, T, Hk, Dk] (token-major, as decode tensors come from the projections).
        value (np.ndarray): [N, T, Hv, Dv].
        g_log, beta (np.ndarray): [N, T, Hv].
        scale (float): multiplies every output.
        state (np.ndarray): [N, Hv, Dk, Dv], each request's state before its first token.
        l2norm (bool): L2-normalize q and k first (``l2_normalize``).

    Returns:
        tuple[np.ndarray, np.ndarray]: out [N, T, Hv, Dv] and the states after every token [N, T, Hv, Dk, Dv],
        all float64 (the final state is ``states[:, -1]``).
    """
    q, k = (np.asarray(x, dtype=np.float64) for x in (query, key))
    if l2norm:
        q, k = l2_normalize(q), l2_normalize(k)
    n, t_len = q.shape[:2]
    hv, dv = value.shape[2], value.shape[3]
    out = np.empty((n, t_len, hv, dv))
    states = np.empty((n, t_len, hv, q.shape[3], dv))
    current = np.asarray(state, dtype=np.float64)
    for t in range(t_len):
        step = [x[:, t : t + 1].swapaxes(1, 2) for x in (q, k, np.asarray(value, dtype=np.float64))]
        gates = [np.asarray(x, dtype=np.float64)[:, t : t + 1].swapaxes(1, 2) for x in (g_log, beta)]
        o, current = recurrent(*step, *gates, scale=scale, initial_state=current)
        out[:, t] = o[:, :, 0]
        states[:, t] = current
    return out, states


def gdn_tkg(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    b: np.ndarray,
    a: np.ndarray,
    A_log: np.ndarray,
    dt_bias: np.ndarray,
    z: np.ndarray,
    norm_weight: np.ndarray,
    state_in: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The documented fused single-token decode step (``nkilib.experimental.gdn.gdn_tkg``, SDK 2.33), float64.

    Dimensions:
        BH: batch × value heads, value head fastest (row b·Hv + h). Hv = len(A_log). K, V: head dims.

    Args:
        q, k (np.ndarray): [BH, K] raw query and key, already expanded to the value heads (not L2-normalized).
        v (np.ndarray): [BH, V].
        b, a (np.ndarray): [BH] raw beta (pre-sigmoid) and raw gate input (pre-softplus).
        A_log, dt_bias (np.ndarray): [Hv].
        z (np.ndarray): [BH, V] output gate of the gated RMSNorm.
        norm_weight (np.ndarray): [V].
        state_in (np.ndarray): [BH, K, V].

    Returns:
        tuple[np.ndarray, np.ndarray]: out [BH, V] = RMSNormGated(o, z) and the state after the token
        [BH, K, V], float64.
    """
    bh, dk = np.shape(q)
    hv = np.shape(A_log)[0]
    g, beta = fused_gates(np.reshape(a, (bh // hv, hv)), np.reshape(b, (bh // hv, hv)), A_log, dt_bias)
    # One request per batch row, its Hv value heads reading Hv (already expanded) key heads, one token.
    as_step = [np.reshape(x, (bh // hv, 1, hv, -1)) for x in (q, k, v)]
    state = np.reshape(state_in, (bh // hv, hv, dk, -1))
    o, states = decode_steps(*as_step, g[:, None], beta[:, None], dk**-0.5, state, l2norm=True)
    out = gated_rms_norm(o[:, 0].reshape(bh, -1), z, norm_weight)
    return out, states[:, 0].reshape(bh, dk, -1)
