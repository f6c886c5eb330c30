"""The schur mask pack: every constant mask the Schur-merge inverse consumes, built once on the host.

Building these planes on the device would cost an ``affine_select`` or iota compare per chunk on exactly the
engines the merge is bound by; from the host they cost one DMA.

Plane order (``mask_pack[p]``, each ``[chunk, chunk]`` float32, row i = receiving token, column j = source):

| plane | name | contents | consumed by |
|---|---|---|---|
| 0 | ``PLANE_UPPER_NEG`` | −1e9 where j > i, else 0 | added to the log-decay difference before ``exp`` so the upper triangle becomes exactly 0 |
| 1 | ``PLANE_TRIL_STRICT`` | 1 where j < i | masks A = β·(decay ∘ KKᵀ) to its strictly-lower part |
| 2 | ``PLANE_EYE`` | identity | seeds the inverse and PE transposes |
| 3 | ``PLANE_OFF0`` | 1 at (i, i−1) for odd i | level 0 of the merge: 2×2 blocks, ``Inv = I − A∘off0`` |
| 4..9 | ``off_neg_plane(level)``, level 1..6 | −1 on the lower-left h×h quadrant of every 2h×2h diagonal block, h = 2^level | level ``level`` of the merge: ``R = A∘plane`` (pre-negated), ``Inv += Inv·R·Inv`` |
"""

from __future__ import annotations

import numpy as np

from .constants import ALGORITHM_SCHUR, CHUNK

UPPER_NEG_FILL = -1e9  # exp(−1e9 + anything bounded) underflows to exactly 0 in fp32 and bf16

PLANE_UPPER_NEG = 0
PLANE_TRIL_STRICT = 1
PLANE_EYE = 2
PLANE_OFF0 = 3
FIRST_OFF_NEG_PLANE = 4
N_MERGE_LEVELS = 6  # levels 1..6 merge 2→4 … 64→128 at chunk 128
N_MASKS = FIRST_OFF_NEG_PLANE + N_MERGE_LEVELS
PLANE_NAMES = ("upper_neg", "tril_strict", "eye", "off0", *(f"off_neg_h{2**lv}" for lv in range(1, 7)))


def off_neg_plane(level: int) -> int:
    """Index of the pre-negated off-block plane used by merge ``level`` (1..6; half-block size 2**level)."""
    if not 1 <= level <= N_MERGE_LEVELS:
        raise ValueError(f"merge level must be in 1..{N_MERGE_LEVELS}, got {level}")
    return FIRST_OFF_NEG_PLANE + level - 1


def off_block_mask(chunk: int, half: int) -> np.ndarray:
    """0/1 mask of the lower-left ``half``×``half`` quadrant of every ``2·half`` diagonal block.

    Args:
        chunk (int): plane size (rows = cols = chunk); a multiple of ``2·half``.
        half (int): half-block size of the merge level.

    Returns:
        np.ndarray: [chunk, chunk] float32, 1 where row i and column j share a ``2·half`` block,
        i lies in its lower half and j in its upper half.
    """
    idx = np.arange(chunk)
    same_block = (idx[:, None] // (2 * half)) == (idx[None, :] // (2 * half))
    row_low = (idx[:, None] % (2 * half)) >= half
    col_high = (idx[None, :] % (2 * half)) < half
    return (same_block & row_low & col_high).astype(np.float32)


def build_mask_pack(chunk: int = CHUNK) -> np.ndarray:
    """Build the schur mask pack.

    Dimensions:
        N_MASKS: number of planes (10).
        chunk: plane size, a power of two with 2**(N_MERGE_LEVELS+1) == chunk for the kernel (128).

    Args:
        chunk (int): plane size; powers of two from 2 to 128 are accepted (planes past the chunk's own
            levels are all zero), so references can run smaller chunks.

    Returns:
        np.ndarray: [N_MASKS, chunk, chunk] float32, planes in the order of the module docstring.
    """
    if chunk < 2 or chunk > 128 or chunk & (chunk - 1):
        raise ValueError(f"chunk must be a power of two in [2, 128], got {chunk}")
    idx = np.arange(chunk)
    pack = np.zeros((N_MASKS, chunk, chunk), dtype=np.float32)
    pack[PLANE_UPPER_NEG] = np.where(idx[None, :] > idx[:, None], UPPER_NEG_FILL, 0.0)
    pack[PLANE_TRIL_STRICT] = idx[None, :] < idx[:, None]
    pack[PLANE_EYE] = np.eye(chunk, dtype=np.float32)
    pack[PLANE_OFF0] = off_block_mask(chunk, 1)
    for level in range(1, N_MERGE_LEVELS + 1):
        half = 2**level
        if 2 * half <= chunk:
            pack[off_neg_plane(level)] = -off_block_mask(chunk, half)
    return pack


def default_mask_pack(mask_pack: np.ndarray | None, algorithm: object) -> np.ndarray | None:
    """The caller's mask pack, or ``build_mask_pack()`` for schur when none was passed (the host entry points'
    default)."""
    if mask_pack is None and isinstance(algorithm, str) and algorithm == ALGORITHM_SCHUR:
        return build_mask_pack()
    return mask_pack
