"""vLLM's ``chunk_gated_delta_rule`` (``vllm/model_executor/layers/fla/ops/chunk.py``, vLLM 044990c): FLA's prefill
under vLLM's own signature, which returns three values, as ``vllm_chunk_gated_delta_rule``.

vLLM's function shares FLA's name but not its form: its positional order differs after ``initial_state``
(``output_final_state, cu_seqlens, head_first, use_qk_l2norm_in_kernel``), and it returns ``(o, final_state,
intermediate_states)``. A call cannot be told apart from FLA's by its shapes, so the form is chosen by name: this
entry, under vLLM's name prefixed ``vllm_`` (as ``vllm_fused_recurrent_gated_delta_rule``), or FLA's name called
with vLLM's own keyword ``return_intermediate_states`` (``forms.chunk_gated_delta_rule`` hands such a call here). It
runs ``gdn_nki.torch.chunk_gated_delta_rule`` (one ``gdn_nki`` op; every rule, the same ``ContractError``\\ s).

States are [N, H, K, V], as in that vLLM version. vLLM's later form (the call in
``vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py``, a55a8d9: ``chunk_indices``, ``chunk_offsets``,
``core_attn_out``) keeps its states V-major, [N, H, V, K] (``fla/ops/chunk.py``, 8744bb0); its keywords are
rejected here by name rather than its states read transposed (at K = V no shape would tell).
"""

from __future__ import annotations

import inspect
from typing import Any

from gdn_ref.contract import names_entry_point

from ..host.torch_io import import_torch, rejection
from . import chunk as host_chunk
from . import ops
from .traced_rejection import rejects_at_trace_time

torch = import_torch()
Tensor = torch.Tensor

VLLM_CHUNK_ENTRY = "gdn_nki.torch.vllm_chunk_gated_delta_rule"
# The keywords of vLLM's later, V-major form: each rejected with the layout it implies.
V_MAJOR_KEYWORDS = ("chunk_indices", "chunk_offsets", "core_attn_out")
_V_MAJOR_FIX = (
    "vLLM's call with {name} keeps its states V-major [N, H, V, K]; this entry's are [N, H, K, V]: drop "
    "{name} and pass initial_state.transpose(-1, -2).contiguous() (the final state comes back [N, H, K, V])"
)


def _stand_in(rejected: Any, argument: Any) -> tuple[Any, Any, None]:
    """A rejected call's three results while tracing (``traced_rejection``)."""
    out, state = ops._output_and_state(rejected, argument)
    return out, state, None


@rejects_at_trace_time(_stand_in)
@names_entry_point(VLLM_CHUNK_ENTRY)
def vllm_chunk_gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
    head_first: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    return_intermediate_states: bool = False,
    **kwargs: Any,
) -> tuple[Tensor, Tensor | None, None]:
    """vLLM's ``chunk_gated_delta_rule``: the chunked prefill of FLA's, in vLLM's signature and results.

    Dimensions:
        B: batch (1 with ``cu_seqlens``). T: tokens. Hk, Hv: key and value heads. K, V: head dims. N: sequences.

    Args:
        q, k (Tensor): [B, T, Hk, K]. v (Tensor): [B, T, Hv, V]. g (Tensor): [B, T, Hv] log-decays.
        beta (Tensor): [B, T, Hv].
        scale (float | None): None: K ** −0.5.
        initial_state (Tensor | None): [N, Hv, K, V] fp32, read.
        output_final_state (bool): also return the final states.
        cu_seqlens (Tensor | None): [N + 1] packed sequence bounds (B = 1).
        head_first (bool): False only (vLLM deprecates True; gdn-nki rejects it by name).
        use_qk_l2norm_in_kernel (bool): L2-normalize q and k first.
        return_intermediate_states (bool): False only: vLLM's per-chunk state snapshots are not produced yet
            (rejected by name; ``chunk_gated_delta_rule``'s ``checkpoint_every`` keeps states every 128 tokens).
        kwargs: HF transformers' pass-through attention keywords, accepted and not used; vLLM's later V-major
            form's keywords (``chunk_indices``, ``chunk_offsets``, ``core_attn_out``) and any other are rejected
            by name.

    Returns:
        tuple: (o [B, T, Hv, V] in q's dtype, the final states [N, Hv, K, V] fp32 or None, None).

    Notes:
        As ``gdn_nki.torch.chunk_gated_delta_rule``: bad input raises ``ContractError`` naming the argument; in
        grad mode the outputs are on the graph and a backward raises ``ForwardOnlyError``.
    """
    if kwargs:
        hints = {name: _V_MAJOR_FIX.format(name=name) for name in V_MAJOR_KEYWORDS}
        parameters = tuple(p for p in inspect.signature(vllm_chunk_gated_delta_rule).parameters if p != "kwargs")
        host_chunk.reject_unknown_keywords(kwargs, "vllm_chunk_gated_delta_rule", parameters, "vLLM's", hints)
    if return_intermediate_states is not False:
        raise rejection("return_intermediate_states", repr(return_intermediate_states), "gdn-nki does not produce "
                        "vLLM's per-chunk state snapshots yet", "pass return_intermediate_states=False (the third "
                        "result is None); for states at fixed positions use gdn_nki.torch.chunk_gated_delta_rule's "
                        "checkpoint_every= on a pool")  # fmt: skip
    o, final = ops.chunk_gated_delta_rule(
        q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        cu_seqlens=cu_seqlens, head_first=head_first, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
    )  # fmt: skip
    return o, final, None
