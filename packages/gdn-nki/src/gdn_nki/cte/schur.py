"""The schur intra-chunk inverse: (I + A)⁻¹ by recursive Schur-complement block merge, level-major over a group.

For a lower block-triangular matrix, inv([[P, 0], [R, Q]]) = [[P⁻¹, 0], [−Q⁻¹ R P⁻¹, Q⁻¹]]. With ``Inv`` holding
the block-diagonal inverses of the current block size h, the merged inverse (blocks 2h) is ``Inv + Inv·R̃·Inv``
where ``R̃ = A ∘ (−off)`` keeps A's lower-left h×h quadrant of every merged block, negated (mask pack planes
4..9). Level 0 (2×2 blocks) is ``Inv = I − A ∘ off0``. Levels 1..6 double the block size to 128.

The system arrives transposed and the result leaves transposed: the kernel hands over ``Aᵀ``
(``chunks.Chunk.a_t``, made from Γᵀ without a transpose) and the transition stage multiplies with ``Invᵀ``.
``nc_matmul`` computes stationaryᵀ·moving, so with ``Aᵀ`` as the stationary operand every product with the system
reads A itself: ``mid = R̃·Inv`` is ``(Aᵀ)ᵀ Inv`` masked, and from it ``Inv R̃ Inv = (Invᵀ)ᵀ·mid`` and ``(Inv R̃ Inv)ᵀ = midᵀ·Invᵀ``. The masks are
therefore the pack's planes as they are for the compact levels, and transposed for level 0 (``off0ᵀ``, read with
``Aᵀ``).

Block-sparse levels. Everything a level computes lives inside its merged blocks, and the product ``Inv·R̃·Inv`` only
in their off quadrants, so no level needs the whole 128×128 tensor-engine array:

- Levels 1..4 (merged blocks of 4..32) work on the four diagonal 32×32 blocks only. Their tiles are *compact*:
  [C, 32] per chunk, row p holding the 32 columns of p's own diagonal block (``compact[p, f] = full[p, 32·(p//32)
  + f]``), and ``BATCH`` chunks share one [C, BATCH, 32] tile, so one elementwise instruction serves them all.
  Each matmul is four 32×32×32 matmuls on the four disjoint diagonal PE tiles (``nc_matmul`` tiling mode,
  ``tile_position`` / ``tile_size``: ISA ``nki.isa.nc_matmul``, "Tiling mode", v2.33.0), which the tensor engine
  runs side by side; the elementwise work streams 32 elements per partition instead of 128.
- Levels 5 and 6 compute only the off quadrant of ``Invᵀ``: ``nᵀ Invᵀ_low`` with ``n = −(Aᵀ_up,low)ᵀ Inv_up``,
  two 32×32 blocks (level 5) or one 64×64 block (level 6), contracting only the h rows that are nonzero — no
  mask, the contraction itself selects A's off quadrant. Level 5 writes the two diagonal 64-blocks of the full
  ``Invᵀ`` tile (the diagonal 32-blocks placed by identity products beside the off quadrant, ``_level5``) and
  the ``Inv_up`` level 6 reads; level 6 writes the upper-right 64-block; the lower-left one stays zero.

- With bf16 operands the compact levels carry ``Invᵀ`` beside ``Inv``: both merged products come from the same
  ``mid``, so a level never waits on a transpose of the previous level's ``Inv`` (one tensor -> elementwise round
  trip less per level; fp32 keeps the transposes, its extra products cost more than they save). Level 0 then
  makes both compact orientations straight from ``Aᵀ ∘ (−off0ᵀ)``: identity matmuls of its diagonal blocks (one
  of them transposing), the identity added on their evacuations — no full-tile inverse, no subtract.

Precision: every element of ``Invᵀ`` is one fp32 PSUM value rounded once into the operand dtype — the compact
levels add the fp32 product to the previous ``Invᵀ`` where the two never overlap (one term is an exact zero), and
the off-quadrant blocks are new entries. The carried ``Inv`` is rounded the same way from the same products summed
in the other orientation, so it may differ from the transpose of ``Invᵀ`` in the last bit.

Every level runs over all chunks of the group before the next level starts (level-major): each step issues
``group_size`` independent same-kind instructions, which hides each instruction's dependency latency behind its
siblings. Do not fold this back into a per-chunk loop.

gdn_ref twin: ``gdn_ref.inverse.schur_inverse`` (the same merge on full tiles, float64; ``schur_inverse_blocked``
is its block-sparse form).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gdn_ref.constants import CHUNK_SCHUR as CHUNK
from gdn_ref.masks import PLANE_EYE, PLANE_OFF0, off_neg_plane

from ..common import tiles
from ..common.backend import nisa, nl
from ..common.tiles import FP32
from .chunks import Chunk
from .constant_tiles import Constants

QUAD = 32  # the smallest PE tile (4×32 rows/columns from NeuronCore-v3) and the compact tiles' width
N_QUADS = CHUNK // QUAD
COMPACT_LEVELS = range(1, 5)
# Chunks per batch-compact tile: one elementwise instruction of 32·BATCH elements per partition instead of BATCH
# MIN_II-bound ones of 32. 2 is best: larger batches make each level's elementwise step wait for more matmuls.
BATCH = 2
# Rounds the operand stage sits out after its first phase (``lanes.LaneInputs.operand_idle_rounds``, which says
# why), for bf16 operands and for fp32 ones: the fastest counts of those swept (PERFORMANCE.md).
OPERAND_IDLE_ROUNDS = 3
OPERAND_IDLE_ROUNDS_FP32 = 2


def load_merge_planes(mask_pack: Any, consts: Constants, dtype: Any) -> Iterator[None]:
    """Load the merge's masks into ``consts.planes``, transposed where the kernel reads the system transposed
    (module docstring): the level-0 plane ``off0ᵀ`` (DMA-transposed), and the compact levels' pre-negated
    off-block planes as compact [C, 32] tiles, each diagonal 32×32 block copied into its rows (fp32: they multiply
    an fp32 PSUM product; a batch reads one through a stride-0 view repeating it per chunk). Then (after one yield:
    ``lanes.LaneInputs.deferred_loads``) the on-chip work: the negated level-0 plane."""
    off0_t = tiles.sbuf((CHUNK, CHUNK), FP32)
    nisa.dma_transpose(dst=off0_t, src=mask_pack[PLANE_OFF0, :, :])
    consts.planes["off0_t"] = off0_t
    if dtype != FP32:  # the compact level 0 (``invert_group``) adds Aᵀ ∘ (−off0ᵀ) to the identity
        eye_compact = tiles.sbuf((CHUNK, QUAD), FP32)
        for q in range(N_QUADS):
            nisa.dma_copy(dst=eye_compact[_quad(q), :], src=mask_pack[PLANE_EYE, _quad(q), _quad(q)])
        consts.planes["eye_compact"] = eye_compact
    for level in COMPACT_LEVELS:
        plane = tiles.sbuf((CHUNK, QUAD), FP32)
        for q in range(N_QUADS):
            block = _quad(q)
            nisa.dma_copy(dst=plane[block, :], src=mask_pack[off_neg_plane(level), block, block])
        consts.planes[level] = plane
    yield
    if dtype != FP32:
        consts.planes["off0_t_neg"] = tiles.copy_to(tiles.sbuf((CHUNK, CHUNK), dtype), off0_t, -1.0)


def invert_group(chunks: list[Chunk], consts: Constants, dtype: Any) -> Iterator[None]:
    """Set ``chunk.inverse_t = (I + Aᵀ)⁻¹ = ((I + A)⁻¹)ᵀ`` for every chunk of the group from ``chunk.a_t``,
    level-major; yields per step (two per compact level).

    Within a level each step runs over all batches of ``BATCH`` chunks before the next step (its PE instructions,
    then its elementwise ones), so no engine's queue holds an instruction that waits on the step just before it for
    the same batch. ``inverse`` holds the batch-compact ``Inv`` (of the lower system I + A), ``inverse_t`` its
    transpose.
    """
    a_t = [chunk.a_t for chunk in chunks]
    batches = [slice(i, i + BATCH) for i in range(0, len(a_t), BATCH)]
    both = dtype != FP32  # carry Invᵀ beside Inv (see below); with fp32 operands its products cost more than the
    if both:  # transposes they replace, so fp32 transposes each level
        # Level 0 straight into the compact tiles: I + (Aᵀ ∘ (−off0ᵀ)) summed by the tensor engine (exact: the two
        # terms never overlap), each orientation beside the other; no full-tile inverse and no subtract.
        off0 = [tiles.multiply(x, consts.planes["off0_t_neg"], dtype) for x in a_t]
        blocks = [[m[_quad(q), _quad(q)] for q in range(N_QUADS)] for m in off0]
        inverse = [_identity_plus(blocks[b], consts, dtype, transpose=True) for b in batches]
        compact_t = [_identity_plus(blocks[b], consts, dtype, transpose=False) for b in batches]
        blocks_t = [_blocks(x) for x in compact_t]
    else:
        level0_t = [_level0(x, consts, dtype) for x in a_t]  # level 0: full tiles of Invᵀ; then batch-compact
        full_blocks = [[inv[_quad(q), _quad(q)] for q in range(N_QUADS)] for inv in level0_t]
        inverse = [_group_transpose(full_blocks[b], consts.eye, dtype) for b in batches]
        blocks_t = [full_blocks[b] for b in batches]
    yield
    for level in COMPACT_LEVELS:
        plane = consts.planes[level]
        mid = [
            _off_block_product(a_t[b], plane.expand_dim(1).broadcast(1, len(a_t[b])), inv, dtype)
            for b, inv in zip(batches, inverse, strict=True)
        ]
        # A step of its own: the chain's tensor-engine work, issued between the two, fills the wait for the masks
        yield
        products = [_diagonal_product(inv_t, m) for inv_t, m in zip(blocks_t, mid, strict=True)]  # Inv R̃ Inv
        # Inv's merge on the vector engine straight from PSUM, one instruction: the next level's mid waits on it,
        # and the balancer's staged form (a scalar-engine evacuation, then GpSimd's add) is one dependency more
        # on every level's path; the Invᵀ merge, read a step later, stays the balancer's (forcing both is slower).
        inverse = [_merge(inv, p, dtype, engine=tiles.VECTOR) for inv, p in zip(inverse, products, strict=True)]
        if both:
            # (Inv R̃ Inv)ᵀ = (R̃ Inv)ᵀ·Invᵀ from the same mid, merged into the compact Invᵀ: the next level's Invᵀ
            # without waiting on a transpose of this level's Inv (one PE -> elementwise round trip less per level).
            products = [_diagonal_product(_blocks(m), x) for x, m in zip(compact_t, mid, strict=True)]
            compact_t = [_merge(x, p, dtype) for x, p in zip(compact_t, products, strict=True)]
        del products  # free their PSUM before the transposes allocate theirs
        if not both:
            compact_t = [_group_transpose(_blocks(inv), consts.eye, dtype) for inv in inverse]
        blocks_t = [_blocks(x) for x in compact_t]
        yield
    inverse_t = [x[:, c, :] for x in compact_t for c in range(x.shape[1])]
    inverse = [x[:, c, :] for x in inverse for c in range(x.shape[1])]
    full_t = [chunk.place.inverse_t for chunk in chunks]
    upper = []  # per chunk, Inv's upper-left 64-block (level 6 reads it)
    for step in _level5(a_t, inverse, inverse_t, full_t, upper, consts.eye, dtype):
        yield step
    for step in _level6(a_t, upper, full_t, dtype):
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


def _level0(a_t: Any, consts: Constants, dtype: Any) -> Any:
    """Transposed inverse of every 2×2 diagonal block, I − Aᵀ ∘ off0ᵀ, as a full tile."""
    inverse_t = tiles.sbuf(tuple(a_t.shape), dtype)
    return tiles.combine(inverse_t, consts.eye, tiles.multiply(a_t, consts.planes["off0_t"], dtype), nl.subtract)


def _diagonal_product(stationary: list[list[Any]], moving: Any) -> Any:
    """``stationaryᵀ · moving`` on every chunk's diagonal 32×32 blocks (``stationary[chunk][quadrant]``, ``moving``
    batch-compact), into batch-compact PSUM."""
    product = tiles.psum(tuple(moving.shape))
    for c, chunk_blocks in enumerate(stationary):
        for q, block in enumerate(chunk_blocks):
            _tile_matmul(product[_quad(q), c, :], block, moving[_quad(q), c, :], q * QUAD, q * QUAD)
    return product


def _merge(inverse: Any, product: Any, dtype: Any, engine: Any = None) -> Any:
    """The merged batch-compact inverse (either orientation), ``Inv + Inv R̃ Inv``, into a new tile of ``dtype``.

    The fp32 product, read from PSUM, is added to the previous inverse into a new tile of ``dtype``. The two
    terms never overlap (``Inv`` is block-diagonal with this level's half-blocks, the product lives only in the
    off quadrant of each merged block, and it is exactly zero elsewhere: its sums run over the masked zeros of
    R̃), so each element of the sum is one term plus an exact zero — the bits of summing every level in fp32 and
    rounding once. That is what lets each level's product be a matmul into a fresh PSUM tile: an fp32 PSUM
    accumulator per chunk over all levels would hold one matmul accumulation group open per chunk for the whole
    inverse — sixteen at once for a unit of sixteen chunks (the API's largest group), beside the other stages'
    groups, where TensorE has 8, one per PSUM bank (docs/nki-sources.md §4.2).
    """
    return tiles.combine(tiles.sbuf(tuple(inverse.shape), dtype), product, inverse, nl.add, engine=engine)


def _off_block_product(a_t: list[Any], plane: Any, inverse: Any, dtype: Any) -> Any:
    """``mid = R̃ Inv`` with R̃ = A ∘ (−off) on the diagonal 32×32 blocks of every chunk, as a batch-compact
    [C, n, 32] tile of ``dtype`` (one mask multiply for the whole batch).

    Computed as ((Aᵀ)ᵀ Inv) ∘ (−off), ``Aᵀ`` the stationary: the mask is applied to the product, on its PSUM
    evacuation, instead of to A. Exact, because Inv is block-diagonal with the half-blocks of this level: entry
    [i, m] of A Inv sums A[i, k] Inv[k, m] over k in m's half-block only, so where −off keeps [i, m] (i in the
    lower, m in the upper half of one merged block) the sum covers exactly A's off quadrant, and elsewhere it is
    discarded. This saves masking A at every level; A's upper part only ever lands in discarded entries.

    The multiply runs on the vector engine straight from PSUM, never staged (a scalar-engine evacuation, then
    GpSimd's multiply) as the balancer may prefer when the vector engine is busy: it sits on each level's critical
    path, where a second instruction costs one more dependency latency. So does the merge of Inv
    (``invert_group``).
    """
    product = tiles.psum(tuple(inverse.shape))
    for c, x_t in enumerate(a_t):
        for q in range(N_QUADS):
            _tile_matmul(product[_quad(q), c, :], x_t[_quad(q), _quad(q)], inverse[_quad(q), c, :], q * QUAD, q * QUAD)
    masked = tiles.sbuf(tuple(product.shape), dtype)
    return tiles.combine(masked, product, plane, nl.multiply, engine=tiles.VECTOR)


def _level5(
    a_t: list[Any],
    inverse: list[Any],
    inverse_t: list[Any],
    full_t: list[Any],
    upper: list[Any],
    eye: Any,
    dtype: Any,
) -> Iterator[None]:
    """Merge 32-blocks into 64-blocks: write the two diagonal 64-blocks of ``Invᵀ`` into the chunks' full tiles,
    and Inv's upper-left 64-block into ``upper`` (one tile per chunk, for level 6).

    For merged block j (32-blocks u = 2j, v = 2j + 1) the new entries are Inv's lower-left block
    ``−Inv_v A_vu Inv_u`` and, transposed, ``Invᵀ``'s upper-right one ``n_vᵀ Invᵀ_v`` with
    ``n_v = −Aᵀ_uvᵀ Inv_u`` — the one product with the system that reads it as given (``Aᵀ_uv`` stationary). Row
    block u of the 64-block of ``Invᵀ`` is then ``[Invᵀ_u, n_vᵀ Invᵀ_v]`` and row block v ``[0, Invᵀ_v]``: the
    diagonal blocks are identity products of the compact ``Inv`` (exact; as stationary it comes out transposed, and
    the identity's rows carry the zeros beside ``Invᵀ_v``), so one evacuation per 64-block writes all of it. The
    full tile's lower-left 64-block is zero from the launch on (``chunks.allocate_tile_sets``); level 6 writes the
    upper-right one. Inv's upper-left 64-block ``[[Inv_0, 0], [Invᵀ_off01ᵀ = Invᵀ_1ᵀ n_1, Inv_1]]`` comes from the
    same tiles by the same kind of products. Yields once.
    """
    pairs, half = ((0, 1), (2, 3)), CHUNK // 2
    offs = []
    for start in range(0, len(a_t), BATCH):
        members = range(start, min(start + BATCH, len(a_t)))
        # n_v in the rows of block v, for a batch of chunks: one copy streams 32·BATCH elements per partition, where
        # one per chunk would stream 32, below the engines' 64-element minimum initiation interval
        off_psum = tiles.psum((CHUNK, len(members), QUAD))
        off = tiles.sbuf((CHUNK, len(members), QUAD), dtype)
        for u, v in pairs:
            for c, i in enumerate(members):
                x_t, inv = a_t[i], inverse[i]
                _tile_matmul(off_psum[_quad(v), c, :], x_t[_quad(u), _quad(v)], inv[_quad(u), :], u * QUAD, v * QUAD)
            # One pair's copies on each engine: the balancer would put all sixteen of a unit on the scalar engine,
            # one queue on the path (all on the vector engine is slower too)
            engine = (tiles.SCALAR, tiles.VECTOR)[v // 2]
            tiles.copy_to(off[_quad(v), :, :], off_psum[_quad(v), :, :], scale=-1.0, engine=engine)
        offs.extend(off[:, c, :] for c in range(len(members)))
    for inv, inv_t, off, full in zip(inverse, inverse_t, offs, full_t, strict=True):
        product = tiles.psum((CHUNK, half))
        for h, (u, v) in enumerate(pairs):
            cols = _quad(h, half)
            _tile_matmul(product[_quad(u), :QUAD], inv[_quad(u), :], eye[_quad(u), _quad(u)], u * QUAD, u * QUAD)
            _tile_matmul(product[_quad(u), QUAD:], off[_quad(v), :], inv_t[_quad(v), :], v * QUAD, u * QUAD)
            _tile_matmul(product[_quad(v), :], inv[_quad(v), :], eye[_quad(v), cols], v * QUAD, v * QUAD)
        # On the vector engine, not the balancer's choice: faster once the n_v copies above are split over two
        # engines.
        for h in range(2):
            tiles.copy_to(full[_quad(h, half), _quad(h, half)], product[_quad(h, half), :], engine=tiles.VECTOR)
        upper_psum = tiles.psum((half, half))
        _tile_matmul(upper_psum[_quad(0), :], inv_t[_quad(0), :], eye[_quad(0), :half], 0, 0)
        _tile_matmul(upper_psum[_quad(1), :QUAD], inv_t[_quad(1), :], off[_quad(1), :], QUAD, QUAD)
        _tile_matmul(upper_psum[_quad(1), QUAD:], inv_t[_quad(1), :], eye[_quad(1), _quad(1)], QUAD, QUAD)
        upper.append(tiles.evacuate(upper_psum, dtype))
    yield


def _level6(a_t: list[Any], upper: list[Any], full_t: list[Any], dtype: Any) -> Iterator[None]:
    """Merge the two 64-blocks: the upper-right 64-block of ``Invᵀ`` is ``nᵀ Invᵀ_low`` with
    ``n = −Aᵀ_up,lowᵀ Inv_up`` (``Inv_up``: Inv's upper-left 64-block, from ``_level5``); yields once."""
    half = CHUNK // 2
    up, low = slice(0, half), slice(half, CHUNK)
    offs = []
    for x_t, inv_up in zip(a_t, upper, strict=True):
        off_psum = tiles.psum((CHUNK, half))
        _tile_matmul(off_psum[low, :], x_t[up, low], inv_up, 0, half)
        off = tiles.sbuf((CHUNK, half), dtype)
        offs.append(tiles.copy_to(off[low, :], off_psum[low, :], scale=-1.0))
    for off, full in zip(offs, full_t, strict=True):
        product = tiles.psum((half, half))
        _tile_matmul(product, off, full[low, low], half, 0)
        tiles.copy_to(full[up, low], product)
    yield
