"""Constants of the documented ``gdn_cte`` API shared by every implementation.

Each value is fixed by the API reference (the seed document) or by the hardware it targets; the reason
is written beside it.
"""

from __future__ import annotations

ALGORITHM_SCHUR = "schur"
ALGORITHM_NEUMANN = "neumann"
ALGORITHMS = (ALGORITHM_SCHUR, ALGORITHM_NEUMANN)
# The documented default: the Schur merge is faster at every benchmarked shape.
DEFAULT_ALGORITHM = ALGORITHM_SCHUR

# Chunk length per algorithm. Schur's 128 fills the 128 partitions of a NeuronCore tile; neumann's 64 is
# four 16-row sub-blocks, small enough that doubling intermediates stay in bf16's range.
CHUNK_SCHUR = 128
CHUNK_NEUMANN = 64
CHUNK_BY_ALGORITHM = {ALGORITHM_SCHUR: CHUNK_SCHUR, ALGORITHM_NEUMANN: CHUNK_NEUMANN}
CHUNK = CHUNK_SCHUR  # the mask pack's default plane size

# Neumann inverts 16-row diagonal sub-blocks by recursive doubling (log2(16) = 4 rounds).
SUBBLOCK_NEUMANN = 16

# Chunks per grouped inverse for schur. 8 is the documented default (1024 tokens to amortize);
# 16 bounds on-chip memory: each group member keeps about six 128x128 tiles live.
DEFAULT_GROUP_SIZE = 8
MIN_GROUP_SIZE = 1
MAX_GROUP_SIZE = 16

# Head dims sit on the 128-lane partition axis of on-chip tiles.
MAX_HEAD_DIM = 128

# The documented compute dtypes: query's dtype sets the dtype of the matmul operands and of out.
COMPUTE_DTYPES = ("float32", "bfloat16")
