"""The neumann intra-chunk inverse (chunk 64): 16-row diagonal sub-blocks by recursive doubling, joined by block
substitution.

It inverts the upper-triangular system it is given, ``I + Aᵀ`` (``chunks.Chunk.a_t``), and the result is the
``Invᵀ = (I + Aᵀ)⁻¹`` the transition stage multiplies with — no transpose at the end. With ``Aᵀ = A_d + N``
(``A_d`` the strictly-upper parts of the four 16×16 diagonal blocks, ``N`` the strictly block-upper rest):

- ``X_d = (I + A_d)⁻¹ = (I + P)(I + P²)(I + P⁴)(I + P⁸)`` with ``P = −A_d`` (nilpotent: P¹⁶ = 0, so exact).
  Doubling works on 16-row blocks only: on whole 64-chunks its intermediates reach 1e13+.
- Block back substitution ``Inv_i = X_ii (E_i − Σ_{m>i} N_im Inv_m)`` for the four block rows, run on all rows
  at once as ``Inv ← X_d − (X_d N) Inv`` starting from ``X_d``: sweep t makes one more block row exact (X_d N is
  nilpotent of index 4), so three sweeps give the exact inverse.

Chunks of a group run level-major, like schur's merge, so independent same-kind instructions are issued together.

The whole inverse runs in fp32 whatever the compute dtype, and only the result is rounded to it: the doubling
forms powers of the 16×16 blocks, which reach ~1e3 for near-collinear keys and must cancel back to entries of
order 1 — in bf16 that cancellation destroys the result (measured rel. error > 0.5).

gdn_ref twin: ``gdn_ref.inverse.neumann_inverse`` (the same doubling and substitution, float64, with operand
rounding hooks).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gdn_ref.constants import CHUNK_NEUMANN as CHUNK
from gdn_ref.constants import SUBBLOCK_NEUMANN as SUBBLOCK

from ..common import tiles
from ..common.backend import nisa, nl
from ..common.tiles import FP32
from .chunks import Chunk
from .constant_tiles import Constants

DOUBLING_ROUNDS = 3  # (I + P) then three squarings: P², P⁴, P⁸
SUBSTITUTION_SWEEPS = CHUNK // SUBBLOCK - 1
GROUP_SIZE = 8  # chunks per level-major group (the group_size knob is schur's)
# Rounds the operand stage sits out after its first phase (``lanes.LaneInputs.operand_idle_rounds``): none pays
# with this inverse's steps (PERFORMANCE.md).
OPERAND_IDLE_ROUNDS = 0


def build_block_planes(consts: Constants, dtype: Any) -> Iterator[None]:
    """Build the block masks on device: ``neg_diag`` = −1 on the diagonal blocks' strictly-upper part,
    ``above`` = 1 on the strictly block-upper part. A step generator like schur's merge planes
    (``lanes.LaneInputs.deferred_loads``): nothing to load, so all of it comes after the one yield."""
    yield
    row_block = _block_index(channel_multiplier=1, step=0)
    col_block = _block_index(channel_multiplier=0, step=1)
    same_block = tiles.sbuf((CHUNK, CHUNK), FP32)
    nisa.tensor_tensor(dst=same_block, data1=row_block, data2=col_block, op=nl.equal)
    above = tiles.sbuf((CHUNK, CHUNK), FP32)
    nisa.tensor_tensor(dst=above, data1=row_block, data2=col_block, op=nl.less)
    neg_same = tiles.sbuf((CHUNK, CHUNK), FP32)
    nisa.tensor_scalar(dst=neg_same, data=same_block, op0=nl.multiply, operand0=-1.0)
    neg_diag = tiles.sbuf((CHUNK, CHUNK), FP32)
    # keep where column − row − 1 >= 0 (strictly upper)
    nisa.affine_select(
        dst=neg_diag,
        pattern=[[1, CHUNK]],
        channel_multiplier=-1,
        offset=-1,
        on_true_tile=neg_same,
        on_false_value=0.0,
        cmp_op=nl.greater_equal,
    )
    consts.planes["neg_diag"], consts.planes["above"] = neg_diag, above


def _block_index(channel_multiplier: int, step: int) -> Any:
    """[C, C] int32 tile of (row or column index) // SUBBLOCK."""
    index = tiles.sbuf((CHUNK, CHUNK), nl.int32)
    nisa.iota(dst=index, pattern=[[step, CHUNK]], offset=0, channel_multiplier=channel_multiplier)
    block = tiles.sbuf((CHUNK, CHUNK), nl.int32)
    nisa.tensor_scalar(dst=block, data=index, op0=nl.right_shift, operand0=SUBBLOCK.bit_length() - 1)
    return block


def invert_group(chunks: list[Chunk], consts: Constants, dtype: Any) -> Iterator[None]:
    """Set ``chunk.inverse_t = (I + Aᵀ)⁻¹`` for every chunk of the group, level-major; yields per step."""
    a_list = [chunk.a_t for chunk in chunks]
    diag_inverse = yield from _diagonal_blocks_inverse(a_list, consts, FP32)
    inverse = yield from _block_substitution(a_list, diag_inverse, consts, FP32)
    for chunk, inv in zip(chunks, inverse, strict=True):
        # into its place in the unit's tile set (``chunks.ChunkTiles``), which the transition stage reads, rounded to the compute dtype
        dst = chunk.place.inverse_t if chunk.place is not None else tiles.sbuf(tuple(inv.shape), dtype)
        chunk.inverse_t = tiles.copy_to(dst, inv)


def _transposed(x: Any, dtype: Any) -> Any:
    return tiles.evacuate(tiles.transpose(x), dtype)


def _diagonal_blocks_inverse(a_list: list[Any], consts: Constants, dtype: Any) -> Iterator[None]:
    """X_d per chunk by recursive doubling: X = I + P, then X ← X + P^(2^r) X for r = 1..3."""
    power = [tiles.multiply(a, consts.planes["neg_diag"], dtype) for a in a_list]  # P = −A_d
    power_t = [_transposed(p, dtype) for p in power]
    inverse = []
    for p in power:
        x = tiles.sbuf(tuple(p.shape), dtype)
        tiles.combine(x, consts.eye32, p, nl.add)
        inverse.append(x)
    for rnd in range(1, DOUBLING_ROUNDS + 1):
        squared_t = [tiles.evacuate(tiles.matmul(p, pt), dtype) for p, pt in zip(power, power_t, strict=True)]
        if rnd < DOUBLING_ROUNDS:  # the last round needs only the transposed power
            power = [tiles.evacuate(tiles.matmul(pt, p), dtype) for p, pt in zip(power, power_t, strict=True)]
        power_t = squared_t
        inverse = [_add_product(x, pt, x, dtype) for x, pt in zip(inverse, power_t, strict=True)]
        yield
    return inverse


def _add_product(base: Any, stationary: Any, moving: Any, dtype: Any) -> Any:
    """base + stationaryᵀ @ moving into a new tile (the product read straight from PSUM)."""
    dst = tiles.sbuf(tuple(base.shape), dtype)
    tiles.combine(dst, base, tiles.matmul(stationary, moving), nl.add)
    return dst


def _block_substitution(a_list: list[Any], diag_inverse: list[Any], consts: Constants, dtype: Any) -> Iterator[None]:
    """Inv = (I + Aᵀ)⁻¹ from X_d by three sweeps of Inv ← X_d − (X_d N) Inv."""
    above = [tiles.multiply(a, consts.planes["above"], dtype) for a in a_list]  # N
    diag_t = [_transposed(x, dtype) for x in diag_inverse]
    # (−X_d N)ᵀ = −Nᵀ X_dᵀ, the stationary operand of every sweep
    coupling_t = [tiles.evacuate(tiles.matmul(n, xt), dtype, scale=-1.0) for n, xt in zip(above, diag_t, strict=True)]
    inverse = diag_inverse
    for _ in range(SUBSTITUTION_SWEEPS):
        sweep = []
        for x_d, zt, inv in zip(diag_inverse, coupling_t, inverse, strict=True):
            acc = tiles.matmul(zt, inv)
            tiles.matmul(consts.eye32, x_d, dst=acc, accumulate=True)
            sweep.append(tiles.evacuate(acc, dtype))
        inverse = sweep
        yield
    return inverse
