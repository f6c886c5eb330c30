"""gdn-ref: reference implementations of the chunked gated delta rule (GDN).

The float64 token-by-token oracle (:func:`recurrent`), the chunk-parallel form with either intra-chunk inverse
(:func:`chunked`), the inverses themselves, the schur mask pack, the documented ``gdn_cte`` API on the host, and the
float64 decode oracle (:func:`decode_steps`, :func:`gdn_tkg_reference`).
"""

from .api import gdn_cte
from .block import gdn_block_decode_pool
from .chunked import chunked
from .constants import (
    ALGORITHM_NEUMANN,
    ALGORITHM_SCHUR,
    ALGORITHMS,
    CHUNK_BY_ALGORITHM,
    CHUNK_NEUMANN,
    CHUNK_SCHUR,
    DEFAULT_ALGORITHM,
    DEFAULT_GROUP_SIZE,
    MAX_GROUP_SIZE,
    MAX_HEAD_DIM,
    SUBBLOCK_NEUMANN,
)
from .contract import ContractError
from .decode import decode_steps, fused_gates, gated_rms_norm, l2_normalize
from .decode import gdn_tkg as gdn_tkg_reference
from .inverse import neumann_inverse, schur_inverse, schur_inverse_blocked
from .layer import LayerResult, gdn_layer_prefill
from .masks import (
    N_MASKS,
    PLANE_EYE,
    PLANE_OFF0,
    PLANE_TRIL_STRICT,
    PLANE_UPPER_NEG,
    build_mask_pack,
    off_block_mask,
    off_neg_plane,
)
from .norm import gated_rms_norm_oracle
from .recurrent import recurrent
from .rounding import to_bf16_values

__all__ = [
    "ALGORITHMS",
    "ALGORITHM_NEUMANN",
    "ALGORITHM_SCHUR",
    "CHUNK_BY_ALGORITHM",
    "CHUNK_NEUMANN",
    "CHUNK_SCHUR",
    "DEFAULT_ALGORITHM",
    "DEFAULT_GROUP_SIZE",
    "MAX_GROUP_SIZE",
    "MAX_HEAD_DIM",
    "N_MASKS",
    "PLANE_EYE",
    "PLANE_OFF0",
    "PLANE_TRIL_STRICT",
    "PLANE_UPPER_NEG",
    "SUBBLOCK_NEUMANN",
    "ContractError",
    "LayerResult",
    "build_mask_pack",
    "chunked",
    "decode_steps",
    "fused_gates",
    "gated_rms_norm",
    "gated_rms_norm_oracle",
    "gdn_block_decode_pool",
    "gdn_cte",
    "gdn_layer_prefill",
    "gdn_tkg_reference",
    "l2_normalize",
    "neumann_inverse",
    "off_block_mask",
    "off_neg_plane",
    "recurrent",
    "schur_inverse",
    "schur_inverse_blocked",
    "to_bf16_values",
]
