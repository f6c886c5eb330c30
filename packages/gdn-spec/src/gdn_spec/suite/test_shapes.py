"""Shapes: out is [B, Hv, S, Dv] and the state [B, Hv, Dk, Dv] for GQA, Dk ≠ Dv and a masked head dim."""

from __future__ import annotations

import pytest

from gdn_ref.constants import ALGORITHM_NEUMANN, CHUNK_BY_ALGORITHM
from gdn_spec.impl import Implementation
from gdn_spec.regimes import Geometry, make_case

from ._support import call_args, fixed_shape, run

# (B, Hk, Hv, chunks, Dk, Dv): GQA 3, Dk ≠ Dv both ways, the non-power-of-two 100, the 128 maximum.
GEOMETRIES = [(2, 2, 6, 2, 64, 16), (1, 2, 4, 1, 16, 100), (1, 1, 1, 1, 128, 128), (2, 2, 2, 3, 100, 64)]


@pytest.mark.parametrize("dims", GEOMETRIES, ids=lambda d: "B{}-Hk{}-Hv{}-C{}-Dk{}-Dv{}".format(*d))
@pytest.mark.parametrize("supply_state", [False, True], ids=["omitted", "supplied"])
def test_output_shapes(gdn_impl: Implementation, gdn_algorithm: str, gdn_dtype: str, dims, supply_state: bool) -> None:
    B, Hk, Hv, chunks, Dk, Dv = dims
    if gdn_algorithm == ALGORITHM_NEUMANN:
        if supply_state:
            pytest.skip('"neumann" supports only the omitted state (its rejection is tested in test_neumann)')
        Hk = Hv  # neumann forbids head sharing: same sizes without GQA
    # A head-dim-limited kernel runs the same B, heads and S at its nearest head dims (Dk ≠ Dv kept if it can).
    S = chunks * CHUNK_BY_ALGORITHM[gdn_algorithm]
    # B and the heads are part of what is checked (no shrink_lanes): above max_lanes a row is skipped.
    geometry = fixed_shape(gdn_impl.capabilities, Geometry(B, Hk, Hv, S, Dk, Dv))
    out, state = run(
        gdn_impl, call_args(make_case("random", geometry, gdn_dtype, 0, supply_state=supply_state), gdn_algorithm)
    )
    # The expected shape is in the message: the summary reports a failure by its message.
    expected_out, expected_state = (B, Hv, geometry.S, geometry.Dv), (B, Hv, geometry.Dk, geometry.Dv)
    assert out.shape == expected_out, f"out shape {out.shape}, expected [B, Hv, S, Dv] = {expected_out}"
    assert state.shape == expected_state, f"state shape {state.shape}, expected [B, Hv, Dk, Dv] = {expected_state}"
