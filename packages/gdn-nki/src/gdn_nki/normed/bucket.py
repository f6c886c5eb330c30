"""``gdn_cte_bucket_normed``: the bucketed serving prefill (``gdn_cte_bucket``) with the layer's gated RMSNorm folded
into its output stage, so one launch of a bucket's program writes y = rmsnorm(o) · weight · act(z) where
``gdn_cte_bucket`` then ``gdn_gated_rms_norm`` take two."""

from __future__ import annotations

from typing import Any

from gdn_ref.constants import DEFAULT_ALGORITHM, DEFAULT_GROUP_SIZE

from ..common.backend import nki
from ..common.kernel_assert import assert_valid_call
from ..cte.bucket import BucketLayout, checked_call, emit_bucket
from ..norm.rules import output_norm_violations
from .output_stage import OutputNorm


@nki.jit
def gdn_cte_bucket_normed(
    query: Any,
    key: Any,
    value: Any,
    g_log: Any,
    beta: Any,
    z: Any,
    norm_weight: Any,
    chunk_bounds: Any,
    state_indices: Any,
    state_pool: Any,
    scale: float = 1.0,
    algorithm: str = DEFAULT_ALGORITHM,
    mask_pack: Any = None,
    group_size: int = DEFAULT_GROUP_SIZE,
    checkpoint_every: int = 0,
    checkpoint_indices: Any = None,
    read_indices: Any = None,
    state_v_first: bool = False,
    state_row_stride: int | None = None,
    eps: float = 1e-6,
    activation: str = "silu",
) -> tuple[Any, Any]:
    """Bucketed gated delta-rule prefill whose output is gated-RMS-normalized per token and head before its store.

    Dimensions:
        As ``gdn_cte_bucket``: T (the bucket's tokens), N (sequence slots), P (pool rows), K, Hk, Hv, Dk, Dv.

    Args:
        query, key, value, g_log, beta, chunk_bounds, state_indices, state_pool, scale, algorithm, mask_pack,
            group_size, checkpoint_every, checkpoint_indices, read_indices, state_v_first, state_row_stride: as
            ``gdn_cte_bucket``.
        z (nl.NkiTensor): [1, T, Hv, Dv] @ HBM in query's dtype: the gate, seq-first (the layer's z projection)
            and packed as q/k/v are: token t of the bucket at row t, padding tokens anything finite (their rows
            are normalized on their own and belong to no sequence).
        norm_weight (nl.NkiTensor): [Dv] @ HBM float32 or bfloat16: the norm's weight; None: no scale.
        eps (float): added to mean(o²) (HF's ``rms_norm_eps``).
        activation (str): the gate, "silu" / "swish" or "sigmoid".

    Returns:
        tuple: y [1, Hv, T, Dv] @ HBM in the compute dtype (padding tokens' rows are not meaningful) and
        ``state_pool``.

    Notes:
        y is bit for bit ``gdn_gated_rms_norm(o, z', norm_weight, eps, activation)`` of ``gdn_cte_bucket``'s o, z'
        being z head-major: the output stage is ``gdn_cte_normed``'s (``output_stage``), per token, so a padding
        token's row never reaches a real token's. The layout stays run-time data: every layout of a bucket is
        one program, as ``gdn_cte_bucket``'s. Every trace-time rule of both kernels is checked before anything is
        allocated. Measured against the two launches: PERFORMANCE.md, "Gated RMSNorm".
    """
    layout = BucketLayout(chunk_bounds, state_indices, state_pool, checkpoint_every, checkpoint_indices, read_indices,
                          bool(state_v_first), state_row_stride)  # fmt: skip
    call, pool = checked_call(query, key, value, g_log, beta, scale, algorithm, mask_pack, group_size, layout)
    assert_valid_call(output_norm_violations(query, value, z, norm_weight, eps, activation), "gdn_cte_bucket_normed")
    norm = OutputNorm.allocate(z, norm_weight, float(eps), activation)
    return emit_bucket(call, layout, pool, norm), state_pool
