"""The documented ``gdn_cte`` API implemented on the host with numpy: contract checks, aliasing, dispatch."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from . import contract
from .chunked import chunked
from .constants import ALGORITHM_SCHUR, ALGORITHMS, COMPUTE_DTYPES, DEFAULT_ALGORITHM, DEFAULT_GROUP_SIZE

# What gdn-spec may run against this implementation (read as a plain attribute; gdn-ref never imports gdn-spec).
CAPABILITIES = {"name": "gdn-ref", "algorithms": ALGORITHMS, "dtypes": COMPUTE_DTYPES}


def gdn_cte(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    g_log: np.ndarray,
    beta: np.ndarray,
    scale: float = 1.0,
    algorithm: str = DEFAULT_ALGORITHM,
    mask_pack: np.ndarray | None = None,
    group_size: int = DEFAULT_GROUP_SIZE,
    recurrent_state: np.ndarray | None = None,
    *,
    check_values: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Chunked gated delta-rule (GDN) prefill on the host, with the kernel's contract and precision.

    Dimensions:
        B: batch. Hk: key/query heads. Hv: value heads, a multiple of Hk (value head h reads key head
        h // (Hv//Hk)). S: tokens, divisible by 128 ("schur") or 64 ("neumann"). Dk = Dq, Dv ≤ 128.

    Args:
        query (np.ndarray): [B, Hk, S, Dk] float32 or bfloat16, L2-normalized; its dtype is the compute dtype.
        key (np.ndarray): [B, Hk, S, Dk], L2-normalized, query's dtype.
        value (np.ndarray): [B, Hv, S, Dv], query's dtype.
        g_log (np.ndarray): [B, Hv, S] float32 per-token log-decay, <= 0; -inf is a reset (decay exactly 0).
        beta (np.ndarray): [B, Hv, S] float32 per-token update strength in (0, 1).
        scale (float): query scaling, typically Dk^-0.5.
        algorithm (str): "schur" (default) or "neumann".
        mask_pack (np.ndarray | None): [N_MASKS, 128, 128] float32 from ``build_mask_pack()``; required by
            "schur", which drives its inverse with it exactly as the kernel does.
        group_size (int): chunks per grouped inverse for "schur", in [1, 16]. Grouping only orders the
            kernel's work, so it is validated here and does not change the result.
        recurrent_state (np.ndarray | None): [B, Hv, Dk, Dv] float32, optional in/out. Supplied: its contents
            are the initial state, it is updated in place and returned as the second output (same object).
            Omitted: the state starts at zero and a fresh array is returned. "neumann" takes only the omitted form.
        check_values (bool): scan every input element first (``contract.check_values``: g_log <= 0 and not
            NaN, everything else finite). Default on; pass False only when the caller guarantees its data.

    Returns:
        tuple[np.ndarray, np.ndarray]: out [B, Hv, S, Dv] in query's dtype (head-major, un-normalized) and the
        final state [B, Hv, Dk, Dv] float32 (``recurrent_state`` itself when supplied).

    Notes:
        Every documented rule is checked by ``contract.enforce`` before anything is read or written, so a
        rejected call leaves ``recurrent_state`` untouched. Any g_log <= 0, -inf included, matches the oracle. The math runs in float32; with bfloat16 inputs every
        matmul operand is rounded to bfloat16 (fp32 accumulation, fp32 master state), predicting the kernel.
    """
    contract.enforce(
        query,
        key,
        value,
        g_log,
        beta,
        scale=scale,
        algorithm=algorithm,
        mask_pack=mask_pack,
        group_size=group_size,
        recurrent_state=recurrent_state,
        values=check_values,
    )
    out, final_state = chunked(
        query,
        key,
        value,
        g_log,
        beta,
        scale,
        recurrent_state,
        algorithm=algorithm,
        compute_dtype=np.float32,
        bf16_operands=query.dtype == ml_dtypes.bfloat16,
        mask_pack=mask_pack if algorithm == ALGORITHM_SCHUR else None,
    )
    out = out.astype(query.dtype)
    if recurrent_state is None:
        return out, final_state.astype(np.float32, copy=False)
    recurrent_state[...] = final_state
    return out, recurrent_state


gdn_cte.gdn_spec_capabilities = CAPABILITIES
