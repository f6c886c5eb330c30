"""The error metric and the tolerance table."""

from __future__ import annotations

import numpy as np
import pytest

from gdn_spec.metrics import BF16_UNIT_ROUNDOFF, FP32_UNIT_ROUNDOFF, REF_RMS_FLOOR, TOLERANCES, compare, rms


def test_identical_is_zero_error() -> None:
    ref = np.random.default_rng(0).standard_normal((2, 3, 4))
    e = compare("out", ref.astype(np.float32), ref.astype(np.float32), "float32")
    assert e.ok and e.rel_rms == 0 and e.max_abs == 0


def test_relative_rms_and_max_are_scale_free() -> None:
    ref = np.random.default_rng(1).standard_normal(1000)
    for magnitude in (1e-3, 1.0, 1e5):
        e = compare("state", magnitude * ref * (1 + 1e-3), magnitude * ref, "bfloat16")
        assert e.rel_rms == pytest.approx(1e-3, rel=1e-6)
        assert e.max_rel == pytest.approx(1e-3, rel=1e-6)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_always_fails(bad: float) -> None:
    ref = np.ones(10)
    got = ref.copy()
    got[3] = bad
    e = compare("out", got, ref, "bfloat16")
    assert not e.finite and not e.ok and e.ratio == float("inf")


def test_shape_mismatch_fails() -> None:
    assert not compare("out", np.ones(3), np.ones(4), "float32").ok


def test_shape_mismatch_is_reported_as_one_not_as_non_finite() -> None:
    """A transposed [Dv, Dk] state is a layout bug; calling it NON-FINITE sends its author hunting for NaNs."""
    e = compare("state", np.ones((1, 2, 8, 4)), np.ones((1, 2, 4, 8)), "float32")
    assert "shape (1, 2, 8, 4), expected (1, 2, 4, 8)" in str(e)
    assert "NON-FINITE" not in str(e) and str(e).endswith("FAIL")


def test_tiny_reference_is_judged_absolutely() -> None:
    e = compare("out", np.full(5, 1e-12), np.zeros(5), "float32")
    assert e.rel_rms == pytest.approx(1e-12 / REF_RMS_FLOOR)
    assert e.ok


def test_table_covers_both_dtypes_and_outputs_and_tracks_unit_roundoff() -> None:
    assert set(TOLERANCES) == {"float32", "bfloat16"}
    for dtype, u in (("float32", FP32_UNIT_ROUNDOFF), ("bfloat16", BF16_UNIT_ROUNDOFF)):
        for output in ("out", "state"):
            tol = TOLERANCES[dtype][output]
            assert u < tol.rel_rms <= tol.max_rel
    assert TOLERANCES["float32"]["out"].rel_rms < TOLERANCES["bfloat16"]["out"].rel_rms


def test_rms() -> None:
    assert rms(np.array([3.0, -3.0])) == 3.0 and rms(np.zeros(0)) == 0.0


def test_condition_widens_both_bounds_only_above_one() -> None:
    rng = np.random.default_rng(3)
    ref = rng.standard_normal(4096)
    base = TOLERANCES["bfloat16"]["out"]
    got = ref * (1 + 2 * base.rel_rms * rng.choice([-1.0, 1.0], ref.shape))  # rel-RMS 2× the table
    assert not compare("out", got, ref, "bfloat16", condition=0.5).ok  # a condition below 1 never tightens
    assert compare("out", got, ref, "bfloat16", condition=0.5).tolerance == base
    widened = compare("out", got, ref, "bfloat16", condition=3.0)
    assert widened.tolerance.rel_rms == pytest.approx(3 * base.rel_rms)
    assert widened.tolerance.max_rel == pytest.approx(3 * base.max_rel)
    assert widened.ok


def test_scale_floor_judges_against_the_larger_scale() -> None:
    rng = np.random.default_rng(4)
    ref = rng.standard_normal((2, 8, 8))
    initial = 1e3 * rng.standard_normal((2, 8, 8))
    got = ref + 1.0  # an absolute error of 1: huge next to ref, small next to the initial state
    assert not compare("state", got, ref, "bfloat16").ok
    floored = compare("state", got, ref, "bfloat16", scale_floor=initial)
    assert floored.rel_rms == pytest.approx(1.0 / rms(initial))
    assert floored.max_rel == pytest.approx(1.0 / np.max(np.abs(initial)))
    assert floored.ok


def test_condition_multiplier_is_capped() -> None:
    from gdn_spec.metrics import MAX_CONDITION

    ref = np.random.default_rng(5).standard_normal(1024)
    capped = compare("out", np.zeros_like(ref), ref, "bfloat16", condition=1e6)
    assert capped.tolerance.rel_rms == pytest.approx(MAX_CONDITION * TOLERANCES["bfloat16"]["out"].rel_rms)
    assert not capped.ok, "a zero output must fail whatever the measured condition"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_zero_or_doubled_final_state_fails_where_the_large_state_is_erased(dtype: str) -> None:
    """At the issue's shape the delta rule erases the 1e5 incoming state ~25 000× over 384 tokens: judged against
    the incoming state, a zero final state passed. Against the state carried into the last chunk it fails."""
    from gdn_spec.oracle import errors_vs_oracle, oracle
    from gdn_spec.regimes import Geometry, make_case

    case = make_case("large_state", Geometry(B=2, Hk=2, Hv=2, S=384, Dk=16, Dv=100), dtype, seed=1)
    ref_out, ref_state = oracle(case)
    initial = case.oracle["initial_state"]
    assert rms(initial) / rms(ref_state) > 1e4  # the erasure that hid the flaw
    for wrong in (np.zeros_like(ref_state), 2 * ref_state):
        assert not errors_vs_oracle(case, ref_out, wrong)[1].ok
    assert all(e.ok for e in errors_vs_oracle(case, ref_out, ref_state))
