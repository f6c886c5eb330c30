"""The fused decode block oracle against an independent per-token torch float64 layer (HF Qwen3.5 decode order;
skipped without torch), padding rows, rollback and the pools left unwritten."""

from __future__ import annotations

import numpy as np
import pytest

from gdn_ref.block import gdn_block_decode_pool

HK, HV, DK, DV, E, W, L, P = 2, 4, 8, 6, 16, 4, 3, 7
C = 2 * HK * DK + HV * DV


def _params(rng: np.random.Generator) -> dict:
    r = rng.standard_normal
    return dict(
        w_qkv=r((E, C)) * 0.3,
        w_z=r((E, HV * DV)) * 0.3,
        w_b=r((E, HV)) * 0.3,
        w_a=r((E, HV)) * 0.3,
        conv_weight=r((C, W)) * 0.5,
        conv_bias=r(C) * 0.1,
        A_log=r(HV) * 0.3,
        dt_bias=r(HV) * 0.3,
        norm_weight=1.0 + 0.1 * r(DV),
    )


def _torch_layer_token(x, p, window, state):
    """One token of one request, written as HF's torch fallbacks do it (concat + conv1d, loop recurrence)."""
    import torch
    import torch.nn.functional as tnf

    t = {k: torch.as_tensor(v, dtype=torch.float64) for k, v in p.items()}
    mixed = x @ t["w_qkv"]
    full = torch.cat([window, mixed[:, None]], dim=1)  # [C, L + 1]
    y = tnf.silu(tnf.conv1d(full[None], t["conv_weight"][:, None], t["conv_bias"], groups=C)[0, :, -1])
    q, k, v = y[: HK * DK].view(HK, DK), y[HK * DK : 2 * HK * DK].view(HK, DK), y[2 * HK * DK :].view(HV, DV)
    q, k = q.repeat_interleave(HV // HK, 0), k.repeat_interleave(HV // HK, 0)
    q, k = (y * torch.rsqrt(y.pow(2).sum(-1, keepdim=True) + 1e-6) for y in (q, k))  # HF's l2norm
    q = q * DK**-0.5
    g = -t["A_log"].exp() * tnf.softplus(x @ t["w_a"] + t["dt_bias"])
    beta = torch.sigmoid(x @ t["w_b"])
    new_state = state * g.exp()[:, None, None]
    kv = (new_state * k[:, :, None]).sum(1)
    new_state = new_state + k[:, :, None] * ((v - kv) * beta[:, None])[:, None]
    o = (new_state * q[:, :, None]).sum(1)
    z = (x @ t["w_z"]).view(HV, DV)
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-6) * t["norm_weight"] * tnf.silu(z)
    return o.reshape(-1), full[:, -L:], new_state


def _pools(rng):
    return rng.standard_normal((P, C, L)), rng.standard_normal((P, HV, DK, DV)) * 0.2


def _call(hidden, p, conv_pool, state_pool, rows, accepted=None):
    return gdn_block_decode_pool(
        hidden,
        **p,
        conv_pool=conv_pool,
        state_pool=state_pool,
        state_indices=rows,
        num_key_heads=HK,
        num_accepted_tokens=accepted,
    )


def test_block_matches_an_independent_torch_layer_token_by_token():
    torch = pytest.importorskip("torch")  # run by the integration session (noxfile TORCH_GATED_TESTS)
    rng = np.random.default_rng(0)
    p, (conv_pool, state_pool) = _params(rng), _pools(rng)
    n, t_len, rows = 3, 2, np.array([4, -1, 1])
    hidden = rng.standard_normal((n, t_len, E))
    out, conv_after, state_after = _call(hidden, p, conv_pool, state_pool, rows)
    for i, row in enumerate(rows):
        if row < 0:
            assert not out[i].any()
            continue
        window, state = torch.tensor(conv_pool[row]), torch.tensor(state_pool[row])
        for t in range(t_len):
            o, window, state = _torch_layer_token(torch.tensor(hidden[i, t]), p, window, state)
            np.testing.assert_allclose(out[i, t], o.numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(conv_after[row], window.numpy(), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(state_after[row], state.numpy(), rtol=1e-10, atol=1e-12)
    untouched = [r for r in range(P) if r not in (4, 1)]
    assert np.array_equal(conv_after[untouched], conv_pool[untouched])
    assert np.array_equal(state_after[untouched], state_pool[untouched])


def test_per_token_rows_roll_back_to_the_accepted_token():
    rng = np.random.default_rng(1)
    p, (conv_pool, state_pool) = _params(rng), _pools(rng)
    hidden = rng.standard_normal((2, 3, E))
    rows = np.array([[0, 1, 2], [3, 4, 5]])
    accepted = np.array([2, 3])
    conv0, state0 = conv_pool.copy(), state_pool.copy()
    out, conv_after, state_after = _call(hidden, p, conv_pool, state_pool, rows, accepted)
    assert np.array_equal(conv_pool, conv0) and np.array_equal(state_pool, state0)  # caller's pools unwritten
    for i in range(2):
        start = rows[i, accepted[i] - 1]
        ref, c1, s1 = _call(hidden[i : i + 1], p, conv_pool, state_pool, np.array([start]))
        np.testing.assert_array_equal(out[i], ref[0])
        np.testing.assert_array_equal(conv_after[rows[i, -1]], c1[start])
        np.testing.assert_array_equal(state_after[rows[i, -1]], s1[start])
    assert np.array_equal(state_after[6], state_pool[6])


@pytest.mark.parametrize("t_len", [1, 3])
def test_one_step_of_t_tokens_is_t_steps_of_one(t_len):
    rng = np.random.default_rng(2)
    p, (conv_pool, state_pool) = _params(rng), _pools(rng)
    hidden = rng.standard_normal((2, t_len, E))
    rows = np.array([5, 2])
    out, conv_after, state_after = _call(hidden, p, conv_pool, state_pool, rows)
    cp, sp = conv_pool, state_pool
    for t in range(t_len):
        o, cp, sp = _call(hidden[:, t : t + 1], p, cp, sp, rows)
        np.testing.assert_allclose(out[:, t], o[:, 0], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(conv_after, cp, rtol=1e-12, atol=1e-14)  # the matmul rounds per batch shape
    np.testing.assert_allclose(state_after, sp, rtol=1e-12, atol=1e-14)
