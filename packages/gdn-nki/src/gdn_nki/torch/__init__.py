"""gdn-nki for PyTorch model code: every drop-in under its original name, from one import. Needs the optional
extra ``gdn-nki[torch]``.

    from gdn_nki.torch import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule   # was: fla.ops...

- ``chunk_gated_delta_rule``: FLA's prefill (``chunk.py``);
- ``fused_recurrent_gated_delta_rule``: FLA's decode; ``vllm_fused_recurrent_gated_delta_rule``: vLLM's pool
  variant of it (same original name in vLLM, so exported under its own here); ``fused_sigmoid_gating_delta_rule_update``:
  vLLM's / SGLang's fused-gating update (``fused_recurrent.py``, also public as ``gdn_nki.torch_decode``).
"""

from .chunk import chunk_gated_delta_rule
from .fused_recurrent import (
    fused_recurrent_gated_delta_rule,
    fused_sigmoid_gating_delta_rule_update,
    vllm_fused_recurrent_gated_delta_rule,
)

__all__ = [
    "chunk_gated_delta_rule",
    "fused_recurrent_gated_delta_rule",
    "fused_sigmoid_gating_delta_rule_update",
    "vllm_fused_recurrent_gated_delta_rule",
]
