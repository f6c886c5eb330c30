"""Resolving the implementation under test and validating its capabilities."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings

from gdn_ref.constants import CHUNK_BY_ALGORITHM
from gdn_spec import impl
from gdn_spec.impl import Capabilities, ImplementationError, load, resolve
from gdn_spec.profiles import PROMISES, unmet
from gdn_spec.regimes import EQUAL_HEAD_GEOMETRIES, HEAD_DIMS, HEAD_GEOMETRIES, Geometry
from gdn_spec.suite._support import DEFAULT_MAX_WORK, drawable_head_dims, fit, shapes


def test_load_module_callable_reads_capabilities() -> None:
    loaded = load("mutants:CORRECT")
    assert loaded.capabilities.name == "mutant:none" and loaded.capabilities.max_work == 1 << 22
    assert loaded.capabilities.algorithms == ("schur", "neumann")


@pytest.mark.parametrize("spec", ["mutants", "mutants:", "no_such_module_xyz:f", "mutants:NOPE", "mutants:CAPS"])
def test_bad_specs_are_errors(spec: str) -> None:
    with pytest.raises(ImplementationError):
        load(spec)


@pytest.mark.parametrize("raw", [{"algorithms": ("fla",)}, {"dtypes": ()}, {"max_sequence": 5}, {"example_scale": 0}])
def test_bad_capabilities_are_errors(raw: dict) -> None:
    with pytest.raises(ImplementationError):
        Capabilities.from_mapping(raw, "x")


def test_limits_explain_skips() -> None:
    caps = Capabilities.from_mapping({"max_seq_len": 256, "dtypes": ["bfloat16"]}, "k")
    assert caps.dtypes == ("bfloat16",)
    assert "float32" in caps.unsupported(dtype="float32")
    assert caps.too_large(Geometry(1, 1, 1, 256, 16, 16)) is None
    assert "max_seq_len=256" in caps.too_large(Geometry(1, 1, 1, 512, 16, 16))


def test_resolution_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(impl, "registered", lambda: {})
    assert resolve(None, {}) is None
    assert resolve(None, {"GDN_SPEC_IMPL": "mutants:CORRECT"}).spec == "mutants:CORRECT"
    assert resolve("mutants:out_fp32", {"GDN_SPEC_IMPL": "mutants:CORRECT"}).spec == "mutants:out_fp32"
    monkeypatch.setattr(impl, "registered", lambda: {"only": "mutants:CORRECT"})
    assert resolve(None, {}).spec == "mutants:CORRECT"
    assert resolve("only", {}).spec == "mutants:CORRECT"
    monkeypatch.setattr(impl, "registered", lambda: {"a": "mutants:CORRECT", "b": "mutants:out_fp32"})
    with pytest.raises(ImplementationError, match="several"):
        resolve(None, {})


def test_plugin_names_match_the_sources() -> None:
    from gdn_ref.constants import ALGORITHMS, COMPUTE_DTYPES
    from gdn_spec import plugin

    assert plugin.ALGORITHMS == ALGORITHMS and plugin.COMPUTE_DTYPES == COMPUTE_DTYPES
    assert (plugin.ENV_VAR, plugin.ENTRY_POINT_GROUP) == (impl.ENV_VAR, impl.ENTRY_POINT_GROUP)


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ({"max_head_dim": 0}, ("max_head_dim=0", "[1, 128]", "largest Dk and Dv")),
        ({"max_head_dim": 256}, ("max_head_dim=256", "[1, 128]", "largest Dk and Dv")),
        ({"max_head_dim": True}, ("max_head_dim=True", "integer")),
        ({"head_dims": ()}, ("head_dims=()", "non-empty", "e.g. (64, 128)")),
        ({"head_dims": 64}, ("head_dims=64", "collection of integers")),
        ({"head_dims": "64"}, ("head_dims='64'", "collection of integers")),
        ({"head_dims": (64, 129)}, ("head_dims=(64, 129)", "[1, 128]")),
        ({"head_dims": (64.0,)}, ("head_dims=(64.0,)", "lists 64.0, which is not an integer")),
        ({"head_dims": (64, 128), "max_head_dim": 100}, ("[128] above max_head_dim=100", "drop those sizes")),
        ({"equal_head_dims": "yes"}, ("equal_head_dims='yes'", "must be a bool", "Dk == Dv")),
    ],
)
def test_bad_head_dim_capabilities_name_field_value_rule_and_fix(raw: dict, words: tuple[str, ...]) -> None:
    with pytest.raises(ImplementationError) as info:
        Capabilities.from_mapping(raw, "k")
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_head_dim_capabilities_explain_skips() -> None:
    default = Capabilities.from_mapping({}, "k")
    assert default.unsupported_head_dims(128, 16) is None and default.allows_head_dim(100)
    caps = Capabilities.from_mapping({"head_dims": [128, 64, 64], "equal_head_dims": True}, "k")
    assert caps.head_dims == (64, 128)  # normalized: sorted, deduplicated, a tuple
    assert caps.unsupported_head_dims(64, 64) is None and caps.unsupported_head_dims(128, 128) is None
    assert "Dk=32 is not in its declared head_dims=(64, 128)" in caps.unsupported_head_dims(32, 32)
    assert "Dv=100 is not in its declared head_dims" in caps.unsupported_head_dims(64, 100)
    assert "equal_head_dims=True" in caps.unsupported_head_dims(64, 128)
    capped = Capabilities.from_mapping({"max_head_dim": 64}, "k")
    assert capped.allows_head_dim(64) and not capped.allows_head_dim(100)
    assert "Dv=128 exceeds its declared max_head_dim=64" in capped.unsupported_head_dims(16, 128)


@pytest.mark.parametrize(
    "raw",
    [{"equal_head_dims": True}, {"head_dims": (64, 128)}, {"max_head_dim": 64}, {"head_dims": (32,)}, {}],
    ids=["equal", "64-128", "max-64", "only-32", "default"],
)
@pytest.mark.parametrize("algorithm", ["schur", "neumann"])
def test_drawn_shapes_stay_inside_the_declared_head_dims(raw: dict, algorithm: str) -> None:
    """Every shape the numerics area draws (after fitting into the work budget) is one the implementation
    declared; and the draws still reach every suite size it allows (a support filter must not collapse them)."""
    caps = Capabilities.from_mapping({**raw, "max_work": 1 << 22}, "k")
    seen: set[tuple[int, int]] = set()

    @settings(max_examples=200, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(shape=shapes(algorithm, caps))
    def draw(shape: tuple[Geometry, int]) -> None:
        geometry, _ = shape
        assert caps.unsupported_head_dims(geometry.Dk, geometry.Dv) is None, geometry
        seen.add((geometry.Dk, geometry.Dv))

    draw()
    sizes = drawable_head_dims(caps)
    assert {d for pair in seen for d in pair} == set(sizes), (seen, sizes)
    assert any(dk != dv for dk, dv in seen) == (len(sizes) > 1 and not caps.equal_head_dims), seen


@pytest.mark.parametrize("algorithm", ["schur", "neumann"])
def test_value_regime_draws_end_inside_a_chunk_at_few_lanes(algorithm: str) -> None:
    """The value regimes' draws (``inside_chunk``, ``max_lanes``) for a kernel taking any S: every length ends
    inside a chunk, at most two lanes, and still several chunks. Hypothesis favours a tail of 0 in its first
    examples, so with three examples a regime could otherwise miss a ragged-tail bug."""
    caps = Capabilities.from_mapping({"any_seq_len": True}, "k")
    chunk = CHUNK_BY_ALGORITHM[algorithm]
    chunks_seen: set[int] = set()

    @settings(max_examples=60, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(shape=shapes(algorithm, caps, max_lanes=2, inside_chunk=True))
    def draw(shape: tuple[Geometry, int]) -> None:
        geometry, _ = shape
        assert geometry.S % chunk and geometry.lanes <= 2, geometry
        chunks_seen.add(-(-geometry.S // chunk))

    draw()
    assert max(chunks_seen) > 2, chunks_seen


# Declarations of the head-dim tests below (as from_mapping dicts), and the (Dk, Dv) requests they are asked for:
# the suite's fixed shapes, its drawn sizes, and odd sizes around them.
HEAD_DIM_DECLARATIONS = {
    "equal": {"equal_head_dims": True},
    "16-64": {"head_dims": (16, 64)},
    "64-128": {"head_dims": (64, 128)},
    "only-64": {"head_dims": (64,)},
    "max-64": {"max_head_dim": 64},
    "max-1": {"max_head_dim": 1},
    "equal-64-128": {"head_dims": (64, 128), "equal_head_dims": True},
}
REQUEST_SIZES = (1, 15, 16, 17, 32, 63, 64, 65, 100, 127, 128)


def test_nearest_head_dims_of_a_kernel_declaring_nothing_is_every_request_itself() -> None:
    """A kernel without head-dim limits runs every fixed-shape test at exactly the sizes it names."""
    caps = Capabilities.from_mapping({}, "k")
    assert all(caps.nearest_head_dims(dk, dv) == (dk, dv) for dk in range(1, 129) for dv in range(1, 129))


@pytest.mark.parametrize("raw", list(HEAD_DIM_DECLARATIONS.values()), ids=list(HEAD_DIM_DECLARATIONS))
def test_nearest_head_dims_is_supported_and_keeps_what_it_can(raw: dict) -> None:
    """The pair is the request when supported, else a supported pair; a request with Dk ≠ Dv keeps Dk ≠ Dv, in
    the same order, whenever the declaration has such a pair (the transposition bugs it catches need it)."""
    caps = Capabilities.from_mapping(raw, "k")
    sizes = caps.head_dims or range(1, (caps.max_head_dim or 128) + 1)
    has_unequal = not caps.equal_head_dims and len(sizes) > 1
    for dk in REQUEST_SIZES:
        for dv in REQUEST_SIZES:
            got = caps.nearest_head_dims(dk, dv)
            assert caps.unsupported_head_dims(*got) is None, ((dk, dv), got)
            if caps.unsupported_head_dims(dk, dv) is None:
                assert got == (dk, dv)
            if dk != dv and has_unequal:
                assert got[0] != got[1] and (got[0] > got[1]) == (dk > dv), ((dk, dv), got)


@pytest.mark.parametrize(
    ("raw", "asked", "expected"),
    [
        ({"equal_head_dims": True}, (32, 16), (16, 16)),  # the base shape: the smaller, no dearer than asked
        ({"equal_head_dims": True}, (100, 64), (64, 64)),
        ({"equal_head_dims": True}, (128, 128), (128, 128)),
        ({"head_dims": (16, 64)}, (32, 16), (64, 16)),  # (16, 16) is nearer, but loses Dk ≠ Dv
        ({"head_dims": (16, 64)}, (100, 64), (64, 16)),  # as near as (16, 64): Dk > Dv kept
        ({"head_dims": (16, 64)}, (16, 100), (16, 64)),
        ({"head_dims": (16, 64)}, (128, 128), (64, 64)),
        ({"head_dims": (16, 64)}, (32, 32), (16, 16)),  # as near as (64, 64): the cheaper
        ({"head_dims": (64,)}, (32, 16), (64, 64)),  # no unequal pair exists
        ({"max_head_dim": 64}, (100, 64), (64, 63)),
        ({"head_dims": (64, 128), "equal_head_dims": True}, (32, 16), (64, 64)),
    ],
)
def test_nearest_head_dims_examples(raw: dict, asked: tuple[int, int], expected: tuple[int, int]) -> None:
    assert Capabilities.from_mapping(raw, "k").nearest_head_dims(*asked) == expected


def test_supported_geometry_is_noted_only_when_it_differs() -> None:
    """A substituted fixed shape is noted for the test's report (and its failure message), naming the sizes run,
    the sizes asked for and the capability; an unchanged one is the same object, with nothing noted."""
    from gdn_spec import plugin
    from gdn_spec.contract import BASE_GEOMETRY
    from gdn_spec.suite._support import supported

    plugin._SUBSTITUTIONS.clear()
    base = BASE_GEOMETRY["schur"]
    assert supported(Capabilities.from_mapping({}, "k"), base) is base
    assert plugin._SUBSTITUTIONS == []
    square = Capabilities.from_mapping({"equal_head_dims": True}, "sq")
    assert supported(square, base) == Geometry(base.B, base.Hk, base.Hv, base.S, 16, 16)
    assert plugin._SUBSTITUTIONS == [
        "ran at Dk=16, Dv=16 instead of Dk=32, Dv=16: sq: Dk=32 != Dv=16, and it declares equal_head_dims=True"
    ]
    plugin._SUBSTITUTIONS.clear()


@pytest.mark.parametrize("max_lanes", [1, 2])
@pytest.mark.parametrize("algorithm", ["schur", "neumann"])
def test_drawn_shapes_fit_a_few_lane_kernel_and_still_vary(algorithm: str, max_lanes: int) -> None:
    """Numerics draws shrink into max_lanes for both algorithms (schur's fallback used to keep Hk = Hv = 2, two
    lanes, so a one-lane kernel was called above its limit) and keep varying in S and the head dims: shrinking
    S and the head sizes for a lane limit made every schur draw of a one-lane kernel S = 128 (one chunk: the
    state carried across chunks never checked) at Dk = Dv = 16, and 77% of them (16, 16) for max_lanes=2."""
    caps = Capabilities.from_mapping({"max_lanes": max_lanes}, "k")
    chunk = CHUNK_BY_ALGORITHM[algorithm]
    drawn: list[Geometry] = []

    @settings(max_examples=100, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(shape=shapes(algorithm, caps))
    def draw(shape: tuple[Geometry, int]) -> None:
        assert caps.too_large(shape[0]) is None, shape
        drawn.append(shape[0])

    draw()
    lengths = {g.S for g in drawn}
    head_dims = Counter((g.Dk, g.Dv) for g in drawn)
    assert max(lengths) > chunk and len(lengths) >= 4, sorted(lengths)  # several chunks, several lengths
    assert len(head_dims) >= 8, head_dims
    # The cheapest pair is drawn about as often as any other (1/16 of the draws, more where the default work
    # budget shrinks a draw): it is no sink for every draw the lane limit touched.
    assert head_dims[(16, 16)] < len(drawn) / 4, head_dims


@pytest.mark.parametrize("algorithm", ["schur", "neumann"])
@pytest.mark.parametrize(
    "raw",
    [{"max_lanes": 1}, {"max_lanes": 2}, {"max_lanes": 3}, {"max_lanes": 4}, {"max_lanes": 1, "max_work": 1 << 20}],
)
def test_fit_shrinks_along_the_lane_limit(raw: dict, algorithm: str) -> None:
    """Above max_lanes a draw loses batch items, then heads — Hv staying a multiple of Hk (equal for neumann), the
    GQA ratio Hv / Hk kept while one key head allows it, else one key head and max_lanes value heads — and keeps
    its S and head dims unless the work budget needs them smaller (then only shrinks further). Every drawable
    shape is checked; before, S and the head sizes went first, whatever limit was exceeded."""
    caps = Capabilities.from_mapping(raw, "k")
    lanes = caps.max_lanes
    chunk = CHUNK_BY_ALGORITHM[algorithm]
    heads = HEAD_GEOMETRIES if algorithm == "schur" else EQUAL_HEAD_GEOMETRIES
    budget = min(caps.max_work or DEFAULT_MAX_WORK, DEFAULT_MAX_WORK)
    for (Hk, Hv), B, chunks, Dk, Dv in itertools.product(heads, (1, 2), range(1, 9), HEAD_DIMS, HEAD_DIMS):
        drawn = Geometry(B, Hk, Hv, chunks * chunk, Dk, Dv)
        got = fit(drawn, caps, algorithm)
        assert caps.fits(got) and got.work <= budget, (drawn, got)
        assert got.Hv % got.Hk == 0 and (algorithm == "schur" or got.Hk == got.Hv), (drawn, got)
        ratio = Hv // Hk
        if Hv <= lanes:
            within = Geometry(min(B, lanes // Hv), Hk, Hv, drawn.S, Dk, Dv)
        elif ratio <= lanes:
            key_heads = min(Hk, lanes // ratio)
            within = Geometry(1, key_heads, key_heads * ratio, drawn.S, Dk, Dv)
        else:
            within = Geometry(1, 1, lanes, drawn.S, Dk, Dv)
        if within.work <= budget:  # the lane limit alone was exceeded: S and the head dims are kept
            assert got == within, (drawn, got)
        else:
            assert got.lanes <= within.lanes and got.S <= drawn.S and got.work < within.work, (drawn, got)


def test_fit_shrinks_only_s_above_max_seq_len() -> None:
    """Above max_seq_len a draw keeps B, the heads and the head dims, and runs the most whole chunks within the
    limit (it was halved to one chunk: 896 -> 384 -> 128 against max_seq_len=300)."""
    caps = Capabilities.from_mapping({"max_seq_len": 300}, "k")
    assert fit(Geometry(1, 2, 2, 896, 64, 64), caps, "schur") == Geometry(1, 2, 2, 256, 64, 64)
    assert fit(Geometry(2, 2, 2, 512, 16, 100), caps, "neumann") == Geometry(2, 2, 2, 256, 16, 100)
    below_a_chunk = Capabilities.from_mapping({"max_seq_len": 100}, "k")  # no schur shape fits: the caller skips
    assert fit(Geometry(1, 2, 2, 896, 64, 64), below_a_chunk, "schur") == Geometry(1, 2, 2, 128, 64, 64)


def test_fit_shrinks_s_first_above_max_work() -> None:
    """Above the work budget S halves first (whole chunks), then the lanes (B, then the heads), and the head sizes
    only when one lane of one chunk is above the budget — then the lanes are kept as far as the budget allows.
    (The heads and the head sizes used to shrink together: the 100 x 64 draw ran at 2 heads of 16 x 16, the
    128 x 128 one at B = 1 and 2 heads.)"""
    caps = Capabilities.from_mapping({"max_work": 1 << 20}, "k")
    assert fit(Geometry(1, 2, 2, 896, 64, 64), caps, "schur") == Geometry(1, 2, 2, 128, 64, 64)
    assert fit(Geometry(2, 2, 4, 896, 64, 32), caps, "schur") == Geometry(1, 2, 4, 128, 64, 32)
    assert fit(Geometry(2, 2, 8, 896, 64, 64), caps, "schur") == Geometry(1, 1, 2, 128, 64, 64)
    assert fit(Geometry(2, 2, 8, 896, 100, 64), caps, "schur") == Geometry(1, 1, 1, 128, 100, 64)
    assert fit(Geometry(2, 2, 8, 896, 128, 128), caps, "schur") == Geometry(2, 2, 8, 128, 16, 16)


@pytest.mark.parametrize("max_work", [1 << 22, 1 << 20, 1 << 18])
@pytest.mark.parametrize("algorithm", ["schur", "neumann"])
def test_fit_shrinks_head_dims_only_when_one_lane_is_above_max_work(algorithm: str, max_work: int) -> None:
    """Every drawable shape keeps its head dims whenever one lane of one chunk at them fits the budget: fewer lanes
    are tried first (the head dims are what a kernel tiles; more lanes repeat the same recurrence). Before, the
    heads and the head dims shrank together: under the self-tests' max_work = 2^22, 31% of schur draws ran at
    Dk = Dv = 16 although fewer heads at the drawn sizes fitted."""
    caps = Capabilities.from_mapping({"max_work": max_work}, "k")
    chunk = CHUNK_BY_ALGORITHM[algorithm]
    heads = HEAD_GEOMETRIES if algorithm == "schur" else EQUAL_HEAD_GEOMETRIES
    for (Hk, Hv), B, chunks, Dk, Dv in itertools.product(heads, (1, 2), range(1, 9), HEAD_DIMS, HEAD_DIMS):
        drawn = Geometry(B, Hk, Hv, chunks * chunk, Dk, Dv)
        got = fit(drawn, caps, algorithm)
        assert caps.fits(got) and got.lanes <= drawn.lanes, (drawn, got)
        assert got.Hv % got.Hk == 0 and (algorithm == "schur" or got.Hk == got.Hv), (drawn, got)
        kept = chunk * Dk * Dv <= max_work
        assert ((got.Dk, got.Dv) == (Dk, Dv)) == kept, (drawn, got)
        if not kept:
            assert (got.Dk, got.Dv) == (16, 16), (drawn, got)


def test_a_call_above_a_declared_limit_is_skipped_naming_it() -> None:
    """The safety net every suite call goes through (``run``): a call above max_seq_len or max_lanes is skipped
    with the limit as the reason; a call within them, and a rank violation (no sizes), is not."""
    from gdn_spec.contract import valid_call
    from gdn_spec.suite._support import require_call_supported

    caps = Capabilities.from_mapping({"max_seq_len": 100, "max_lanes": 2}, "k")
    with pytest.raises(pytest.skip.Exception, match=r"S=128 exceeds its declared max_seq_len=100"):
        require_call_supported(caps, valid_call("schur"))
    with pytest.raises(pytest.skip.Exception, match=r"B·Hv=4 exceeds its declared max_lanes=2"):
        require_call_supported(caps, valid_call("neumann", geometry=Geometry(2, 2, 2, 64, 32, 16)))
    call = valid_call("neumann")
    require_call_supported(caps, call)  # S = 64, B·Hv = 2: within both
    require_call_supported(caps, {**call, "value": call["value"][0]})  # a 3-D value has no sizes to judge


def test_a_capability_the_adapter_set_is_not_called_declared() -> None:
    """A seq-first adapter sets state_in_place=False and validates_arguments=False whatever the kernel declares;
    skip reasons said the kernel "declares" them, even for a kernel declaring the opposite."""

    kernel = Capabilities.from_mapping({"state_in_place": True}, "vllm-style")
    assert unmet("in_place_state", "api", replace(kernel, state_in_place=False)) == (
        "vllm-style declares state_in_place=False (" + PROMISES["in_place_state"] + ")"
    )
    adapted = replace(kernel, state_in_place=False, set_by_adapter=("state_in_place",))
    assert unmet("in_place_state", "api", adapted).startswith("vllm-style's adapter sets state_in_place=False (")
