"""The float64 GatedDeltaNet layer of Qwen3-Next after its input projections, composed of gdn-ref's oracles:
conv1d → SiLU → split q | k | v → gating → the recurrence (GQA, l2-normalized q and k) → gated RMSNorm with z.

Hugging Face transformers 5.25 ``Qwen3NextGatedDeltaNet.forward`` (read, not copied) concatenates q | k | v
(``key_dim``, ``key_dim``, ``value_dim`` channels, head-major within each), convolves them along time with SiLU,
computes β = sigmoid(b) and g = −exp(A_log)·softplus(a + dt_bias), runs the chunked rule with
``use_qk_l2norm_in_kernel`` (eps 1e-6) and scale Dk^-0.5, value head j reading key head j // (Hv / Hk), then
normalizes each value head's output with ``Qwen3NextRMSNormGated`` and z before ``out_proj``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .conv import conv_from_window
from .decode import fused_gates, l2_normalize
from .norm import gated_rms_norm_oracle
from .recurrent import recurrent


class LayerResult(NamedTuple):
    """A prefill's output (before out_proj) and the states it leaves, all float64."""

    out: np.ndarray  # [T, Hv, Dv]
    conv_window: np.ndarray  # [C, L]
    recurrent_state: np.ndarray  # [Hv, Dk, Dv]


def gdn_layer_prefill(
    mixed_qkv: np.ndarray,
    z: np.ndarray,
    b: np.ndarray,
    a: np.ndarray,
    *,
    conv_weight: np.ndarray,
    A_log: np.ndarray,
    dt_bias: np.ndarray,
    norm_weight: np.ndarray,
    num_key_heads: int,
    head_k_dim: int,
    eps: float = 1e-6,
    conv_window: np.ndarray | None = None,
    recurrent_state: np.ndarray | None = None,
) -> LayerResult:
    """One sequence through a GatedDeltaNet layer after in_proj, from its conv window and recurrent state.

    Dimensions:
        T: tokens. C = 2·Hk·Dk + Hv·Dv: conv channels. W: conv width. L >= W − 1: window length.

    Args:
        mixed_qkv (np.ndarray): [T, C] q | k | v projections, token-major (HF's order before the conv).
        z (np.ndarray): [T, Hv, Dv] the gate projection.
        b, a (np.ndarray): [T, Hv] beta and decay projections.
        conv_weight (np.ndarray): [C, W] depthwise taps (HF's ``conv1d.weight[:, 0, :]``); no bias.
        A_log, dt_bias (np.ndarray): [Hv].
        norm_weight (np.ndarray): [Dv] the gated RMSNorm's weight.
        num_key_heads, head_k_dim (int): Hk and Dk (Hv and Dv follow from z).
        eps (float): the layer's ``rms_norm_eps``.
        conv_window (np.ndarray | None): [C, L] inputs before the first token; None: W − 1 zeros.
        recurrent_state (np.ndarray | None): [Hv, Dk, Dv]; None: zeros.

    Returns:
        LayerResult: out [T, Hv, Dv], the final conv window [C, L] and the final recurrent state [Hv, Dk, Dv].
    """
    tokens, channels = np.shape(mixed_qkv)
    hv, dv = np.shape(z)[1:]
    hk, dk = num_key_heads, head_k_dim
    if channels != 2 * hk * dk + hv * dv:
        raise ValueError(f"mixed_qkv has {channels} channels; q | k | v need 2·{hk}·{dk} + {hv}·{dv}")
    width = np.shape(conv_weight)[1]
    window = np.zeros((channels, width - 1)) if conv_window is None else conv_window
    mixed, windows = conv_from_window(mixed_qkv, window, conv_weight, activation="silu")
    final_window = windows[-1] if tokens else np.asarray(window, dtype=np.float64)
    q = l2_normalize(mixed[:, : hk * dk].reshape(tokens, hk, dk))
    k = l2_normalize(mixed[:, hk * dk : 2 * hk * dk].reshape(tokens, hk, dk))
    v = mixed[:, 2 * hk * dk :].reshape(tokens, hv, dv)
    g, beta = fused_gates(a, b, A_log, dt_bias)

    def head_major(x: np.ndarray) -> np.ndarray:  # [T, H, ...] -> [1, H, T, ...]
        return np.moveaxis(x, 0, 1)[None]

    initial = None if recurrent_state is None else np.asarray(recurrent_state, dtype=np.float64)[None]
    o, state = recurrent(
        head_major(q), head_major(k), head_major(v), head_major(g), head_major(beta), dk**-0.5, initial
    )
    out = gated_rms_norm_oracle(np.moveaxis(o[0], 0, 1), z, norm_weight, eps=eps, activation="silu")
    return LayerResult(out, final_window, state[0])
