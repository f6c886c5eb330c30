"""mask_pack: REQUIRED by schur and validated (shape, dtype, exact contents); neumann does not need one."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from gdn_ref.constants import ALGORITHM_NEUMANN, ALGORITHM_SCHUR
from gdn_ref.masks import build_mask_pack
from gdn_spec.contract import BASE_GEOMETRY
from gdn_spec.impl import Implementation
from gdn_spec.regimes import make_case

from ..oracle import errors_vs_oracle
from ._support import assert_close, call_args, changed, fixed_shape, run, snapshot


def _corrupt_one_entry() -> np.ndarray:
    pack = build_mask_pack()
    pack[2, 5, 5] = 0.0  # one diagonal entry of the identity plane
    return pack


BAD_PACKS = {
    "missing": lambda: None,
    "shape-64": lambda: build_mask_pack(64),
    "dtype-float64": lambda: build_mask_pack().astype(np.float64),
    "dtype-bfloat16": lambda: build_mask_pack().astype(ml_dtypes.bfloat16),
    "one-entry-changed": _corrupt_one_entry,
    "planes-reordered": lambda: build_mask_pack()[::-1].copy(),
}


@pytest.mark.gdn_requires("validation")
@pytest.mark.parametrize("gdn_algorithm", [ALGORITHM_SCHUR])
@pytest.mark.parametrize("bad", list(BAD_PACKS))
def test_schur_rejects_bad_pack(gdn_impl: Implementation, gdn_algorithm: str, bad: str) -> None:
    if bad in ("one-entry-changed", "planes-reordered") and not gdn_impl.capabilities.content_checks:
        pytest.skip(f"{gdn_impl.capabilities.name} declares content_checks=False (a traced kernel cannot read them)")
    dtype = gdn_impl.capabilities.dtypes[0]
    geometry = fixed_shape(gdn_impl.capabilities, BASE_GEOMETRY[gdn_algorithm], shrink_lanes=True)
    args = call_args(make_case("initial_state", geometry, dtype, 11), gdn_algorithm)
    args["mask_pack"] = BAD_PACKS[bad]()
    before = snapshot(args)
    with pytest.raises(Exception) as info:  # any exception type; the message is checked
        gdn_impl(**args)
    assert "mask_pack" in str(info.value), f"the rejection must name `mask_pack`: {info.value}"
    assert not changed(before, args), f"rejected call modified {changed(before, args)}"


@pytest.mark.parametrize("gdn_algorithm", [ALGORITHM_NEUMANN])
def test_neumann_needs_no_pack(gdn_impl: Implementation, gdn_algorithm: str, gdn_dtype: str) -> None:
    case = make_case(
        "random", fixed_shape(gdn_impl.capabilities, BASE_GEOMETRY[gdn_algorithm], shrink_lanes=True), gdn_dtype, 12
    )
    args = call_args(case, gdn_algorithm)
    assert args["mask_pack"] is None
    out, state = run(gdn_impl, args)
    assert_close(errors_vs_oracle(case, out, state), "neumann with mask_pack=None")
