"""The oracle against an outside implementation, an independent loop, and a deliberately wrong variant."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gdn_ref import recurrent
from ref_inputs import HF_CASES, assert_close, hf_case, make_inputs, rel_rms


@pytest.mark.parametrize("case", HF_CASES)
def test_oracle_matches_hf_transformers_vectors(case: str) -> None:
    # HF pre-multiplies q by scale; the oracle multiplies the output: equal in exact arithmetic. HF ran in
    # float32 token by token, so ~1e-7 relative per step accumulates to ~1e-6 at worst (tests/data/README.md).
    data = hf_case(case)
    out, state = recurrent(
        data["query"], data["key"], data["value"], data["g_log"], data["beta"], float(data["scale"]),
        data["initial_state"],
    )  # fmt: skip
    assert_close(out, data["out_recurrent"], 1e-6, 1e-5, f"{case} out vs HF recurrent")
    assert_close(state, data["state_recurrent"], 1e-6, 1e-5, f"{case} state vs HF recurrent")
    assert_close(out, data["out_chunk"], 2e-6, 1e-5, f"{case} out vs HF chunk")
    assert_close(state, data["state_chunk"], 2e-6, 1e-5, f"{case} state vs HF chunk")


def _scalar_loop_one_head(q, k, v, g, b, scale, state0):
    """One head, written as plain Python over scalars and column by column (independent of the oracle's form)."""
    n_tokens, dk = len(g), len(state0)
    dv = len(state0[0])
    state = [[float(state0[i][j]) for j in range(dv)] for i in range(dk)]
    out = []
    for t in range(n_tokens):
        alpha = math.exp(g[t])
        row = []
        for j in range(dv):
            column = [alpha * state[i][j] for i in range(dk)]
            predicted = sum(k[t][i] * column[i] for i in range(dk))
            write = b[t] * (v[t][j] - predicted)
            for i in range(dk):
                state[i][j] = column[i] + k[t][i] * write
            row.append(scale * sum(q[t][i] * state[i][j] for i in range(dk)))
        out.append(row)
    return np.array(out), np.array(state)


def test_oracle_matches_independent_scalar_loop() -> None:
    x = make_inputs(1, B=1, Hk=1, Hv=2, S=23, Dk=5, Dv=3)
    out, state = recurrent(*x.args())
    for h in range(2):  # both value heads read key head 0
        ref_out, ref_state = _scalar_loop_one_head(
            x.query[0, 0].tolist(), x.key[0, 0].tolist(), x.value[0, h].tolist(), x.g_log[0, h].tolist(),
            x.beta[0, h].tolist(), x.scale, x.initial_state[0, h].tolist(),
        )  # fmt: skip
        np.testing.assert_allclose(out[0, h], ref_out, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(state[0, h], ref_state, rtol=1e-12, atol=1e-12)


def _delta_on_pre_decay_state(x) -> np.ndarray:
    """A different model: u = β(v − Sᵀk) on the state BEFORE the decay."""
    q, k = x.query[:, 0], x.key[:, 0]
    state = x.initial_state[:, 0].copy()
    out = np.empty_like(x.value[:, 0])
    for t in range(x.g_log.shape[-1]):
        write = x.beta[:, 0, t, None] * (x.value[:, 0, t] - np.einsum("bk,bkv->bv", k[:, t], state))
        state = np.exp(x.g_log[:, 0, t])[:, None, None] * state + k[:, t, :, None] * write[:, None, :]
        out[:, t] = x.scale * np.einsum("bk,bkv->bv", q[:, t], state)
    return out


def test_delta_on_pre_decay_state_is_caught() -> None:
    # The two orders' writes differ by β(1 − α)Sᵀk (α = e^g), so strong gates and β near 1 expose it: ~20%
    # relative, against the 1e-12 at which correct implementations agree here.
    x = make_inputs(2, B=2, Hk=1, Hv=1, S=64, Dk=16, Dv=8, gate="strong", beta_range=(0.9, 1.0))
    out, _ = recurrent(*x.args())
    wrong = _delta_on_pre_decay_state(x)
    assert rel_rms(wrong, out[:, 0]) > 0.1, "the oracle does not distinguish decay-then-delta from delta-then-decay"


def test_output_is_read_after_the_write() -> None:
    # From a zero state, token 0's output is scale·(q₀·k₀)·β₀v₀: zero if the read happened before the write.
    x = make_inputs(3, S=1, with_state=False)
    out, _ = recurrent(*x.args())
    expected = x.scale * np.einsum("bhd,bhd->bh", x.query[:, :, 0], x.key[:, :, 0])
    expected = np.repeat(expected, 2, axis=1)[..., None] * x.beta[:, :, 0, None] * x.value[:, :, 0]
    np.testing.assert_allclose(out[:, :, 0], expected, rtol=1e-12, atol=1e-14)


def test_gqa_reads_key_head_h_div_ratio() -> None:
    x = make_inputs(4, Hk=2, Hv=6, S=40)
    out, state = recurrent(*x.args())
    repeated = np.repeat(x.query, 3, axis=1), np.repeat(x.key, 3, axis=1)
    out_rep, state_rep = recurrent(*repeated, x.value, x.g_log, x.beta, x.scale, x.initial_state)
    np.testing.assert_array_equal(out, out_rep)
    np.testing.assert_array_equal(state, state_rep)


def test_scale_equals_prescaled_query_and_state_defaults_to_zero() -> None:
    x = make_inputs(5, with_state=False)
    out, state = recurrent(*x.args())
    out_pre, _ = recurrent(x.query * x.scale, x.key, x.value, x.g_log, x.beta, 1.0, None)
    np.testing.assert_allclose(out, out_pre, rtol=1e-12, atol=1e-13)
    out_zero, state_zero = recurrent(*x.args()[:-1], np.zeros_like(state))
    np.testing.assert_array_equal(out, out_zero)
    np.testing.assert_array_equal(state, state_zero)


def test_oracle_returns_float64_and_leaves_inputs_untouched() -> None:
    x = make_inputs(6).astype(np.float32)
    before = [a.copy() for a in (x.query, x.key, x.value, x.g_log, x.beta, x.initial_state)]
    out, state = recurrent(*x.args())
    assert out.dtype == np.float64 and state.dtype == np.float64
    assert out.shape == x.value.shape and state.shape == x.initial_state.shape
    for old, new in zip(before, (x.query, x.key, x.value, x.g_log, x.beta, x.initial_state), strict=True):
        np.testing.assert_array_equal(old, new)
