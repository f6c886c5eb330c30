"""The last check before a launch's results reach the caller: finite inputs (the value scans held) must give finite
outputs and states. A non-finite one means the recurrence overflowed — the transition I − β k kᵀ has eigenvalue
1 − β‖k‖², expanding when β‖k‖² > 2 (un-normalised q and k, the usual FLA mistake), so the state grows
geometrically past float32 — and is refused before anything is committed."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gdn_ref.contract import ContractError, Violation, first_bad_index

RULE_ID = "recurrence.overflow"


def refuse_overflow(results: dict[str, np.ndarray], strength: Callable[[], float], api: str = "gdn_cte") -> None:
    """Raise ``ContractError`` naming ``key`` when any result holds a NaN/±Inf (one finiteness scan of each).

    Args:
        results (dict[str, np.ndarray]): what is about to be returned or committed, by name (``out``, the final
            states), each scanned in blocks for its first non-finite element.
        strength (Callable[[], float]): the largest β·‖k‖² of the call (``largest_strength``), computed only when a
            result is bad: the message names it.
        api (str): whose contract the violation belongs to (``Violation.api``: gdn_cte or gdn_step).

    Notes:
        Call it only when the inputs were scanned (``check_values``): then a non-finite result cannot come from a
        non-finite input, and the caller's buffers are still as they were.
    """
    for name, result in results.items():
        where = first_bad_index(result, lambda block: ~np.isfinite(block))
        if where is None:
            continue
        # "at [..]", not "index [..]": the torch drop-ins re-index "index [..]" as an element of `key` itself
        value = f"largest β·‖k‖² = {strength():.4g} (the kernel's {name} holds {float(result[where])} at {list(where)})"
        raise ContractError([Violation(
            RULE_ID, "key", value,
            "the recurrence overflowed float32: the transition I − β k kᵀ has eigenvalue 1 − β·‖k‖², expanding when "
            "β·‖k‖² > 2, so the state grows geometrically; FLA callers normally L2-normalise q and k",
            "pass use_qk_l2norm_in_kernel=True (decode_step: use_qk_l2norm=True), or L2-normalise q and k along "
            "their head dim", api,
        )])  # fmt: skip


def largest_strength(key: np.ndarray, beta: np.ndarray, head_axis: int, normalised: bool = False) -> float:
    """The largest β·‖k‖² over every value head and token: above 2, that token's transition expands the state.

    Dimensions:
        Hk, Hv: key and value heads (value head h reads key head h // (Hv / Hk)). Dk: key head dim.

    Args:
        key (np.ndarray): [..., Hk, ..., Dk] with its heads on ``head_axis`` and Dk last.
        beta (np.ndarray): key's shape without Dk, Hv heads on ``head_axis``.
        head_axis (int): the heads' axis (1 head-major [B, H, S], 2 token-major [N, T, H]).
        normalised (bool): the kernel L2-normalises k itself (‖k‖ = 1).

    Returns:
        float: max over the elements of β·‖k‖².
    """
    beta = np.asarray(beta, dtype=np.float64)
    if normalised:
        return float(beta.max(initial=0.0))
    squared = np.square(np.asarray(key, dtype=np.float64)).sum(axis=-1)
    group = beta.shape[head_axis] // squared.shape[head_axis]
    return float((np.repeat(squared, group, axis=head_axis) * beta).max(initial=0.0))
