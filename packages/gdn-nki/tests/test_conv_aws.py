"""AWS's documented ``gdn_conv1d_prefill`` / ``gdn_conv1d_decode`` (SDK 2.33 signatures) against the fp64 conv
oracle and Hugging Face's Qwen3-Next conv functions."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gdn_nki
from gdn_nki.common import backend
from gdn_ref.conv import conv_from_window
from gdn_spec.metrics import compare, describe

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}


@settings(max_examples=6, deadline=None)
@given(
    B=st.integers(1, 3),
    tiles=st.integers(1, 2),
    T=st.sampled_from([1, 2, 5, 513, 700]),
    K=st.integers(2, 5),
    dtype=st.sampled_from(["float32", "bfloat16"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_prefill_then_decode_match_the_oracle(B, tiles, T, K, dtype, seed) -> None:
    """Each row from an empty window; the state is the last K raw inputs (zeros before the first); a decode token
    then slides it by one. T = 513 and 700 cross a token block (its K - 1 inputs before it)."""
    rng = np.random.default_rng(seed)
    C = 128 * tiles
    mixed = rng.standard_normal((B, C, T)).astype(DTYPES[dtype])
    weight = (0.5 * rng.standard_normal((C, K))).astype(np.float32)
    out, state = backend.simulate(gdn_nki.gdn_conv1d_prefill)(mixed, weight)
    token = rng.standard_normal((B, C, 1)).astype(DTYPES[dtype])
    out1, state1 = backend.simulate(gdn_nki.gdn_conv1d_decode)(token, state, weight)
    for b in range(B):
        ref, windows = conv_from_window(mixed[b].T, np.zeros((C, K)), weight, None, "silu")
        error = compare("out", out[b].T, ref, dtype)
        assert error.ok, describe([error])
        np.testing.assert_array_equal(state[b], windows[-1].astype(state.dtype))
        ref1, after = conv_from_window(token[b].T, windows[-1], weight, None, "silu")
        error = compare("out", out1[b].T, ref1, dtype)
        assert error.ok, describe([error])
        np.testing.assert_array_equal(state1[b], after[-1].astype(state.dtype))


def test_matches_hf_causal_conv1d_fn_and_update() -> None:
    torch = pytest.importorskip("torch")
    modeling = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    if not hasattr(modeling, "causal_conv1d_fn"):
        pytest.skip("this transformers has no causal_conv1d_fn")
    rng = np.random.default_rng(0)
    mixed = rng.standard_normal((2, 256, 600)).astype(np.float32)  # two token blocks: the halo crosses
    weight = rng.standard_normal((256, 4)).astype(np.float32)
    out, state = backend.simulate(gdn_nki.gdn_conv1d_prefill)(mixed, weight)
    ref = modeling.causal_conv1d_fn(torch.from_numpy(mixed), torch.from_numpy(weight), None, activation="silu")
    np.testing.assert_allclose(out, ref.numpy(), rtol=1e-5, atol=1e-5)
    token = rng.standard_normal((2, 256, 1)).astype(np.float32)
    hf_state = torch.from_numpy(state.copy())
    ref1 = modeling.causal_conv1d_update(torch.from_numpy(token), hf_state, torch.from_numpy(weight), None,
                                         activation="silu")  # fmt: skip
    out1, state1 = backend.simulate(gdn_nki.gdn_conv1d_decode)(token, state, weight)
    np.testing.assert_allclose(out1, ref1.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(state1, hf_state.numpy())
