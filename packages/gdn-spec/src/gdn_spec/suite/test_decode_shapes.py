"""Shapes and dtypes of a decode step: out is [N, T, Hv, Dv] in query's dtype, the pool keeps its shape and
float32, across request counts, token counts, GQA ratios and head dims."""

from __future__ import annotations

import numpy as np
import pytest

from gdn_spec.decode.cases import Addressing, DecodeGeometry, make_decode_case
from gdn_spec.impl import Implementation
from gdn_spec.regimes import NUMPY_DTYPES

from ._decode_support import call_of, caps_of, require, run_decode, unsupported_call

SHAPES = {
    "single_request": DecodeGeometry(N=1, T=1, Hk=1, Hv=1, Dk=16, Dv=16),
    "gqa_2": DecodeGeometry(N=2, T=1, Hk=2, Hv=4, Dk=32, Dv=16),
    "gqa_4_dv_gt_dk": DecodeGeometry(N=2, T=1, Hk=1, Hv=4, Dk=16, Dv=64),
    "head_dim_128": DecodeGeometry(N=1, T=1, Hk=2, Hv=2, Dk=128, Dv=128),
    "tokens_4": DecodeGeometry(N=2, T=4, Hk=2, Hv=4, Dk=32, Dv=16),
}


@pytest.mark.gdn_requires("dtypes")
@pytest.mark.parametrize("shape", list(SHAPES))
def test_out_shape_and_dtype(gdn_impl: Implementation, gdn_dtype: str, shape: str) -> None:
    caps = caps_of(gdn_impl)
    geometry = SHAPES[shape]
    require(caps.lacks("gating", "precomputed"))
    if geometry.Hk != geometry.Hv:
        require(caps.lacks("gqa"))
    if not caps.allows_tokens(geometry.T):
        pytest.skip(f"T={geometry.T}: {caps.declaring('max_tokens')}")
    addressing = Addressing(per_token=geometry.T > 1 and not caps.final_state_only)
    require(unsupported_call(caps, geometry, addressing))
    case = make_decode_case("random", geometry, gdn_dtype, 31, addressing=addressing)
    out, pool = run_decode(gdn_impl, call_of(case))
    g = geometry
    assert out.shape == (g.N, g.T, g.Hv, g.Dv), (
        f"out is {out.shape}, expected [N, T, Hv, Dv] = {(g.N, g.T, g.Hv, g.Dv)}"
    )
    assert out.dtype == NUMPY_DTYPES[gdn_dtype], f"out is {out.dtype}, expected query's dtype {gdn_dtype}"
    assert pool.shape == case.pool_before.shape and pool.dtype == np.float32, (
        f"the pool came back {pool.shape} {pool.dtype}, expected {case.pool_before.shape} float32"
    )
