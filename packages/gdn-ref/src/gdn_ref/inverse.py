"""The two intra-chunk triangular inverses, (I + A)^{-1} for strictly-lower A, over batched [..., C, C] stacks.

Both take an optional operand rounding hook (``round_operand``, see :mod:`gdn_ref.rounding`) applied to every
matmul operand, so a float32 run with the bf16 hook reproduces the kernel's "bf16 operands, fp32 accumulation".
"""

from __future__ import annotations

import numpy as np

from .constants import SUBBLOCK_NEUMANN
from .masks import PLANE_EYE, PLANE_OFF0, off_neg_plane
from .rounding import RoundFn, keep


def _log2_exact(n: int, what: str) -> int:
    if n < 1 or n & (n - 1):
        raise ValueError(f"{what} must be a power of two, got {n}")
    return n.bit_length() - 1


def diagonal_blocks(x: np.ndarray, size: int) -> np.ndarray:
    """View of the ``size``×``size`` diagonal blocks of a stack of square matrices (writable if x is).

    Args:
        x (np.ndarray): [..., C, C] with C a multiple of ``size``; its last two axes must be C-contiguous.
        size (int): block size.

    Returns:
        np.ndarray: [..., C // size, size, size] view: block b is x[..., b·size:(b+1)·size, same range].
    """
    C = x.shape[-1]
    if C % size:
        raise ValueError(f"matrix size {C} is not a multiple of block size {size}")
    if x.strides[-1] != x.itemsize or x.strides[-2] != C * x.itemsize:
        raise ValueError("diagonal_blocks needs matrices whose last two axes are C-contiguous")
    row, col = x.strides[-2:]
    # Block b starts b·size rows down and b·size columns right: one stride of size·(row + col).
    return np.lib.stride_tricks.as_strided(
        x,
        shape=(*x.shape[:-2], C // size, size, size),
        strides=(*x.strides[:-2], size * (row + col), row, col),
        writeable=x.flags.writeable,
    )


def _zeroed_output(A: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """A zero-filled result array: ``out`` (checked) when given, else a new one like A."""
    if out is None:
        return np.zeros_like(A)
    if out.shape != A.shape or out.dtype != A.dtype or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous {A.shape} {A.dtype}, got {out.shape} {out.dtype}")
    out.fill(0)
    return out


def schur_inverse(A: np.ndarray, mask_pack: np.ndarray, round_operand: RoundFn = keep) -> np.ndarray:
    """(I + A)^{-1} by the recursive Schur-complement block merge, driven by the mask pack as the kernel is.

    Dimensions:
        C: chunk length, a power of two equal to the mask pack's plane size (128 for the kernel).

    Args:
        A (np.ndarray): [..., C, C] strictly lower triangular, float32 or float64.
        mask_pack (np.ndarray): [N_MASKS, C, C] from ``build_mask_pack(C)``.
        round_operand (RoundFn): applied to every matmul operand (bf16 emulation); identity by default.

    Returns:
        np.ndarray: [..., C, C] the unit lower-triangular inverse, in A's dtype.

    Notes:
        Level 0 makes 2×2 blocks elementwise: ``Inv = I − A∘off0``. Level l = 1..log2(C)−1 merges blocks of
        h = 2^l into 2h: ``R = A∘off_neg_plane(l)`` (the plane is pre-negated, so R = −A on the lower-left h×h
        quadrant of every 2h block), then ``Inv ← Inv + (Inv·R)·Inv``. Why that is the block formula: Inv is
        block-diagonal with h-blocks, so on one 2h block Inv = diag(P⁻¹, Q⁻¹) and R = [[0, 0], [−A₂₁, 0]],
        giving Inv·R·Inv = [[0, 0], [−Q⁻¹A₂₁P⁻¹, 0]]. Adding it yields [[P⁻¹, 0], [−Q⁻¹A₂₁P⁻¹, Q⁻¹]], which is
        inv([[P, 0], [A₂₁, Q]]). Blocks never mix: R has no entries outside the 2h diagonal blocks. No power
        of A is formed, so nothing depends on A being small. Each level costs two full C×C products, most of
        them multiplying zeros; :func:`schur_inverse_blocked` computes only the nonzero blocks.
    """
    C = A.shape[-1]
    levels = _log2_exact(C, "chunk")
    if mask_pack.shape[-2:] != (C, C):
        raise ValueError(f"mask_pack planes are {mask_pack.shape[-2:]}, expected ({C}, {C}); use build_mask_pack({C})")
    planes = mask_pack.astype(A.dtype)
    inverse = planes[PLANE_EYE] - A * planes[PLANE_OFF0]
    for level in range(1, levels):
        off_neg = round_operand(A * planes[off_neg_plane(level)])
        inverse_op = round_operand(inverse)
        inverse = inverse + round_operand(inverse_op @ off_neg) @ inverse_op
    return inverse


def schur_inverse_blocked(A: np.ndarray, round_operand: RoundFn = keep, *, out: np.ndarray | None = None) -> np.ndarray:
    """The same Schur merge as :func:`schur_inverse`, computing only the nonzero blocks.

    Dimensions:
        C: chunk length, a power of two.

    Args:
        A (np.ndarray): [..., C, C] strictly lower triangular, float32 or float64.
        round_operand (RoundFn): applied to every matmul operand, in the same places as in ``schur_inverse``.
        out (np.ndarray | None): C-contiguous [..., C, C] array of A's dtype to write the result into.

    Returns:
        np.ndarray: [..., C, C] the unit lower-triangular inverse, in A's dtype.

    Notes:
        Works in place on the dense result through views of its diagonal blocks: merging two h-blocks only
        fills the lower-left quadrant of their 2h-block with −Q⁻¹A₂₁P⁻¹, evaluated in the kernel's order ((Q⁻¹·(−A₂₁))·P⁻¹) with the same operand
        rounding. The skipped products are exact zeros, so it agrees with the masked form up to the order of
        fp32 summation; it costs C·h² multiply-adds per level instead of 2C³.
    """
    C = A.shape[-1]
    _log2_exact(C, "chunk")
    A = np.ascontiguousarray(A)
    inverse = _zeroed_output(A, out)
    diagonal_blocks(inverse, 1)[..., 0, 0] = 1
    if C > 1:  # level 0, elementwise: the inverse of [[1, 0], [a, 1]] is [[1, 0], [−a, 1]]
        diagonal_blocks(inverse, 2)[..., 1, 0] = -diagonal_blocks(A, 2)[..., 1, 0]
    half = 2
    while half < C:  # merge h-blocks into 2h-blocks in place: only the lower-left quadrant is new
        merged, coupling = diagonal_blocks(inverse, 2 * half), diagonal_blocks(A, 2 * half)[..., half:, :half]
        mid = round_operand(round_operand(merged[..., half:, half:]) @ round_operand(-coupling))
        merged[..., half:, :half] = mid @ round_operand(merged[..., :half, :half])
        half *= 2
    return inverse


def _doubling_inverse(A_diag: np.ndarray, round_operand: RoundFn) -> np.ndarray:
    """(I + A)^{-1} of small strictly-lower blocks by recursive doubling of the Neumann series.

    With P = −A (nilpotent: P^n = 0 for n×n), Σ_{j<n} P^j = (I − P)^{-1} = (I + A)^{-1} exactly. Round r turns
    M = Σ_{j<2^r} P^j into Σ_{j<2^{r+1}} P^j via M ← M + P·M, then squares P; log2(n) rounds suffice.
    """
    n = A_diag.shape[-1]
    rounds = _log2_exact(n, "subblock")
    power = -A_diag
    series = np.broadcast_to(np.eye(n, dtype=A_diag.dtype), A_diag.shape).copy()
    for r in range(rounds):
        power_op = round_operand(power)
        series = series + power_op @ round_operand(series)
        if r + 1 < rounds:  # the last square would be P^n = 0
            power = power_op @ power_op
    return series


def neumann_inverse(
    A: np.ndarray, subblock: int = SUBBLOCK_NEUMANN, round_operand: RoundFn = keep, *, out: np.ndarray | None = None
) -> np.ndarray:
    """(I + A)^{-1} by recursive doubling on diagonal sub-blocks joined by block forward substitution.

    Dimensions:
        C: chunk length, a multiple of ``subblock`` (64 for the kernel: four 16-row sub-blocks).

    Args:
        A (np.ndarray): [..., C, C] strictly lower triangular, float32 or float64.
        subblock (int): rows per diagonal sub-block, a power of two (16 for the kernel: log2(16) = 4 rounds).
        round_operand (RoundFn): applied to every matmul operand (bf16 emulation); identity by default.
        out (np.ndarray | None): C-contiguous [..., C, C] array of A's dtype to write the result into.

    Returns:
        np.ndarray: [..., C, C] the unit lower-triangular inverse, in A's dtype.

    Notes:
        Diagonal blocks: X_ii = (I + A_ii)^{-1} by doubling (powers of a 16×16 block stay moderate, unlike
        powers of the whole chunk). Off-diagonal blocks, row block by row block:
        X_ij = −X_ii · Σ_{m=j}^{i−1} A_im X_mj, which only needs rows of X already finished.
    """
    C = A.shape[-1]
    if C % subblock:
        raise ValueError(f"chunk {C} is not a multiple of subblock {subblock}")
    n = C // subblock
    A = np.ascontiguousarray(A)
    inverse = _zeroed_output(A, out)
    diag_inv = diagonal_blocks(inverse, subblock)
    diag_inv[...] = _doubling_inverse(diagonal_blocks(A, subblock), round_operand)
    # grid[..., i, :, j, :] is sub-block (i, j)
    grid_x = inverse.reshape(*A.shape[:-2], n, subblock, n, subblock)
    grid_a = A.reshape(grid_x.shape)
    for i in range(1, n):
        x_ii = round_operand(diag_inv[..., i, :, :])
        for j in range(i):
            coupled = sum(
                round_operand(grid_a[..., i, :, m, :]) @ round_operand(grid_x[..., m, :, j, :]) for m in range(j, i)
            )
            grid_x[..., i, :, j, :] = -(x_ii @ round_operand(coupled))
    return inverse
