"""The decode drop-ins on torch: FLA's and vLLM's fused_recurrent_gated_delta_rule and vLLM/SGLang's
fused_sigmoid_gating_delta_rule_update, against HF's torch recurrence and the fp64 oracle; rejections by name."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'gdn-nki[torch]'; nox -s integration)")

from decode_inputs import assert_within, step_inputs  # noqa: E402
from gdn_nki.host.torch_io import as_torch  # noqa: E402
from gdn_nki.torch_decode import (  # noqa: E402
    fused_recurrent_gated_delta_rule,
    fused_sigmoid_gating_delta_rule_update,
    vllm_fused_recurrent_gated_delta_rule,
)
from gdn_ref import decode_steps, fused_gates  # noqa: E402
from gdn_ref.contract import ContractError  # noqa: E402


def _t(x: np.ndarray):
    return as_torch(np.ascontiguousarray(x))


def test_fla_form_matches_hf_recurrence_with_gqa_varlen_and_final_state() -> None:
    hf = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    x = step_inputs(31, "float32", N=3, T=2, Hk=2, Hv=4)
    q, k, v = (_t(a.reshape(1, 6, *a.shape[2:])) for a in (x.query, x.key, x.value))
    g, beta = (_t(a.reshape(1, 6, -1)) for a in (x.g_log, x.beta))
    cu = torch.tensor([0, 1, 4, 6], dtype=torch.int64)  # lengths 1, 3, 2: grouped by length, one launch each
    h0 = _t(x.pool[:3])
    o, final = fused_recurrent_gated_delta_rule(q, k, v, g, beta=beta, initial_state=h0, output_final_state=True,
                                                use_qk_l2norm_in_kernel=True, cu_seqlens=cu)  # fmt: skip
    assert torch.equal(h0, _t(x.pool[:3]))  # FLA's initial_state is only read
    for n, (a, b) in enumerate(((0, 1), (1, 4), (4, 6))):
        want_o, want_state = hf.torch_recurrent_gated_delta_rule(
            *(t[:, a:b].repeat_interleave(2, dim=2) for t in (q, k)), v[:, a:b], g[:, a:b], beta[:, a:b],
            initial_state=h0[n : n + 1].clone(), output_final_state=True, use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        torch.testing.assert_close(o[:, a:b], want_o, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(final[n : n + 1], want_state, rtol=1e-5, atol=1e-5)


def test_fla_form_rejects_what_it_cannot_honour() -> None:
    x = step_inputs(32, "float32", N=1, T=1)
    q, k, v = (_t(a) for a in (x.query, x.key, x.value))
    with pytest.raises(ContractError, match=r"`gk` given"):
        fused_recurrent_gated_delta_rule(q, k, v, gk=torch.zeros(1, 1, 4, 32))
    with pytest.raises(ContractError, match=r"`beta` shape \(1, 1, 4, 16\)"):
        fused_recurrent_gated_delta_rule(q, k, v, _t(x.g_log), beta=torch.ones(1, 1, 4, 16))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_vllm_spec_decode_form_updates_the_pool_rows_in_place(dtype: str) -> None:
    x = step_inputs(33, dtype, N=3, T=3, P=12)
    rows = np.array([[4, 1, 9], [-1, -1, -1], [0, 6, 7]], np.int32)
    accepted = np.array([2, 0, 3], np.int32)
    before = x.pool.copy()
    pool = torch.from_numpy(x.pool)
    packed = [_t(a.reshape(1, 9, *a.shape[2:])) for a in (x.query, x.key, x.value, x.g_log, x.beta)]
    cu = torch.tensor([0, 3, 6, 9], dtype=torch.int32)
    q, k, v = packed[:3]
    o, state = vllm_fused_recurrent_gated_delta_rule(q, k, v, packed[3], packed[4], scale=0.3, initial_state=pool,
                                                     cu_seqlens=cu, ssm_state_indices=_t(rows),
                                                     num_accepted_tokens=_t(accepted), use_qk_l2norm_in_kernel=True)  # fmt: skip
    assert state is pool
    ref_out, ref_states = decode_steps(x.query, x.key, x.value, x.g_log, x.beta, 0.3, before[[1, 0, 7]], l2norm=True)
    got = o.float().numpy().reshape(3, 3, *o.shape[2:])
    for n in (0, 2):
        assert_within("out", got[n], ref_out[n], dtype)
        for t in range(3):
            assert_within("state", x.pool[rows[n, t]], ref_states[n, t], dtype)
    assert not got[1].any()
    untouched = [r for r in range(12) if r not in rows[[0, 2]]]
    assert np.array_equal(x.pool[untouched], before[untouched])


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (dict(retrieve_parent_token=torch.zeros(2, 2, dtype=torch.int64)), "retrieve_parent_token"),
        (dict(inplace_final_state=False), "inplace_final_state"),
        (dict(ssm_state_indices=torch.tensor([1, 2], dtype=torch.int32)), r"ssm_state_indices.*shape \(2,\)"),
        (dict(cu_seqlens=torch.tensor([0, 1, 4], dtype=torch.int32)), r"sequence lengths \[1, 3\]"),
        (dict(ssm_state_indices=torch.tensor([[1, 2], [2, 3]], dtype=torch.int32)), "state_indices.distinct"),
    ],
)
def test_vllm_form_rejections_leave_the_pool_untouched(change, match) -> None:
    x = step_inputs(34, "float32", N=2, T=2, P=6)
    before = x.pool.copy()
    packed = [_t(a.reshape(1, 4, *a.shape[2:])) for a in (x.query, x.key, x.value, x.g_log, x.beta)]
    kwargs = dict(initial_state=torch.from_numpy(x.pool), cu_seqlens=torch.tensor([0, 2, 4], dtype=torch.int32),
                  ssm_state_indices=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32))  # fmt: skip
    kwargs.update(change)
    with pytest.raises(ContractError, match=match):
        vllm_fused_recurrent_gated_delta_rule(*packed, **kwargs)
    assert np.array_equal(x.pool, before)


def test_sigmoid_gating_update_matches_the_fused_oracle() -> None:
    x = step_inputs(35, "float32", N=3, T=1, P=8)
    rows = np.array([6, -1, 2], np.int32)
    before = x.pool.copy()
    pool = torch.from_numpy(x.pool)
    flat = [_t(a.reshape(1, 3, *a.shape[2:])) for a in (x.query, x.key, x.value)]
    a2d, b2d = (_t(a.reshape(3, -1)) for a in (x.a, x.b))  # SGLang passes [B*T, HV]
    o = fused_sigmoid_gating_delta_rule_update(_t(x.A_log), a2d, _t(x.dt_bias), 1.0, 20.0, *flat, b2d, pool,
                                               _t(rows), use_qk_l2norm_in_kernel=True,
                                               cu_seqlens=torch.tensor([0, 1, 2, 3]))  # fmt: skip
    g, beta = fused_gates(x.a, x.b, x.A_log, x.dt_bias)
    ref_out, ref_states = decode_steps(x.query, x.key, x.value, g, beta, 32**-0.5, before[[6, 0, 2]], l2norm=True)
    got = o.numpy().reshape(3, 1, *o.shape[2:])
    for n, row in ((0, 6), (2, 2)):
        assert_within("out", got[n], ref_out[n], "float32")
        assert_within("state", x.pool[row], ref_states[n, -1], "float32")
    with pytest.raises(ContractError, match="softplus_beta"):
        fused_sigmoid_gating_delta_rule_update(_t(x.A_log), a2d, _t(x.dt_bias), 2.0, 20.0, *flat, b2d, pool, _t(rows))


def test_sigmoid_gating_update_per_token_rows_roll_back_with_num_accepted_tokens() -> None:
    """[N, T] rows and num_accepted_tokens (the serving example's speculative decode): request n resumes from row
    [n, a − 1], the state after token t goes to row [n, t]; a padding request's rows and every other row untouched."""
    x = step_inputs(36, "float32", N=3, T=2, P=10)
    rows = np.array([[0, 1], [-1, -1], [4, 7]], np.int32)
    accepted = np.array([2, 1, 1], np.int32)
    before = x.pool.copy()
    pool = torch.from_numpy(x.pool)
    flat = [_t(a.reshape(1, 6, *a.shape[2:])) for a in (x.query, x.key, x.value)]
    a3d, b3d = (_t(a.reshape(1, 6, -1)) for a in (x.a, x.b))
    o = fused_sigmoid_gating_delta_rule_update(_t(x.A_log), a3d, _t(x.dt_bias), 1.0, 20.0, *flat, b3d, pool,
                                               _t(rows), use_qk_l2norm_in_kernel=True,
                                               cu_seqlens=torch.tensor([0, 2, 4, 6], dtype=torch.int32),
                                               num_accepted_tokens=_t(accepted))  # fmt: skip
    g, beta = fused_gates(x.a, x.b, x.A_log, x.dt_bias)
    starts = before[[1, 0, 4]]  # request 0 accepted both tokens of its last step: its state is in row [0, 1]
    ref_out, ref_states = decode_steps(x.query, x.key, x.value, g, beta, 32**-0.5, starts, l2norm=True)
    got = o.numpy().reshape(3, 2, *o.shape[2:])
    for n in (0, 2):
        assert_within("out", got[n], ref_out[n], "float32")
        for t in range(2):
            assert_within("state", x.pool[rows[n, t]], ref_states[n, t], "float32")
    untouched = [r for r in range(10) if r not in rows[[0, 2]].reshape(-1)]
    assert np.array_equal(x.pool[untouched], before[untouched])


@pytest.mark.parametrize("default", ["g", "beta"])
def test_fla_form_batch_rows_and_default_gates_match_the_oracle(default: str) -> None:
    """B = 2 rows of T = 3 tokens without cu_seqlens (every other test packs B = 1, where a gate read time-major,
    [T, B, HV], is the same tensor), and FLA's defaults for the gate not passed: g = None no decay, beta = None
    ones."""
    x = step_inputs(36, "float32", N=2, T=3, P=2)
    g_log = np.zeros_like(x.g_log) if default == "g" else x.g_log
    beta = np.ones_like(x.beta) if default == "beta" else x.beta
    gates = dict(g=None if default == "g" else _t(x.g_log), beta=None if default == "beta" else _t(x.beta))
    o, final = fused_recurrent_gated_delta_rule(_t(x.query), _t(x.key), _t(x.value), **gates,
                                                initial_state=_t(x.pool), output_final_state=True)  # fmt: skip
    ref_out, ref_states = decode_steps(x.query, x.key, x.value, g_log, beta, 32**-0.5, x.pool)
    assert_within("out", o.numpy(), ref_out, "float32")
    assert_within("state", final.numpy(), ref_states[:, -1], "float32")


def test_fla_form_scatters_each_length_group_back_to_its_sequences() -> None:
    """Packed lengths 2, 1, 2, 1: two launches of two sequences each, interleaved in the packing, every output
    back at its own tokens and every final state at its own row (lengths 1, 3, 2 above launch one each)."""
    x = step_inputs(37, "float32", N=1, T=6, P=4)
    cu = (0, 2, 3, 5, 6)
    o, final = fused_recurrent_gated_delta_rule(_t(x.query), _t(x.key), _t(x.value), _t(x.g_log), beta=_t(x.beta),
                                                initial_state=_t(x.pool), output_final_state=True,
                                                cu_seqlens=torch.tensor(cu))  # fmt: skip
    for n, (a, b) in enumerate(itertools.pairwise(cu)):
        tokens = (slice(None), slice(a, b))
        ref_out, ref_states = decode_steps(x.query[tokens], x.key[tokens], x.value[tokens], x.g_log[tokens],
                                           x.beta[tokens], 32**-0.5, x.pool[n : n + 1])  # fmt: skip
        assert_within("out", o[:, a:b].numpy(), ref_out, "float32")
        assert_within("state", final[n : n + 1].numpy(), ref_states[:, -1], "float32")


def test_fla_form_checks_every_length_group_before_launching_any() -> None:
    """Packed lengths 1, 2, 1, 3, 2 (three launches, one per length): bad values in the last group launched (a
    NaN in sequence 3's v) and in the second (sequence 4's initial state) refuse the call before any launch, even
    the first group's, in one error naming both as the caller numbers them (not as each group's launch numbers its
    requests)."""
    from gdn_nki.traces import recording_launches

    x = step_inputs(38, "float32", N=1, T=9, P=5)
    cu = torch.tensor((0, 1, 3, 4, 7, 9))
    v, h0 = x.value.copy(), x.pool.copy()
    v[0, 5, 1, 2] = np.nan  # sequence 3 (tokens 4..6), its second token
    h0[4, 0, 0, 0] = np.inf
    args = (_t(x.query), _t(x.key), _t(v), _t(x.g_log))
    with recording_launches() as launches, pytest.raises(ContractError) as refused:
        fused_recurrent_gated_delta_rule(*args, beta=_t(x.beta), initial_state=_t(h0), output_final_state=True,
                                         cu_seqlens=cu)  # fmt: skip
    assert launches == []
    assert refused.value.sequences == [3, 4]
    assert "`v` value nan at index [0, 5, 1, 2]" in str(refused.value)
    assert "(sequence 3)" in str(refused.value) and "(sequence 4)" in str(refused.value)
    assert not any(f"(sequence {n})" in str(refused.value) for n in (0, 1, 2))


def test_check_values_reaches_every_length_group() -> None:
    """``gdn_nki.torch.check_values`` runs the CPU path up to its first launch: with mixed lengths that now follows
    every group's rules, so a NaN in the last group launched is caught (it was past the first launch)."""
    from gdn_nki.torch import check_values

    x = step_inputs(39, "float32", N=1, T=6, P=3)
    v = x.value.copy()
    v[0, 4, 0, 1] = np.nan  # sequence 2 (tokens 3..5), the only one of length 3
    h0 = _t(x.pool)
    with pytest.raises(ContractError) as refused:
        check_values(fused_recurrent_gated_delta_rule, _t(x.query), _t(x.key), _t(v), _t(x.g_log), beta=_t(x.beta),
                     initial_state=h0, cu_seqlens=torch.tensor((0, 1, 3, 6)))  # fmt: skip
    assert refused.value.sequences == [2] and torch.equal(h0, _t(x.pool))


@pytest.mark.parametrize("form", ["vllm", "sigmoid"])
def test_an_empty_decode_batch_is_refused_in_the_callers_words(form: str) -> None:
    """No request: one violation naming the caller's empty q, not six naming the kernel's [N, T, Hk, Dk] layout."""
    from gdn_nki.torch import fused_recurrent_gated_delta_rule as drop_in
    from gdn_nki.torch import fused_sigmoid_gating_delta_rule_update as sigmoid

    q, v, pool = torch.zeros(1, 0, 2, 32), torch.zeros(1, 0, 4, 16), torch.zeros(4, 4, 32, 16)
    rows, bounds = torch.zeros(0, dtype=torch.int32), torch.tensor([0])
    with pytest.raises(ContractError) as refused:
        if form == "vllm":
            drop_in(q, q, v, torch.zeros(1, 0, 4), torch.zeros(1, 0, 4), initial_state=pool, inplace_final_state=True,
                    cu_seqlens=bounds, ssm_state_indices=rows)  # fmt: skip
        else:
            sigmoid(torch.zeros(4), torch.zeros(0, 4), torch.zeros(4), 1.0, 20.0, q, q, v, torch.zeros(0, 4), pool, rows,
                    cu_seqlens=bounds)  # fmt: skip
    assert len(refused.value.violations) == 1 and "`q` shape (1, 0, 2, 32)" in str(refused.value)
    assert "must not be empty" in str(refused.value) and "[N, T, Hk, Dk]" not in str(refused.value)
