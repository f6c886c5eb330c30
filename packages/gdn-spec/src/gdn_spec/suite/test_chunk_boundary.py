"""Chunk-boundary invariance (schur): S tokens in one call equal the same tokens split over two calls that carry
the state — wherever the split falls relative to chunk and group boundaries."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from gdn_ref.constants import ALGORITHM_SCHUR, CHUNK_SCHUR
from gdn_spec.impl import Implementation
from gdn_spec.metrics import compare
from gdn_spec.regimes import Geometry, make_case

from ._support import assert_close, call_args, fixed_shape, run

# (chunks in total, chunks in the first call, group_size, regime): splits before, inside and after a group boundary,
# and after two full groups at the default group size. Each split runs one of the two regimes, alternating (the
# regimes are sampled over the splits, not crossed with them: each still meets group sizes 2 and 8).
SPLITS = [
    (2, 1, 8, "random"),
    (3, 1, 2, "model_gates"),
    (3, 2, 2, "random"),
    (5, 3, 2, "model_gates"),
    (4, 2, 3, "random"),
    (17, 16, 8, "model_gates"),
]
# The split's lanes and head dims: GQA and Dk != Dv up to 5 chunks; one lane pair of small heads beyond (the long
# split checks the carry after two full groups, cheaply).
GEOMETRY = Geometry(1, 2, 4, 0, 32, 16)
LONG_GEOMETRY = Geometry(1, 1, 2, 0, 16, 16)
LONG_SPLIT_CHUNKS = 8


def _token_slice(args: dict, start: int, stop: int, state: np.ndarray) -> dict:
    part = dict(args)
    for name in ("query", "key", "value"):
        part[name] = np.ascontiguousarray(args[name][:, :, start:stop])
    for name in ("g_log", "beta"):
        part[name] = np.ascontiguousarray(args[name][:, :, start:stop])
    part["recurrent_state"] = state
    return part


@pytest.mark.parametrize("gdn_algorithm", [ALGORITHM_SCHUR])  # needs a supplied state to carry
@pytest.mark.parametrize("split", SPLITS, ids=lambda s: f"C{s[0]}-first{s[1]}-group{s[2]}-{s[3]}")
def test_one_call_equals_two(gdn_impl: Implementation, gdn_algorithm: str, gdn_dtype: str, split) -> None:
    chunks, first, group_size, regime = split
    shape = LONG_GEOMETRY if chunks > LONG_SPLIT_CHUNKS else GEOMETRY
    geometry = fixed_shape(gdn_impl.capabilities, replace(shape, S=chunks * CHUNK_SCHUR), shrink_lanes=True)
    case = make_case(regime, geometry, gdn_dtype, chunks * 10 + first, supply_state=True)
    whole = call_args(case, gdn_algorithm, group_size)
    initial = whole["recurrent_state"].copy()
    out_whole, state_whole = run(gdn_impl, whole)

    cut = first * CHUNK_SCHUR
    parts = call_args(case, gdn_algorithm, group_size)
    # The state is carried as the returned value (the same object as the buffer for an in-place kernel).
    out_a, state_a = run(gdn_impl, _token_slice(parts, 0, cut, initial.copy()))
    out_b, state_b = run(gdn_impl, _token_slice(parts, cut, geometry.S, np.array(state_a, dtype=np.float32)))
    out_split = np.concatenate([out_a, out_b], axis=2)
    errors = [
        compare("out", out_split, out_whole.astype(np.float64), gdn_dtype),
        compare("state", state_b, state_whole, gdn_dtype),
    ]
    assert_close(errors, f"{chunks} chunks split after {first}, group_size={group_size}")
