"""gdn-nki for PyTorch model code: every drop-in under its original name, from one import, each a ``torch.library``
custom op (namespace ``gdn_nki``; ``ops.py``), and context-parallel prefill over a ``torch.distributed`` group
(``context_parallel.py``). Needs the optional extra ``gdn-nki[torch]``.

    from gdn_nki.torch import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule   # was: fla.ops...

- ``chunk_gated_delta_rule``: FLA's prefill (host path: ``chunk.py``);
- ``fused_recurrent_gated_delta_rule``: FLA's decode, and vLLM's pool variant when called with vLLM's keywords;
  ``vllm_fused_recurrent_gated_delta_rule``: that variant under its own name (vLLM reuses FLA's);
  ``fused_sigmoid_gating_delta_rule_update``: SGLang's fused-gating update (host path: ``fused_recurrent.py``; also
  public as ``gdn_nki.torch_decode``);
- ``vllm_fused_sigmoid_gating_delta_rule_update`` (vLLM's signature of SGLang's name; the shared name called with
  one of vLLM's keywords is it) and ``fused_recurrent_gated_delta_rule_packed_decode``: vLLM's newer decode calls
  on a V-major pool (``vllm_decode.py``);
- ``vllm_chunk_gated_delta_rule``: vLLM's prefill of FLA's name, in vLLM's signature with its three results
  (``vllm_chunk.py``);
- ``gdn_tkg``: AWS's fused single-token step (``gdn_nki.gdn_tkg``) on torch tensors;
- ``causal_conv1d_fn``, ``causal_conv1d_update``: vLLM's conv prefill and decode on a conv-state pool;
  ``causal_conv1d``: FLA's conv (``conv.py``);
- ``rms_norm_gated``, ``FusedRMSNormGated``: FLA's gated RMSNorm, the layer's output stage (``norm.py``);
- ``fused_gdn_gating``: vLLM's prefill gates g and β from the a and b projections (``gating.py``);
- ``ForwardOnlyError``: what a backward through any of them raises (they are inference kernels; in grad mode they
  run, eager and compiled, and their outputs sit on the graph so that a backward says so: ``forward_only.py``);
- ``check_values``: the value rules a device path trusts, run on demand (``values.py``);
- ``context_parallel_chunk_gated_delta_rule``, ``build_cp_context``, ``ContextParallel``: FLA's ``cp_context``
  (both passes through ``chunk_gated_delta_rule``'s op; on device tensors, or traced, the call reads no value on
  the host: ``context_parallel.py``).
"""

from ..host.torch_io import ForwardOnlyError
from .context_parallel import ContextParallel, build_cp_context
from .conv import causal_conv1d, causal_conv1d_fn, causal_conv1d_update
from .forms import chunk_gated_delta_rule, fused_sigmoid_gating_delta_rule_update
from .gating import fused_gdn_gating
from .norm import FusedRMSNormGated, rms_norm_gated
from .ops import (
    context_parallel_chunk_gated_delta_rule,
    fused_recurrent_gated_delta_rule,
    gdn_tkg,
    vllm_fused_recurrent_gated_delta_rule,
)
from .values import check_values
from .vllm_chunk import vllm_chunk_gated_delta_rule
from .vllm_decode import fused_recurrent_gated_delta_rule_packed_decode, vllm_fused_sigmoid_gating_delta_rule_update

__all__ = [
    "ContextParallel",
    "ForwardOnlyError",
    "FusedRMSNormGated",
    "build_cp_context",
    "causal_conv1d",
    "causal_conv1d_fn",
    "causal_conv1d_update",
    "check_values",
    "chunk_gated_delta_rule",
    "context_parallel_chunk_gated_delta_rule",
    "fused_gdn_gating",
    "fused_recurrent_gated_delta_rule",
    "fused_recurrent_gated_delta_rule_packed_decode",
    "fused_sigmoid_gating_delta_rule_update",
    "gdn_tkg",
    "rms_norm_gated",
    "vllm_chunk_gated_delta_rule",
    "vllm_fused_recurrent_gated_delta_rule",
    "vllm_fused_sigmoid_gating_delta_rule_update",
]
