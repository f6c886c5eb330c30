"""Host entry point of the gating kernel (vLLM's ``fused_gdn_gating``): validate everything, then launch (nothing of
the caller's is written: the results are new arrays)."""

from __future__ import annotations

import numpy as np

from gdn_ref.contract import ContractError

from ..common import backend
from ..gating.kernel import gdn_gating
from ..gating.rules import API, gating_violations
from .conv import _finite


def fused_gdn_gating(
    A_log: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    dt_bias: np.ndarray,
    beta: float = 1.0,
    threshold: float = 20.0,
    *,
    check_values: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Run ``gdn_gating``: g = −exp(A_log)·softplus(a + dt_bias) and β = sigmoid(b), every rule checked first.

    Dimensions:
        T: tokens. H: heads.

    Args:
        A_log (np.ndarray): [H] float32 or bfloat16.
        a, b (np.ndarray): [T, H] float32 or bfloat16.
        dt_bias (np.ndarray): [H] float32 or bfloat16.
        beta (float): the softplus' beta (vLLM's keyword; not the delta rule's β).
        threshold (float): vLLM's softplus switch-over, at least 20 (``gating.rules.MIN_THRESHOLD``).
        check_values (bool): also scan every input for NaN/±Inf.

    Returns:
        tuple: g [1, T, H] float32 and beta_output [1, T, H] in b's dtype.

    Notes:
        A rejected call raises ``ContractError`` (argument, value, rule, fix) before launching.
    """
    inputs = {"A_log": A_log, "a": a, "b": b, "dt_bias": dt_bias}
    found = gating_violations(A_log, a, b, dt_bias, beta, threshold)
    if not found and check_values:
        found = [v for name, x in inputs.items() for v in _finite(name, x, API, "gating.finite")]
    if found:
        raise ContractError(found)
    arrays = [np.ascontiguousarray(x) for x in inputs.values()]
    g, beta_out = backend.simulate(gdn_gating)(*arrays, float(beta), float(threshold))
    return np.asarray(g), np.asarray(beta_out)
