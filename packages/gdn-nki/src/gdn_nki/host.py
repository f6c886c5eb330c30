"""Host conveniences around the kernel: run it on numpy arrays, and prefill sequences of any length."""

from __future__ import annotations

import numpy as np

from gdn_ref.constants import ALGORITHM_SCHUR, CHUNK_BY_ALGORITHM, DEFAULT_ALGORITHM, DEFAULT_GROUP_SIZE
from gdn_ref.contract import enforce
from gdn_ref.masks import build_mask_pack

from . import backend
from .api import gdn_cte


def simulate(
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
    grid: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Run ``gdn_cte`` on the CPU with numpy arrays (``nki.simulate`` when installed, nki-cpu otherwise).

    Dimensions and Args:
        As ``gdn_cte``; arrays are numpy (bfloat16 via ml_dtypes). ``grid`` launches ``gdn_cte[grid]``
        (lanes split over programs).

    Returns:
        tuple: (out [B, Hv, S, Dv] in query's dtype, final state [B, Hv, Dk, Dv] fp32). When ``recurrent_state``
        is supplied, the second output IS that array, updated in place.

    Notes:
        The whole contract, including the host-only rules (mask pack contents, writable state), is checked
        before the kernel runs, so a rejected call changes no buffer.
    """
    enforce(query, key, value, g_log, beta, scale, algorithm, mask_pack, group_size, recurrent_state)
    kernel = gdn_cte if grid is None else gdn_cte[grid]
    out, final_state = backend.simulate(kernel)(
        query, key, value, g_log, beta, scale=scale, algorithm=algorithm, mask_pack=mask_pack,
        group_size=group_size, recurrent_state=recurrent_state,
    )  # fmt: skip
    if recurrent_state is not None:
        return out, recurrent_state
    return out, final_state


simulate.gdn_spec_capabilities = {  # read by gdn-spec's conformance suite
    "name": f"gdn-nki ({backend.BACKEND_NAME})",
    "algorithms": ("schur", "neumann"),
    "dtypes": ("float32", "bfloat16"),
}


def prefill(
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
) -> tuple[np.ndarray, np.ndarray]:
    """``simulate`` for any sequence length: pad to the algorithm's chunk multiple, return the real tokens.

    Args:
        As ``simulate``; S may be any positive length. ``mask_pack`` defaults to ``build_mask_pack()`` for schur.

    Returns:
        tuple: (out [B, Hv, S, Dv], final state), as ``simulate``.

    Notes:
        Padding tokens carry g = 0 and β = 0 (q, k, v = 0): they neither decay nor write the state, so the final
        state and the real tokens' outputs are exactly those of the unpadded sequence.
    """
    if mask_pack is None and algorithm == ALGORITHM_SCHUR:
        mask_pack = build_mask_pack()
    seq_len = query.shape[2] if getattr(query, "ndim", 0) == 4 else 0
    chunk = CHUNK_BY_ALGORITHM.get(algorithm, 1)
    pad = -seq_len % chunk
    if pad:
        query, key, value, g_log, beta = (_pad_tokens(x, pad) for x in (query, key, value, g_log, beta))
    out, state = simulate(query, key, value, g_log, beta, scale, algorithm, mask_pack, group_size, recurrent_state)
    return out[:, :, :seq_len], state


def _pad_tokens(x: np.ndarray, pad: int) -> np.ndarray:
    widths = [(0, 0)] * x.ndim
    widths[2] = (0, pad)
    return np.pad(x, widths)
