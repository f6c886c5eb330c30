"""Decode numerics: every live request's outputs and every pool row it writes against the float64 oracle
(``gdn_ref.decode.decode_steps``), every regime × compute dtype, under the tolerance table.

Hypothesis draws the sizes, the seed and the addressing (per-request or per-token rows, num_accepted_tokens,
padding requests) within what the kernel declares; the values come from the seed (``gdn_spec.decode.cases``).

Under a derandomized profile (``ci``, ``quick``) each drawn test draws from its own seed (its regime, options and
dtype), as the prefill numerics do: one shared seed gave every drawn test the same three cases, none of them with
per-token rows or num_accepted_tokens.
"""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from gdn_spec.decode.cases import REGIMES, Addressing, DecodeCase, DecodeGeometry, errors_vs_oracle, make_decode_case
from gdn_spec.impl import Implementation

from ._decode_support import (
    addressings,
    base_geometry,
    call_of,
    caps_of,
    decode_shapes,
    require,
    run_decode,
    unsupported_call,
)
from ._support import assert_close, record_worst

# A scale no head size gives as Dk**-0.5: a kernel applying Dk**-0.5 itself instead of its argument fails here.
CALLER_SCALE = 0.3
# Raw q and k norms at which the l2norm's eps (1e-6 under the root) is 10–1000 % of Σx²: the normalized vectors
# then have norms 0.3–0.95, where without the eps they would have norm 1 (at norms 0.5–3 the eps moves them by
# at most 2e-6, below every tolerance).
SMALL_QK_NORMS = (3e-4, 3e-3)
# Qwen3-Next's decode head dims with four value heads per key head (its heads scaled down, as the prefill suite's):
# a request's state [8, 128, 128] fp32 is 512 KiB, more than a 128-partition on-chip tile of 2 KiB per partition
# holds, so a kernel tiling the state runs several tiles per request. The drawn sizes reach that rarely
# (Hv >= 6 with Dk, Dv >= 100: a few percent of draws).
QWEN3_NEXT_DECODE = DecodeGeometry(N=3, T=2, Hk=2, Hv=8, Dk=128, Dv=128)


def _judge(impl: Implementation, case: DecodeCase, request: pytest.FixtureRequest, label: str) -> None:
    out, pool = run_decode(impl, call_of(case))
    errors = errors_vs_oracle(case, out, pool)
    record_worst(request.node, errors, algorithm="decode", dtype=case.dtype, regime=label)
    assert_close(errors, case.describe())


def _examples(impl: Implementation) -> int:
    return max(1, round(settings.default.max_examples * caps_of(impl).example_scale))


def _drawn(impl: Implementation, gdn_dtype: str, request: pytest.FixtureRequest, regime: str, **options) -> None:
    caps = caps_of(impl)
    label = ", ".join([regime, *(f"{key}={value}" for key, value in options.items())])

    @settings(max_examples=_examples(impl))
    @given(data=st.data(), seed=st.integers(0, 2**32 - 1))
    def check(data: st.DataObject, seed: int) -> None:
        geometry = data.draw(decode_shapes(caps), label="geometry")
        addressing = data.draw(addressings(caps, geometry), label="addressing")
        case = make_decode_case(regime, geometry, gdn_dtype, seed, addressing=addressing, **options)
        _judge(impl, case, request, label)

    if settings.default.derandomize:
        check = hypothesis_seed(zlib.crc32(f"{label}/{gdn_dtype}".encode()))(check)
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


def test_qk_l2norm_eps_on_small_keys(gdn_impl: Implementation, gdn_dtype: str, request: pytest.FixtureRequest) -> None:
    """use_qk_l2norm=True on raw q and k of norms 3e-4–3e-3 (``SMALL_QK_NORMS``), where the eps under the root is
    a sizable part of Σx²: a kernel that drops it, or adds it outside the root, fails here."""
    caps = caps_of(gdn_impl)
    require(caps.lacks("qk_l2norm"), caps.lacks("gating", "precomputed"))
    _drawn(gdn_impl, gdn_dtype, request, "random", l2norm=True, qk_norms=SMALL_QK_NORMS)


def test_qwen3_next_head_dims_match_oracle(
    gdn_impl: Implementation, gdn_dtype: str, request: pytest.FixtureRequest
) -> None:
    """Dk = Dv = 128 with Hv = 8 on Hk = 2 (``QWEN3_NEXT_DECODE``), two tokens, per-token rows with
    num_accepted_tokens and a padding request where declared: a state too large for one on-chip tile, each of its
    tiles against the oracle."""
    caps = caps_of(gdn_impl)
    require(caps.lacks("gating", "precomputed"), caps.lacks("gqa"))
    geometry = base_geometry(caps, QWEN3_NEXT_DECODE.T, QWEN3_NEXT_DECODE.N)
    geometry = DecodeGeometry(geometry.N, geometry.T, QWEN3_NEXT_DECODE.Hk, QWEN3_NEXT_DECODE.Hv,
                              QWEN3_NEXT_DECODE.Dk, QWEN3_NEXT_DECODE.Dv)  # fmt: skip
    per_token = caps.per_token_states
    addressing = Addressing(per_token=per_token, accepted=per_token and caps.num_accepted_tokens,
                            padding=int(caps.padding and geometry.N > 1))  # fmt: skip
    require(unsupported_call(caps, geometry, addressing))
    case = make_decode_case("random", geometry, gdn_dtype, 41, addressing=addressing)
    _judge(gdn_impl, case, request, "Qwen3-Next head dims")


def test_applies_the_callers_scale(gdn_impl: Implementation, gdn_dtype: str, request: pytest.FixtureRequest) -> None:
    caps = caps_of(gdn_impl)
    require(caps.lacks("fixed_scale", False), caps.lacks("gating", "precomputed"))
    case = make_decode_case("random", base_geometry(caps), gdn_dtype, 23, scale=CALLER_SCALE)
    _judge(gdn_impl, case, request, f"scale={CALLER_SCALE}")
