"""The tiny HF Qwen3-Next model generates with gdn-nki in both phases — prefill through
``gdn_nki.torch.chunk_gated_delta_rule``, every decode step through ``gdn_nki.torch_decode.
fused_recurrent_gated_delta_rule`` — and its greedy tokens are HF's own fp32 path's. Skipped, with the reason,
without torch and transformers (``nox -s integration`` installs both)."""

from __future__ import annotations

import pytest

from example_scripts import load_example

torch = pytest.importorskip("torch", reason="torch is not installed (nox -s integration installs it)")
pytest.importorskip("transformers", reason="transformers is not installed (nox -s integration installs it)")

PROMPT, NEW_TOKENS = 16, 4


def test_greedy_generation_on_gdn_nki_equals_hf_fp32() -> None:
    from transformers import Qwen3NextForCausalLM

    from gdn_nki.torch import chunk_gated_delta_rule
    from gdn_nki.torch_decode import fused_recurrent_gated_delta_rule

    example = load_example("qwen3_next_layer")
    hf = example.hf
    torch.manual_seed(0)
    model = Qwen3NextForCausalLM(example.tiny_config()).eval()
    ids = torch.randint(0, 256, (2, PROMPT))
    calls: list[int] = []

    def decode(*args, **kwargs):
        calls.append(args[0].shape[1])
        return fused_recurrent_gated_delta_rule(*args, **kwargs)

    with torch.no_grad():
        theirs = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)
        saved = hf.torch_chunk_gated_delta_rule, hf.torch_recurrent_gated_delta_rule
        hf.torch_chunk_gated_delta_rule, hf.torch_recurrent_gated_delta_rule = chunk_gated_delta_rule, decode
        try:
            ours = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)
        finally:
            hf.torch_chunk_gated_delta_rule, hf.torch_recurrent_gated_delta_rule = saved
    assert calls == [1] * (NEW_TOKENS - 1), "every decode step ran on gdn-nki"
    assert torch.equal(ours, theirs)
