"""Numerics: out and final state against the float64 oracle, every regime × algorithm × compute dtype.

Hypothesis draws the shape, group size, seed and whether a zero state buffer is supplied; the regime is a
parameter so every regime is covered in every run whatever the example budget. The plain regime (``SHAPE_SWEEP``)
sweeps shapes with the profile's full example count at every lane count; every other regime, whose point is its
values, runs half as many shapes (at least one) at up to ``REGIME_MAX_LANES`` lanes, each ending inside a chunk
for a kernel taking any S: each regime still meets every algorithm and dtype, at a sample of shapes (every length,
head dim and group size; fewer repeats of the same recurrence side by side).

Under a derandomized profile (``ci``, ``quick``) each value regime draws from its own seed (its name, algorithm and
dtype): one shared seed gave every regime the same shapes, so the eleven value regimes ran three shapes between
them where they now run a sample each, as reproducibly.
"""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from gdn_ref.constants import ALGORITHM_NEUMANN, ALGORITHM_SCHUR
from gdn_spec.contract import BASE_GEOMETRY
from gdn_spec.impl import Implementation
from gdn_spec.regimes import REGIMES, make_case

from ..oracle import errors_vs_oracle
from ._support import (
    LONG_CASES,
    LongCase,
    assert_close,
    call_args,
    fixed_shape,
    long_geometry,
    record_worst,
    require_fits,
    run,
    shapes,
)

# A scale no head size gives as Dk**-0.5 (0.25 at Dk = 16, 0.177 at 32, ...): every other call uses Dk**-0.5, so
# without this test a kernel ignoring its scale argument (applying Dk**-0.5 itself) passes the whole suite.
CALLER_SCALE = 0.3
# The regime whose numerics test draws the profile's full example count of shapes; the others draw half.
SHAPE_SWEEP = "random"
# Lanes (B·Hv) of a value regime's draws: two keep a GQA head map and a second batch item or head, while the cost of
# a simulated kernel grows with lanes × chunks; the shape sweep and the head_mapping / independence areas check
# more lanes.
REGIME_MAX_LANES = 2


@pytest.mark.parametrize("regime", list(REGIMES))
def test_matches_oracle(
    gdn_impl: Implementation, gdn_algorithm: str, gdn_dtype: str, regime: str, request: pytest.FixtureRequest
) -> None:
    caps = gdn_impl.capabilities
    if REGIMES[regime].needs_state and gdn_algorithm == ALGORITHM_NEUMANN:
        pytest.skip(f'regime {regime} needs an initial state; "neumann" supports only the omitted form')
    sweep = regime == SHAPE_SWEEP
    examples = max(1, round(settings.default.max_examples * caps.example_scale * (1.0 if sweep else 0.5)))
    may_supply = gdn_algorithm != ALGORITHM_NEUMANN
    drawn = shapes(gdn_algorithm, caps, max_lanes=None if sweep else REGIME_MAX_LANES, inside_chunk=not sweep)

    @settings(max_examples=examples)
    @given(shape=drawn, seed=st.integers(0, 2**32 - 1), supply=st.booleans())
    def check(shape, seed: int, supply: bool) -> None:
        geometry, group_size = shape
        require_fits(caps, geometry)  # the smallest shape of the algorithm can still be above a declared limit
        case = make_case(regime, geometry, gdn_dtype, seed, supply_state=supply and may_supply)
        out, state = run(gdn_impl, call_args(case, gdn_algorithm, group_size))
        errors = errors_vs_oracle(case, out, state)
        record_worst(request.node, errors, algorithm=gdn_algorithm, dtype=gdn_dtype, regime=regime)
        assert_close(errors, f"{regime} {geometry} group_size={group_size} seed={seed}")

    if settings.default.derandomize and not sweep:
        check = hypothesis_seed(zlib.crc32(f"{regime}/{gdn_algorithm}/{gdn_dtype}".encode()))(check)
    check()


def test_applies_the_callers_scale(gdn_impl: Implementation, gdn_algorithm: str, gdn_dtype: str) -> None:
    """out is computed with the ``scale`` passed, not with Dk**-0.5: a kernel ignoring the argument fails here."""
    caps = gdn_impl.capabilities
    if caps.fixed_scale:
        pytest.skip(f"{caps.name} applies Dk**-0.5 itself (fixed_scale=True): no other scale can be passed")
    geometry = fixed_shape(caps, BASE_GEOMETRY[gdn_algorithm])
    supply = gdn_algorithm == ALGORITHM_SCHUR  # an incoming state: the scale multiplies q·S0 as well as the chunk
    case = make_case("initial_state" if supply else "random", geometry, gdn_dtype, 17, scale=CALLER_SCALE)
    out, state = run(gdn_impl, call_args(case, gdn_algorithm))
    assert_close(
        errors_vs_oracle(case, out, state), f"scale={CALLER_SCALE} (Dk**-0.5 = {geometry.Dk**-0.5:.4g}) {geometry}"
    )


@pytest.mark.parametrize("long_case", LONG_CASES, ids=lambda c: c.id)
def test_long_sequences_match_oracle(
    gdn_impl: Implementation, gdn_algorithm: str, gdn_dtype: str, long_case: LongCase, request: pytest.FixtureRequest
) -> None:
    """Thousands of tokens at a few small lanes: the state carried across many chunks and several full groups at
    the default group size (a kernel exact for 8 chunks that then restarts from a zero state fails here), ending
    inside a chunk for a kernel taking any S. The short draws stay within 8 chunks, one group at the default."""
    regime = long_case.regime
    if REGIMES[regime].needs_state and gdn_algorithm == ALGORITHM_NEUMANN:
        pytest.skip(f'regime {regime} needs an initial state; "neumann" supports only the omitted form')
    geometry = long_geometry(gdn_impl.capabilities, long_case, gdn_algorithm)
    case = make_case(regime, geometry, gdn_dtype, seed=long_case.chunks)
    out, state = run(gdn_impl, call_args(case, gdn_algorithm, long_case.group_size))
    errors = errors_vs_oracle(case, out, state)
    record_worst(request.node, errors, algorithm=gdn_algorithm, dtype=gdn_dtype, regime=regime)
    groups = f", group_size={long_case.group_size}" if gdn_algorithm == ALGORITHM_SCHUR else ""
    assert_close(errors, f"long sequence, {regime}, S={geometry.S} tokens{groups}: {geometry}")
