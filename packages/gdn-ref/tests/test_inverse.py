"""Both triangular inverses against np.linalg.inv, and the mask-pack recipe against the plain block formula."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from gdn_ref import (
    N_MASKS,
    build_mask_pack,
    neumann_inverse,
    off_neg_plane,
    schur_inverse,
    schur_inverse_blocked,
    to_bf16_values,
)
from gdn_ref.inverse import diagonal_blocks
from ref_inputs import l2_normalize, make_inputs, rel_rms

INVERSES = {
    "schur_mask_pack": lambda A: schur_inverse(A, build_mask_pack(A.shape[-1])),
    "schur_blocked": schur_inverse_blocked,
    "neumann": neumann_inverse,
}


def system_matrix(seed: int, chunk: int, keys: str, n_chunks: int = 3) -> np.ndarray:
    """A = strictly_lower(diag(β) K Kᵀ) with g = 0 (no decay to damp it) and β near 1: the hard regime."""
    x = make_inputs(seed, Hk=1, Hv=1, S=n_chunks * chunk, Dk=32, keys=keys, beta_range=(0.97, 0.999))
    key = x.key[0, 0]
    if keys == "positive":  # FLA's rand-style keys: all in one orthant, highly correlated
        key = l2_normalize(np.random.default_rng(seed).random(key.shape))
    key = key.reshape(n_chunks, chunk, -1)
    beta = x.beta[0, 0].reshape(n_chunks, chunk)
    return np.tril(beta[..., None] * (key @ key.swapaxes(-1, -2)), -1)


@pytest.mark.parametrize("keys", ["collinear", "positive", "normal"])
@pytest.mark.parametrize("chunk", [128, 64])
@pytest.mark.parametrize("name", sorted(INVERSES))
def test_inverse_matches_linalg_in_float64(name: str, chunk: int, keys: str) -> None:
    A = system_matrix(11, chunk, keys)
    reference = np.linalg.inv(np.eye(chunk) + A)
    assert np.linalg.cond(np.eye(chunk) + A).max() > 5 or keys == "normal"  # the regime is not trivially benign
    inverse = INVERSES[name](A)
    assert inverse.dtype == np.float64
    error = np.max(np.abs(inverse - reference)) / np.max(np.abs(reference))
    # Neumann's powers of a collinear 16×16 block reach binomial sizes (C(15,7) ≈ 6e3) and cancel: ~1e-12 here.
    assert error < 1e-10, f"{name} C={chunk} {keys}: max error {error:.2e}"
    np.testing.assert_allclose(np.diagonal(inverse, axis1=-2, axis2=-1), 1.0, atol=1e-12)
    assert np.all(np.triu(inverse, 1) == 0)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_mask_pack_recipe_equals_plain_block_formula(dtype) -> None:
    # Both evaluate [[P⁻¹,0],[−Q⁻¹A₂₁P⁻¹,Q⁻¹]] level by level; the masked form only adds exact zeros.
    A = system_matrix(12, 128, "positive").astype(dtype)
    masked = schur_inverse(A, build_mask_pack(128))
    blocked = schur_inverse_blocked(A)
    tol = 1e-14 if dtype == np.float64 else 1e-6
    np.testing.assert_allclose(masked, blocked, rtol=0, atol=tol)


def test_mask_pack_recipe_equals_block_formula_with_bf16_operands() -> None:
    A = system_matrix(13, 128, "normal").astype(np.float32)
    masked = schur_inverse(A, build_mask_pack(128), to_bf16_values)
    blocked = schur_inverse_blocked(A, to_bf16_values)
    # Same rounded operands; only fp32 summation order may differ, which can flip a rare bf16 rounding.
    assert rel_rms(masked, blocked) < 1e-4


def test_block_formula_written_out_by_hand() -> None:
    # inv([[P,0],[R,Q]]) = [[P⁻¹,0],[−Q⁻¹RP⁻¹,Q⁻¹]] for one 2h = 128 merge, built from np.linalg.inv blocks.
    A = system_matrix(14, 128, "collinear", n_chunks=1)[0]
    M = np.eye(128) + A
    P, R, Q = M[:64, :64], M[64:, :64], M[64:, 64:]
    P_inv, Q_inv = np.linalg.inv(P), np.linalg.inv(Q)
    expected = np.block([[P_inv, np.zeros((64, 64))], [-Q_inv @ R @ P_inv, Q_inv]])
    np.testing.assert_allclose(schur_inverse(A, build_mask_pack(128)), expected, atol=1e-12)


def test_schur_inverse_is_driven_by_the_mask_pack() -> None:
    A = system_matrix(15, 128, "normal", n_chunks=1)
    pack = build_mask_pack(128)
    good = schur_inverse(A, pack)
    broken = pack.copy()
    broken[off_neg_plane(3)] = 0  # drop the level that merges 8-blocks into 16-blocks
    assert np.max(np.abs(schur_inverse(A, broken) - good)) > 1e-3
    assert pack.shape == (N_MASKS, 128, 128)


def test_inverses_accept_a_smaller_chunk_and_any_leading_dims() -> None:
    A = system_matrix(16, 32, "normal", n_chunks=6).reshape(2, 3, 32, 32)
    reference = np.linalg.inv(np.eye(32) + A)
    for name, inverse in INVERSES.items():
        np.testing.assert_allclose(inverse(A), reference, atol=1e-12, err_msg=name)


def test_doubling_needs_exactly_log2_subblock_rounds() -> None:
    # With 16-row sub-blocks, four doubling rounds sum P⁰..P¹⁵ = the exact inverse; an 8-row sub-block is also
    # exact (3 rounds), so the sub-block size changes nothing but the rounding.
    A = system_matrix(17, 64, "normal")
    np.testing.assert_allclose(neumann_inverse(A, 16), neumann_inverse(A, 8), atol=1e-12)
    with pytest.raises(ValueError, match="multiple"):
        neumann_inverse(A, 48)


def test_diagonal_blocks_is_a_writable_view() -> None:
    x = np.zeros((2, 8, 8))
    diagonal_blocks(x, 4)[:, 1] = 1.0
    assert x[:, 4:, 4:].min() == 1.0 and x[:, :4].sum() == 0 and x[:, 4:, :4].sum() == 0


def test_bf16_rounding_matches_ml_dtypes() -> None:
    rng = np.random.default_rng(18)
    x = np.concatenate(
        [
            rng.standard_normal(10_000).astype(np.float32) * 10.0 ** rng.integers(-30, 30, 10_000),
            np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3.4e38, 1e-45, 1.00390625, 1.01171875], np.float32),
        ]
    )
    expected = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(to_bf16_values(x), expected)  # NaN == NaN for assert_array_equal
    assert to_bf16_values(x.astype(np.float64)).dtype == np.float64
