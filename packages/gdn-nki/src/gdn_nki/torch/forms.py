"""The public drop-ins whose name two projects share: FLA's ``chunk_gated_delta_rule`` and SGLang's
``fused_sigmoid_gating_delta_rule_update`` (``ops.py``), which are vLLM's when called with one of vLLM's own keywords
(its forms: ``vllm_chunk.py``, ``vllm_decode.py``). The choice is by keyword, never by shapes. A module of its own:
vLLM's forms run ``ops``' drop-ins, so ``ops`` cannot import them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from . import ops, vllm_chunk, vllm_decode


def _or_vllms_chunk_form(fla: Callable[..., Any]) -> Callable[..., Any]:
    """FLA's prefill drop-in that is vLLM's when called with vLLM's own keyword ``return_intermediate_states``: that
    call, positional arguments in vLLM's order included, goes to ``vllm_chunk_gated_delta_rule`` (three results)."""

    @functools.wraps(fla)
    def dispatch(*args: Any, **kwargs: Any) -> Any:
        if "return_intermediate_states" not in kwargs:
            return fla(*args, **kwargs)
        return vllm_chunk.vllm_chunk_gated_delta_rule(*args, **kwargs)

    return dispatch


def _or_vllms_sigmoid_form(sglang: Callable[..., Any]) -> Callable[..., Any]:
    """SGLang's fused-gating drop-in that is vLLM's (another signature, a V-major pool, two results) when called with
    one of vLLM's own keywords: that call goes to ``vllm_decode.vllm_fused_sigmoid_gating_delta_rule_update``."""

    @functools.wraps(sglang)
    def dispatch(*args: Any, **kwargs: Any) -> Any:
        vllm_keywords = [name for name in vllm_decode.VLLM_SIGMOID_KEYWORDS if name in kwargs]
        if not vllm_keywords:
            return sglang(*args, **kwargs)
        vllm_decode.reject_sglang_keywords(vllm_keywords[0], kwargs)
        return vllm_decode.vllm_fused_sigmoid_gating_delta_rule_update(*args, **kwargs)

    return dispatch


chunk_gated_delta_rule = _or_vllms_chunk_form(ops.chunk_gated_delta_rule)
fused_sigmoid_gating_delta_rule_update = _or_vllms_sigmoid_form(ops.fused_sigmoid_gating_delta_rule_update)
