"""Decode is prefill continued: after the oracle's prefill of a prompt, n tokens decoded through the kernel — one
call per token, or several tokens per call — equal ``gdn_ref.recurrent`` over the prompt and those n tokens
(the outputs of the n tokens and the final state), within the tolerance table."""

from __future__ import annotations

import numpy as np
import pytest

from gdn_ref.recurrent import recurrent
from gdn_spec.impl import Implementation
from gdn_spec.metrics import compare
from gdn_spec.regimes import NUMPY_DTYPES, l2_normalize

from ._decode_support import base_geometry, caps_of, require, run_decode
from ._support import assert_close, record_worst

PROMPT = 5
DECODED = 4


def _tokens(rng: np.random.Generator, n: int, s: int, hk: int, hv: int, dk: int, dv: int, dtype: str) -> dict:
    compute = NUMPY_DTYPES[dtype]
    return {
        "query": l2_normalize(rng.standard_normal((n, s, hk, dk))).astype(compute),
        "key": l2_normalize(rng.standard_normal((n, s, hk, dk))).astype(compute),
        "value": rng.standard_normal((n, s, hv, dv)).astype(compute),
        "g_log": rng.uniform(-0.5, -0.001, (n, s, hv)).astype(np.float32),
        "beta": rng.uniform(0.05, 0.95, (n, s, hv)).astype(np.float32),
    }


@pytest.mark.parametrize("per_call", [1, 2, 4])
def test_decode_continues_prefill(
    gdn_impl: Implementation, gdn_dtype: str, per_call: int, request: pytest.FixtureRequest
) -> None:
    caps = caps_of(gdn_impl)
    require(caps.lacks("gating", "precomputed"))
    g = base_geometry(caps, per_call, requests=2)
    per_token = per_call > 1 and not caps.final_state_only
    if per_token:
        require(caps.lacks("per_token_states"))
    rng = np.random.default_rng(5150 + per_call)
    tokens = _tokens(rng, g.N, PROMPT + DECODED, g.Hk, g.Hv, g.Dk, g.Dv, gdn_dtype)
    head_major = {name: np.swapaxes(x.astype(np.float64), 1, 2) for name, x in tokens.items()}
    scale = g.Dk**-0.5
    ref_out, ref_state = recurrent(*head_major.values(), scale=scale)  # the prefill of prompt + decoded tokens
    prompt = {name: x[:, :, :PROMPT] for name, x in head_major.items()}
    _, prompt_state = recurrent(*prompt.values(), scale=scale)
    # Pool rows: the requests' rows, in a pool with rows nobody names around them.
    rows_per_request = per_call if per_token else 1
    pool = rng.standard_normal((g.N * rows_per_request * 2 + 2, g.Hv, g.Dk, g.Dv)).astype(np.float32)
    rows = rng.permutation(pool.shape[0])[: g.N * rows_per_request * 2].reshape(g.N, 2, rows_per_request)
    current = rows[:, 0, 0]
    pool[current] = prompt_state
    outs = []
    for call_index, start in enumerate(range(PROMPT, PROMPT + DECODED, per_call)):
        call = {name: np.ascontiguousarray(x[:, start : start + per_call]) for name, x in tokens.items()}
        if per_token:  # read column 0 (the previous call's final row), the state after each token to its row
            indices = rows[:, call_index % 2].copy()
            indices[:, 0] = current
            current = indices[:, -1]
        else:
            indices = current
        call.update(state_pool=pool, state_indices=indices.astype(np.int32), scale=scale, use_qk_l2norm=False)
        out, pool = run_decode(gdn_impl, call)
        outs.append(out)
    errors = [
        compare("out", np.concatenate(outs, axis=1), np.swapaxes(ref_out[:, :, PROMPT:], 1, 2), gdn_dtype),
        compare("state", pool[current], ref_state, gdn_dtype, scale_floor=prompt_state),
    ]
    record_worst(request.node, errors, algorithm="decode", dtype=gdn_dtype, regime=f"prefill+{per_call}/call")
    assert_close(errors, f"prompt of {PROMPT} by the oracle, then {DECODED} tokens {per_call} per call ({g})")
