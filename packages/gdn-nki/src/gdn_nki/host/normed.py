"""Host entry point of ``gdn_cte_normed``: the chunked prefill with the gated RMSNorm in its output stage, every
rule of both kernels checked before the launch."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gdn_ref.constants import DEFAULT_ALGORITHM, DEFAULT_GROUP_SIZE
from gdn_ref.contract import Arguments, ContractError, names_entry_point, plain_int
from gdn_ref.masks import default_mask_pack
from gdn_ref.norm import API

from ..norm.rules import output_norm_violations
from ..normed.kernel import gdn_cte_normed
from .conv import _finite
from .launch_grid import check_grid
from .prefill import _launch


@names_entry_point("gdn_nki.simulate_normed")
def simulate_normed(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    g_log: np.ndarray,
    beta: np.ndarray,
    z: np.ndarray,
    norm_weight: np.ndarray | None,
    scale: float = 1.0,
    algorithm: str = DEFAULT_ALGORITHM,
    mask_pack: np.ndarray | None = None,
    group_size: int = DEFAULT_GROUP_SIZE,
    recurrent_state: np.ndarray | None = None,
    *,
    eps: float = 1e-6,
    activation: str = "silu",
    grid: int | None = None,
    check_values: bool = True,
    on_commit: Callable[[], None] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Run ``gdn_cte_normed``: ``simulate`` whose output is y = rmsnorm(o) · norm_weight · act(z) in one launch.

    Dimensions:
        As ``simulate``: B, Hk, Hv, S (a chunk multiple), Dk, Dv.

    Args:
        query, key, value, g_log, beta, scale, algorithm, group_size, recurrent_state, grid, check_values,
            on_commit: as ``simulate``. mask_pack: as ``simulate``, ``build_mask_pack()`` when omitted (schur).
        z (np.ndarray): [B, S, Hv, Dv] in query's dtype, seq-first (the layer's z projection).
        norm_weight (np.ndarray | None): [Dv] float32 or bfloat16; None: no scale.
        eps (float): the norm's epsilon (HF's ``rms_norm_eps``). activation (str): "silu" / "swish" or "sigmoid".

    Returns:
        tuple: (y [B, Hv, S, Dv] in query's dtype, final state), as ``simulate``'s (out, final state).

    Notes:
        y is bit for bit ``gated_rms_norm(o, z.transpose(0, 2, 1, 3), norm_weight)`` of ``simulate``'s o. A
        rejected call raises ``ContractError`` naming each broken rule before launching; a supplied
        ``recurrent_state`` is written only once the launch has completed, as ``simulate``'s.
    """
    grid, group_size = check_grid(grid), plain_int(group_size)
    mask_pack = default_mask_pack(mask_pack, algorithm)
    call = Arguments(query, key, value, g_log, beta, scale, algorithm, mask_pack, group_size, recurrent_state)
    violations = call.violations(values=check_values)
    violations += output_norm_violations(query, value, z, norm_weight, eps, activation)
    if not violations and check_values:
        violations = [
            v for name, a in (("z", z), ("weight", norm_weight)) for v in _finite(name, a, API, "norm.finite")
        ]
    if violations:
        raise ContractError(violations)
    extra = {"z": np.ascontiguousarray(z), "norm_weight": norm_weight, "eps": float(eps), "activation": activation}
    kernel = gdn_cte_normed if grid is None else gdn_cte_normed[grid]
    return _launch(call, kernel, check_values, on_commit, extra)
