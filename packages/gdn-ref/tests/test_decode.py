"""The decode oracle: T tokens from a state are the recurrence's tokens, and the fused tkg step is its formula."""

from __future__ import annotations

import numpy as np
import pytest

from gdn_ref import decode_steps, fused_gates, gdn_tkg_reference, recurrent
from gdn_ref.contract import ContractError, index_violations, rejection_message, validate_step, validate_tkg


def _step_inputs(seed: int, N=3, T=4, Hk=2, Hv=4, Dk=8, Dv=6):
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((2, N, T, Hk, Dk))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((N, T, Hv, Dv))
    g = -rng.uniform(0.01, 2.0, (N, T, Hv))
    beta = rng.uniform(0.05, 1.0, (N, T, Hv))
    state = rng.standard_normal((N, Hv, Dk, Dv))
    return q, k, v, g, beta, state


def test_decode_steps_are_the_recurrence_token_by_token() -> None:
    q, k, v, g, beta, state = _step_inputs(1)
    out, states = decode_steps(q, k, v, g, beta, 0.3, state)
    head_major = [x.swapaxes(1, 2) for x in (q, k, v, g, beta)]
    for t in range(1, q.shape[1] + 1):
        ref_out, ref_state = recurrent(*[x[:, :, :t] for x in head_major], scale=0.3, initial_state=state)
        np.testing.assert_allclose(states[:, t - 1], ref_state, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out.swapaxes(1, 2), ref_out, rtol=1e-12, atol=1e-12)


def test_l2norm_is_applied_to_q_and_k_with_eps() -> None:
    q, k, v, g, beta, state = _step_inputs(2)
    raw = 5.0 * k
    out, _ = decode_steps(q, raw, v, g, beta, 1.0, state, l2norm=True)
    qn = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6)
    kn = raw / np.sqrt((raw * raw).sum(-1, keepdims=True) + 1e-6)
    ref, _ = decode_steps(qn, kn, v, g, beta, 1.0, state)
    np.testing.assert_allclose(out, ref, rtol=1e-12)


def _tkg_inputs(seed: int, B=2, Hv=3, K=8, V=4):
    rng = np.random.default_rng(seed)
    bh = B * Hv
    f32 = np.float32
    return dict(
        q=rng.standard_normal((bh, K)).astype(f32),
        k=rng.standard_normal((bh, K)).astype(f32),
        v=rng.standard_normal((bh, V)).astype(f32),
        b=rng.standard_normal(bh).astype(f32),
        a=(0.1 * rng.standard_normal(bh)).astype(f32),
        A_log=(0.5 * rng.standard_normal(Hv)).astype(f32),
        dt_bias=(0.1 * rng.standard_normal(Hv)).astype(f32),
        z=rng.standard_normal((bh, V)).astype(f32),
        norm_weight=(1.0 + 0.2 * rng.standard_normal(V)).astype(f32),
        state_in=(0.1 * rng.standard_normal((bh, K, V))).astype(f32),
    )


def test_tkg_reference_is_the_documented_formula_row_by_row() -> None:
    """Written out per row, as AWS's page states it: row r is batch r // Hv, value head r % Hv."""
    x = _tkg_inputs(3)
    out, state = gdn_tkg_reference(**x)
    hv = x["A_log"].size
    for r in range(x["q"].shape[0]):
        h = r % hv
        q, k = (x[n][r].astype(np.float64) for n in ("q", "k"))
        q = q / np.sqrt(q @ q + 1e-6) / np.sqrt(q.size)
        k = k / np.sqrt(k @ k + 1e-6)
        g = -np.exp(float(x["A_log"][h])) * np.log1p(np.exp(float(x["a"][r]) + float(x["dt_bias"][h])))
        beta = 1 / (1 + np.exp(-float(x["b"][r])))
        s = np.exp(g) * x["state_in"][r].astype(np.float64)
        s = s + np.outer(k, beta * (x["v"][r] - k @ s))
        o = q @ s
        z = x["z"][r].astype(np.float64)
        o = o / np.sqrt(np.mean(o * o) + 1e-6) * x["norm_weight"] * z / (1 + np.exp(-z))
        np.testing.assert_allclose(state[r], s, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(out[r], o, rtol=1e-12, atol=1e-14)


def test_fused_gates_match_softplus_and_sigmoid_at_large_arguments() -> None:
    g, beta = fused_gates(np.array([-100.0, 0.0, 100.0]), np.array([-50.0, 0.0, 50.0]), np.zeros(3), np.zeros(3))
    np.testing.assert_allclose(g, [-np.exp(-100.0), -np.log(2.0), -100.0], rtol=1e-12)
    np.testing.assert_allclose(beta, [np.exp(-50.0) / (1 + np.exp(-50.0)), 0.5, 1 / (1 + np.exp(-50.0))], rtol=1e-12)


def test_tkg_contract_accepts_a_valid_call_and_names_each_broken_rule() -> None:
    x = _tkg_inputs(4)
    assert validate_tkg(**x) == []
    bad = dict(x, z=x["z"][:, :3], b=x["b"].astype(np.float64), dt_bias=np.zeros(4, np.float32))
    found = {v.rule_id: v for v in validate_tkg(**bad)}
    assert set(found) == {"z.shape", "b.dtype", "dt_bias.shape"}
    text = str(ContractError(list(found.values())))
    assert text.startswith("gdn_tkg rejected the call") and "`z` shape (6, 3)" in text and "Fix:" in text


def test_tkg_contract_scans_values_and_the_fused_gate() -> None:
    x = _tkg_inputs(5)
    x["z"][1, 2] = np.nan
    assert [v.rule_id for v in validate_tkg(**x)] == ["z.finite"]
    assert validate_tkg(**x, host=False) == []
    x = _tkg_inputs(5)
    x["A_log"][0] = 100.0  # exp overflows in fp32: -inf * softplus(...) is fine, but a + dt_bias = -inf is not
    x["a"][0] = -np.float32(3e38)
    x["dt_bias"][0] = -np.float32(3e38)
    assert "g.domain" in [v.rule_id for v in validate_tkg(**x)]


def _step_args(**over):
    q, k, v, g, beta, _ = _step_inputs(6)
    f32 = np.float32
    args = dict(query=q.astype(f32), key=k.astype(f32), value=v.astype(f32), g_log=g.astype(f32),
                beta=beta.astype(f32), state_pool=np.zeros((8, 4, 8, 6), f32),
                state_indices=np.array([5, -1, 2], np.int32))  # fmt: skip
    args.update(over)
    return args


def test_step_contract_rules() -> None:
    assert validate_step(_step_args()) == []
    ids = [v.rule_id for v in validate_step(_step_args(a=np.zeros((3, 4, 4), np.float32)))]
    assert ids == ["gates.form"]
    ids = [v.rule_id for v in validate_step(_step_args(state_indices=np.array([5, -1, 2], np.int64)))]
    assert ids == ["state_indices.dtype"]
    accepted = np.array([1, 1, 1], np.int32)
    assert [v.rule_id for v in validate_step(_step_args(num_accepted_tokens=accepted))] == ["num_accepted_tokens.form"]


@pytest.mark.parametrize(
    ("name", "bad", "rule"),
    [("g_log", 0.5, "g_log.domain"), ("g_log", np.nan, "g_log.domain"), ("beta", 1.5, "beta.domain"),
     ("beta", np.nan, "beta.finite"), ("beta", np.inf, "beta.finite"), ("beta", -0.25, "beta.domain")],
)  # fmt: skip
def test_step_gates_are_scanned_in_the_callers_layout(name: str, bad: float, rule: str) -> None:
    """Precomputed gates ([N, T, Hv]) go through gdn_cte's domain rules and the finite scan; the violation names
    the element as the caller laid it out."""
    args = _step_args()
    args[name] = args[name].copy()
    args[name][2, 3, 1] = bad
    found = validate_step(args)
    assert [(v.rule_id, v.argument) for v in found] == [(rule, name)], found
    assert "at index [2, 3, 1]" in found[0].value


@pytest.mark.parametrize(
    ("indices", "accepted", "rule"),
    [
        ([[0, 1], [8, 2]], None, "state_indices.range"),
        ([[0, 1], [-2, 2]], None, "state_indices.range"),
        ([[0, -1], [3, 2]], None, "state_indices.padding"),
        ([[0, 1], [1, 2]], None, "state_indices.distinct"),
        ([[0, 1], [3, 2]], [1, 3], "num_accepted_tokens.range"),
        ([[0, 1], [3, 2]], [0, 1], "num_accepted_tokens.range"),
    ],
)
def test_index_values(indices, accepted, rule) -> None:
    acc = None if accepted is None else np.array(accepted, np.int32)
    found = index_violations(np.array(indices, np.int32), acc, 8, 2)
    assert [v.rule_id for v in found] == [rule]
    assert "gdn_step rejected" in rejection_message(found)


def test_index_values_accept_padding_and_its_ignored_accept_count() -> None:
    assert index_violations(np.array([[-1, -1], [3, 2]], np.int32), np.array([0, 2], np.int32), 8, 2) == []
    assert index_violations(np.array([-1, -1, 4], np.int32), None, 8, 1) == []
