"""gdn-nki for PyTorch model code: FLA's ``chunk_gated_delta_rule`` on the NKI kernel (``chunk.py``), the decode
drop-ins (``fused_recurrent.py``) and context-parallel prefill over a ``torch.distributed`` group
(``context_parallel.py``). Needs the optional extra ``gdn-nki[torch]``.

    from gdn_nki.torch import chunk_gated_delta_rule   # was: from fla.ops.gated_delta_rule import ...
"""

from .chunk import chunk_gated_delta_rule, context_parallel_chunk_gated_delta_rule
from .context_parallel import ContextParallel, build_cp_context

__all__ = ["ContextParallel", "build_cp_context", "chunk_gated_delta_rule", "context_parallel_chunk_gated_delta_rule"]
