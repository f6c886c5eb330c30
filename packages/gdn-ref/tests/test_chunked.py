"""The chunk-parallel form against the oracle: precisions, lengths, chunk boundaries, head mapping."""

from __future__ import annotations

import sys

import ml_dtypes
import numpy as np
import pytest

from gdn_ref import ALGORITHMS, SUBBLOCK_NEUMANN, build_mask_pack, chunked, neumann_inverse, recurrent, to_bf16_values
from ref_inputs import HF_CASES, assert_close, hf_case, make_inputs, rel_rms

# (compute dtype, bf16 operands) → (rel-RMS bound, max-abs bound) against the float64 oracle. Outputs and states
# are O(1) here (v ~ N(0, 1), unit keys).
# - fp64: measured ≤ 2e-15; 1e-12 leaves room for longer sums, and any real bug is O(1e-2) or worse.
# - fp32: measured ≤ 8e-7; per-step rounding 6e-8 grows with the ~C-term sums and the chunk chain.
# - bf16 operands: measured 3e-3..8e-3 (worst at g = 0, where nothing damps the state's accumulated error).
#   bf16 keeps 8 mantissa bits (unit roundoff 2^-9 ≈ 2e-3) and each output passes 3-4 rounded matmul stages
#   (k, T, V_new, scores); 2e-2 is FLA's own ratio scale (0.005-0.02) and still far below a real bug's O(0.1-1).
TOLERANCES = {
    (np.float64, False): (1e-12, 1e-12),
    (np.float32, False): (1e-5, 1e-5),
    (np.float32, True): (2e-2, 5e-2),
}
PRECISION_IDS = {(np.float64, False): "fp64", (np.float32, False): "fp32", (np.float32, True): "bf16ops"}


@pytest.mark.parametrize("gate", ["moderate", "zero", "strong", "extreme"])
@pytest.mark.parametrize("precision", list(TOLERANCES), ids=list(PRECISION_IDS.values()))
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_chunked_matches_oracle(algorithm: str, precision: tuple, gate: str) -> None:
    # S = 300 is a multiple of neither chunk (128, 64): the padded tail is exercised every time.
    x = make_inputs(31, B=2, Hk=2, Hv=4, S=300, Dk=32, Dv=16, gate=gate)
    out_ref, state_ref = recurrent(*x.args())
    dtype, bf16 = precision
    out, state = chunked(*x.args(), algorithm=algorithm, compute_dtype=dtype, bf16_operands=bf16)
    assert out.dtype == dtype and state.dtype == dtype
    rel, abs_ = TOLERANCES[precision]
    label = f"{algorithm} {PRECISION_IDS[precision]} {gate}"
    assert_close(out, out_ref, rel, abs_, f"{label} out")
    assert_close(state, state_ref, rel, abs_, f"{label} state")


@pytest.mark.parametrize("case", HF_CASES)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_chunked_matches_hf_transformers_chunk_function(algorithm: str, case: str) -> None:
    data = hf_case(case)
    args = (data["query"], data["key"], data["value"], data["g_log"], data["beta"], float(data["scale"]))
    out, state = chunked(*args, data["initial_state"], algorithm=algorithm)
    assert_close(out, data["out_chunk"], 5e-6, 2e-5, f"{algorithm} {case} out")
    assert_close(state, data["state_chunk"], 5e-6, 2e-5, f"{algorithm} {case} state")


@pytest.mark.parametrize("n_tokens", [1, 15, 63, 64, 65, 127, 128, 129, 257])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_any_sequence_length(algorithm: str, n_tokens: int) -> None:
    x = make_inputs(32, S=n_tokens)
    out_ref, state_ref = recurrent(*x.args())
    out, state = chunked(*x.args(), algorithm=algorithm, compute_dtype=np.float64)
    assert out.shape == out_ref.shape
    assert_close(out, out_ref, 1e-12, 1e-12, f"S={n_tokens} out")
    assert_close(state, state_ref, 1e-12, 1e-12, f"S={n_tokens} state")


@pytest.mark.parametrize("split", [100, 128, 192, 299])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_chunk_boundary_invariance(algorithm: str, split: int) -> None:
    # One call over S tokens == two calls carrying the state, wherever the split falls (pegainfer#691).
    x = make_inputs(33, S=300).astype(np.float32)
    whole_out, whole_state = chunked(*x.args(), algorithm=algorithm)
    first = [a[:, :, :split] for a in (x.query, x.key, x.value, x.g_log, x.beta)]
    second = [a[:, :, split:] for a in (x.query, x.key, x.value, x.g_log, x.beta)]
    out_1, state_1 = chunked(*first, x.scale, x.initial_state, algorithm=algorithm)
    out_2, state_2 = chunked(*second, x.scale, state_1, algorithm=algorithm)
    assert_close(np.concatenate([out_1, out_2], axis=2), whole_out, 1e-6, 1e-6, f"split {split} out")
    assert_close(state_2, whole_state, 1e-6, 1e-6, f"split {split} state")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_gqa_mapping_equals_repeating_key_heads(algorithm: str) -> None:
    x = make_inputs(34, Hk=2, Hv=6, S=200)  # ratio 3: value heads 0-2 read key head 0, 3-5 key head 1
    out, state = chunked(*x.args(), algorithm=algorithm, compute_dtype=np.float64)
    q_rep, k_rep = np.repeat(x.query, 3, axis=1), np.repeat(x.key, 3, axis=1)
    out_rep, state_rep = chunked(
        q_rep, k_rep, x.value, x.g_log, x.beta, x.scale, x.initial_state, algorithm=algorithm,
        compute_dtype=np.float64,
    )  # fmt: skip
    np.testing.assert_allclose(out, out_rep, rtol=0, atol=1e-14)
    np.testing.assert_allclose(state, state_rep, rtol=0, atol=1e-14)
    swapped = np.concatenate([x.key[:, 1:], x.key[:, :1]], axis=1)  # h % Hk-style mapping would not match
    out_wrong, _ = chunked(x.query, swapped, *x.args()[2:], algorithm=algorithm, compute_dtype=np.float64)
    assert rel_rms(out_wrong, out) > 0.1


@pytest.mark.parametrize("bf16", [False, True])
def test_mask_pack_driven_schur_equals_blocked_schur(bf16: bool) -> None:
    x = make_inputs(35, S=384).astype(np.float32)
    blocked = chunked(*x.args(), bf16_operands=bf16)
    masked = chunked(*x.args(), bf16_operands=bf16, mask_pack=build_mask_pack())
    for got, want in zip(masked, blocked, strict=True):
        assert rel_rms(got, want) < (1e-4 if bf16 else 1e-6)


def test_ill_conditioned_keys_bf16_doubling_breaks_so_neumann_inverts_in_fp32() -> None:
    # Near-collinear unit keys, β near 1, g = 0: A_ii ≈ strictly-lower ones, whose powers in the doubling reach
    # binomial sizes (C(15,7) ≈ 6e3) and must cancel. In float64 both algorithms are exact. A doubling inverse with
    # bf16 operands fails the cancellation — which is why the kernel, and this emulation, run
    # neumann's inverse in fp32; schur forms no powers and keeps bf16 operands.
    x = make_inputs(36, S=256, gate="zero", keys="collinear", beta_range=(0.97, 0.999))
    out_ref, _ = recurrent(*x.args())
    for algorithm in ALGORITHMS:
        out64, _ = chunked(*x.args(), algorithm=algorithm, compute_dtype=np.float64)
        assert_close(out64, out_ref, 1e-12, 1e-11, f"{algorithm} fp64 ill-conditioned")
    out32, _ = chunked(*x.args(), algorithm="neumann")
    assert rel_rms(out32, out_ref) < 1e-4  # measured ~2e-5: 6e3-sized intermediates × fp32's 6e-8
    f32 = x.astype(np.float32)
    for algorithm in ALGORITHMS:
        out_bf16, _ = chunked(*f32.args(), algorithm=algorithm, bf16_operands=True)
        assert rel_rms(out_bf16, out_ref) < 2e-2, algorithm

    key = f32.key[0, 0, :64].astype(np.float64)
    beta = f32.beta[0, 0, :64, None].astype(np.float64)
    system = np.tril(beta * (key @ key.T), -1)
    exact = np.linalg.inv(np.eye(64) + system)
    bf16_doubling = neumann_inverse(system.astype(np.float32), SUBBLOCK_NEUMANN, to_bf16_values)
    assert rel_rms(bf16_doubling, exact) > 0.1


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_extreme_gates_with_partial_chunk_stay_finite(algorithm: str) -> None:
    # FLA #792: T = 75, per-token g ≈ −31…−69 turned a padded tail into NaN through 0·inf.
    x = make_inputs(37, S=75, gate="extreme").astype(np.float32)
    out, state = chunked(*x.args(), algorithm=algorithm)
    out_ref, state_ref = recurrent(*x.args())
    assert_close(out, out_ref, 1e-5, 1e-5, "extreme out")
    assert_close(state, state_ref, 1e-5, 1e-5, "extreme state")


def test_bf16_inputs_and_inputs_untouched() -> None:
    x = make_inputs(38, S=130).astype(ml_dtypes.bfloat16)
    before = [a.copy() for a in (x.query, x.key, x.value, x.g_log, x.beta, x.initial_state)]
    out, state = chunked(*x.args(), bf16_operands=True)
    out_ref, _ = recurrent(*x.args())
    assert out.dtype == np.float32 and state.dtype == np.float32
    assert rel_rms(out, out_ref) < 2e-2
    for old, new in zip(before, (x.query, x.key, x.value, x.g_log, x.beta, x.initial_state), strict=True):
        assert old.tobytes() == new.tobytes()


def test_rejects_unknown_algorithm_and_dtype() -> None:
    x = make_inputs(39, S=16)
    with pytest.raises(ValueError, match="algorithm"):
        chunked(*x.args(), algorithm="cholesky")
    with pytest.raises(ValueError, match="compute_dtype"):
        chunked(*x.args(), compute_dtype=np.float16)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_slabs_and_threads_change_no_arithmetic(algorithm: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Lanes are independent: one slab per lane on two threads must equal one slab on one thread, bit for bit.
    module = sys.modules["gdn_ref.chunked"]
    x = make_inputs(40, B=2, Hk=2, Hv=4, S=200).astype(np.float32)
    monkeypatch.setattr(module, "_cpu_count", lambda: 1)
    monkeypatch.setattr(module, "SLAB_BYTES", 2**40)
    single = chunked(*x.args(), algorithm=algorithm)
    monkeypatch.setattr(module, "_cpu_count", lambda: 2)
    monkeypatch.setattr(module, "SLAB_BYTES", 1)
    threaded = chunked(*x.args(), algorithm=algorithm)
    for got, want in zip(threaded, single, strict=True):
        np.testing.assert_array_equal(got, want)
