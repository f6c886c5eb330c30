"""The schur intra-chunk inverse: (I + A)⁻¹ by recursive Schur-complement block merge, level-major over a group.

For a lower block-triangular matrix, inv([[P, 0], [R, Q]]) = [[P⁻¹, 0], [−Q⁻¹ R P⁻¹, Q⁻¹]]. With ``Inv`` holding
the block-diagonal inverses of the current block size, the merged inverse is ``Inv + Inv·R̃·Inv`` where
``R̃ = A ∘ (−off)`` keeps A's off-diagonal quadrant of every merged block, pre-negated (mask pack planes 4..9).
Level 0 (2×2 blocks) is elementwise: ``Inv = I − A ∘ off0``. Levels 1..6 double the block size to 128.

No power of A is ever formed, so nothing here depends on A being small. Each level's ``(Inv R̃ Inv)ᵀ`` is one fp32
matmul, added from PSUM to the previous Invᵀ (``_merge``); as the two terms never overlap, every element of Invᵀ is
one fp32 value rounded once into the operand dtype — the bits an fp32 accumulator over all levels would give.

Every level runs over all chunks of the group before the next level starts (level-major): each step issues
``group_size`` independent same-kind instructions, which hides each instruction's dependency latency behind its
siblings. Do not fold this back into a per-chunk loop.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gdn_ref.masks import N_MERGE_LEVELS, PLANE_OFF0, off_neg_plane

from . import tiles
from .backend import nisa, nl
from .stages import Chunk, Constants
from .tiles import FP32

CHUNK = 128


def load_merge_planes(mask_pack: Any, consts: Constants, dtype: Any) -> None:
    """Load the level-0 plane, and the pre-negated off-block planes TRANSPOSED (see ``_off_block_product``),
    into ``consts.planes`` (fp32: they multiply an fp32 PSUM product)."""
    consts.planes["off0"] = nl.load(mask_pack[PLANE_OFF0, :, :], dtype=dtype)
    for level in range(1, N_MERGE_LEVELS + 1):
        plane_t = tiles.sbuf((CHUNK, CHUNK), FP32)
        nisa.dma_transpose(dst=plane_t, src=mask_pack[off_neg_plane(level), :, :])
        consts.planes[level] = plane_t


def invert_group(chunks: list[Chunk], consts: Constants, dtype: Any) -> Iterator[None]:
    """Set ``chunk.inverse_t = ((I + A)⁻¹)ᵀ`` for every chunk of the group, level-major; yields per level."""
    level0 = [_level0(chunk.a, consts, dtype) for chunk in chunks]
    inverse = [inv for inv, _ in level0]
    inverse_t = [tiles.evacuate(acc, dtype) for _, acc in level0]
    del level0  # its PSUM tiles are dead once evacuated; held, they would stay live through every level
    yield
    for level in range(1, N_MERGE_LEVELS + 1):
        plane_t = consts.planes[level]
        mid = [
            _off_block_product(chunk.a, plane_t, inv_t, dtype) for chunk, inv_t in zip(chunks, inverse_t, strict=True)
        ]
        products = [tiles.matmul(inv, m) for inv, m in zip(inverse, mid, strict=True)]  # (Inv R̃ Inv)ᵀ
        inverse_t = [_merge(inv_t, product, dtype) for inv_t, product in zip(inverse_t, products, strict=True)]
        del products  # free their PSUM before the transposes allocate theirs
        if level < N_MERGE_LEVELS:
            inverse = [tiles.evacuate(tiles.transpose(t), dtype) for t in inverse_t]
        yield
    for chunk, inv_t in zip(chunks, inverse_t, strict=True):
        chunk.inverse_t = inv_t


def _merge(inverse_t: Any, product: Any, dtype: Any) -> Any:
    """The merged Invᵀ = Invᵀ + (Inv R̃ Inv)ᵀ into a new tile of ``dtype``: the fp32 product, read from PSUM, plus
    the previous level's Invᵀ.

    The two terms never overlap: Inv is block-diagonal with this level's half-blocks and the product lives only in
    the off quadrant of each merged block, where Inv is zero (and the product is exactly zero elsewhere: its sums
    run over the masked zeros of R̃). So each element of the sum is one term plus an exact zero, and adding the
    fp32 product to an Invᵀ already rounded to ``dtype`` gives the bits of summing every level in fp32 and rounding
    once. That is what lets each level's product be one matmul into a fresh PSUM tile: an fp32 PSUM accumulator
    per chunk over all levels would hold one matmul accumulation group open per chunk for the whole inverse — 16 at
    once with two units in preparation, where TensorE has 8, one per PSUM bank (docs/nki-sources.md §4.2).
    """
    return tiles.combine(tiles.sbuf(tuple(inverse_t.shape), dtype), product, inverse_t, nl.add)


def _off_block_product(a: Any, plane_t: Any, inverse_t: Any, dtype: Any) -> Any:
    """(Inv R̃)ᵀ = R̃ᵀ Invᵀ with R̃ = A ∘ (−off), as an SBUF tile of ``dtype``.

    Computed as (Aᵀ Invᵀ) ∘ (−off)ᵀ: the mask is applied to the product, on its PSUM evacuation, instead of to A.
    Exact, because Inv is block-diagonal with the half-blocks of this level: entry [j, m] of Aᵀ Invᵀ sums
    A[i, j] Inv[m, i] over i in m's half-block only, so where (−off)ᵀ keeps [j, m] (j in the upper, m in the lower
    half of one merged block) the sum covers exactly A's off quadrant, and elsewhere it is discarded. This saves
    masking A at every level; A's upper part only ever lands in discarded entries.
    """
    return tiles.multiply(tiles.matmul(a, inverse_t), plane_t, dtype)


def _level0(a: Any, consts: Constants, dtype: Any) -> tuple[Any, Any]:
    """Inverse of every 2×2 diagonal block, I − A ∘ off0, and its transpose in an fp32 PSUM tile."""
    inverse = tiles.sbuf(tuple(a.shape), dtype)
    tiles.combine(inverse, consts.eye, tiles.multiply(a, consts.planes["off0"], dtype), nl.subtract)
    return inverse, tiles.matmul(inverse, consts.eye)
