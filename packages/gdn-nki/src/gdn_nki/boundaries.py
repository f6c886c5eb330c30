"""Where the sequences of a bucketed launch start and end, on device: per-chunk tables built from the kernel's
device tensors (chunk boundaries, pool rows, checkpoint rows) by instructions, and what the chain does with them
at each chunk boundary (``bucket.gdn_cte_bucket``).

A bucket runs every value head as one lane over all of its chunks, as a dense launch with one batch row does. The
only sequence-dependent work is at chunk boundaries of the chain, and NKI 2.33 has no data-dependent branch
("NKI Scalar Values", SDK 2.33: a comparison of run-time scalars is traced but cannot be used), so both become
arithmetic and run-time addresses:

- at a sequence's first chunk the carried state is replaced by the pool row's state (or zero): the state after the
  chunk before is blended ``keep · h + init`` with ``keep`` 0 there and 1 elsewhere (exact: ``keep`` is 0 or 1, and
  ``init`` is zero wherever ``keep`` is 1);
- after a sequence's last chunk (and after each checkpoint's chunk) the state is stored to its pool row by a DMA
  addressed at run time (a row read with ``nisa.scalar_load``); a chunk with nothing to store addresses row P, one
  past the pool, and the DMA skips it (``oob_mode=nisa.oob_mode.skip``: ISA ``dma_copy`` v2.29.1–v2.33.0,
  ``nki.isa.oob_mode`` v2.29.1). The initial state is loaded the same way into a zeroed tile, so a sequence with
  no row (−1) starts from zero.

Tables (chunk c of the bucket, c = 0..n, n = T / chunk; column n is past the last chunk and names nothing):

| table | shape | holds |
|---|---|---|
| ``start_row`` | [1, n + 1] int32 | the pool row the sequence starting at chunk c starts from; P where none starts or it has no row |
| ``end_row`` | [1, n + 1] int32 | the pool row the state after chunk c goes to (a sequence's end); P where none |
| ``checkpoint_row`` | [1, n + 1] int32 | the pool row of the checkpoint after chunk c; P where none (only with checkpoints) |
| ``keep`` | [Dk, n + 1] fp32 | 0 where a sequence with at least one chunk starts at chunk c, else 1 (on every partition) |

They are sums over the sequences (on partitions) of 0/1 comparisons of an iota against the boundaries, weighted by
``row − P``: a tensor-engine product with fp32 operands, exact for integers below 2²⁴. A zero-length sequence has
weight 0 (its state stays in its row, untouched); two sequences with chunks never start or end at the same chunk.

The kernel trusts the tables' inputs (as FlashInfer's and vLLM's kernels do); the host entry points check them
first (``gdn_ref.packed``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import tiles
from .backend import nisa, nl
from .tiles import FP32

INT32 = nl.int32
MAX_TABLE = 512  # columns of a table: the tensor engine's moving free size


@dataclass
class ChunkBoundaries:
    """The per-chunk tables of a bucketed launch and the pool they address (module docstring)."""

    pool: Any  # [P, Hv, Dk, Dv] fp32 @ HBM
    start_row: Any
    end_row: Any
    keep: Any
    checkpoint_row: Any = None

    def initial_state(self, h: int, dst: Any) -> None:
        """Load value head ``h`` of the state chunk 0's sequence starts from into ``dst`` ([Dk, Dv] fp32): the pool
        row, or zero."""
        self._load_row(_column(self.start_row, 0), h, dst)

    def link(self, h: int, c: Any, last: bool) -> BoundaryLink:
        """What the chain's link for chunk ``c`` (an int, or a compiled loop's run-time scalar) of value head ``h``
        does at the boundary after it: issued now (the rows and the next chunk's initial state load, ahead of the
        link so their latency hides behind it), applied per state block (``BoundaryLink.apply``). ``last``: the
        lane's last chunk (no next chunk to start)."""
        stores = [nisa.scalar_load(_column(self.end_row, c))]
        if self.checkpoint_row is not None:
            stores.append(nisa.scalar_load(_column(self.checkpoint_row, c)))
        if last:
            return BoundaryLink(self.pool, h, stores, None, None)
        dk, dv = self.pool.shape[2], self.pool.shape[3]
        init = tiles.sbuf((dk, dv), FP32)
        self._load_row(_column(self.start_row, c + 1), h, init)
        return BoundaryLink(self.pool, h, stores, _column(self.keep, c + 1), init)

    def _load_row(self, row_table: Any, h: int, dst: Any) -> None:
        """Zero ``dst``, then DMA value head ``h`` of the pool row the table entry names (skipped when it names
        row P)."""
        nisa.memset(dst=dst, value=0.0)
        row = nisa.scalar_load(row_table)
        nisa.dma_copy(dst=dst, src=_pool_view(self.pool, row, h, slice(0, dst.shape[1])), oob_mode=nisa.oob_mode.skip)


@dataclass
class BoundaryLink:
    """The boundary after one chunk: the rows its state goes to, and the next chunk's ``keep`` column and
    initial state (None after a lane's last chunk)."""

    pool: Any
    h: int
    rows: list[Any]
    keep: Any
    init: Any

    def apply(self, block: Any, cols: slice) -> None:
        """Store column block ``cols`` of the state after the chunk to each row (skipped where it names row P),
        then make the block the next chunk's entry: ``keep · block + init`` in place."""
        for row in self.rows:
            nisa.dma_copy(dst=_pool_view(self.pool, row, self.h, cols), src=block, oob_mode=nisa.oob_mode.skip)
        if self.keep is not None:
            tiles.scale_add(block, block, self.keep, self.init[:, cols])


def _column(table: Any, c: Any) -> Any:
    """Column ``c`` of a table: a static slice, or a run-time ``nl.ds`` start on the free axis."""
    return table[:, c : c + 1] if isinstance(c, int) else table[:, nl.ds(c, 1)]


def _pool_view(pool: Any, row: Any, h: int, cols: slice) -> Any:
    """Columns ``cols`` of value head ``h`` of pool row ``row`` (a run-time scalar), [Dk, cols], on the pool itself
    (``.ap`` on an argument, never on a view: hbm._chunk_major says why)."""
    _, _, dk, dv = pool.shape
    pattern = [[dv, dk], [1, cols.stop - cols.start]]
    return pool.ap(pattern=pattern, offset=h * dk * dv + cols.start, scalar_offset=row, indirect_dim=0)


def build(
    chunk_bounds: Any,
    state_indices: Any,
    pool: Any,
    n_chunks: int,
    checkpoint_every: int = 0,
    checkpoint_indices: Any = None,
) -> ChunkBoundaries:
    """The tables of a bucket of ``n_chunks`` chunks from the kernel's device tensors.

    Args:
        chunk_bounds (nl.NkiTensor): [N + 1] int32 @ HBM, sequence i is chunks ``chunk_bounds[i] ..
            chunk_bounds[i + 1] − 1``; non-decreasing, from 0, at most ``n_chunks``.
        state_indices (nl.NkiTensor): [N] int32 @ HBM, pool row per sequence, −1 = none.
        pool (nl.NkiTensor): [P, Hv, Dk, Dv] fp32 @ HBM.
        n_chunks (int): chunks of the bucket.
        checkpoint_every (int): chunks between checkpoints (0: none).
        checkpoint_indices (nl.NkiTensor): [N, K] int32 @ HBM, pool row of checkpoint k (after ``(k + 1) ·
            checkpoint_every`` chunks of sequence i), −1 = none.

    Returns:
        ChunkBoundaries: the tables, in SBUF.
    """
    seqs = state_indices.shape[0]
    rows_total, dk = pool.shape[0], pool.shape[2]
    width = n_chunks + 1
    first = _vector(chunk_bounds, seqs, 0)
    end = _vector(chunk_bounds, seqs, 1)
    live = tiles.sbuf((seqs, 1), FP32)
    nisa.tensor_tensor(dst=live, data1=end, data2=first, op=nl.greater)
    chunk_index = tiles.sbuf((seqs, width), FP32)
    nisa.iota(dst=chunk_index, pattern=[[1, width]], offset=0)
    starts = _equal(chunk_index, first, 0.0)
    ends = _equal(chunk_index, end, 1.0)
    weight = _row_weight(_vector(state_indices, seqs, 0), live, rows_total)

    ones = tiles.sbuf((seqs, dk), FP32)
    nisa.memset(dst=ones, value=1.0)
    live_rows = tiles.sbuf((seqs, dk), FP32)
    nisa.tensor_scalar(dst=live_rows, data=ones, op0=nl.multiply, operand0=live)
    started = tiles.psum((dk, width))
    nisa.nc_matmul(dst=started, stationary=live_rows, moving=starts)
    keep = tiles.sbuf((dk, width), FP32)
    nisa.tensor_scalar(dst=keep, data=started, op0=nl.multiply, operand0=-1.0, op1=nl.add, operand1=1.0)

    checkpoint_row = None
    if checkpoint_every:
        checkpoint_row = _checkpoint_table(
            chunk_bounds, checkpoint_indices, seqs, width, rows_total, checkpoint_every, first, end
        )
    return ChunkBoundaries(
        pool, _row_table(weight, starts, rows_total), _row_table(weight, ends, rows_total), keep, checkpoint_row
    )


def _vector(tensor: Any, length: int, offset: int, stride: int = 1) -> Any:
    """Elements ``offset + i·stride`` (i < length) of an int32 HBM tensor (1-D, or a column of a row-major 2-D one)
    as an fp32 column [length, 1]."""
    raw = tiles.sbuf((length, 1), INT32)
    nisa.dma_copy(dst=raw, src=tensor.ap(pattern=[[stride, length], [1, 1]], offset=offset))
    column = tiles.sbuf((length, 1), FP32)
    nisa.tensor_copy(dst=column, src=raw)
    return column


def _equal(chunk_index: Any, bound: Any, shift: float) -> Any:
    """0/1 [N, width]: ``c + shift == bound_i``."""
    found = tiles.sbuf(tuple(chunk_index.shape), FP32)
    nisa.tensor_scalar(dst=found, data=chunk_index, op0=nl.add, operand0=shift, op1=nl.equal, operand1=bound)
    return found


def _row_weight(rows: Any, live: Any, rows_total: int) -> Any:
    """Per sequence ``(row − P)`` where it has a row and chunks, else 0 (so a table's sum plus P is the row, or P)."""
    has_row = tiles.sbuf(tuple(rows.shape), FP32)
    nisa.tensor_scalar(dst=has_row, data=rows, op0=nl.greater_equal, operand0=0.0)
    weight = tiles.sbuf(tuple(rows.shape), FP32)
    nisa.tensor_scalar(dst=weight, data=rows, op0=nl.subtract, operand0=float(rows_total))
    nisa.tensor_tensor(dst=weight, data1=weight, data2=has_row, op=nl.multiply)
    nisa.tensor_tensor(dst=weight, data1=weight, data2=live, op=nl.multiply)
    return weight


def _row_table(weight: Any, found: Any, rows_total: int) -> Any:
    """[1, width] int32: ``P + Σ_i weight_i · found[i, c]``."""
    total = tiles.psum((1, found.shape[1]))
    nisa.nc_matmul(dst=total, stationary=weight, moving=found)
    table = tiles.sbuf((1, found.shape[1]), INT32)
    nisa.tensor_scalar(dst=table, data=total, op0=nl.add, operand0=float(rows_total))
    return table


def _checkpoint_table(
    chunk_bounds: Any,
    checkpoint_indices: Any,
    seqs: int,
    width: int,
    rows_total: int,
    every: int,
    first: Any,
    end: Any,
) -> Any:
    """[1, width] int32: the pool row of the checkpoint taken after chunk c, else P.

    Checkpoint k of sequence i follows chunk ``first_i + (k + 1)·every − 1``, when that chunk is the sequence's;
    the sum runs over the sequences on partitions, one checkpoint index k at a time (accumulating in PSUM).
    """
    per_seq = checkpoint_indices.shape[1]
    total = tiles.psum((1, width))
    chunk_index = tiles.sbuf((seqs, width), FP32)
    nisa.iota(dst=chunk_index, pattern=[[1, width]], offset=1)  # c + 1: the chunks done after chunk c
    for k in range(per_seq):
        at = tiles.sbuf((seqs, 1), FP32)  # chunks done at checkpoint k: first + (k + 1)·every
        nisa.tensor_scalar(dst=at, data=first, op0=nl.add, operand0=float((k + 1) * every))
        inside = tiles.sbuf((seqs, 1), FP32)
        nisa.tensor_tensor(dst=inside, data1=end, data2=at, op=nl.greater_equal)
        found = tiles.sbuf((seqs, width), FP32)
        nisa.tensor_scalar(dst=found, data=chunk_index, op0=nl.equal, operand0=at)
        rows = _vector(checkpoint_indices, seqs, k, per_seq)
        weight = _row_weight(rows, inside, rows_total)
        nisa.nc_matmul(dst=total, stationary=weight, moving=found, accumulate=k > 0)
    table = tiles.sbuf((1, width), INT32)
    nisa.tensor_scalar(dst=table, data=total, op0=nl.add, operand0=float(rows_total))
    return table
