"""The block's in_proj stage: ``hidden @ W`` for each projection weight, token-major rows into HBM scratch.

hidden [M, E] (M = N·T tokens) is contracted over E on the partitions: hidden element e = p·KT + k (KT = E / 128)
sits on partition p of contraction step k, so a weight's 128 rows of step k are rows p·KT + k — each partition's
share of a column block is one contiguous run of the row (4 KiB for a 2048-column block of bf16), the run length
at which the DMA reaches its full rate (docs/nki-sources.md §4.4). hidden's transposed tiles come from one
token-major load and a PE transpose per step (a column load would move one element per descriptor).

Each matmul takes the [128, M-tile] hidden tile as the stationary operand and 512 weight columns as the moving one
(``nki.isa.nc_matmul``; 512 fp32 columns, one PSUM bank, are a matmul's largest moving free size:
docs/nki-sources.md §2.9), accumulating over the KT steps into one PSUM bank per 512 columns and token tile; a
column block keeps at most ``BANK_LIMIT_PER_BLOCK`` banks open, so two blocks in flight stay within the 8
accumulation groups PSUM holds (one per bank: docs/nki-sources.md §4.2).

Every projection's products stay in SBUF until every weight's loads are issued (``project_all``): a store waits on
its products and a DMA queue issues in order, so a store between weight loads would hold the loads behind it.
"""

from __future__ import annotations

from typing import Any

from ..common.backend import nisa, nl
from ..common.engines import SCALAR, VECTOR
from ..common.tiles import matmul, psum, sbuf

PARTITIONS = 128
DMA_QUEUES = 16  # a NeuronCore's DMA queues / engines (docs/nki-sources.md §4.4)
BANK_COLUMNS = 512  # fp32 columns of one PSUM bank: a matmul's largest moving free size
BANK_LIMIT_PER_BLOCK = 4  # two column blocks in flight: 8 PSUM banks, PSUM's accumulation groups


class HiddenTiles:
    """hidden [M, E] as stationary operands: per token tile (at most 128 tokens) a [128, KT, tokens] tile of
    hidden's dtype, partition p of step k holding element p·KT + k."""

    def __init__(self, hidden: Any):
        tokens, size = hidden.shape
        self.steps = size // PARTITIONS
        self.token_tiles: list[tuple[int, int, Any]] = []
        for m0 in range(0, tokens, PARTITIONS):
            count = min(PARTITIONS, tokens - m0)
            rows = sbuf((count, size), hidden.dtype)
            copy_by_rows(rows, hidden[m0 : m0 + count, :])
            tile = sbuf((PARTITIONS, self.steps, count), hidden.dtype)
            for k in range(self.steps):
                turned = psum((PARTITIONS, count), hidden.dtype)  # a PE transpose keeps its dtype
                nisa.nc_transpose(dst=turned, data=rows[:, k : size : self.steps], engine=nisa.tensor_engine)
                _evacuate(tile[:, k, :], turned, k)
            self.token_tiles.append((m0, count, tile))


class Projection:
    """``out [M, cols] = hidden @ weight`` (weight [E, cols] in hidden's dtype; out in any float dtype, rounded once
    from the fp32 PSUM sums), column block by column block: each block's weight DMAs, then its matmuls,
    evacuations and stores (the weight streams through SBUF: a block's tiles are free once its products are
    issued)."""

    def __init__(self, hidden: HiddenTiles, weight: Any, out: Any):
        self.hidden, self.weight, self.out = hidden, weight, out
        banks = max(1, BANK_LIMIT_PER_BLOCK // len(hidden.token_tiles))
        self.block = banks * BANK_COLUMNS
        self.starts = list(range(0, weight.shape[1], self.block))

    def apply(self) -> None:
        """Every block's weight loads and products, evacuated into one SBUF tile per token tile (``store`` writes
        them out: a store waits on its products, and a DMA queue issues in order, so a store issued between weight
        loads would hold the loads queued behind it)."""
        tiles = self.hidden.token_tiles
        self.results = results = [sbuf((count, self.weight.shape[1]), self.out.dtype) for _, count, _ in tiles]
        for c0 in self.starts:
            per_step = self._load_block(c0)
            width = self._width(c0)
            spans = [(b0, min(BANK_COLUMNS, width - b0)) for b0 in range(0, width, BANK_COLUMNS)]
            sums = [[psum((count, span)) for _, span in spans] for _, count, _ in tiles]
            for k, part in enumerate(per_step):
                for (_, _, tile), per_tile in zip(tiles, sums, strict=True):
                    for (b0, span), acc in zip(spans, per_tile, strict=True):
                        matmul(tile[:, k, :], part[:, b0 : b0 + span], dst=acc, accumulate=k > 0)
            del per_step  # the block's weight tiles are free
            # The last block's evacuations end on the scalar engine: the vector engine, whose in-order queue holds
            # the next stage's setup (the conv's row tables and masks) behind them, is free one evacuation sooner
            # (N = 8: 265.5 -> 265.2 µs; PERFORMANCE.md, "Fused decode block").
            last = c0 == self.starts[-1]
            for result, per_tile in zip(results, sums, strict=True):
                for i, ((b0, span), acc) in enumerate(zip(spans, per_tile, strict=True)):
                    _evacuate(result[:, c0 + b0 : c0 + b0 + span], acc, i + last)
            del sums  # the banks are free for the next block

    def store(self) -> None:
        """The products into ``out``."""
        for (m0, count, _), result in zip(self.hidden.token_tiles, self.results, strict=True):
            copy_by_rows(self.out[m0 : m0 + count, :], result)

    def _width(self, c0: int) -> int:
        return min(self.block, self.weight.shape[1] - c0)

    def _load_block(self, c0: int) -> list[Any]:
        """One tile per contraction step k: rows p·KT + k of the block's columns, one run per partition. A block
        that is the whole weight (b's and a's: Hv columns) loads every step in one DMA, whose run per partition is
        its KT consecutive rows (1 KiB at Qwen3-Next's 32 heads, where a step's row alone is 64 bytes)."""
        steps, columns, width = self.hidden.steps, self.weight.shape[1], self._width(c0)
        if width == columns:
            whole = sbuf((PARTITIONS, steps, width), self.weight.dtype)
            nisa.dma_copy(dst=whole, src=self.weight.ap(pattern=[[steps * columns, PARTITIONS], [1, steps * width]],
                                                        offset=0).reshape((PARTITIONS, steps, width)))  # fmt: skip
            return [whole[:, k, :] for k in range(steps)]
        per_step = []
        for k in range(steps):
            part = sbuf((PARTITIONS, width), self.weight.dtype)
            nisa.dma_copy(dst=part, src=self.weight.ap(pattern=[[steps * columns, PARTITIONS], [1, width]],
                                                       offset=k * columns + c0))  # fmt: skip
            per_step.append(part)
        return per_step


def project_all(hidden: HiddenTiles, pairs: list[tuple[Any, Any]]) -> None:
    """``out = hidden @ weight`` for each (weight, out) pair, every weight's loads and products first, then every
    store in the pairs' order (a DMA queue issues in order: the next stage's first DMAs, issued after the stores,
    queue behind the last pairs'). Pass the pair the next stage reads first: its products are made first, so its
    stores start once the last weight is in, and the next stage's DMAs queue behind the later pairs' stores,
    whose products end with the last weight's. Stored last pair first, the conv's first loads queued behind q|k|v's
    stores (267.6 against 265.5 µs at N = 8); q|k|v projected last, its stores waited on the launch's last
    products (N = 64, T = 4: 2,468.8 against 2,462.2 µs; PERFORMANCE.md, "Fused decode block")."""
    projections = [Projection(hidden, weight, out) for weight, out in pairs]
    for projection in projections:
        projection.apply()
    for projection in projections:
        projection.store()


def copy_by_rows(dst: Any, src: Any) -> None:
    """A copy between HBM rows and a tile of few partitions (the tokens), as up to ``DMA_QUEUES`` DMAs of
    consecutive rows: a transfer is served by one DMA engine per 8 partitions (docs/nki-sources.md §4.4), so a
    single DMA of 8 token rows would take one engine; pieces of whole rows, each on its own queue, take one each,
    and (unlike column pieces) their HBM extents are disjoint, so no piece is ordered after another."""
    rows = dst.shape[0]
    per_piece = -(-rows // DMA_QUEUES)
    for r0 in range(0, rows, per_piece):
        r1 = min(rows, r0 + per_piece)
        nisa.dma_copy(dst=dst[r0:r1, :], src=src[r0:r1, :])


def _evacuate(dst: Any, src: Any, i: int) -> None:
    """A PSUM tile into SBUF, alternating the scalar and vector engines (each PSUM reader), so two evacuations run
    side by side."""
    if i % 2:
        nisa.tensor_copy(dst=dst, src=src, engine=VECTOR)
    else:
        nisa.activation(dst=dst, op=nl.copy, data=src, engine=SCALAR)


def scratch(shape: tuple[int, ...], dtype: Any) -> Any:
    """An HBM tensor the block's stages hand each other."""
    return nl.ndarray(shape, dtype=dtype, buffer=nl.shared_hbm)
