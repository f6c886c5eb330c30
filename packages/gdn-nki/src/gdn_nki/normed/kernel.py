"""``gdn_cte_normed``: ``gdn_cte`` with the layer's gated RMSNorm folded into its output stage (``output_stage``),
so one launch writes y = rmsnorm(o) · weight · act(z) where ``gdn_cte`` then ``gdn_gated_rms_norm`` take two."""

from __future__ import annotations

from typing import Any

from gdn_ref.constants import CHUNK_BY_ALGORITHM, DEFAULT_ALGORITHM, DEFAULT_GROUP_SIZE
from gdn_ref.contract import Arguments

from ..common.backend import nki
from ..common.kernel_assert import assert_valid_call
from ..cte.kernel import allocate_outputs, emit
from ..cte.plan import dense_spans
from ..norm.rules import output_norm_violations
from .output_stage import OutputNorm


@nki.jit
def gdn_cte_normed(
    query: Any,
    key: Any,
    value: Any,
    g_log: Any,
    beta: Any,
    z: Any,
    norm_weight: Any,
    scale: float = 1.0,
    algorithm: str = DEFAULT_ALGORITHM,
    mask_pack: Any = None,
    group_size: int = DEFAULT_GROUP_SIZE,
    recurrent_state: Any = None,
    eps: float = 1e-6,
    activation: str = "silu",
) -> tuple[Any, Any]:
    """Chunked gated delta-rule prefill whose output is gated-RMS-normalized per token and head before its store.

    Dimensions:
        As ``gdn_cte``: B, Hk, Hv, S, Dk, Dv.

    Args:
        query, key, value, g_log, beta, scale, algorithm, mask_pack, group_size, recurrent_state: as ``gdn_cte``.
        z (nl.NkiTensor): [B, S, Hv, Dv] @ HBM in query's dtype: the gate, seq-first as the layer's z projection
            holds it (HF's ``Qwen3NextGatedDeltaNet``).
        norm_weight (nl.NkiTensor): [Dv] @ HBM float32 or bfloat16: the norm's weight; None: no scale.
        eps (float): added to mean(o²) (HF's ``rms_norm_eps``).
        activation (str): the gate, "silu" / "swish" or "sigmoid".

    Returns:
        tuple: y [B, Hv, S, Dv] @ HBM in the compute dtype (head-major like ``gdn_cte``'s out), and the final state
        as ``gdn_cte``'s.

    Notes:
        y is bit for bit ``gdn_gated_rms_norm(o, z', norm_weight, eps, activation)`` of ``gdn_cte``'s o, z' being
        z head-major: the norm reads each out tile as rounded to the compute dtype and runs the norm kernel's
        instructions on it (``output_stage``). Every rule of both kernels is checked at trace time before anything
        is allocated. Measured against the two launches: PERFORMANCE.md, "Gated RMSNorm".
    """
    call = Arguments(query, key, value, g_log, beta, scale, algorithm, mask_pack, group_size, recurrent_state)
    assert_valid_call(
        call.violations(host=False) + output_norm_violations(query, value, z, norm_weight, eps, activation)
    )
    out, final_state = allocate_outputs(query, value, recurrent_state)
    norm = OutputNorm.allocate(z, norm_weight, float(eps), activation)
    emit(call, out, final_state, dense_spans(query.shape[0], query.shape[2], CHUNK_BY_ALGORITHM[algorithm]), norm=norm)
    return out, final_state
