"""Host entry point of the gated RMSNorm kernel: validate everything, then launch (nothing of the caller's is
written: the result is a new array)."""

from __future__ import annotations

import numpy as np

from gdn_ref.contract import ContractError
from gdn_ref.norm import API

from ..common import backend
from ..norm.kernel import gdn_gated_rms_norm
from ..norm.rules import norm_violations
from .conv import _finite


def gated_rms_norm(
    x: np.ndarray,
    z: np.ndarray | None,
    weight: np.ndarray | None,
    *,
    eps: float = 1e-6,
    activation: str = "silu",
    check_values: bool = True,
) -> np.ndarray:
    """Run ``gdn_gated_rms_norm`` (y = x · rsqrt(mean(x²) + eps) · weight · act(z) per row) with every rule checked
    first.

    Dimensions:
        D: the normalized (last) axis, head_v_dim (128 at Qwen3-Next's shapes). Leading axes: any (tokens, heads).

    Args:
        x (np.ndarray): [..., D] float32 or bfloat16 (the recurrence's output).
        z (np.ndarray | None): x's shape and dtype: the gate; None: no gate.
        weight (np.ndarray | None): [D] float32 or bfloat16; None: no scale.
        eps (float): added to mean(x²) (HF's ``rms_norm_eps``, FLA's ``eps``).
        activation (str): "silu" / "swish" or "sigmoid".
        check_values (bool): also scan x, z and the weight for NaN/±Inf.

    Returns:
        np.ndarray: y, x's shape and dtype.

    Notes:
        A rejected call raises ``ContractError`` (argument, value, rule, fix) before launching.
    """
    found = norm_violations(x, z, weight, eps, activation)
    if not found and check_values:
        found = [
            v for name, a in (("x", x), ("g", z), ("weight", weight)) for v in _finite(name, a, API, "norm.finite")
        ]
    if found:
        raise ContractError(found)
    arrays = [None if a is None else np.ascontiguousarray(a) for a in (x, z, weight)]
    return np.asarray(backend.simulate(gdn_gated_rms_norm)(*arrays, float(eps), activation))
