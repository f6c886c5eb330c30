"""The decode adapters on the real kernels they were written for (skipped without torch, transformers or gdn-nki):
HF's recurrent function as a decode step through the pool glue, gdn-nki's vLLM drop-in through the in-place pool
form, and a wrong declaration failing. (FLA's naive recurrence runs in ``nox -s thirdparty``: importing FLA alone
takes tens of seconds.)"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from test_power import check

HF = "transformers.models.qwen3_next.modeling_qwen3_next:torch_recurrent_gated_delta_rule"
VLLM_DROP_IN = "gdn_nki.torch_decode:vllm_fused_recurrent_gated_delta_rule"


def _needs(*modules: str) -> None:
    for module in modules:
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed")


def _passed(result: dict, *areas: str) -> None:
    assert result["code"] == 0, result["output"]
    for area in areas:
        counts = result["summary"]["areas"][area]
        assert counts.get("passed") and not counts.get("failed"), f"{area}: {counts}\n{result['output']}"


def test_hf_recurrent_as_a_decode_step(tmp_path: Path) -> None:
    _needs("torch", "transformers")
    result = check(HF, ("decode_numerics", "decode_prefill"), "random or prefill", tmp_path,
                   extra=("--adapter", "hf-decode"))  # fmt: skip
    _passed(result, "decode_numerics", "decode_prefill")
    assert "hf-decode adapter (scale=internal" in result["summary"]["run"]["via"]


def test_vllm_signature_addresses_the_pool_itself(tmp_path: Path) -> None:
    """Through vllm-decode the kernel gets the pool and its indices: the pool, padding and verify-then-resume
    tests run on the kernel itself (gdn-nki's drop-in of vLLM's function)."""
    _needs("torch", "gdn_nki")
    result = check(VLLM_DROP_IN, ("decode_pool", "decode_speculative"), "", tmp_path,
                   extra=("--adapter", "vllm-decode"))  # fmt: skip
    _passed(result, "decode_pool", "decode_speculative")


def test_a_wrong_scale_declaration_fails(tmp_path: Path) -> None:
    """HF's function takes no scale (it swallows scale= in **kwargs and applies Dk**-0.5): called through
    fla-decode, which declares scale=argument, the caller's-scale test fails."""
    _needs("torch", "transformers")
    result = check(HF, ("decode_numerics",), "scale", tmp_path, extra=("--adapter", "fla-decode"))
    assert result["code"] == 1 and result["summary"]["areas"]["decode_numerics"].get("failed"), result["output"]
