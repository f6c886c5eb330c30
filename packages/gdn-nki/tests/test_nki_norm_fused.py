"""gdn_cte_normed (the gated RMSNorm folded into gdn_cte's output stage) through ``gdn_nki.simulate_normed``: bit for
bit ``gdn_cte`` then ``gdn_gated_rms_norm`` on the same z rows at the launches users run (several lanes, GQA, a
batch, a supplied state, grid 2, a compiled loop, both algorithms, bf16 and fp32), within the tolerance table against
gdn-ref's fp64 layer oracle, each option, and the rejections (naming the argument, nothing written)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import gdn_nki
import nki_cpu
from gdn_nki.common import backend
from gdn_nki.cte import lanes
from gdn_ref.contract import ContractError
from gdn_ref.norm import gated_rms_norm_oracle
from gdn_spec.metrics import compare
from gdn_spec.regimes import Geometry
from nki_inputs import case, kernel_kwargs, oracle

BF16 = ml_dtypes.bfloat16


def _norm_inputs(c, seed: int = 0, weight_dtype: type = np.float32) -> tuple[np.ndarray, np.ndarray]:
    """z seq-first [B, S, Hv, Dv] in the case's dtype, and a weight [Dv]."""
    g = c.geometry
    rng = np.random.default_rng(seed)
    z = (2.0 * rng.standard_normal((g.B, g.S, g.Hv, g.Dv))).astype(c.kernel["query"].dtype)
    weight = (1.0 + 0.5 * rng.standard_normal(g.Dv)).astype(weight_dtype)
    return z, weight


def _two_launches(c, algorithm: str, z, weight, **options) -> tuple[np.ndarray, np.ndarray]:
    """``simulate`` then ``gated_rms_norm`` on its o and z's rows in o's head-major order."""
    norm = {k: options.pop(k) for k in ("eps", "activation") if k in options}
    o, state = gdn_nki.simulate(**kernel_kwargs(c, algorithm, **options))
    y = gdn_nki.gated_rms_norm(o, np.ascontiguousarray(z.transpose(0, 2, 1, 3)), weight, **norm)
    return y, state


def _assert_bits(got: np.ndarray, want: np.ndarray) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    same = got.view(np.uint8) == want.view(np.uint8)
    assert same.all(), f"{int((~same).sum())} bytes differ"


@pytest.mark.parametrize(
    ("dtype", "algorithm", "geometry", "options"),
    [
        # Qwen3-Next's GQA ratio (2 value heads per key head), two batch rows, a supplied state
        ("bfloat16", "schur", Geometry(2, 1, 2, 256, 128, 128), {"state": True}),
        ("float32", "schur", Geometry(1, 2, 4, 128, 64, 128), {}),
        ("bfloat16", "neumann", Geometry(1, 2, 2, 192, 128, 128), {}),  # chunk 64: three chunks
        ("bfloat16", "schur", Geometry(1, 2, 4, 256, 128, 128), {"grid": 2}),  # lanes split over two programs
        ("bfloat16", "schur", Geometry(1, 1, 1, 256, 128, 64), {"group_size": 1}),  # Dv 64: one column block
    ],
)
def test_bit_for_bit_the_two_launches(dtype: str, algorithm: str, geometry: Geometry, options: dict) -> None:
    c = case(dtype, geometry, seed=geometry.S, supply_state=options.pop("state", False))
    z, weight = _norm_inputs(c)
    y, state = gdn_nki.simulate_normed(**kernel_kwargs(c, algorithm, **options), z=z, norm_weight=weight)
    want_y, want_state = _two_launches(c, algorithm, z, weight, **options)
    _assert_bits(y, want_y)
    _assert_bits(state, want_state)


@pytest.mark.nki_cpu_only  # reads nki-cpu's trace
@pytest.mark.usefixtures("loop_every_steady_run")
def test_bit_for_bit_in_a_compiled_loop() -> None:
    """Lanes whose steady periods are a compiled loop (batch row 1 and value head 1 too): their z rows are addressed
    from the loop's run-time token, which an unrolled launch never does."""
    units = 2 * lanes.PIPELINE_DEPTH - 1 + lanes.PIPELINE_DEPTH  # two iterations of one unit group (test_nki_program)
    c = case("bfloat16", Geometry(2, 1, 2, units * 4 * 128, 32, 16), seed=5, supply_state=True)
    z, weight = _norm_inputs(c, seed=5)
    y, state = gdn_nki.simulate_normed(**kernel_kwargs(c, "schur", group_size=4), z=z, norm_weight=weight)
    trace = nki_cpu.last_trace()
    assert trace.static_instructions < len(trace.records), "no compiled loop ran"
    want_y, want_state = _two_launches(c, "schur", z, weight, group_size=4)
    _assert_bits(y, want_y)
    _assert_bits(state, want_state)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_matches_the_fp64_layer_oracle(dtype: str) -> None:
    """y against gdn-ref's fp64 recurrence then its fp64 gated norm, under the tolerance table's ``out`` row."""
    c = case(dtype, Geometry(1, 2, 4, 256, 128, 128), seed=11, supply_state=True)
    z, weight = _norm_inputs(c, seed=11)
    y, _ = gdn_nki.simulate_normed(**kernel_kwargs(c, "schur"), z=z, norm_weight=weight, eps=1e-6)
    ref_o, _ = oracle(c)
    z_head_major = np.asarray(z, np.float64).transpose(0, 2, 1, 3)
    ref = gated_rms_norm_oracle(ref_o, z_head_major, weight.astype(np.float64), eps=1e-6, activation="silu")
    error = compare("out", np.asarray(y, np.float64), ref, dtype)
    assert error.ok, error


@pytest.mark.parametrize(
    ("activation", "eps", "weighted", "weight_dtype"),
    [("sigmoid", 1e-5, True, np.float32), ("swish", 1e-2, False, np.float32), ("silu", 1e-6, True, BF16)],
)
def test_options(activation: str, eps: float, weighted: bool, weight_dtype: type) -> None:
    c = case("bfloat16", Geometry(1, 1, 2, 128, 128, 128), seed=3)
    z, weight = _norm_inputs(c, seed=3, weight_dtype=weight_dtype)
    weight = weight if weighted else None
    options = {"eps": eps, "activation": activation}
    y, _ = gdn_nki.simulate_normed(**kernel_kwargs(c, "schur"), z=z, norm_weight=weight, **options)
    _assert_bits(y, _two_launches(c, "schur", z, weight, **options)[0])


def _bad(c, change: dict) -> dict:
    z, weight = _norm_inputs(c)
    call = {**kernel_kwargs(c, "schur"), "z": z, "norm_weight": weight, **change}
    if callable(change.get("z")):
        call["z"] = change["z"](z)
    return call


@pytest.mark.parametrize(
    ("change", "argument"),
    [
        ({"z": lambda z: np.ascontiguousarray(z.transpose(0, 2, 1, 3))}, "z"),  # head-major passed: the wrong layout
        ({"z": lambda z: z.astype(np.float32)}, "z"),  # not the compute dtype
        ({"z": None}, "z"),
        ({"norm_weight": np.ones(64, np.float32)}, "weight"),
        ({"norm_weight": np.ones(128, np.float16)}, "weight"),
        ({"eps": -1.0}, "eps"),
        ({"activation": "gelu"}, "activation"),
        ({"query": None}, "query"),  # gdn_cte's own rules still apply
    ],
)
def test_rejections_name_the_argument(change: dict, argument: str) -> None:
    c = case("bfloat16", Geometry(1, 1, 2, 128, 128, 128), seed=4, supply_state=True)
    call = _bad(c, change)
    before = call["recurrent_state"].copy()
    with pytest.raises(ContractError, match=f"`{argument}`") as info:
        gdn_nki.simulate_normed(**call)
    assert "gdn_nki.simulate_normed" in str(info.value)
    _assert_bits(call["recurrent_state"], before)  # nothing written


@pytest.mark.parametrize("argument", ["z", "norm_weight"])
def test_non_finite_norm_inputs_rejected(argument: str) -> None:
    c = case("bfloat16", Geometry(1, 1, 2, 128, 128, 128), seed=6, supply_state=True)
    call = _bad(c, {})
    call[argument].reshape(-1)[7] = np.nan
    before = call["recurrent_state"].copy()
    with pytest.raises(ContractError, match=f"`{'weight' if argument == 'norm_weight' else argument}`"):
        gdn_nki.simulate_normed(**call)
    _assert_bits(call["recurrent_state"], before)


def test_kernel_asserts_at_trace_time() -> None:
    """A direct launch stops its trace naming the norm's broken rule, as gdn_cte's own."""
    c = case("bfloat16", Geometry(1, 1, 2, 128, 128, 128), seed=8)
    z, weight = _norm_inputs(c)
    kwargs = kernel_kwargs(c, "schur")
    with pytest.raises(AssertionError, match="`z`"):
        backend.simulate(gdn_nki.gdn_cte_normed)(**kwargs, z=z[:, :64], norm_weight=weight)
