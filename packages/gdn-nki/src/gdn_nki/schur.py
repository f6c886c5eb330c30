"""The schur intra-chunk inverse: (I + A)⁻¹ by recursive Schur-complement block merge, level-major over a group.

For a lower block-triangular matrix, inv([[P, 0], [R, Q]]) = [[P⁻¹, 0], [−Q⁻¹ R P⁻¹, Q⁻¹]]. With ``Inv`` holding
the block-diagonal inverses of the current block size h, the merged inverse (blocks 2h) is ``Inv + Inv·R̃·Inv``
where ``R̃ = A ∘ (−off)`` keeps A's lower-left h×h quadrant of every merged block, negated (mask pack planes
4..9). Level 0 (2×2 blocks) is ``Inv = I − A ∘ off0`` (with bf16 operands made straight into the compact tiles,
see below). Levels 1..6 double the block size to 128. The
kernel carries ``Invᵀ`` (the transposed orientation the later stages multiply with).

Block-sparse levels. Everything a level computes lives inside its merged blocks, and the product ``Inv·R̃·Inv`` only
in their off quadrants, so no level needs the whole 128×128 tensor-engine array:

- Levels 1..4 (merged blocks of 4..32) work on the four diagonal 32×32 blocks only. Their tiles are *compact*:
  [C, 32] per chunk, row p holding the 32 columns of p's own diagonal block (``compact[p, f] = full[p, 32·(p//32)
  + f]``), and ``BATCH`` chunks share one [C, BATCH, 32] tile, so one elementwise instruction serves them all.
  Each matmul is four 32×32×32 matmuls on the four disjoint diagonal PE tiles (``nc_matmul`` tiling mode,
  ``tile_position`` / ``tile_size``: ISA ``nki.isa.nc_matmul``, "Tiling mode", v2.33.0), which the tensor engine
  runs side by side; the elementwise work streams 32 elements per partition instead of 128.
- Levels 5 and 6 compute only the off quadrant: ``(Inv R̃ Inv)ᵀ`` restricted to it is ``Inv_upᵀ · (−A_lowᵀ
  Invᵀ_low)``, two 32×32 blocks (level 5) or one 64×64 block (level 6), contracting only the h rows that are
  nonzero — no mask, the contraction itself selects A's off quadrant. Level 5 writes the two 64-blocks of the
  full ``Invᵀ`` tile (the diagonal 32-blocks transposed into place by the same products, ``_level5``), level 6
  its upper-right 64-block; the lower-left one stays zero.

- With bf16 operands the compact levels carry ``Inv`` beside ``Invᵀ``: ``Inv R̃ Inv = (Inv R̃)·Inv`` is one more
  matmul from the same ``mid = (Inv R̃)ᵀ`` that gives ``(Inv R̃ Inv)ᵀ = Invᵀ·mid``, merged into the compact ``Inv``
  like its transpose, so a level never waits on a transpose of the previous level's ``Invᵀ`` (one tensor ->
  elementwise round trip less per level; fp32 keeps the transposes, its extra products cost more than they save).
  Level 0 then makes both compact orientations straight from ``A ∘ (−off0)``: identity matmuls of its diagonal
  blocks (one of them transposing), the identity added on their evacuations — no full-tile inverse, no subtract.

Precision: every element of ``Invᵀ`` is one fp32 PSUM value rounded once into the operand dtype, as before —
the compact levels add the fp32 product to the previous ``Invᵀ`` where the two never overlap (one term is an
exact zero), and the off-quadrant blocks are new entries. The carried ``Inv`` is rounded the same way from the same
products summed in the other orientation, so it may differ from the transpose of ``Invᵀ`` in the last bit.

Every level runs over all chunks of the group before the next level starts (level-major): each step issues
``group_size`` independent same-kind instructions, which hides each instruction's dependency latency behind its
siblings. Do not fold this back into a per-chunk loop.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gdn_ref.masks import PLANE_EYE, PLANE_OFF0, off_neg_plane

from . import tiles
from .backend import nisa, nl
from .stages import Chunk, Constants
from .tiles import FP32

CHUNK = 128
QUAD = 32  # the smallest PE tile (4×32 rows/columns from NeuronCore-v3) and the compact tiles' width
N_QUADS = CHUNK // QUAD
COMPACT_LEVELS = range(1, 5)
# Chunks per batch-compact tile: one elementwise instruction of 32·BATCH elements per partition instead of BATCH
# MIN_II-bound ones of 32. Measured (one lane, bf16): 2 is best — larger batches make each level's elementwise step
# wait for more matmuls (S=2048: 49.5 µs at 1, 48.9 at 2, 51.1 at 4, 53.1 at 8).
BATCH = 2


def load_merge_planes(mask_pack: Any, consts: Constants, dtype: Any, group_size: int) -> Iterator[None]:
    """Load the level-0 plane, and the compact levels' pre-negated off-block planes TRANSPOSED (see
    ``_off_block_product``) as compact [C, 32] tiles, into ``consts.planes`` (fp32: they multiply an fp32 PSUM
    product; a batch reads one through a stride-0 view repeating it per chunk). Each diagonal 32×32 block of a
    plane is DMA-transposed into its rows. Then (after one yield: ``lanes.LaneInputs.deferred_loads``) the on-chip
    work: the negated level-0 plane and the ``group_size`` assembly tiles of level 5 (``_level5``), one per chunk
    position of a unit, each the identity until level 5 writes its two off blocks."""
    consts.planes["off0"] = nl.load(mask_pack[PLANE_OFF0, :, :], dtype=dtype)
    if dtype != FP32:  # the compact level 0 (``invert_group``) adds A ∘ (−off0) to the identity
        eye_compact = tiles.sbuf((CHUNK, QUAD), FP32)
        for q in range(N_QUADS):
            nisa.dma_copy(dst=eye_compact[_quad(q), :], src=mask_pack[PLANE_EYE, _quad(q), _quad(q)])
        consts.planes["eye_compact"] = eye_compact
    for level in COMPACT_LEVELS:
        plane_t = tiles.sbuf((CHUNK, QUAD), FP32)
        for q in range(N_QUADS):
            block = _quad(q)
            nisa.dma_transpose(dst=plane_t[block, :], src=mask_pack[off_neg_plane(level), block, block])
        consts.planes[level] = plane_t
    yield
    if dtype != FP32:
        consts.planes["off0_neg"] = tiles.copy_to(tiles.sbuf((CHUNK, CHUNK), dtype), consts.planes["off0"], -1.0)
    consts.planes["assembly"] = [
        tiles.copy_to(tiles.sbuf((CHUNK, CHUNK), dtype), consts.eye) for _ in range(group_size)
    ]


def invert_group(chunks: list[Chunk], consts: Constants, dtype: Any) -> Iterator[None]:
    """Set ``chunk.inverse_t = ((I + A)⁻¹)ᵀ`` for every chunk of the group, level-major; yields per step (two per
    compact level).

    Within a level each step runs over all batches of ``BATCH`` chunks before the next step (its PE instructions,
    then its elementwise ones), so no engine's queue holds an instruction that waits on the step just before it for
    the same batch.
    """
    a_list = [chunk.a for chunk in chunks]
    batches = [slice(i, i + BATCH) for i in range(0, len(a_list), BATCH)]
    both = dtype != FP32  # carry Inv beside Invᵀ (see below); with fp32 operands its products cost more than the
    if both:  # transposes they replace (measured: fp32 S=2048 77.8 -> 78.5 µs), so fp32 transposes each level
        # Level 0 straight into the compact tiles: I + (A ∘ (−off0)) summed by the tensor engine (exact: the two
        # terms never overlap), each orientation beside the other; no full-tile inverse and no subtract.
        off0 = [tiles.multiply(a, consts.planes["off0_neg"], dtype) for a in a_list]
        blocks = [[m[_quad(q), _quad(q)] for q in range(N_QUADS)] for m in off0]
        inverse_t = [_identity_plus(blocks[b], consts, dtype, transpose=True) for b in batches]
        compact = [_identity_plus(blocks[b], consts, dtype, transpose=False) for b in batches]
        inverse = [_blocks(x) for x in compact]
    else:
        inverse_full = [_level0(a, consts, dtype) for a in a_list]  # level 0: full tiles; then batch-compact
        full_blocks = [[inv[_quad(q), _quad(q)] for q in range(N_QUADS)] for inv in inverse_full]
        inverse_t = [_group_transpose(full_blocks[b], consts.eye, dtype) for b in batches]
        inverse = [full_blocks[b] for b in batches]
    yield
    for level in COMPACT_LEVELS:
        plane = consts.planes[level]
        mid = [
            _off_block_product(a_list[b], plane.expand_dim(1).broadcast(1, len(a_list[b])), inv_t, dtype)
            for b, inv_t in zip(batches, inverse_t, strict=True)
        ]
        # A step of its own: the chain's tensor-engine work, issued between the two, fills the wait for the masks
        # (measured, one lane bf16: S = 8192 146.1 -> 144.5 µs)
        yield
        products = [_diagonal_product(inv, m) for inv, m in zip(inverse, mid, strict=True)]  # (Inv R̃ Inv)ᵀ
        inverse_t = [_merge(inv_t, p, dtype) for inv_t, p in zip(inverse_t, products, strict=True)]
        if both:
            # Inv R̃ Inv = (Inv R̃)·Inv from the same mid, merged into the compact Inv: the next level's Inv without
            # waiting on a transpose of this level's Invᵀ (one PE -> elementwise round trip less per level).
            products = [_diagonal_product(_blocks(m), x) for x, m in zip(compact, mid, strict=True)]
            compact = [_merge(x, p, dtype) for x, p in zip(compact, products, strict=True)]
        del products  # free their PSUM before the transposes allocate theirs
        if not both:
            compact = [_group_transpose(_blocks(inv_t), consts.eye, dtype) for inv_t in inverse_t]
        inverse = [_blocks(x) for x in compact]
        yield
    inverse = [x[:, c, :] for x in compact for c in range(x.shape[1])]
    inverse_t = [x[:, c, :] for x in inverse_t for c in range(x.shape[1])]
    full_t = [chunk.slot.inverse_t for chunk in chunks]
    for step in _level5(a_list, inverse, inverse_t, full_t, consts.planes["assembly"]):
        yield step
    for step in _level6(a_list, full_t, consts.eye, dtype):
        yield step
    for chunk, inv_t in zip(chunks, full_t, strict=True):
        chunk.inverse_t = inv_t


def _quad(q: int, size: int = QUAD) -> slice:
    return slice(q * size, (q + 1) * size)


def _blocks(group: Any) -> list[list[Any]]:
    """The diagonal 32×32 blocks of every chunk of a batch-compact [C, n, 32] tile: ``[chunk][quadrant]``."""
    return [[group[_quad(q), c, :] for q in range(N_QUADS)] for c in range(group.shape[1])]


def _tile_matmul(dst: Any, stationary: Any, moving: Any, row: int, col: int, transpose: bool = False) -> None:
    """``dst = stationaryᵀ · moving`` on the PE tile at (``row``, ``col``) sized to the stationary (K × M)."""
    k, m = stationary.shape
    nisa.nc_matmul(
        dst=dst,
        stationary=stationary,
        moving=moving,
        is_transpose=transpose,
        tile_position=(row, col),
        tile_size=(k, m),
    )


def _group_transpose(blocks: list[list[Any]], eye: Any, dtype: Any) -> Any:
    """Each chunk's diagonal 32×32 blocks transposed, as a batch-compact [C, n, 32] tile of ``dtype``: four PE
    transposes per chunk on the four diagonal tiles (bit-exact) and one evacuation for the whole batch."""
    out = tiles.psum((CHUNK, len(blocks), QUAD), blocks[0][0].dtype)
    for c, chunk_blocks in enumerate(blocks):
        for q, block in enumerate(chunk_blocks):
            eye_q = eye[_quad(q), _quad(q)]
            _tile_matmul(out[_quad(q), c, :], block, eye_q, q * QUAD, q * QUAD, transpose=True)
    return tiles.evacuate(out, dtype)


def _identity_plus(blocks: list[list[Any]], consts: Constants, dtype: Any, transpose: bool) -> Any:
    """I + each chunk's diagonal 32×32 blocks (transposed when ``transpose``), as a batch-compact [C, n, 32] tile of
    ``dtype``: identity matmuls on the four diagonal PE tiles (exact), the identity added on the evacuation (exact:
    the blocks' diagonals are zero)."""
    out = tiles.psum((CHUNK, len(blocks), QUAD))
    eye = consts.eye
    for c, chunk_blocks in enumerate(blocks):
        for q, block in enumerate(chunk_blocks):
            eye_q, dst, at = eye[_quad(q), _quad(q)], out[_quad(q), c, :], q * QUAD
            if transpose:
                _tile_matmul(dst, block, eye_q, at, at)
            else:
                _tile_matmul(dst, eye_q, block, at, at)
    identity = consts.planes["eye_compact"].expand_dim(1).broadcast(1, len(blocks))
    return tiles.combine(tiles.sbuf((CHUNK, len(blocks), QUAD), dtype), out, identity, nl.add)


def _level0(a: Any, consts: Constants, dtype: Any) -> Any:
    """Inverse of every 2×2 diagonal block, I − A ∘ off0, as a full tile."""
    inverse = tiles.sbuf(tuple(a.shape), dtype)
    return tiles.combine(inverse, consts.eye, tiles.multiply(a, consts.planes["off0"], dtype), nl.subtract)


def _diagonal_product(inverse: list[list[Any]], mid: Any) -> Any:
    """``Invᵀ · mid`` on every chunk's diagonal 32×32 blocks (``inverse[chunk][quadrant]``), into batch-compact
    PSUM."""
    product = tiles.psum(tuple(mid.shape))
    for c, chunk_blocks in enumerate(inverse):
        for q, block in enumerate(chunk_blocks):
            _tile_matmul(product[_quad(q), c, :], block, mid[_quad(q), c, :], q * QUAD, q * QUAD)
    return product


def _merge(inverse_t: Any, product: Any, dtype: Any) -> Any:
    """The merged batch-compact ``Invᵀ`` = ``Invᵀ + (Inv R̃ Inv)ᵀ`` into a new tile of ``dtype``.

    The fp32 product, read from PSUM, is added to the previous ``Invᵀ`` into a new tile of ``dtype``. The two
    terms never overlap (``Inv`` is block-diagonal with this level's half-blocks, the product lives only in the
    off quadrant of each merged block, and it is exactly zero elsewhere: its sums run over the masked zeros of
    R̃), so each element of the sum is one term plus an exact zero — the bits of summing every level in fp32 and
    rounding once. That is what lets each level's product be a matmul into a fresh PSUM tile: an fp32 PSUM
    accumulator per chunk over all levels would hold one matmul accumulation group open per chunk for the whole
    inverse — 16 at once with two units in preparation, where TensorE has 8, one per PSUM bank
    (docs/nki-sources.md §4.2).
    """
    return tiles.combine(tiles.sbuf(tuple(inverse_t.shape), dtype), product, inverse_t, nl.add)


def _off_block_product(a_list: list[Any], plane_t: Any, inverse_t: Any, dtype: Any) -> Any:
    """(Inv R̃)ᵀ = R̃ᵀ Invᵀ with R̃ = A ∘ (−off) on the diagonal 32×32 blocks of every chunk, as a batch-compact
    [C, n, 32] tile of ``dtype`` (one mask multiply for the whole batch).

    Computed as (Aᵀ Invᵀ) ∘ (−off)ᵀ: the mask is applied to the product, on its PSUM evacuation, instead of to A.
    Exact, because Inv is block-diagonal with the half-blocks of this level: entry [j, m] of Aᵀ Invᵀ sums
    A[i, j] Inv[m, i] over i in m's half-block only, so where (−off)ᵀ keeps [j, m] (j in the upper, m in the lower
    half of one merged block) the sum covers exactly A's off quadrant, and elsewhere it is discarded. This saves
    masking A at every level; A's upper part only ever lands in discarded entries.

    The multiply runs on the vector engine straight from PSUM, never staged (a scalar-engine evacuation, then
    GpSimd's multiply) as the balancer may prefer when the vector engine is busy: it sits on each level's critical
    path, where a second instruction costs one more dependency latency (measured, one lane bf16 schur: S = 2048
    45.0 -> 44.5 µs, S = 8192 151.5 -> 148.4 µs; forcing the merges onto the vector engine too was slower, 149.4).
    """
    product = tiles.psum(tuple(inverse_t.shape))
    for c, a in enumerate(a_list):
        for q in range(N_QUADS):
            _tile_matmul(product[_quad(q), c, :], a[_quad(q), _quad(q)], inverse_t[_quad(q), c, :], q * QUAD, q * QUAD)
    masked = tiles.sbuf(tuple(product.shape), dtype)
    return tiles.combine(masked, product, plane_t, nl.multiply, engine=tiles.VECTOR)


def _level5(
    a_list: list[Any], inverse: list[Any], inverse_t: list[Any], full_t: list[Any], assembly: list[Any]
) -> Iterator[None]:
    """Merge 32-blocks into 64-blocks and write the two 64-blocks of ``Invᵀ`` into the chunks' full tiles.

    The off quadrant of merged block j (rows of 32-block u = 2j, columns of v = 2j + 1) of ``Invᵀ`` is
    ``Inv_uᵀ · mid_u`` with ``mid_u = −A[v, u]ᵀ Invᵀ_v``. Row block q of a 64-block is then one product of the same
    stationary ``Inv_q`` (compact) with row block q of the chunk's assembly tile — the identity, with ``mid_u`` written
    over the zeros of block (u, v) — whose 64 columns are ``[Inv_uᵀ, Inv_uᵀ mid_u]`` (q = u) or ``[0, Inv_vᵀ]``
    (q = v): the diagonal 32-blocks come out transposed into place (an identity product is exact) beside the off
    quadrant, and one evacuation per 64-block writes it into the full tile. The tile's lower-left 64-block is zero
    from the launch on (``stages.chain_slots``); level 6 writes the upper-right one. Against placing the diagonal
    blocks by four copies and each off block by a copy (measured, one lane, bf16 schur): S = 2048 46.3 -> 45.2 µs,
    S = 8192 157.1 -> 151.7 µs; fp32 S = 8192 269.5 -> 266.2 µs. Yields once.
    """
    pairs, half = ((0, 1), (2, 3)), CHUNK // 2
    movings = assembly[: len(a_list)]  # by chunk position in the unit, as the chain slots
    for a, inv_t, moving in zip(a_list, inverse_t, movings, strict=True):
        mid_psum = tiles.psum((CHUNK, QUAD))
        for u, v in pairs:
            _tile_matmul(mid_psum[_quad(u), :], a[_quad(v), _quad(u)], inv_t[_quad(v), :], v * QUAD, u * QUAD)
            tiles.copy_to(moving[_quad(u), _quad(v)], mid_psum[_quad(u), :], scale=-1.0)
    for inv, moving, full in zip(inverse, movings, full_t, strict=True):
        product = tiles.psum((CHUNK, half))
        for q in range(N_QUADS):
            cols = _quad(q // 2, half)
            _tile_matmul(product[_quad(q), :], inv[_quad(q), :], moving[_quad(q), cols], q * QUAD, q * QUAD)
        # On the vector engine: the mid copies above go to the scalar one (measured: S = 8192 148.4 -> 147.2 µs with
        # the output's evacuations free too, against the balancer's choice for both).
        for h in range(2):
            tiles.copy_to(full[_quad(h, half), _quad(h, half)], product[_quad(h, half), :], engine=tiles.VECTOR)
    yield


def _level6(a_list: list[Any], full_t: list[Any], eye: Any, dtype: Any) -> Iterator[None]:
    """Merge the two 64-blocks: the off quadrant (rows 0..63, columns 64..127) of ``Invᵀ`` is
    ``Inv_upᵀ · (−A_lowᵀ Invᵀ_low)``, with ``Inv_up`` the transpose of ``Invᵀ``'s upper 64-block; yields once."""
    half = CHUNK // 2
    up, low = slice(0, half), slice(half, CHUNK)
    operands = []
    for a, full in zip(a_list, full_t, strict=True):
        inverse_up = tiles.psum((half, half), full.dtype)
        _tile_matmul(inverse_up, full[up, up], eye[up, up], 0, 0, transpose=True)
        mid_psum = tiles.psum((half, half))
        _tile_matmul(mid_psum, a[low, up], full[low, low], half, 0)
        operands.append((tiles.evacuate(inverse_up, dtype), tiles.evacuate(mid_psum, dtype, scale=-1.0)))
    for (inverse_up, mid), full in zip(operands, full_t, strict=True):
        product = tiles.psum((half, half))
        _tile_matmul(product, inverse_up, mid, 0, 0)
        tiles.copy_to(full[up, low], product)
    yield
