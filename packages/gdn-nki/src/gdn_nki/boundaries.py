"""Where the sequences of a bucketed launch start and end, on device: per-chunk tables built from the kernel's
device tensors (chunk boundaries, pool rows, checkpoint rows) by instructions, and what the chain does with them
at each chunk boundary (``bucket.gdn_cte_bucket``).

A bucket runs every value head as one lane over all of its chunks, as a dense launch with one batch row does. The
only sequence-dependent work is at chunk boundaries of the chain, and NKI 2.33 has no data-dependent branch
("NKI Scalar Values", SDK 2.33: a comparison of run-time scalars is traced but cannot be used), so both become
arithmetic and run-time addresses:

- at a sequence's first chunk the carried state is replaced by the pool row's state (or zero): the state after the
  chunk before is blended ``keep · h + init`` with ``keep`` 0 there and 1 elsewhere (exact: ``keep`` is 0 or 1, and
  ``init`` is zero wherever ``keep`` is 1). ``init`` comes from a copy of the named pool rows gathered per
  value head (``InitialStates``: slot N is zeros, for chunks where no sequence starts and for −1 rows), so
  no load of the chain reads the pool its stores write. The rows read are ``state_indices``, or ``read_indices``
  where a sequence starts from another row than the one it ends in (a prefix-cache hit: the cache's row is read,
  the request's own row written);
- after each chunk the state is stored by ONE DMA addressed at run time (a row read with ``nisa.scalar_load``):
  to the row of the sequence ending there, else to the row of a checkpoint taken there (one chunk holds at most one
  sequence's end and checkpoints); a last checkpoint that is its sequence's end is copied from that row once the
  head's chain is done (``ChunkBoundaries.lane_done``). A chunk with nothing to store addresses row P, one past the
  pool, and the DMA skips it (``oob_mode=nisa.oob_mode.skip``: ISA ``dma_copy`` v2.29.1–v2.33.0,
  ``nki.isa.oob_mode`` v2.29.1). The chain writes the state after a chunk into a tile of its own (``after``), the
  stores read it and the blend makes the next entry from it, so the chain never waits for a store.

Tables (chunk c of the bucket, c = 0..n, n = T / chunk; column n is past the last chunk and names nothing):

| table | shape | holds |
|---|---|---|
| ``start_slot`` | [1, n + 1] int32 | the slot of the sequence starting at chunk c (its gathered initial state); N where none starts or it has no row |
| ``store_row`` | [1, n + 1] int32 | the pool row the state after chunk c goes to: a sequence's end (with a row), else a checkpoint's; P where none |
| ``copy_row`` | [1, N] int32 | with checkpoints: the row a slot's final state is copied to when its last checkpoint is its end; P where none |
| ``keep`` | [Dk, n + 1] fp32 | 0 where a sequence with at least one chunk starts at chunk c, else 1 (on every partition) |

They are sums over the sequences (on partitions) of 0/1 comparisons of an iota against the boundaries, weighted by
``row − P`` (``slot − N``): a tensor-engine product with fp32 operands, exact for integers below 2²⁴. A zero-length sequence has
weight 0 (its state stays in its row, untouched); two sequences with chunks never start or end at the same chunk.

The kernel trusts the tables' inputs (as FlashInfer's and vLLM's kernels do); the host entry points check them
first (``gdn_ref.bucketed``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import tiles
from .backend import nisa, nl
from .tiles import FP32

INT32 = nl.int32
MAX_TABLE = 512  # columns of a table: the tensor engine's moving free size
FOUND_TILES = 4  # the checkpoint table's comparison tiles, written in turn (SBUF independent of K)


@dataclass
class ChunkBoundaries:
    """The per-chunk tables of a bucketed launch, the pool they address, and the tiles the chain writes the state
    after a chunk into (module docstring)."""

    pool: Any  # [P, Hv, Dk, Dv] fp32 @ HBM
    initial: InitialStates  # the named pool rows' states, gathered per value head
    start_slot: Any
    store_row: Any
    keep: Any
    # With checkpoints: per slot, the checkpoint row its final state is copied to once stored (``lane_done``)
    copy_row: Any = None
    # One [Dk, Dv] fp32 tile per position of a unit: the state after the chunk there, before the blend, which the
    # store DMAs read. Blending in place instead would make the blend (and the whole chain) wait for the stores.
    after: list[Any] = field(default_factory=list)

    def initial_state(self, h: int, dst: Any) -> None:
        """Load value head ``h`` of the state chunk 0's sequence starts from into ``dst`` ([Dk, Dv] fp32): the pool
        row, or zero."""
        self._load_initial(_column(self.start_slot, 0), h, dst)

    def load_next_initial(self, h: int, c: Any, dst: Any) -> None:
        """With the loads of chunk ``c`` (an int, or a compiled loop's run-time scalar): DMA value head ``h`` of
        the initial state a sequence starting at chunk c + 1 starts from (zeros where none does) into ``dst``
        ([Dk, Dv] fp32, the chunk's ``ChunkTiles.initial``), periods before the chain's blend reads it."""
        self._load_initial(_column(self.start_slot, c + 1), h, dst)

    def link(self, h: int, c: Any, last: bool, position: int, init: Any) -> BoundaryLink:
        """What the chain's link for chunk ``c`` (an int, or a compiled loop's run-time scalar) of value head ``h``,
        at ``position`` in its unit, does at the boundary after it: the rows its state is stored to (read now,
        ahead of the link), the blend with ``init`` (``load_next_initial``), applied per state block
        (``BoundaryLink``). ``last``: the lane's last chunk (no next chunk to start)."""
        stores = [nisa.scalar_load(_column(self.store_row, c))]
        if last:
            return BoundaryLink(self.pool, h, stores, None, None, None)
        after = self.after[position % len(self.after)]
        return BoundaryLink(self.pool, h, stores, _column(self.keep, c + 1), init, after)

    def lane_done(self, h: int) -> None:
        """After value head ``h``'s last link: copy the final state of each sequence whose last checkpoint is its
        end from its pool row to that checkpoint's row (skipped where ``copy_row`` names row P), so the chain
        stores each chunk's state once even where a checkpoint and an end coincide."""
        if self.copy_row is None:
            return
        dv = self.pool.shape[3]
        for i in range(self.copy_row.shape[1]):
            src = _pool_view(self.pool, nisa.scalar_load(self.initial.rows[:, i : i + 1]), h, slice(0, dv))
            dst = _pool_view(self.pool, nisa.scalar_load(self.copy_row[:, i : i + 1]), h, slice(0, dv))
            nisa.dma_copy(dst=dst, src=src, oob_mode=nisa.oob_mode.skip)

    def _load_initial(self, slot_entry: Any, h: int, dst: Any) -> None:
        """DMA value head ``h`` of the gathered initial state the table entry names (slot N: zeros) into ``dst``."""
        self.initial.gather(h)
        slot = nisa.scalar_load(slot_entry)
        nisa.dma_copy(dst=dst, src=_pool_view(self.initial.tensor, slot, h, slice(0, dst.shape[1])))


@dataclass
class BoundaryLink:
    """The boundary after one chunk: the rows its state goes to, the next chunk's ``keep`` column and initial
    state, and the tile the state after the chunk is written into (the last three None after a lane's last chunk:
    the state is written in place and only stored)."""

    pool: Any
    h: int
    rows: list[Any]
    keep: Any
    init: Any
    after: Any

    def after_chunk(self, block: Any, cols: slice) -> Any:
        """Where the link writes column block ``cols`` of the state after the chunk (``block``: the next chunk's
        entry state's block)."""
        return block if self.after is None else self.after[:, cols]

    def blend(self, after: Any, block: Any, cols: slice) -> None:
        """Make the next chunk's entry block ``block = keep · after + init`` from column block ``cols`` of the state
        after the chunk (``after``); nothing after a lane's last chunk."""
        if self.keep is not None:
            tiles.scale_add(block, after, self.keep, self.init[:, cols])

    def store(self, whole: Any) -> None:
        """Store the state after the chunk to each row, one DMA per row for the whole [Dk, Dv] state (skipped where
        the row is P); ``whole``: the state tile, read when the link wrote in place (a lane's last chunk)."""
        src = whole if self.after is None else self.after
        for row in self.rows:
            nisa.dma_copy(dst=_pool_view(self.pool, row, self.h, slice(0, src.shape[1])), src=src,
                          oob_mode=nisa.oob_mode.skip)  # fmt: skip


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
    positions: int = 1,
    read_indices: Any = None,
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
        positions (int): chunks per unit of the pipeline (the group size): one ``after`` tile each.
        read_indices (nl.NkiTensor): [N] int32 @ HBM, the pool row sequence i starts from when it is not the row
            its final state goes to (a prefix-cache hit resumes from a cache row it must not overwrite), −1 =
            zero; None: ``state_indices``.

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
    rows = _vector(state_indices, seqs, 0)
    has_row = _at_least_zero(rows)
    row_weight = _weight(rows, rows_total, has_row, live)
    reads = state_indices if read_indices is None else read_indices
    has_read = has_row if read_indices is None else _at_least_zero(_vector(read_indices, seqs, 0))
    slot = tiles.sbuf((seqs, 1), FP32)
    nisa.iota(dst=slot, pattern=[[0, 1]], offset=0, channel_multiplier=1)
    slot_weight = _weight(slot, seqs, has_read, live)

    ones = tiles.sbuf((seqs, dk), FP32)
    nisa.memset(dst=ones, value=1.0)
    live_rows = tiles.sbuf((seqs, dk), FP32)
    nisa.tensor_scalar(dst=live_rows, data=ones, op0=nl.multiply, operand0=live)
    started = tiles.psum((dk, width))
    nisa.nc_matmul(dst=started, stationary=live_rows, moving=starts)
    keep = tiles.sbuf((dk, width), FP32)
    nisa.tensor_scalar(dst=keep, data=started, op0=nl.multiply, operand0=-1.0, op1=nl.add, operand1=1.0)

    end_row = _sum_table(row_weight, ends, rows_total)
    copy_row = None
    if checkpoint_every:
        end_row, copy_row = _with_checkpoints(
            end_row, chunk_bounds, checkpoint_indices, seqs, width, rows_total, checkpoint_every, first, end,
            has_row, live,
        )  # fmt: skip
    dv = pool.shape[3]
    after = [tiles.sbuf((dk, dv), FP32) for _ in range(positions)]
    initial = _initial_states(pool, reads, seqs)
    return ChunkBoundaries(
        pool, initial, _sum_table(slot_weight, starts, seqs), end_row, keep, copy_row, after,
    )  # fmt: skip


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


def _at_least_zero(values: Any) -> Any:
    """0/1 per partition: ``values >= 0`` (a pool row, not −1)."""
    found = tiles.sbuf(tuple(values.shape), FP32)
    nisa.tensor_scalar(dst=found, data=values, op0=nl.greater_equal, operand0=0.0)
    return found


def _weight(values: Any, total: int, *flags: Any) -> Any:
    """Per sequence ``(value − total)`` where every 0/1 flag is 1, else 0 (so a table's sum plus ``total`` is the
    value, or ``total``)."""
    weight = tiles.sbuf(tuple(values.shape), FP32)
    nisa.tensor_scalar(dst=weight, data=values, op0=nl.subtract, operand0=float(total))
    for flag in flags:
        nisa.tensor_tensor(dst=weight, data1=weight, data2=flag, op=nl.multiply)
    return weight


@dataclass
class InitialStates:
    """[N + 1, Hv, Dk, Dv] fp32 @ HBM: slot i holds pool row ``read_indices[i]`` (``state_indices`` when none) (not read for −1: the DMA skips
    the row outside the pool), slot N zeros; gathered one value head at a time (``gather``).

    The chain's loads read this copy and never the pool its stores write: a load and a store of the pool addressed
    at run time could be the same row for all the program can tell, and would be ordered one after the other on
    the chain's path. A head is gathered when its lane's first chunks are loaded, before any of its states is
    stored (the stores before it write other heads), one DMA per slot: the first lane waits for its own [Dk, Dv]
    states only, and no copy of a later head's sits in the DMA queues ahead of the first chunks' loads.
    """

    pool: Any
    rows: Any  # [1, N] int32 tile: the slots' pool rows
    tensor: Any
    zero: Any  # [Dk, Dv] fp32 zeros
    gathered: set[int] = field(default_factory=set)

    def gather(self, h: int) -> None:
        """Copy value heads ``h`` and ``h + 1`` of each slot's pool row, and zeros into slot N (once per head):
        the next lane's states a lane ahead, so its first chunk does not wait out a gather's latency."""
        for head in (h, h + 1):
            if head not in self.gathered and head < self.tensor.shape[1]:
                self._gather(head)

    def _gather(self, h: int) -> None:
        self.gathered.add(h)
        seqs, dv = self.rows.shape[1], self.zero.shape[1]
        nisa.dma_copy(dst=self.tensor[seqs, h, :, :], src=self.zero)
        for i in range(seqs):
            row = nisa.scalar_load(self.rows[:, i : i + 1])
            nisa.dma_copy(dst=self.tensor[i, h, :, :], src=_pool_view(self.pool, row, h, slice(0, dv)),
                          oob_mode=nisa.oob_mode.skip)  # fmt: skip


def _initial_states(pool: Any, read_indices: Any, seqs: int) -> InitialStates:
    """The launch's ``InitialStates``, nothing gathered yet."""
    _, heads, dk, dv = pool.shape
    tensor = nl.ndarray((seqs + 1, heads, dk, dv), dtype=FP32, buffer=nl.shared_hbm)
    zero = tiles.sbuf((dk, dv), FP32)
    nisa.memset(dst=zero, value=0.0)
    rows = tiles.sbuf((1, seqs), INT32)
    nisa.dma_copy(dst=rows, src=read_indices.ap(pattern=[[seqs, 1], [1, seqs]], offset=0))
    return InitialStates(pool, rows, tensor, zero)


def _sum_table(weight: Any, found: Any, total: int) -> Any:
    """[1, width] int32: ``total + Σ_i weight_i · found[i, c]``."""
    sums = tiles.psum((1, found.shape[1]))
    nisa.nc_matmul(dst=sums, stationary=weight, moving=found)
    table = tiles.sbuf((1, found.shape[1]), INT32)
    nisa.tensor_scalar(dst=table, data=sums, op0=nl.add, operand0=float(total))
    return table


def _with_checkpoints(
    end_row: Any,
    chunk_bounds: Any,
    checkpoint_indices: Any,
    seqs: int,
    width: int,
    rows_total: int,
    every: int,
    first: Any,
    end: Any,
    has_row: Any,
    live: Any,
) -> tuple[Any, Any]:
    """The store table with the checkpoints in it, and the per-slot rows a final state is copied to.

    Checkpoint k of sequence i follows chunk ``first_i + (k + 1)·every − 1``, when that chunk is the sequence's.
    One chunk holds at most one sequence's end and checkpoints, so each chunk stores its state to ONE row: the
    end's where there is one (and a state row), else the checkpoint's. Only where a sequence's last checkpoint is
    its end, with a state row, does the checkpoint need a second copy: ``copy_row[i]`` names it (else P), and
    ``ChunkBoundaries.lane_done`` copies the stored final state there, pool row to pool row, once per value head.

    The checkpoints' table is a sum over the sequences on partitions, one checkpoint index k at a time
    (accumulating in PSUM); the per-checkpoint columns are made for all k at once ([N, K] tiles) and the K
    comparisons are independent of each other, so the table is a few instructions deep whatever K (the first
    chain link reads it).

    Returns:
        ``([1, width] int32 store rows, [1, N] int32 copy rows)``.
    """
    per_seq = checkpoint_indices.shape[1]
    at = tiles.sbuf((seqs, per_seq), FP32)  # chunks done at checkpoint k: first + (k + 1)·every
    nisa.iota(dst=at, pattern=[[every, per_seq]], offset=every)
    nisa.tensor_scalar(dst=at, data=at, op0=nl.add, operand0=first)
    inside = tiles.sbuf((seqs, per_seq), FP32)
    nisa.tensor_scalar(dst=inside, data=at, op0=nl.less_equal, operand0=end)
    raw = tiles.sbuf((seqs, per_seq), INT32)
    nisa.dma_copy(dst=raw, src=checkpoint_indices)
    rows = tiles.sbuf((seqs, per_seq), FP32)
    nisa.tensor_copy(dst=rows, src=raw)
    weight = _weight(rows, rows_total, _at_least_zero(rows), inside)
    chunk_index = tiles.sbuf((seqs, width), FP32)
    nisa.iota(dst=chunk_index, pattern=[[1, width]], offset=1)  # c + 1: the chunks done after chunk c
    total = tiles.psum((1, width))
    found = [tiles.sbuf((seqs, width), FP32) for _ in range(min(per_seq, FOUND_TILES))]
    for k in range(per_seq):
        at_k = found[k % len(found)]
        nisa.tensor_scalar(dst=at_k, data=chunk_index, op0=nl.equal, operand0=at[:, k : k + 1])
        nisa.nc_matmul(dst=total, stationary=weight[:, k : k + 1], moving=at_k, accumulate=k > 0)
    # Where no end is stored (row P in end_row), the checkpoint's row: end_row + [end_row == P]·(Σ weights)
    no_end = tiles.sbuf((1, width), FP32)
    nisa.tensor_scalar(dst=no_end, data=end_row, op0=nl.equal, operand0=float(rows_total))
    checkpoint = tiles.sbuf((1, width), FP32)
    nisa.tensor_tensor(dst=checkpoint, data1=total, data2=no_end, op=nl.multiply)
    store_row = tiles.sbuf((1, width), INT32)
    nisa.tensor_tensor(dst=store_row, data1=checkpoint, data2=end_row, op=nl.add)

    # A last checkpoint at the end of a sequence with a state row: its weight (row − P), summed over k, per slot
    at_end = tiles.sbuf((seqs, per_seq), FP32)
    nisa.tensor_scalar(dst=at_end, data=at, op0=nl.equal, operand0=end)
    nisa.tensor_tensor(dst=at_end, data1=at_end, data2=weight, op=nl.multiply)
    copy_weight = tiles.sbuf((seqs, 1), FP32)
    nisa.tensor_reduce(dst=copy_weight, op=nl.add, data=at_end, axis=1)
    for flag in (has_row, live):
        nisa.tensor_tensor(dst=copy_weight, data1=copy_weight, data2=flag, op=nl.multiply)
    slot_index = tiles.sbuf((seqs, seqs), FP32)  # c − p: 0 on the diagonal
    nisa.iota(dst=slot_index, pattern=[[1, seqs]], offset=0, channel_multiplier=-1)
    identity = tiles.sbuf((seqs, seqs), FP32)
    nisa.tensor_scalar(dst=identity, data=slot_index, op0=nl.equal, operand0=0.0)
    return store_row, _sum_table(copy_weight, identity, rows_total)
