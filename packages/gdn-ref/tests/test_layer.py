"""The float64 GatedDeltaNet layer oracle: against HF's Qwen3NextGatedDeltaNet (torch-gated), and its states."""

from __future__ import annotations

import numpy as np
import pytest

from gdn_ref.layer import gdn_layer_prefill

HK, DK, HV, DV, W = 2, 16, 4, 8, 4
C = 2 * HK * DK + HV * DV


def _inputs(tokens: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "mixed_qkv": rng.standard_normal((tokens, C)),
        "z": rng.standard_normal((tokens, HV, DV)),
        "b": rng.standard_normal((tokens, HV)),
        "a": rng.standard_normal((tokens, HV)),
    }


def _weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "conv_weight": 0.5 * rng.standard_normal((C, W)),
        "A_log": np.log(rng.uniform(0.1, 2.0, HV)),
        "dt_bias": rng.standard_normal(HV),
        "norm_weight": rng.uniform(0.5, 1.5, DV),
    }


def test_states_carry_a_split_prompt():
    """Two halves, the second from the first's conv window and recurrent state, equal the whole prompt."""
    x, w = _inputs(12, 1), _weights(2)
    whole = gdn_layer_prefill(**x, **w, num_key_heads=HK, head_k_dim=DK)
    first = gdn_layer_prefill(**{k: v[:5] for k, v in x.items()}, **w, num_key_heads=HK, head_k_dim=DK)
    second = gdn_layer_prefill(
        **{k: v[5:] for k, v in x.items()},
        **w,
        num_key_heads=HK,
        head_k_dim=DK,
        conv_window=first.conv_window,
        recurrent_state=first.recurrent_state,
    )
    np.testing.assert_allclose(np.concatenate([first.out, second.out]), whole.out, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(second.recurrent_state, whole.recurrent_state, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(second.conv_window, whole.conv_window, rtol=0)
    np.testing.assert_allclose(whole.conv_window, x["mixed_qkv"][-(W - 1) :].T, rtol=0)


def test_matches_hf_qwen3_next_gated_delta_net_fp32():
    """HF's fp32 torch layer (prefill, no cache) equals the oracle after in_proj, composed with out_proj."""
    torch = pytest.importorskip("torch")
    hf = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    from transformers import Qwen3NextConfig

    config = Qwen3NextConfig(
        hidden_size=32,
        num_hidden_layers=1,
        layer_types=["linear_attention"],
        linear_num_key_heads=HK,
        linear_num_value_heads=HV,
        linear_key_head_dim=DK,
        linear_value_head_dim=DV,
        linear_conv_kernel_dim=W,
    )
    torch.manual_seed(0)
    layer = hf.Qwen3NextGatedDeltaNet(config, 0).float().eval()
    w = _weights(3)
    with torch.no_grad():
        for p in (layer.in_proj_qkvz.weight, layer.in_proj_ba.weight, layer.out_proj.weight):
            p.normal_(0.0, 0.3)
        layer.conv1d.weight.copy_(torch.from_numpy(w["conv_weight"])[:, None, :])
        layer.A_log.copy_(torch.from_numpy(w["A_log"]))
        layer.dt_bias.copy_(torch.from_numpy(w["dt_bias"]))
        layer.norm.weight.copy_(torch.from_numpy(w["norm_weight"]))
        hidden = torch.randn(1, 40, config.hidden_size)
        got = layer(hidden).double().numpy()[0]
        q, k, v, z, b, a = layer.fix_query_key_value_ordering(layer.in_proj_qkvz(hidden), layer.in_proj_ba(hidden))
        mixed = torch.cat([x.reshape(1, 40, -1) for x in (q, k, v)], dim=-1)[0]

    def wide(t: torch.Tensor) -> np.ndarray:
        return t.detach().double().numpy()

    ref = gdn_layer_prefill(
        wide(mixed), wide(z[0]), wide(b[0]), wide(a[0]), **w, num_key_heads=HK, head_k_dim=DK, eps=config.rms_norm_eps
    )
    expected = ref.out.reshape(40, HV * DV) @ wide(layer.out_proj.weight).T
    rel_rms = np.sqrt(np.mean((got - expected) ** 2) / np.mean(expected**2))
    assert rel_rms < 1e-5, rel_rms  # fp32 throughout: a few units of fp32's 6e-8 per op, over a 40-token run
    assert np.max(np.abs(got - expected)) < 1e-4 * np.max(np.abs(expected))
