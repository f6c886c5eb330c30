"""``gdn_nki.torch_decode``: the decode drop-ins under their documented module path (``torch/fused_recurrent.py``)."""

from .torch.fused_recurrent import (
    fused_recurrent_gated_delta_rule,
    fused_sigmoid_gating_delta_rule_update,
    vllm_fused_recurrent_gated_delta_rule,
)

__all__ = [
    "fused_recurrent_gated_delta_rule",
    "fused_sigmoid_gating_delta_rule_update",
    "vllm_fused_recurrent_gated_delta_rule",
]
