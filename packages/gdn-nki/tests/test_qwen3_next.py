"""A Qwen3-Next layer and 2-layer model end to end on gdn-nki (``examples/qwen3_next_layer.py``): HF's own torch
path against ours swapped in for it, fp32 and bf16, prefill then decode from our final state. Skipped, with the
reason, without torch and transformers (``nox -s integration`` installs both)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is not installed (nox -s integration installs it)")
pytest.importorskip("transformers", reason="transformers is not installed (nox -s integration installs it)")

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "qwen3_next_layer.py"


def _example():
    spec = importlib.util.spec_from_file_location("qwen3_next_layer", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


# The example calls the model as transformers documents it now: a deprecated argument or output field (HF's
# FutureWarning, e.g. ``past_key_values`` before 5.40) fails the test instead of scrolling by.
@pytest.mark.filterwarnings("error:.*is deprecated.*:FutureWarning")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_qwen3_next_layer_and_model_agree_with_hf_within_gdn_spec_bounds(dtype: str) -> None:
    example = _example()
    result = example.compare_dtype(dtype)
    assert len(result.core) == 2, "the layer and the model's linear-attention layer each called gdn-nki once"
    assert [call.tokens for call in result.core] == [example.PROMPT] * 2
    assert len(result.core[1].errors) == 2, "the model's prefill asked for the final state (its cache)"
    assert len(result.decode) == example.DECODE_STEPS
    assert result.ok, example.report(result)
    assert example.hf.torch_chunk_gated_delta_rule is example.HF_CORE, "HF's function is restored afterwards"


def test_the_swap_is_one_assignment_of_the_fla_entry_point() -> None:
    import torch

    from gdn_nki.torch import chunk_gated_delta_rule
    from gdn_spec.metrics import compare

    example = _example()
    layer, model, ids = example._layer_and_model(torch.float32)
    hidden = model.layers[0].input_layernorm(model.embed_tokens(ids[:, :40]))
    with torch.no_grad():
        theirs = layer(hidden)
        example.hf.torch_chunk_gated_delta_rule = chunk_gated_delta_rule  # the whole change
        try:
            ours = layer(hidden)
        finally:
            example.hf.torch_chunk_gated_delta_rule = example.HF_CORE
    assert not torch.equal(ours, theirs), "the layer ran on gdn-nki, not HF's torch path"
    error = compare("out", ours.numpy(), theirs.numpy(), "float32")
    assert error.ok, str(error)
