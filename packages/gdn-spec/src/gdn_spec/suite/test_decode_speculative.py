"""Speculative verification: T draft tokens with the state after every one kept ([N, T] indices), then a call
that resumes each request from its accepted draft (``num_accepted_tokens``) equals decoding the accepted
tokens and the new ones one after the other from the request's state."""

from __future__ import annotations

import numpy as np
import pytest

from gdn_ref.decode import decode_steps
from gdn_spec.decode.cases import Addressing, make_decode_case
from gdn_spec.impl import Implementation
from gdn_spec.metrics import compare

from ._decode_support import base_geometry, call_of, caps_of, require, run_decode
from ._support import assert_close, record_worst

DRAFT = 3


@pytest.mark.parametrize("accepted", [1, 2, 3])
def test_verify_then_resume(
    gdn_impl: Implementation, gdn_dtype: str, accepted: int, request: pytest.FixtureRequest
) -> None:
    caps = caps_of(gdn_impl)
    require(caps.lacks("per_token_states"), caps.lacks("num_accepted_tokens"), caps.lacks("gating", "precomputed"))
    geometry = base_geometry(caps, DRAFT)
    verify = make_decode_case("random", geometry, gdn_dtype, 211, addressing=Addressing(per_token=True))
    resume = make_decode_case("random", geometry, gdn_dtype, 223, addressing=Addressing(per_token=True))
    first = call_of(verify)
    # Fresh rows for the second call's states, after the first call's pool rows.
    spare = np.random.default_rng(227).standard_normal((geometry.N * DRAFT, *first["state_pool"].shape[1:]))
    first["state_pool"] = np.concatenate([first["state_pool"], spare.astype(np.float32)])
    pool_before = first["state_pool"].copy()
    _, pool = run_decode(gdn_impl, first)
    kept = (accepted - 1 + np.arange(geometry.N)) % DRAFT + 1  # the requests accept different counts in [1, T]
    indices = (verify.call["state_pool"].shape[0] + np.arange(geometry.N * DRAFT)).reshape(geometry.N, DRAFT)
    first_rows = verify.call["state_indices"]
    indices[np.arange(geometry.N), kept - 1] = first_rows[np.arange(geometry.N), kept - 1]
    second = call_of(resume)
    second.update(state_pool=pool, state_indices=indices.astype(np.int32), num_accepted_tokens=kept.astype(np.int32))
    out, pool = run_decode(gdn_impl, second)
    ref_out, ref_states, got_states = [], [], []
    for n in range(geometry.N):
        m = int(kept[n])
        seq = {name: np.concatenate([verify.values[name][n : n + 1, :m], resume.values[name][n : n + 1]], axis=1)
               for name in ("query", "key", "value", "g_log", "beta")}  # fmt: skip
        start = pool_before[first_rows[n, 0]][None].astype(np.float64)
        o, states = decode_steps(*seq.values(), first["scale"], start)
        ref_out.append(o[0, m:])
        ref_states.append(states[0, m:])
        got_states.append(pool[indices[n]])
    errors = [
        compare("out", out, np.stack(ref_out), gdn_dtype),
        compare(
            "state", np.stack(got_states), np.stack(ref_states), gdn_dtype, scale_floor=pool_before[first_rows[:, 0]]
        ),
    ]
    record_worst(request.node, errors, algorithm="decode", dtype=gdn_dtype, regime=f"verify {DRAFT}, accept")
    assert_close(errors, f"verify {DRAFT} drafts, resume from accepted {kept.tolist()} ({geometry})")
