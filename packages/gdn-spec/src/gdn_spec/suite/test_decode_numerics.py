"""Decode numerics: every live request's outputs and every pool row it writes against the float64 oracle
(``gdn_ref.decode.decode_steps``), every regime × compute dtype, under the tolerance table.

Hypothesis draws the sizes, the seed and the addressing (per-request or per-token rows, num_accepted_tokens,
padding requests) within what the kernel declares; the values come from the seed (``gdn_spec.decode.cases``).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gdn_spec.decode.cases import REGIMES, DecodeCase, errors_vs_oracle, make_decode_case
from gdn_spec.impl import Implementation

from ._decode_support import addressings, base_geometry, call_of, caps_of, decode_shapes, require, run_decode
from ._support import assert_close, record_worst

# A scale no head size gives as Dk**-0.5: a kernel applying Dk**-0.5 itself instead of its argument fails here.
CALLER_SCALE = 0.3


def _judge(impl: Implementation, case: DecodeCase, request: pytest.FixtureRequest, label: str) -> None:
    out, pool = run_decode(impl, call_of(case))
    errors = errors_vs_oracle(case, out, pool)
    record_worst(request.node, errors, algorithm="decode", dtype=case.dtype, regime=label)
    assert_close(errors, case.describe())


def _examples(impl: Implementation) -> int:
    return max(1, round(settings.default.max_examples * caps_of(impl).example_scale))


def _drawn(impl: Implementation, gdn_dtype: str, request: pytest.FixtureRequest, regime: str, **options) -> None:
    caps = caps_of(impl)

    @settings(max_examples=_examples(impl))
    @given(data=st.data(), seed=st.integers(0, 2**32 - 1))
    def check(data: st.DataObject, seed: int) -> None:
        geometry = data.draw(decode_shapes(caps), label="geometry")
        addressing = data.draw(addressings(caps, geometry), label="addressing")
        case = make_decode_case(regime, geometry, gdn_dtype, seed, addressing=addressing, **options)
        _judge(impl, case, request, ", ".join([regime, *(f"{key}={value}" for key, value in options.items())]))

    check()


@pytest.mark.parametrize("regime", list(REGIMES))
def test_matches_oracle(gdn_impl: Implementation, gdn_dtype: str, regime: str, request: pytest.FixtureRequest) -> None:
    require(caps_of(gdn_impl).lacks("gating", "precomputed"))
    _drawn(gdn_impl, gdn_dtype, request, regime)


def test_fused_gating_matches_oracle(gdn_impl: Implementation, gdn_dtype: str, request: pytest.FixtureRequest) -> None:
    """g = −exp(A_log)·softplus(a + dt_bias) and β = sigmoid(b) inside the kernel, at Qwen3-Next's gate
    distribution: a wrong sign, a missing softplus or an unbiased a fails here."""
    require(caps_of(gdn_impl).lacks("gating", "fused"))
    _drawn(gdn_impl, gdn_dtype, request, "random", gating="fused")


def test_qk_l2norm_matches_oracle(gdn_impl: Implementation, gdn_dtype: str, request: pytest.FixtureRequest) -> None:
    """use_qk_l2norm=True on raw q and k of norms 0.5–3: q and k normalized inside (eps 1e-6)."""
    caps = caps_of(gdn_impl)
    require(caps.lacks("qk_l2norm"), caps.lacks("gating", "precomputed"))
    _drawn(gdn_impl, gdn_dtype, request, "random", l2norm=True)


def test_applies_the_callers_scale(gdn_impl: Implementation, gdn_dtype: str, request: pytest.FixtureRequest) -> None:
    caps = caps_of(gdn_impl)
    require(caps.lacks("fixed_scale", False), caps.lacks("gating", "precomputed"))
    case = make_decode_case("random", base_geometry(caps), gdn_dtype, 23, scale=CALLER_SCALE)
    _judge(gdn_impl, case, request, f"scale={CALLER_SCALE}")
