"""``gdn_nki.torch_decode``: the decode drop-ins under their documented module path (the ops of ``torch/ops.py``,
whose CPU implementation is ``torch/fused_recurrent.py``)."""

from .torch import (
    fused_recurrent_gated_delta_rule,
    fused_sigmoid_gating_delta_rule_update,
    vllm_fused_recurrent_gated_delta_rule,
)

__all__ = [
    "fused_recurrent_gated_delta_rule",
    "fused_sigmoid_gating_delta_rule_update",
    "vllm_fused_recurrent_gated_delta_rule",
]
