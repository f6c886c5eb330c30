"""A request's decode state as tiles of long contiguous runs, and one token through a tile.

A pool row's state [Hv, Dk, Dv] fp32 is contiguous in HBM. Held as Dk on partitions, every partition would receive
one Dv row of a head (512 bytes for Dv = 128) per head, a short run the DMA moves at a fraction of its peak
(DMA efficiency rises with the contiguous bytes per descriptor up to ≥ 2 KiB "near peak": "DMA bandwidth guide",
NKI deep dives, SDK 2.31; docs/nki-sources.md §4.4). Here each partition holds ``rows`` CONSECUTIVE
Dk rows of one head instead, so a partition's share of a tile is one contiguous run of rows·Dv fp32:

    tile t of a row = value heads t·H .. t·H + H − 1, partition p = h·G + dk_hi (G = Dk / rows partitions a head),
    free = (dk_lo < rows, Dv):  element [p, dk_lo, dv] = S[t·H + h][dk_hi·rows + dk_lo, dv]

and the whole tile is one contiguous block of H·Dk·Dv fp32 (partition stride rows·Dv): one DMA, every partition a
single run of rows·Dv·4 bytes (2 KiB at Dv = 128, rows = 4).

A head's Dk rows are split over G partitions and ``rows`` free slices, so the per-token products contract over
(partition, dk_lo) pairs (``nki.isa.nc_matmul`` contracts over the partition dim and accumulates in PSUM, SDK 2.33):

    [u; o] = [β v; c β v] − Σ_{dk_lo} X[:, dk_lo, :]ᵀ St[dk_lo]    rows·1 matmuls into one PSUM group, as columns
    S_new  = α S + k uᵀ:  X ← α_p X, then per dk_lo  X[:, dk_lo] += k_p[dk_lo] · u[head(p)]   (scalar, vector, GpSimd)

St[dk_lo] is [P, 2H] block-diagonal: column (i, h) holds the recall (i = 0: −αβk) or read (i = 1: −(cαβk − αq))
vector of head h on head h's G partitions, zero elsewhere, so one matmul serves the tile's H heads; the state slice
X[:, dk_lo, :] is the stationary and St the moving operand (``tile_columns``). Its values come
from the [Dk, ·] columns of ``decode.gate_operands`` by a 0/1 selection matmul per dk_lo (``Sel[dk_lo][dk, p] =
[dk = dk_hi(p)·rows + dk_lo]``) and one multiply by the head-block mask. u reaches its heads' G partitions by a 0/1
matmul of its columns, broadcast over each head's G partitions, against the identity; the [β v; cβ v] term enters
the same accumulation group first, as a matmul of the values against a gate-weighted 0/1 pick. Every compute
operand starts at partition 0; rows at other partitions are only read by DMA.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from ..common.backend import nisa, nl
from ..common.engines import GPSIMD, SCALAR
from ..common.tiles import FP32, matmul, psum, sbuf

PMAX = 128
# Bytes a partition's run of one state tile aims at: the DMA efficiency's "near peak" point ("≥ 2 KiB",
# docs/nki-sources.md §4.4). The saturating 4 KiB halves the tiles and doubles their heads: fewer, longer tile
# steps, which overlap the DMA less (PERFORMANCE.md, "Decode").
RUN_BYTES = 2048
# An fp32 PSUM bank per partition (2 KiB): the widest matmul output (a block's selection products).
PSUM_BANK_FP32 = 512
# Dk rows a partition whose rank-1 writes run on GpSimd rather than the vector engine (``tile_update_from_columns``):
# half of Qwen3-Next's 4, which balances the two engines with the scalar engine's copy of u (PERFORMANCE.md).
GPSIMD_ROWS = 2
# Planes of the per-token columns the selection matmul moves: recall, read, key.
PLANES = 3
# Work issued one dependency level at a time: a generator that yields between levels and returns its result, so
# a caller can interleave the levels with other work and no in-order engine waits on the chain.
Steps = Generator[None, None, Any]


def largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, max(1, min(n, at_most)) + 1) if n % d == 0)


@dataclass(frozen=True)
class TileLayout:
    """How a request's state is tiled: ``rows`` Dk rows per partition, ``heads`` value heads per tile, tiles grouped
    in blocks of ``tiles_per_block`` (a block's selection products fill at most one PSUM bank)."""

    dk: int
    dv: int
    value_heads: int
    rows: int
    heads: int
    tiles_per_block: int

    @property
    def parts_per_head(self) -> int:
        return self.dk // self.rows

    @property
    def partitions(self) -> int:
        return self.heads * self.parts_per_head

    @property
    def tiles(self) -> int:
        return self.value_heads // self.heads

    @property
    def free(self) -> int:
        return self.rows * self.dv

    @property
    def block_heads(self) -> int:
        return self.tiles_per_block * self.heads

    @property
    def lanes(self) -> int:
        """Partitions the per-token gate tiles span: every consumer's (Dk columns, tile partitions, pick rows)."""
        return max(self.dk, self.partitions, 2 * self.heads, self.block_heads)


def tile_layout(dk: int, dv: int, value_heads: int) -> TileLayout:
    """The layout of a [Hv, Dk, Dv] state: the most Dk rows per partition whose run is at most ``RUN_BYTES``
    (a divisor of Dk), the most heads per tile that fit 128 partitions (a divisor of Hv, at most 64 so a tile's
    [u; o] rows fit the partitions), the most tiles per block whose selection products fit one PSUM bank."""
    rows = largest_divisor(dk, max(1, RUN_BYTES // (dv * 4)))
    heads = largest_divisor(value_heads, min(PMAX // (dk // rows), PMAX // 2))
    tiles = value_heads // heads
    per_block = largest_divisor(tiles, max(1, min(PSUM_BANK_FP32 // (PLANES * heads), PMAX // heads)))
    return TileLayout(dk=dk, dv=dv, value_heads=value_heads, rows=rows, heads=heads, tiles_per_block=per_block)


def chunk_form_fits(tokens: int, layout: TileLayout) -> bool:
    """Whether T tokens can verify in chunk form (``chunk``): T > 1, a block's planes of all T tokens within one
    PSUM bank, the per-head gate tiles spanning the value columns' partitions, and T·Hv (token, head) rows within
    the partitions (the rank-T write contracts over them)."""
    return (
        tokens > 1
        and PLANES * tokens * layout.block_heads <= PSUM_BANK_FP32
        and layout.dv <= layout.lanes
        and tokens * layout.value_heads <= PMAX
    )


def _against(dst: Any, values: Any, column: Any, op: Any) -> None:
    """``dst = values op column`` on GpSimd ([P, F] each; ``column`` [≥ P, 1] broadcast along the free axis): the
    launch's 0/1 tiles off the vector engine, which the first request's gates and keys queue behind (GpSimd runs
    ``tensor_scalar`` only for rsqrt, so the scalar operand is a column)."""
    parts, free = dst.shape
    nisa.tensor_tensor(dst=dst, data1=values, data2=column[0:parts, :].broadcast(1, free), op=op, engine=GPSIMD)


def _zero_one_compares(dst: Any, values: Any, low: Any, high: Any) -> Callable[[], None]:
    """``dst = 1.0 where low <= values < high else 0.0`` (``low``, ``high``: columns, ``_against``): the two
    compares issued now; returns the product's issue, for the caller to place after other work."""
    above = sbuf(tuple(dst.shape), FP32)
    _against(above, values, low, nl.greater_equal)
    below = sbuf(tuple(dst.shape), FP32)
    _against(below, values, high, nl.less)
    return lambda: nisa.tensor_tensor(dst=dst, data1=above, data2=below, op=nl.multiply, engine=GPSIMD)


class LayoutConstants:
    """The 0/1 tiles of a layout, built once per launch on device (``nki.isa.iota`` and compares).

    - ``select`` [Dk, rows, P]: select[dk, lo, p] = [dk = dk_hi(p)·rows + lo];
    - ``signed_mask`` [P, 3, H]: [p in head h's block] with sign −, −, + for the recall, read and key planes;
    - ``spread`` [H, P]: spread[h, p] = [p in head h's block] (a head's row to its partitions);
    - ``pick`` [block, tiles_per_block, H]: pick[h, t, h'] = [h = t·H + h'] (a block's value row to its tile row);
    - ``identity`` [block, block], ``value_identity`` [Dv, Dv], ``partition_identity`` [P, P];
    - ``write_mask`` [T·Hv, P] (chunk form only, ``chunk``): [p in head h's block] for row (token, tile, h).
    """

    def __init__(self, layout: TileLayout, tokens: int = 1, defer: bool = False):
        dk, rows, g, h, parts = layout.dk, layout.rows, layout.parts_per_head, layout.heads, layout.partitions
        heads_per_tile, block, dv = parts // g, layout.block_heads, layout.dv
        chunk = chunk_form_fits(tokens, layout)
        # All on GpSimd (iotas, then compares against constant columns, ``_against``), so the vector engine is free
        # for the first request's gates and keys; the write's mask first (a matmul and an evacuation follow it),
        # then the rest in order of first use. Each group's iotas before its compares, and a compare's product
        # after the other compares, so no instruction waits out the latency of the one before it. The same values.
        columns = sbuf((max(dk, parts, block, dv, h), 3), FP32)  # 0, G, −1 on every partition
        for i, value in enumerate((0.0, float(g), -1.0)):
            nisa.memset(dst=columns[:, i : i + 1], value=value, engine=GPSIMD)
        zero, width, minus_one = (columns[:, i : i + 1] for i in range(3))
        spread_offsets = sbuf((h, parts), FP32)  # p − G·h
        nisa.iota(dst=spread_offsets, pattern=[[1, parts]], offset=0, channel_multiplier=-g)
        block_offsets = sbuf((parts, h), FP32)  # p − G·h
        nisa.iota(dst=block_offsets, pattern=[[-g, h]], offset=0, channel_multiplier=1)
        if chunk:
            rows_heads = sbuf((h, tokens * layout.value_heads), FP32)  # h' − h of row (t, tile, h')
            nisa.iota(dst=rows_heads, pattern=[[0, tokens * layout.tiles], [1, h]], offset=0, channel_multiplier=-1)
        self.spread = sbuf((h, parts), FP32)
        finish_spread = _zero_one_compares(self.spread, spread_offsets, zero, width)
        mask = sbuf((parts, h), FP32)
        finish_mask = _zero_one_compares(mask, block_offsets, zero, width)
        if chunk:
            pick_rows = sbuf((h, tokens * layout.value_heads), FP32)
            _against(pick_rows, rows_heads, zero, nl.equal)
        finish_spread()
        finish_mask()
        self.write_mask = None
        if chunk:  # [T·Hv, P]: row (t, tile, h) × partition p: [p in head h's block]
            self.write_mask = sbuf((tokens * layout.value_heads, parts), FP32)
            nisa.tensor_copy(dst=self.write_mask,
                             src=matmul(pick_rows, self.spread, stationary_onezero=True, moving_onezero=True))  # fmt: skip
        self.signed_mask = sbuf((parts, PLANES, h), FP32)  # the recall and read planes negated, the key plane not
        for plane in range(PLANES - 1):
            _against(self.signed_mask[:, plane, :], mask, minus_one, nl.multiply)
        nisa.tensor_copy(dst=self.signed_mask[:, PLANES - 1, :], src=mask, engine=GPSIMD)
        self.identity = sbuf((block, block), FP32)
        self.pick = sbuf((block, layout.tiles_per_block, h), FP32)
        self.select = sbuf((dk, rows, parts), FP32)
        self.value_identity = sbuf((dv, dv), FP32)  # [Dv, Dv]: turns [Dv, ·] columns into rows on the PE
        self.partition_identity = self.value_identity  # [P, P]: a V-major tile's store transposes (``pipeline``)
        if parts != dv:
            self.partition_identity = sbuf((parts, parts), FP32)

        def selections() -> None:
            diagonal = sbuf((block, block), FP32)
            nisa.iota(dst=diagonal, pattern=[[-1, block]], offset=0, channel_multiplier=1)
            pick_offsets = sbuf((block, layout.tiles_per_block * h), FP32)  # row − t·H − h'
            nisa.iota(dst=pick_offsets, pattern=[[-h, layout.tiles_per_block], [-1, h]], offset=0,
                      channel_multiplier=1)  # fmt: skip
            offsets = sbuf((dk, rows * parts), FP32)  # dk − lo − rows·dk_hi(p)
            nisa.iota(dst=offsets, pattern=[[-1, rows], [0, heads_per_tile], [-rows, g]], offset=0,
                      channel_multiplier=1)  # fmt: skip
            value_diagonal = sbuf((dv, dv), FP32)
            nisa.iota(dst=value_diagonal, pattern=[[-1, dv]], offset=0, channel_multiplier=1)
            _against(self.identity, diagonal, zero, nl.equal)
            _against(self.pick.reshape((block, layout.tiles_per_block * h)), pick_offsets, zero, nl.equal)
            _against(self.select.reshape((dk, rows * parts)), offsets, zero, nl.equal)
            _against(self.value_identity, value_diagonal, zero, nl.equal)
            if parts != dv:
                partition_diagonal = sbuf((parts, parts), FP32)
                nisa.iota(dst=partition_diagonal, pattern=[[-1, parts]], offset=0, channel_multiplier=1)
                _against(self.partition_identity, partition_diagonal, zero, nl.equal)

        self._selections: Callable[[], None] | None = selections
        if not defer:
            self.finish()

    def finish(self) -> None:
        """Issue the selection and identity tiles (``select``, ``pick``, ``identity``, ``value_identity``,
        ``partition_identity``) if not yet issued: with ``defer``, the caller issues them after the first requests'
        row loads (``pipeline.emit_requests``), which wait on GpSimd's ``scalar_load``s, and before any use."""
        if self._selections is not None:
            self._selections()
            self._selections = None


@dataclass(frozen=True)
class BlockOperands:
    """One token's operands for the tiles of one block (``tiles_per_block`` tiles, their H heads each).

    Attributes:
        stationaries: [P, rows, tiles, 3, H]: the signed, head-masked selection products; planes 0 and 1 of
            [:, lo, t] are tile t's [P, 2H] recall/read stationary for dk_lo = lo, plane 2 the masked keys.
        keys: [P, rows, tiles]: the key entry k[dk_hi(p)·rows + lo] of partition p's head, a per-partition scalar.
        alpha: [P, tiles]: α of partition p's head.
        value_pick: [block, tiles, 2, H]: value_pick[h, t, i, h'] = [h = t·H + h'] · (β_h, c β_h)[i].
        values: [block, Dv] fp32: the block's value rows.
    """

    stationaries: Any
    keys: Any
    alpha: Any
    value_pick: Any
    values: Any


def block_operands(
    layout: TileLayout, consts: LayoutConstants, columns: Any, gates: tuple[Any, Any, Any], values: Any, h0: int
) -> Steps:
    """The operands (``BlockOperands``) of the block of heads ``h0 .. h0 + block`` for one token, in three
    dependency levels (a ``Steps`` generator).

    Args:
        columns: [Dk, tiles, 3, H] the token's recall, read and key columns (``decode.gate_operands``).
        gates: (α, β, c β), each [lanes, Hv] with every partition holding every head's value.
        values: [block, Dv] fp32, the block's value rows.

    Notes:
        ``rows`` selection matmuls (K = Dk, N = 3·block) and a handful of small instructions; nothing here
        depends on the state.
    """
    parts, rows, h, per_block = layout.partitions, layout.rows, layout.heads, layout.tiles_per_block
    block = layout.block_heads
    first = h0 // h
    alpha, beta, scaled_beta = gates
    moving = columns[:, first : first + per_block].reshape((layout.dk, per_block * PLANES * h))
    # Each row's selection product is masked into SBUF right after its matmul, so at most one of them is live in
    # PSUM: holding all ``rows`` of them to the next level (rows · T tokens · the requests in flight, 32 rows
    # at Dv = 16) overflowed PSUM's 16 KiB per partition at small head dims.
    masked = sbuf((parts, rows, per_block, PLANES, h), FP32)
    mask = consts.signed_mask.expand_dim(1).broadcast(1, per_block)
    for lo in range(rows):
        products = psum((parts, per_block * PLANES * h))
        matmul(consts.select[:, lo, :], moving, dst=products, stationary_onezero=True)
        nisa.tensor_tensor(dst=masked[:, lo], data1=products.reshape((parts, per_block, PLANES, h)), data2=mask,
                           op=nl.multiply)  # fmt: skip
    head_mask = consts.signed_mask[:, PLANES - 1, :].expand_dim(1).broadcast(1, per_block)
    alpha_heads = sbuf((parts, per_block, h), FP32)
    nisa.tensor_tensor(dst=alpha_heads, data1=alpha[0:parts, h0 : h0 + block].reshape((parts, per_block, h)),
                       data2=head_mask, op=nl.multiply, engine=GPSIMD)  # fmt: skip
    diagonals = []  # (β_h, c β_h) on partition h: the diagonal of the every-partition tiles
    for gate in (beta, scaled_beta):
        diagonal = sbuf((block, block), FP32)
        nisa.tensor_tensor(dst=diagonal, data1=gate[0:block, h0 : h0 + block], data2=consts.identity,
                           op=nl.multiply, engine=GPSIMD)  # fmt: skip
        diagonals.append(diagonal)
    yield
    alpha_p = sbuf((parts, per_block), FP32)
    nisa.tensor_reduce(dst=alpha_p, op=nl.add, data=alpha_heads, axis=2)
    factors = sbuf((block, 2), FP32)
    for i, diagonal in enumerate(diagonals):
        nisa.tensor_reduce(dst=factors[:, i : i + 1], op=nl.add, data=diagonal, axis=1)
    yield
    keys = sbuf((parts, rows, per_block), FP32)
    nisa.tensor_reduce(dst=keys, op=nl.add, data=masked[:, :, :, PLANES - 1, :], axis=3)
    value_pick = sbuf((block, per_block, 2, h), FP32)
    for i in range(2):
        nisa.tensor_scalar(dst=value_pick[:, :, i, :], data=consts.pick, op0=nl.multiply,
                           operand0=factors[:, i : i + 1], engine=SCALAR)  # fmt: skip
    yield
    return BlockOperands(stationaries=masked, keys=keys, alpha=alpha_p, value_pick=value_pick, values=values)


def tile_columns(layout: TileLayout, ops: BlockOperands, t: int, state: Any) -> Any:
    """One token's [u; o] of tile ``t`` of a block from its state before the token ([P, rows·Dv] fp32), as columns.

    Returns:
        [Dv, 2, H] fp32 in PSUM: [:, 0, h] the delta u of the tile's head h, [:, 1, h] its output.

    Notes:
        One matmul for [β v; c β v] and ``rows`` against the state, one PSUM accumulation group, each with the
        [P, Dv] state slice as the stationary and the [P, 2H] columns moving: the tensor engine's time goes by the
        moving free size (``nc_matmul``'s cost, nki-cpu's COST_MODEL.md item 1), 2H = 8 against Dv = 128, so each
        costs half of the other way round (the stationary's load, 64 columns' worth, then binds).
    """
    parts, dv, h = layout.partitions, layout.dv, layout.heads
    mixed = psum((dv, 2, h))
    matmul(ops.values, ops.value_pick[:, t].reshape((layout.block_heads, 2 * h)), dst=mixed)
    for lo in range(layout.rows):
        moving = ops.stationaries[:, lo, t, 0:2, :].reshape((parts, 2 * h))
        matmul(state[:, lo * dv : (lo + 1) * dv], moving, dst=mixed, accumulate=True)
    return mixed


def tile_update_from_columns(
    layout: TileLayout, consts: LayoutConstants, ops: BlockOperands, t: int, state: Any, mixed: Any, columns: Any
) -> None:
    """S ← α S + k uᵀ on tile ``t`` of a block (``state`` updated in place) from ``tile_columns``' [u; o].

    Args:
        columns: [Dv, 2, H] fp32 SBUF that receives ``mixed`` (the outputs are read from [:, 1, :] later).

    Notes:
        u reaches its heads' partitions in one 0/1 matmul: the stationary is u's columns broadcast over each
        head's G partitions ([Dv, H, G], stride 0: a stationary may be a broadcast view, ``nki.isa.nc_matmul``,
        SDK 2.33), the moving the [Dv, Dv] identity, so the product is u of partition p's head, [P, Dv], the
        transpose and the spread at once.
    """
    dv, g = layout.dv, layout.parts_per_head
    nisa.activation(dst=columns, op=nl.copy, data=mixed)
    spread = psum((layout.partitions, dv))
    heads = columns[:, 0, :].expand_dim(2).broadcast(2, g)
    matmul(heads, consts.value_identity, dst=spread, moving_onezero=True)
    # The rank-1 write of the last GPSIMD_ROWS Dk rows a partition runs on GpSimd (it reaches SBUF only, so the
    # scalar engine makes k·u there, and GpSimd decays and adds), the rest as the vector engine's scaled adds after
    # the scalar engine's decay: the vector engine alone bound the step at T > 1. The same roundings either way.
    alpha = ops.alpha[:, t : t + 1]
    on_vector = layout.rows - min(GPSIMD_ROWS, layout.rows - 1)
    by_vector, by_gpsimd = state[:, 0 : on_vector * dv], state[:, on_vector * dv :]
    if on_vector < layout.rows:  # first: it waits only for this token's products of the tile
        nisa.tensor_tensor(dst=by_gpsimd, data1=by_gpsimd, data2=alpha.broadcast(1, by_gpsimd.shape[1]),
                           op=nl.multiply, engine=GPSIMD)  # fmt: skip
    nisa.activation(dst=by_vector, op=nl.copy, data=by_vector, scale=alpha)
    written = []
    for lo in range(on_vector, layout.rows):
        product = sbuf((layout.partitions, dv), FP32)
        nisa.activation(dst=product, op=nl.copy, data=spread, scale=ops.keys[:, lo, t : t + 1])
        written.append(product)
    for lo in range(layout.rows):
        piece = state[:, lo * dv : (lo + 1) * dv]
        if lo < on_vector:
            nisa.scalar_tensor_tensor(dst=piece, data=spread, op0=nl.multiply, operand0=ops.keys[:, lo, t : t + 1],
                                      op1=nl.add, operand1=piece)  # fmt: skip
        else:
            nisa.tensor_tensor(dst=piece, data1=written[lo - on_vector], data2=piece, op=nl.add, engine=GPSIMD)


def column_outputs(layout: TileLayout, consts: LayoutConstants, outputs: Any) -> Any:
    """Every tile's outputs of one token, columns [Dv, tiles, H], as rows [Hv, Dv] fp32 in PSUM (row = value
    head) by one 0/1 matmul against the identity."""
    rows = psum((layout.value_heads, layout.dv))
    matmul(outputs, consts.value_identity, dst=rows, moving_onezero=True)
    return rows
