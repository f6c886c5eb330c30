"""The float64 gated RMSNorm oracle: its formula, FLA's options, HF's Qwen3NextRMSNormGated, and its rejections."""

from __future__ import annotations

import numpy as np
import pytest

from gdn_ref.contract import ContractError
from gdn_ref.decode import gated_rms_norm
from gdn_ref.norm import gated_rms_norm_oracle

RNG = np.random.default_rng(43)
X = RNG.standard_normal((5, 3, 16))
Z = RNG.standard_normal((5, 3, 16))
W = RNG.standard_normal(16)
B = RNG.standard_normal(16)


def test_unit_rms_and_gate_by_hand():
    """Without weight and gate each row has RMS sqrt(ms / (ms + eps)); the gate multiplies by z·sigmoid(z)."""
    eps = 1e-3
    y = gated_rms_norm_oracle(X, None, eps=eps)
    ms = np.mean(X * X, axis=-1)
    np.testing.assert_allclose(np.sqrt(np.mean(y * y, axis=-1)), np.sqrt(ms / (ms + eps)), rtol=1e-13)
    gated = gated_rms_norm_oracle(X, Z, eps=eps)
    np.testing.assert_allclose(gated, y * Z / (1.0 + np.exp(-Z)), rtol=1e-13)


def test_matches_decode_form():
    np.testing.assert_allclose(gated_rms_norm_oracle(X, Z, W, activation="silu"), gated_rms_norm(X, Z, W), rtol=1e-13)


def test_sigmoid_bias_residual_prenorm():
    r = RNG.standard_normal(X.shape)
    y, h = gated_rms_norm_oracle(X, Z, W, B, activation="sigmoid", residual=r, prenorm=True)
    np.testing.assert_allclose(h, X + r, rtol=0)
    plain = gated_rms_norm_oracle(X + r, None, W, B)
    np.testing.assert_allclose(y, plain / (1.0 + np.exp(-Z)), rtol=1e-13)


def test_hf_qwen3_next_rms_norm_gated_fp32():
    """HF's torch module in fp32 (no down-cast) agrees with the oracle to fp32 rounding."""
    torch = pytest.importorskip("torch")
    mod = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    norm = mod.Qwen3NextRMSNormGated(16, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.from_numpy(W))
        out = norm(torch.from_numpy(X).float(), torch.from_numpy(Z).float()).double().numpy()
    ref = gated_rms_norm_oracle(X, Z, W, eps=1e-6)
    assert np.sqrt(np.mean((out - ref) ** 2) / np.mean(ref**2)) < 1e-6
    assert np.max(np.abs(out - ref)) < 1e-5 * np.max(np.abs(ref))


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"eps": 0.0}, "eps"),
        ({"eps": float("nan")}, "eps"),
        ({"activation": "gelu"}, "activation"),
        ({"norm_before_gate": False}, "norm_before_gate"),
        ({"group_size": 8}, "group_size"),
        ({"weight": np.ones(8)}, "weight"),
        ({"bias": np.ones(8)}, "bias"),
        ({"z": np.ones((5, 3, 8))}, "g"),
        ({"residual": np.ones((5, 16))}, "residual"),
    ],
)
def test_rejections_name_the_argument(kwargs, argument):
    args = {"z": Z, **kwargs}
    with pytest.raises(ContractError) as info:
        gated_rms_norm_oracle(X, **args)
    assert f"`{argument}`" in str(info.value)
