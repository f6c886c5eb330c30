"""The gate activations models fuse into their GDN call: a log-decay from a raw gate and β from a logit.

Qwen3-Next's layers (HF transformers, vLLM, SGLang) compute, per value head h,
``g = −exp(A_log[h]) · softplus(a + dt_bias[h])`` and ``β = sigmoid(b)`` from the projections ``a`` and ``b``;
FLA's ``chunk_gated_delta_rule`` does the same inside its kernel when called with ``use_gate_in_kernel=True``
(with ``A_log``, ``dt_bias``) and ``use_beta_sigmoid_in_kernel=True``. This module is the one place gdn computes
them, so every entry point that takes raw gates (the torch drop-in's options, a decode step) gives them one meaning.

Rounding: the sum ``a + dt_bias`` is rounded to fp32, as FLA's kernel and HF's layer round it; everything after
it is evaluated in float64 and rounded once to fp32. The result is therefore within one fp32 rounding (half an
ulp) of the exact value of the formula at that sum, and within a few ulps of FLA's and HF's fp32 evaluations,
whose own exp / softplus / product each round (FLA's softplus switches to the identity above 20, where the two
differ by less than 1e-9 relative: below fp32 rounding).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def log_decay_from_gate(gate: Any, a_log: Any, dt_bias: Any = None) -> np.ndarray:
    """The GDN log-decay ``g = −exp(A_log) · softplus(gate + dt_bias)`` (always <= 0), in fp32.

    Dimensions:
        Hv: value heads, the last axis of ``gate``.

    Args:
        gate (np.ndarray): [..., Hv] raw gate (the projection ``a``), fp32 or bfloat16 (widened exactly).
        a_log (np.ndarray): [Hv] log of each head's decay rate A (FLA's and HF's ``A_log``).
        dt_bias (np.ndarray | None): [Hv] bias added to the gate before the softplus; None for none.

    Returns:
        np.ndarray: [..., Hv] float32 log-decay, ready as ``g_log`` (after moving heads to gdn_cte's axis).

    Notes:
        Finite inputs give a finite result or −inf (a decay rate so large that the state resets); the caller
        scans its inputs (a NaN stays NaN). Rounding: module docstring.
    """
    x = np.asarray(gate).astype(np.float32)
    if dt_bias is not None:
        x = x + np.asarray(dt_bias).astype(np.float32)  # an fp32 sum, rounded as FLA and HF round it
    with np.errstate(over="ignore"):  # exp(A_log) past fp32's range is a reset: -inf after the rounding
        return log_decay64(x, a_log).astype(np.float32)


def beta_from_logit(logit: Any) -> np.ndarray:
    """β = sigmoid(logit) in fp32, in [0, 1] (1 where the sigmoid saturates in fp32).

    Args:
        logit (np.ndarray): any shape, fp32 or bfloat16 (the projection ``b``).

    Returns:
        np.ndarray: float32 β, same shape.
    """
    return sigmoid64(logit).astype(np.float32)


def log_decay64(x: Any, a_log: Any) -> np.ndarray:
    """``−exp(A_log) · softplus(x)`` in float64, ``x`` the gate with its bias already added: the formula itself,
    shared by the fp32 activation above and the float64 decode oracle (``gdn_ref.decode.fused_gates``)."""
    softplus = np.logaddexp(0.0, np.asarray(x).astype(np.float64))  # log(1 + e^x) without overflow for large x
    return -np.exp(np.asarray(a_log).astype(np.float64)) * softplus


def sigmoid64(x: Any) -> np.ndarray:
    """``1 / (1 + e^−x)`` in float64, without overflow for x << 0."""
    return np.exp(-np.logaddexp(0.0, -np.asarray(x).astype(np.float64)))
