"""The gate activations (gdn_ref.activations): one rounding of the exact formula, per head, no overflow.

The comparison with FLA's and HF's own torch evaluation of the same formulas is in gdn-nki's torch tests (torch is
not a dependency of gdn-ref)."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np

from gdn_ref.activations import beta_from_logit, log_decay_from_gate


def _softplus_exact(x: np.ndarray) -> np.ndarray:
    """softplus in float64 by another route than the module's (log1p on each side of 0)."""
    x = x.astype(np.float64)
    return np.where(x > 0, x + np.log1p(np.exp(-np.abs(x))), np.log1p(np.exp(np.minimum(x, 0))))


def _within_half_an_ulp(got: np.ndarray, exact: np.ndarray) -> None:
    """``got`` (fp32) is a correctly rounded ``exact`` (fp64): within half an fp32 ulp of it (the fp64 reference's
    own error, ~1e-16 relative, is the slack)."""
    half_ulp = 0.5 * np.spacing(np.abs(got).astype(np.float32)).astype(np.float64)
    excess = np.abs(got.astype(np.float64) - exact) - half_ulp * (1 + 1e-9)
    assert (excess <= 0).all(), (
        f"worst {np.max(excess):.3g} past half an ulp at {np.unravel_index(np.argmax(excess), got.shape)}"
    )


def test_log_decay_is_one_rounding_of_the_formula_at_the_fp32_sum_per_head() -> None:
    rng = np.random.default_rng(0)
    heads = 6
    gate = (rng.standard_normal((3, 200, heads)) * 8).astype(np.float32)
    gate[0, :4, 0] = [40.0, -40.0, 0.0, 20.0]
    a_log = np.log(rng.uniform(0.01, 16, heads)).astype(np.float32)
    dt_bias = rng.standard_normal(heads).astype(np.float32)
    got = log_decay_from_gate(gate, a_log, dt_bias)
    assert got.dtype == np.float32 and got.shape == gate.shape and (got <= 0).all()
    summed = gate + dt_bias  # fp32, as FLA and HF round it
    exact = -np.exp(a_log.astype(np.float64)) * _softplus_exact(summed)
    _within_half_an_ulp(got, exact)
    assert np.array_equal(log_decay_from_gate(gate, a_log), log_decay_from_gate(gate, a_log, np.zeros(heads)))
    one_head = log_decay_from_gate(gate[..., 2:3], a_log[2:3], dt_bias[2:3])
    assert np.array_equal(one_head, got[..., 2:3]), "each head uses its own A_log and dt_bias"


def test_log_decay_takes_bfloat16_gates_exactly_and_stays_finite_or_resets_at_the_extremes() -> None:
    gate = np.array([-1000.0, -100.0, 0.0, 100.0, 1000.0], np.float32)
    assert np.array_equal(log_decay_from_gate(gate.astype(ml_dtypes.bfloat16), np.zeros(5)),
                          log_decay_from_gate(gate, np.zeros(5)))  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow or invalid-value warnings
        mild = log_decay_from_gate(gate, np.zeros(5))
        huge_rate = log_decay_from_gate(np.array([1.0], np.float32), np.array([100.0]))
    assert np.isfinite(mild).all() and (mild <= 0).all() and mild[-1] == -1000.0
    assert huge_rate[0] == -np.inf, "a decay rate past fp32's range resets the state (g_log = -inf is accepted)"


def test_beta_is_one_rounding_of_the_sigmoid_in_zero_one() -> None:
    logit = np.linspace(-60, 60, 6001).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = beta_from_logit(logit)
        extremes = beta_from_logit(np.array([-1000.0, 1000.0], np.float32))
    exact = 1.0 / (1.0 + np.exp(-logit.astype(np.float64)))
    _within_half_an_ulp(got, exact)
    assert got.dtype == np.float32 and 0 <= got.min() and got.max() == 1.0 and beta_from_logit(np.zeros(1))[0] == 0.5
    assert extremes.tolist() == [0.0, 1.0]
