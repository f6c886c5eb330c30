"""gdn-nki: the chunked gated delta-rule (GDN) prefill kernel for AWS Trainium, written in NKI.

``gdn_cte`` is the documented ``@nki.jit`` kernel (algorithms "schur" and "neumann"); ``simulate`` runs it on
the CPU (real ``nki.simulate`` when installed, nki-cpu otherwise); ``prefill`` accepts any sequence length.
Decode: ``gdn_tkg`` (AWS's documented fused single-token step) and ``gdn_step`` (N requests × T tokens on a state
pool addressed by device indices), run on the host by ``tkg_simulate`` and ``decode_step``.
The layer's other kernels: the causal conv1d (``conv_decode_step``, with ``query_start_loc`` vLLM's varlen
speculative form; ``conv_prefill_bucket``), the gated RMSNorm (``gdn_gated_rms_norm``, run by ``gated_rms_norm``;
folded into the prefill's output stage: ``gdn_cte_normed``, run by ``simulate_normed``, and into the bucketed
prefill's: ``gdn_cte_bucket_normed``, run by ``prefill_bucket`` with ``z``) and the prefill gates (``gdn_gating``,
run by ``fused_gdn_gating``). The whole layer's decode step but out_proj in one launch:
``gdn_block_tkg`` (AWS's documented fused block) and ``gdn_block_step`` (on the conv-state and recurrent-state
pools, run by ``block_decode_step``).
"""

from gdn_ref.constants import (
    ALGORITHM_NEUMANN,
    ALGORITHM_SCHUR,
    ALGORITHMS,
    CHUNK,
    CHUNK_BY_ALGORITHM,
    DEFAULT_ALGORITHM,
    DEFAULT_GROUP_SIZE,
    MAX_GROUP_SIZE,
    MAX_HEAD_DIM,
)
from gdn_ref.contract import ContractError
from gdn_ref.masks import N_MASKS, build_mask_pack

from .block.aws import gdn_block_tkg
from .block.step import gdn_block_step
from .common.backend import BACKEND_NAME
from .conv.aws import gdn_conv1d_decode, gdn_conv1d_prefill
from .cte.bucket import gdn_cte_bucket
from .cte.kernel import gdn_cte
from .cte.varlen import gdn_cte_varlen
from .gating.kernel import gdn_gating
from .host.block import block_decode_step
from .host.buckets import configure_buckets, configured_buckets, padded_tokens, prefill_bucket
from .host.conv import conv_decode_step, conv_prefill_bucket
from .host.decode import decode_step, tkg_simulate
from .host.gating import fused_gdn_gating
from .host.norm import gated_rms_norm
from .host.normed import simulate_normed
from .host.prefill import prefill, prefill_varlen, simulate
from .norm.kernel import gdn_gated_rms_norm
from .normed.bucket import gdn_cte_bucket_normed
from .normed.kernel import gdn_cte_normed
from .tkg.fused import gdn_tkg
from .tkg.step import gdn_step

__all__ = [
    "ALGORITHMS",
    "ALGORITHM_NEUMANN",
    "ALGORITHM_SCHUR",
    "BACKEND_NAME",
    "CHUNK",
    "CHUNK_BY_ALGORITHM",
    "DEFAULT_ALGORITHM",
    "DEFAULT_GROUP_SIZE",
    "MAX_GROUP_SIZE",
    "MAX_HEAD_DIM",
    "N_MASKS",
    "ContractError",
    "block_decode_step",
    "build_mask_pack",
    "configure_buckets",
    "configured_buckets",
    "conv_decode_step",
    "conv_prefill_bucket",
    "decode_step",
    "fused_gdn_gating",
    "gated_rms_norm",
    "gdn_block_step",
    "gdn_block_tkg",
    "gdn_conv1d_decode",
    "gdn_conv1d_prefill",
    "gdn_cte",
    "gdn_cte_bucket",
    "gdn_cte_bucket_normed",
    "gdn_cte_normed",
    "gdn_cte_varlen",
    "gdn_gated_rms_norm",
    "gdn_gating",
    "gdn_step",
    "gdn_tkg",
    "padded_tokens",
    "prefill",
    "prefill_bucket",
    "prefill_varlen",
    "simulate",
    "simulate_normed",
    "tkg_simulate",
]
