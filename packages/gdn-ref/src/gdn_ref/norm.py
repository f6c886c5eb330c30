"""The float64 gated RMSNorm oracle of a GatedDeltaNet layer's output stage, with the options of FLA's
``rms_norm_gated`` a Qwen3-Next layer needs, and every other option rejected by name.

A Qwen3-Next GatedDeltaNet layer normalizes each value head's output over ``head_v_dim`` and gates it with the
``z`` projection:

    y = x · rsqrt(mean(x²) + eps) · weight (+ bias) · act(z)

Sources and their conventions (read, not copied):

- Hugging Face transformers 5.25 ``Qwen3NextRMSNormGated.forward(hidden_states, gate)``: statistics in fp32,
  the normalized value cast back to the input dtype *before* it meets ``weight``, then times ``silu(gate)`` in
  fp32 and cast to the input dtype (norm before gate, no bias, no residual).
- FLA ``fla/modules/fused_norm_gate.py``: ``rms_norm_gated(x, g, weight, bias, activation='swish', residual=None,
  prenorm=False, residual_in_fp32=False, eps=1e-6)`` and ``FusedRMSNormGated(hidden_size, elementwise_affine=True,
  eps=1e-5, activation='swish')``: x (+ residual) is normalized, scaled by weight (+ bias), then times
  ``swish(g)`` (= silu) or ``sigmoid(g)``; ``prenorm`` also returns x + residual.

Here ``gated_rms_norm_oracle`` is the float64 value of both; ``group_size`` other than the last axis (vLLM's and
Mamba's grouped variant) and ``norm_before_gate=False`` are rejected by name: no Qwen3-Next layer uses them.
"""

from __future__ import annotations

import numpy as np

from .contract import ContractError, Violation

ACTIVATIONS = ("swish", "silu", "sigmoid")
API = "gated_rms_norm"


def _reject(argument: str, value: object, rule_id: str, rule: str, fix: str) -> ContractError:
    return ContractError([Violation(rule_id, argument, f"= {value!r}", rule, fix, api=API)])


def _gate(z: np.ndarray, activation: str) -> np.ndarray:
    """silu / swish (z · sigmoid(z)) or sigmoid(z), float64."""
    sig = 1.0 / (1.0 + np.exp(-z))
    return sig if activation == "sigmoid" else z * sig


def check_norm_options(
    x_shape: tuple[int, ...],
    z_shape: tuple[int, ...] | None,
    weight_shape: tuple[int, ...] | None,
    *,
    eps: float,
    activation: str,
    norm_before_gate: bool = True,
    group_size: int | None = None,
) -> None:
    """Raise ``ContractError`` naming the first broken rule of a gated RMSNorm call.

    Args:
        x_shape, z_shape, weight_shape: shapes of the input, the gate and the weight (None: no gate / no weight).
        eps (float): added to mean(x²); must be finite and > 0.
        activation (str): one of ``ACTIVATIONS``.
        norm_before_gate (bool): only True (a Qwen3-Next layer normalizes, then gates).
        group_size (int | None): only None or the last axis' size (one group per row).
    """
    d = x_shape[-1] if x_shape else 0
    if not x_shape or d < 1:
        raise _reject("x", x_shape, "NORM-SHAPE", "x needs a non-empty last axis", "pass [..., D] with D >= 1")
    if z_shape is not None and tuple(z_shape) != tuple(x_shape):
        raise _reject("g", z_shape, "NORM-GATE", f"the gate has x's shape {tuple(x_shape)}", "pass g shaped like x")
    if weight_shape is not None and tuple(weight_shape) != (d,):
        raise _reject("weight", weight_shape, "NORM-WEIGHT", f"weight is [D] = [{d}]", "pass one weight per channel")
    if not (isinstance(eps, (int, float)) and np.isfinite(eps) and eps > 0):
        raise _reject("eps", eps, "NORM-EPS", "eps is a finite number > 0", "pass the layer's rms_norm_eps")
    if activation not in ACTIVATIONS:
        raise _reject("activation", activation, "NORM-ACT", f"activation is one of {ACTIVATIONS}", "use 'silu'")
    if not norm_before_gate:
        raise _reject(
            "norm_before_gate", norm_before_gate, "NORM-ORDER", "only norm-then-gate is supported", "pass True"
        )
    if group_size is not None and group_size != d:
        raise _reject(
            "group_size", group_size, "NORM-GROUP", f"one group per row (group_size None or {d})", "pass None"
        )


def gated_rms_norm_oracle(
    x: np.ndarray,
    z: np.ndarray | None,
    weight: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    *,
    eps: float = 1e-6,
    activation: str = "swish",
    residual: np.ndarray | None = None,
    prenorm: bool = False,
    norm_before_gate: bool = True,
    group_size: int | None = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """The float64 gated RMSNorm over the last axis.

    Dimensions:
        D: the normalized axis (head_v_dim, 128 at Qwen3-Next's shapes); any leading axes (tokens, heads).

    Args:
        x (np.ndarray): [..., D] input (the recurrence's output per value head).
        z (np.ndarray | None): [..., D] gate; None: no gating.
        weight, bias (np.ndarray | None): [D] affine scale and shift; None: 1 and 0.
        eps (float): added to mean(x²).
        activation (str): 'swish' / 'silu' (z · sigmoid(z)) or 'sigmoid'.
        residual (np.ndarray | None): [..., D] added to x before the norm (FLA's residual).
        prenorm (bool): also return x + residual (FLA's prenorm output).
        norm_before_gate, group_size: only their Qwen3-Next values (``check_norm_options``).

    Returns:
        np.ndarray | tuple[np.ndarray, np.ndarray]: y [..., D] float64, and with ``prenorm`` (y, x + residual).

    Notes:
        Equals ``gdn_ref.decode.gated_rms_norm`` with silu and no bias/residual (the decode path's form).
    """
    check_norm_options(
        np.shape(x),
        None if z is None else np.shape(z),
        None if weight is None else np.shape(weight),
        eps=eps,
        activation=activation,
        norm_before_gate=norm_before_gate,
        group_size=group_size,
    )
    if residual is not None and np.shape(residual) != np.shape(x):
        raise _reject("residual", np.shape(residual), "NORM-RESIDUAL", "residual has x's shape", "pass it like x")
    if bias is not None and np.shape(bias) != (np.shape(x)[-1],):
        raise _reject("bias", np.shape(bias), "NORM-BIAS", "bias is [D]", "pass one bias per channel")
    h = np.asarray(x, dtype=np.float64)
    if residual is not None:
        h = h + np.asarray(residual, dtype=np.float64)
    y = h / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + eps)
    if weight is not None:
        y = y * np.asarray(weight, dtype=np.float64)
    if bias is not None:
        y = y + np.asarray(bias, dtype=np.float64)
    if z is not None:
        y = y * _gate(np.asarray(z, dtype=np.float64), activation)
    return (y, h) if prenorm else y
