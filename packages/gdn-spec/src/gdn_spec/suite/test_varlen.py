"""Varlen (packed sequences), for implementations that declare ``varlen``: called with B = 1, the sequences
packed along S and ``cu_seqlens`` = their int64 offsets [0, L1, L1 + L2, ...], each sequence's output and final
state equal its own call, each starting from its own initial state (``recurrent_state`` ``[N, Hv, Dk, Dv]``)."""

from __future__ import annotations

import numpy as np
import pytest

from gdn_ref.constants import ALGORITHM_SCHUR, CHUNK_SCHUR
from gdn_spec.impl import Implementation
from gdn_spec.metrics import compare
from gdn_spec.regimes import Geometry, make_case

from ._support import assert_close, call_args, require_fits, run

# Sequence lengths in chunks: unequal, with a long one between short ones (a leak shows at either side).
LENGTHS = (1, 3, 2)


@pytest.mark.parametrize("gdn_algorithm", [ALGORITHM_SCHUR])
@pytest.mark.parametrize("regime", ["initial_state", "random"], ids=["own-initial-states", "zero-start"])
def test_each_packed_sequence_equals_its_own_call(
    gdn_impl: Implementation, gdn_algorithm: str, gdn_dtype: str, regime: str
) -> None:
    caps = gdn_impl.capabilities
    if not caps.varlen:
        pytest.skip(f"{caps.name} does not declare varlen (cu_seqlens) support")
    Hk, Hv, Dk, Dv = 2, 4, 32, 16
    cases = [
        make_case(regime, Geometry(1, Hk, Hv, n * CHUNK_SCHUR, Dk, Dv), gdn_dtype, 50 + i)
        for i, n in enumerate(LENGTHS)
    ]
    require_fits(caps, Geometry(1, Hk, Hv, sum(LENGTHS) * CHUNK_SCHUR, Dk, Dv))
    singles = [call_args(case, gdn_algorithm) for case in cases]
    packed = dict(singles[0])
    for name in ("query", "key", "value", "g_log", "beta"):
        packed[name] = np.ascontiguousarray(np.concatenate([s[name] for s in singles], axis=2))
    states = [s["recurrent_state"] for s in singles]
    packed["recurrent_state"] = None if states[0] is None else np.concatenate(states, axis=0)
    packed["cu_seqlens"] = np.concatenate([[0], np.cumsum([c.geometry.S for c in cases])]).astype(np.int64)

    out, state = run(gdn_impl, packed)
    assert state.shape == (len(cases), Hv, Dk, Dv), f"packed final state shape {state.shape}, one per sequence"
    bounds = packed["cu_seqlens"]
    for i, single in enumerate(singles):
        out_i, state_i = run(gdn_impl, single)
        errors = [
            compare("out", out[:, :, bounds[i] : bounds[i + 1]], out_i.astype(np.float64), gdn_dtype),
            compare("state", state[i : i + 1], state_i, gdn_dtype),
        ]
        assert_close(errors, f"sequence {i} of {len(cases)} (tokens {bounds[i]}..{bounds[i + 1]}) vs its own call")
