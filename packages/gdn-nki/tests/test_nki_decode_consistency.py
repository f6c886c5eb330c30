"""Decode is prefill continued: prefill of S tokens then n decode steps equals prefill of S + n tokens, and a
T-token verification with m accepted, continued, equals decoding the accepted tokens one by one."""

from __future__ import annotations

import numpy as np
import pytest

import gdn_nki
from decode_inputs import assert_within, step_inputs
from gdn_ref import recurrent
from gdn_spec.metrics import rms
from gdn_spec.regimes import Geometry, make_case

# fp32: the two paths are different fp32 computations of the same recurrence (chunked vs token by token).
FP32_RELATIVE = 1e-6
DECODE_STEPS = 3


def _token_major(x: np.ndarray, t: int) -> np.ndarray:
    """Token t of a head-major [B, H, S, (D)] tensor as a token-major [B, 1, H, (D)] one."""
    return np.ascontiguousarray(np.swapaxes(x[:, :, t : t + 1], 1, 2))


def _relative(got: np.ndarray, ref: np.ndarray) -> float:
    return rms(np.asarray(got, np.float64) - np.asarray(ref, np.float64)) / rms(np.asarray(ref, np.float64))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(("algorithm", "key_heads"), [("schur", 1), ("neumann", 2)])  # schur with GQA (2 per key)
@pytest.mark.parametrize("prompt", [70, 128])
def test_prefill_then_decode_equals_longer_prefill(dtype: str, algorithm: str, key_heads: int, prompt: int) -> None:
    geometry = Geometry(B=2, Hk=key_heads, Hv=2, S=prompt + DECODE_STEPS, Dk=32, Dv=16)
    c = make_case("random", geometry, dtype, 11 + prompt)
    x = {name: c.kernel[name] for name in ("query", "key", "value", "g_log", "beta")}
    head = {name: v[:, :, :prompt] for name, v in x.items()}
    _, state = gdn_nki.prefill(**head, scale=c.scale, algorithm=algorithm)
    pool = np.zeros((5, *state.shape[1:]), np.float32)
    rows = np.array([3, 1], np.int32)
    pool[rows] = state
    outs = []
    for t in range(prompt, prompt + DECODE_STEPS):
        step = {n: _token_major(x[n], t) for n in ("query", "key", "value", "g_log", "beta")}
        out, _ = gdn_nki.decode_step(step.pop("query"), step.pop("key"), step.pop("value"), pool, rows, **step,
                                     scale=c.scale)  # fmt: skip
        outs.append(out[:, 0])
    decoded = np.stack(outs, axis=2)  # [B, Hv, n, Dv]
    whole_out, whole_state = gdn_nki.prefill(**x, scale=c.scale, algorithm=algorithm)
    if dtype == "float32":
        assert _relative(decoded, whole_out[:, :, prompt:]) < FP32_RELATIVE
        assert _relative(pool[rows], whole_state) < FP32_RELATIVE
    else:  # each path against the fp64 oracle on the same rounded inputs, with gdn-spec's bf16 bounds
        ref_out, ref_state = recurrent(**{n: c.oracle[n] for n in x}, scale=c.scale)
        assert_within("out", decoded, ref_out[:, :, prompt:], dtype)
        assert_within("state", pool[rows], ref_state, dtype)
        assert_within("out", whole_out[:, :, prompt:], ref_out[:, :, prompt:], dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("fused", [False, True])
def test_verify_then_continue_equals_decoding_the_accepted_tokens(dtype: str, fused: bool) -> None:
    """vLLM's speculative form: verify T draft tokens keeping every token's state in its own row, then continue
    from the accepted one (num_accepted_tokens) — token for token what decoding the accepted tokens one by one
    computes, to the bit (the same instructions run per token)."""
    tokens, accepted = 4, np.array([2, 4, 1], np.int32)
    draft = step_inputs(21, dtype, N=3, T=tokens, P=16)
    after = step_inputs(22, dtype, N=3, T=tokens, P=16)
    rows = np.arange(12, dtype=np.int32).reshape(3, tokens)  # request n's rows; its state starts in rows[n, 0]
    pool = np.zeros_like(draft.pool)
    pool[rows[:, 0]] = draft.pool[:3]
    kwargs = dict(use_qk_l2norm=True, scale=0.25)
    verify_out, _ = gdn_nki.decode_step(draft.query, draft.key, draft.value, pool, rows, **draft.gates(fused),
                                        **kwargs)  # fmt: skip
    resumed_out, _ = gdn_nki.decode_step(after.query, after.key, after.value, pool, rows, accepted,
                                         **after.gates(fused), **kwargs)  # fmt: skip
    solo = np.zeros_like(draft.pool)
    solo[:3] = draft.pool[:3]  # request n decodes alone in row n
    for n in range(3):
        steps = [(draft, t, verify_out) for t in range(int(accepted[n]))] + [(after, t, resumed_out) for t in range(4)]
        for inputs, t, expected in steps:
            q, k, v, gates = _token(inputs, n, t, fused)
            out, _ = gdn_nki.decode_step(q, k, v, solo, np.array([n], np.int32), **gates, **kwargs)
            assert np.array_equal(out[0, 0], expected[n, t]), (n, t)
        assert np.array_equal(solo[n], pool[rows[n, -1]])


def _token(x, n: int, t: int, fused: bool):
    """Request n's token t of a step's inputs, as a one-request one-token step."""
    gates = {k: (v if v.ndim == 1 else v[n : n + 1, t : t + 1].copy()) for k, v in x.gates(fused).items()}
    return (*(a[n : n + 1, t : t + 1].copy() for a in (x.query, x.key, x.value)), gates)
