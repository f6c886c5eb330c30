"""Head mapping: value head h reads key/query head h // (Hv // Hk) — the same as repeating each key head."""

from __future__ import annotations

import numpy as np
import pytest

from gdn_ref.constants import ALGORITHM_SCHUR
from gdn_spec.impl import Implementation
from gdn_spec.metrics import compare
from gdn_spec.regimes import Geometry, make_case

from ._support import assert_close, call_args, fixed_shape, run

# GQA ratios 2, 3, 4 of the Qwen layouts (scaled to Hk = 2).
GEOMETRIES = [(2, 4), (2, 6), (2, 8)]


@pytest.mark.parametrize("gdn_algorithm", [ALGORITHM_SCHUR])  # neumann forbids head sharing (test_neumann)
@pytest.mark.parametrize("heads", GEOMETRIES, ids=lambda h: f"Hk{h[0]}-Hv{h[1]}")
def test_gqa_equals_repeated_key_heads(gdn_impl: Implementation, gdn_algorithm: str, gdn_dtype: str, heads) -> None:
    Hk, Hv = heads
    # The heads are the point (no shrink_lanes): above max_lanes the test is skipped naming the limit.
    geometry = fixed_shape(gdn_impl.capabilities, Geometry(1, Hk, Hv, 128, 32, 16))
    case = make_case("random", geometry, gdn_dtype, Hv)
    shared = call_args(case, gdn_algorithm)
    repeated = call_args(case, gdn_algorithm)
    for name in ("query", "key"):
        repeated[name] = np.ascontiguousarray(np.repeat(shared[name], Hv // Hk, axis=1))
    out_shared, state_shared = run(gdn_impl, shared)
    out_repeated, state_repeated = run(gdn_impl, repeated)
    errors = [
        compare("out", out_shared, out_repeated.astype(np.float64), gdn_dtype),
        compare("state", state_shared, state_repeated, gdn_dtype),
    ]
    assert_close(errors, f"Hk={Hk} Hv={Hv} vs key heads repeated {Hv // Hk}x")
