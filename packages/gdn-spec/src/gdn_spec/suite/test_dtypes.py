"""Dtypes: out in query's dtype (the compute dtype), the final state always float32."""

from __future__ import annotations

import numpy as np
import pytest

from gdn_ref.constants import ALGORITHM_NEUMANN
from gdn_spec.contract import BASE_GEOMETRY
from gdn_spec.impl import Implementation
from gdn_spec.regimes import NUMPY_DTYPES, make_case

from ._support import call_args, fixed_shape, run


@pytest.mark.gdn_requires("dtypes")
@pytest.mark.parametrize("supply_state", [False, True], ids=["omitted", "supplied"])
def test_output_dtypes(gdn_impl: Implementation, gdn_algorithm: str, gdn_dtype: str, supply_state: bool) -> None:
    if supply_state and gdn_algorithm == ALGORITHM_NEUMANN:
        pytest.skip('"neumann" supports only the omitted state')
    geometry = fixed_shape(gdn_impl.capabilities, BASE_GEOMETRY[gdn_algorithm], shrink_lanes=True)
    case = make_case("random", geometry, gdn_dtype, 1, supply_state=supply_state)
    out, state = run(gdn_impl, call_args(case, gdn_algorithm))
    assert out.dtype == NUMPY_DTYPES[gdn_dtype], f"out dtype {out.dtype}, expected query's {gdn_dtype}"
    assert state.dtype == np.float32, f"state dtype {state.dtype}, expected float32 whatever the compute dtype"
