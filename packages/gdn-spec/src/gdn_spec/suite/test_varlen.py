"""Varlen (packed sequences), for implementations that declare ``varlen``: called with B = 1, the sequences
packed along S and ``cu_seqlens`` = their int64 offsets [0, L1, L1 + L2, ...], each sequence's output and final
state equal its own call, each starting from its own initial state (``recurrent_state`` ``[N, Hv, Dk, Dv]``)."""

from __future__ import annotations

import numpy as np
import pytest

from gdn_ref.constants import ALGORITHM_SCHUR, CHUNK_SCHUR
from gdn_spec.impl import Implementation
from gdn_spec.metrics import Error, compare
from gdn_spec.regimes import Geometry, make_case

from ..oracle import errors_vs_oracle
from ._support import call_args, require_fits, run, supported

# Sequence lengths in chunks: unequal, with a long one between short ones (a leak shows at either side).
LENGTHS = (1, 3, 2)
# Sequence lengths in tokens whose boundaries fall inside chunks (45 and 345 of 384 = 3 chunks): a kernel that
# resets the state, or masks the intra-chunk attention, only at chunk edges leaks one document into the next.
UNALIGNED_LENGTHS = (45, 300, 39)
QUANTITY = {"out": "output", "state": "final state"}


@pytest.mark.parametrize("gdn_algorithm", [ALGORITHM_SCHUR])
@pytest.mark.parametrize("regime", ["initial_state", "random"], ids=["own-initial-states", "zero-start"])
def test_each_packed_sequence_equals_its_own_call(
    gdn_impl: Implementation, gdn_algorithm: str, gdn_dtype: str, regime: str
) -> None:
    _, singles, out, state, bounds = _run_packed(
        gdn_impl, gdn_algorithm, gdn_dtype, regime, [n * CHUNK_SCHUR for n in LENGTHS], seed=50
    )
    per_sequence = []
    for i, single in enumerate(singles):
        out_i, state_i = run(gdn_impl, single)
        per_sequence.append([
            compare("out", out[:, :, bounds[i] : bounds[i + 1]], out_i.astype(np.float64), gdn_dtype),
            compare("state", state[i : i + 1], state_i, gdn_dtype),
        ])  # fmt: skip
    _assert_each_sequence_close(per_sequence, bounds, "its own call")


@pytest.mark.parametrize("gdn_algorithm", [ALGORITHM_SCHUR])
@pytest.mark.parametrize("regime", ["initial_state", "random"], ids=["own-initial-states", "zero-start"])
def test_sequences_ending_inside_a_chunk_match_the_oracle(
    gdn_impl: Implementation, gdn_algorithm: str, gdn_dtype: str, regime: str
) -> None:
    """Boundaries inside chunks: each sequence against the fp64 oracle of its own tokens (its own call may not
    exist: a dense call needs a chunk multiple)."""
    cases, _, out, state, bounds = _run_packed(
        gdn_impl, gdn_algorithm, gdn_dtype, regime, list(UNALIGNED_LENGTHS), seed=60
    )
    per_sequence = [
        errors_vs_oracle(case, out[:, :, bounds[i] : bounds[i + 1]], np.asarray(state[i : i + 1]))
        for i, case in enumerate(cases)
    ]
    _assert_each_sequence_close(per_sequence, bounds, "the oracle of its own tokens")


def _assert_each_sequence_close(per_sequence: list[list[Error]], bounds: np.ndarray, against: str) -> None:
    """Fail naming every packed sequence out of bounds and, for each, the quantity that failed (output or final
    state) with its figures against the bounds; a quantity within bounds follows only as context. (A leak into
    the next document can be decayed out of that document's final state — rel_rms exactly 0 — while its output
    is wrong, so a message listing both in fixed order led with the figure that was fine.)"""
    failures = []
    for i, errors in enumerate(per_sequence):
        failed = [e for e in errors if not e.ok]
        if not failed:
            continue
        text = f"sequence {i} (tokens {bounds[i]}..{bounds[i + 1]}): " + "; ".join(
            f"{QUANTITY[e.output]} out of bounds, {e.against_bounds()}" for e in failed
        )
        fine = [f"{QUANTITY[e.output]} within bounds, rel_rms {e.rel_rms:.1e}" for e in errors if e.ok]
        failures.append(text + (f" [{'; '.join(fine)}]" if fine else ""))
    if failures:
        pytest.fail(
            f"{len(failures)} of {len(per_sequence)} packed sequences differ from {against}: " + " | ".join(failures),
            pytrace=False,
        )


def _run_packed(impl: Implementation, algorithm: str, dtype: str, regime: str, lengths: list[int], seed: int) -> tuple:
    """One case per sequence length (seeds ``seed``, ``seed`` + 1, …), packed into one B = 1 call with its
    ``cu_seqlens`` and one initial state per sequence; returns the cases, their single-call arguments, the packed
    call's out and state, and the boundaries (skips an implementation without varlen)."""
    caps = impl.capabilities
    if not caps.varlen:
        pytest.skip(f"{caps.name} does not declare varlen (cu_seqlens) support")
    fitted = supported(
        caps, Geometry(1, 2, 4, CHUNK_SCHUR, 32, 16), shrink_lanes=True
    )  # for its head dims (the lengths set S)
    Hk, Hv, Dk, Dv = fitted.Hk, fitted.Hv, fitted.Dk, fitted.Dv
    cases = [make_case(regime, Geometry(1, Hk, Hv, n, Dk, Dv), dtype, seed + i) for i, n in enumerate(lengths)]
    require_fits(caps, Geometry(1, Hk, Hv, sum(lengths), Dk, Dv))
    singles = [call_args(case, algorithm) for case in cases]
    packed = dict(singles[0])
    for name in ("query", "key", "value", "g_log", "beta"):
        packed[name] = np.ascontiguousarray(np.concatenate([s[name] for s in singles], axis=2))
    states = [s["recurrent_state"] for s in singles]
    packed["recurrent_state"] = None if states[0] is None else np.concatenate(states, axis=0)
    bounds = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    packed["cu_seqlens"] = bounds
    out, state = run(impl, packed)
    assert state.shape == (len(cases), Hv, Dk, Dv), f"packed final state shape {state.shape}, one per sequence"
    return cases, singles, out, state, bounds
