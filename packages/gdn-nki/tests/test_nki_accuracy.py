"""gdn_cte on the interpreter against the fp64 oracle: both algorithms × fp32/bf16 over small shapes and stress
regimes, GQA head sharing, group sizes, and chunk-boundary invariance (one call == two calls carrying the state)."""

from __future__ import annotations

import numpy as np
import pytest

from gdn_spec.regimes import Geometry
from nki_inputs import assert_agree, assert_matches_oracle, case, run

ALGORITHMS = ("schur", "neumann")
DTYPES = ("float32", "bfloat16")

# S in 128..384 (one to three schur chunks, two to six neumann chunks); head dims from {16, 64, 100, 128} with
# Dk != Dv both ways (a transposed state or a Dk/Dv mix-up cannot pass), 100 for a partial partition tile.
SHAPES = (
    Geometry(B=1, Hk=1, Hv=1, S=128, Dk=16, Dv=64),
    Geometry(B=2, Hk=1, Hv=1, S=256, Dk=100, Dv=64),
    Geometry(B=1, Hk=2, Hv=2, S=384, Dk=128, Dv=16),
    Geometry(B=1, Hk=1, Hv=1, S=256, Dk=64, Dv=100),
    Geometry(B=1, Hk=1, Hv=1, S=128, Dk=128, Dv=128),
)


def _shape_id(g: Geometry) -> str:
    return f"B{g.B}H{g.Hv}S{g.S}k{g.Dk}v{g.Dv}"


@pytest.mark.parametrize("geometry", SHAPES, ids=_shape_id)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_matches_oracle(algorithm: str, dtype: str, geometry: Geometry) -> None:
    c = case(dtype, geometry, seed=geometry.S + geometry.Dk + geometry.Dv)
    out, state = run(c, algorithm)
    assert out.shape == (geometry.B, geometry.Hv, geometry.S, geometry.Dv)
    assert out.dtype == c.kernel["query"].dtype, "out is in the compute dtype"
    assert state.shape == (geometry.B, geometry.Hv, geometry.Dk, geometry.Dv)
    assert state.dtype == np.float32, "the state is fp32 whatever the compute dtype"
    assert_matches_oracle(c, out, state, algorithm)


# Regimes that stress the numerics (see gdn_spec.regimes); the state regimes need schur (neumann takes no state).
STRESS_REGIMES = ("collinear_keys", "zero_gate", "model_gates", "extreme_gates", "beta_near_zero", "beta_near_one")
STATE_REGIMES = ("initial_state", "small_delta", "large_state")
STRESS_GEOMETRY = Geometry(B=1, Hk=1, Hv=1, S=256, Dk=64, Dv=32)


@pytest.mark.parametrize("regime", STRESS_REGIMES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_stress_regimes(algorithm: str, dtype: str, regime: str) -> None:
    c = case(dtype, STRESS_GEOMETRY, seed=7, regime=regime)
    assert_matches_oracle(c, *run(c, algorithm), algorithm)


@pytest.mark.parametrize("regime", STATE_REGIMES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_state_regimes_schur(dtype: str, regime: str) -> None:
    c = case(dtype, STRESS_GEOMETRY, seed=8, regime=regime)
    assert c.kernel["recurrent_state"] is not None
    assert_matches_oracle(c, *run(c, "schur"), "schur")


def _repeat_key_heads(c_kernel: dict, ratio: int) -> dict:
    """query/key with every key head repeated ``ratio`` times (value head h then reads its own copy)."""
    return {name: np.repeat(c_kernel[name], ratio, axis=1) for name in ("query", "key")}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ratio", [2, 3])
def test_gqa_equals_repeated_key_heads(ratio: int, dtype: str) -> None:
    geometry = Geometry(B=2, Hk=2, Hv=2 * ratio, S=256, Dk=32, Dv=16)
    c = case(dtype, geometry, seed=20 + ratio, regime="initial_state")
    shared = run(c, "schur")
    repeated = run(c, "schur", **_repeat_key_heads(c.kernel, ratio))
    # Lane h runs the same instructions on the same values either way: the results are identical.
    np.testing.assert_array_equal(shared[0], repeated[0], err_msg="out: GQA vs repeated key heads")
    np.testing.assert_array_equal(shared[1], repeated[1], err_msg="state: GQA vs repeated key heads")
    assert_matches_oracle(c, *shared, f"schur GQA {ratio}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_neumann_on_repeated_heads_matches_schur_gqa(dtype: str) -> None:
    """neumann rejects head sharing; fed repeated key heads it computes what schur computes with GQA."""
    geometry = Geometry(B=1, Hk=1, Hv=3, S=256, Dk=32, Dv=16)
    c = case(dtype, geometry, seed=31)
    out, state = run(c, "neumann", **_repeat_key_heads(c.kernel, 3))
    assert_matches_oracle(c, out, state, "neumann, repeated heads")


GROUP_GEOMETRY = Geometry(B=1, Hk=1, Hv=2, S=9 * 128, Dk=32, Dv=16)  # 9 chunks: full and residual groups


def test_group_sizes_agree() -> None:
    """group_size 1, 3, 8, 16 (9 chunks: 9×1, 3×3, 8+1, one residual group of 9) agree to fp32 rounding."""
    c = case("float32", GROUP_GEOMETRY, seed=40, regime="initial_state")
    results = {size: run(c, "schur", group_size=size) for size in (1, 3, 8, 16)}
    for size, result in results.items():
        assert_matches_oracle(c, *result, f"group_size={size}")
        if size != 8:
            assert_agree(result, results[8], "float32", f"group_size={size} vs 8")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("split", [128, 256])
def test_chunk_boundary_invariance(split: int, dtype: str) -> None:
    """One call over S equals two calls where the second resumes from the first's state."""
    geometry = Geometry(B=1, Hk=1, Hv=2, S=384, Dk=32, Dv=48)
    c = case(dtype, geometry, seed=50 + split, regime="initial_state")
    whole_out, whole_state = run(c, "schur")

    def part(lo: int, hi: int) -> dict:
        return {
            name: np.ascontiguousarray(c.kernel[name][:, :, lo:hi])
            for name in ("query", "key", "value", "g_log", "beta")
        }

    state = c.kernel["recurrent_state"].copy()
    first_out, carried = run(c, "schur", **part(0, split), recurrent_state=state)
    second_out, final = run(c, "schur", **part(split, geometry.S), recurrent_state=carried)
    assert final is state, "the chained calls update the one buffer in place"
    joined = np.concatenate([first_out, second_out], axis=2)
    # Judged against the one-call run with the tolerance table: the split only re-rounds the carried state.
    assert_agree((joined, final), (whole_out, whole_state), dtype, f"split at {split} vs one call")
    assert_matches_oracle(c, joined, final, f"split at {split}")
