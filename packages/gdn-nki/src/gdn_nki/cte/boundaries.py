"""Where the sequences of a bucketed launch start and end, on device: per-chunk tables built from the kernel's
device tensors (chunk boundaries, pool rows, checkpoint rows) by instructions, and what the chain does with them
at each chunk boundary (``bucket.gdn_cte_bucket``).

A bucket runs every value head as one lane over all of its chunks, as a dense launch with one batch row does. The
only sequence-dependent work is at chunk boundaries of the chain, and NKI 2.33 has no data-dependent branch
("NKI Scalar Values", SDK 2.33: a comparison of run-time scalars is traced but cannot be used), so both become
arithmetic and run-time addresses:

- at a sequence's first chunk the carried state is replaced by the pool row's state, or zero. Each chunk's
  boundary tiles (``ChunkTiles.boundary``, [Dk, 3·w] fp32 for a state column block of width w) hold three states
  side by side: the state after the chunk (the chain writes it), the state a sequence starting after the chunk
  starts from (loaded with the unit) and zeros (set once). The next chunk reads its entry state at a run-time column offset, 0, w or 2·w for a block of
  width w (``entry_offset``; ``nl.ds`` on an SBUF operand, "NKI Scalar Values", SDK 2.33), so no instruction on the
  chain's path chooses between them. Only the state after a unit's last chunk is copied, from that offset into
  the fixed tile a compiled loop starts the next unit from (``lanes``' state ring). The initial states come from
  a copy of the named pool rows gathered per value head (``InitialStates``), so no load of the chain reads the
  pool its stores write; where no sequence with a row starts, the load names slot N, past the copy, and is
  skipped (``oob_mode.skip``): it moves nothing and the next chunk reads the carried state or the zeros. Each
  column block of the state (``state.column_blocks``) has a boundary tile of its own: an access at a run-time
  offset is ordered against its whole tile, and the two blocks are independent chains. The rows read are
  ``state_indices``, or ``read_indices`` where a sequence starts from another row than the one it ends in (a
  prefix-cache hit: the cache's row is read, the request's own row written);
- after each chunk the state is stored by one DMA per column block addressed at run time (a row read with
  ``nisa.scalar_load``): to the row of the sequence ending there, else to the row of a checkpoint taken there (one
  chunk holds at most one sequence's end and checkpoints). A last checkpoint that is its sequence's end is a second store
  of the same link, from SBUF (``end_copy_row``): a copy from the pool row the end went to would read, at a
  run-time address, what a DMA at a run-time address wrote, an order no page states. A chunk with
  nothing to store addresses row P, one past the pool, and the DMA skips it (``oob_mode=nisa.oob_mode.skip``: ISA
  ``dma_copy`` v2.29.1–v2.33.0, ``nki.isa.oob_mode`` v2.29.1). The stores read the first third of the boundary
  tiles, which only the chain writes, so the chain never waits for a store.

Tables (chunk c of the bucket, c = 0..n, n = T / chunk; column n is past the last chunk and names nothing):

| table | shape | holds |
|---|---|---|
| ``start_slot`` | [1, n + 1] int32 | the slot of the sequence starting at chunk c (its gathered initial state); N (skipped) where none starts or it has no row |
| ``store_row`` | [1, n + 1] int32 | the pool row the state after chunk c goes to: a sequence's end (with a row), else a checkpoint's; P where none |
| ``end_copy_row`` | [1, n + 1] int32 | with checkpoints: the row the state after chunk c is also stored to, where a sequence whose last checkpoint is its end ends; P where none |
| ``entry_offset`` | [1, n + 1] int32 | the third of the boundary tiles chunk c's entry state is: 0 (the carried state) where no sequence starts, 1 (the loaded one) where one with a row starts, 2 (zeros) where one without starts |

They are sums over the sequences (on partitions) of 0/1 comparisons of an iota against the boundaries, weighted by
``row − P`` (``slot − N``): a tensor-engine product with fp32 operands, exact for integers below 2²⁴. A zero-length sequence has
weight 0 (its state stays in its row, untouched); two sequences with chunks never start or end at the same chunk.

The kernel trusts the tables' inputs (as FlashInfer's and vLLM's kernels do); the host entry points check them
first (``gdn_ref.bucketed``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..common import engines, tiles
from ..common.backend import nisa, nl
from ..common.state_layout import head_columns, kmajor_shape, v_major_rows
from ..common.tiles import FP32
from .state import State

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
    entry_offset: Any
    # With checkpoints: [1, n + 1] int32, the second row the state after chunk c is stored to (a last checkpoint
    # at its sequence's end), P where none
    end_copy_row: Any = None
    # Inside a compiled loop's body (``open_window``): each table's columns around the iteration's chunk index, in
    # fixed tiles (by table id), and the first one's offset from that index
    window: dict[int, Any] | None = None
    window_start: int = 0
    v_first: bool = False  # the pool is V-major [P, Hv, Dv, Dk] (``common.state_layout``)

    def open_window(self, index: Any, start: int, stop: int) -> None:
        """Copy columns ``index + start .. index + stop − 1`` of every table (``index``: a compiled loop's
        run-time chunk index) into fixed [1, stop − start] tiles, once an iteration, so the iteration's scalar
        loads read fixed tiles at trace-time columns: ``scalar_load`` takes "a 1x1 tensor" (ISA ``scalar_load``,
        SDK 2.33) and no page says a view at a run-time offset is one (``tiles.load_scalar``). One copy per table
        and iteration instead of one per load."""
        self.window, self.window_start = {}, start
        for table in self._tables():
            fixed = tiles.sbuf((1, stop - start), INT32)
            nisa.tensor_copy(dst=fixed, src=table[:, nl.ds(index + start, stop - start)])
            self.window[id(table)] = fixed

    def close_window(self) -> None:
        """Leave the compiled loop's body: loads read the tables again."""
        self.window = None

    def _tables(self) -> list[Any]:
        return [t for t in (self.start_slot, self.store_row, self.entry_offset, self.end_copy_row) if t is not None]

    def _entry(self, table: Any, c: Any, static: int | None) -> Any:
        """Column ``c`` of a [1, ·] int32 table as an ``NkiScalar``: at a trace-time column, from the iteration's
        window (``static``: ``c`` less the iteration's chunk index), else through a fixed [1, 1] tile
        (``tiles.load_scalar``)."""
        if isinstance(c, int):
            return nisa.scalar_load(_column(table, c))
        if self.window is not None and static is not None:
            at = static - self.window_start
            return nisa.scalar_load(self.window[id(table)][:, at : at + 1])
        return tiles.load_scalar(_column(table, c), at_run_time=True)

    def initial_state(self, h: int, dst: Any) -> None:
        """Load value head ``h`` of the state chunk 0's sequence starts from into ``dst`` ([Dk, Dv] fp32): the pool
        row, or zero (set first; the load is skipped)."""
        nisa.memset(dst=dst, value=0.0)
        self._load_initial(self.start_slot, 0, None, h, dst)

    def load_next_initial(self, h: int, c: Any, dst: list[Any], static: int | None = None) -> None:
        """With the loads of chunk ``c`` (an int, or a compiled loop's run-time scalar): DMA value head ``h`` of
        the initial state a sequence starting at chunk c + 1 starts from into ``dst`` (the chunk's
        ``ChunkTiles.initial``, one [Dk, w] fp32 view per column block), periods before the next chunk reads it;
        skipped where no sequence with a row starts there (``entry_offset`` then points elsewhere)."""
        start = 0
        for block in dst:
            following = None if static is None else static + 1
            self._load_initial(self.start_slot, c + 1, following, h, block, slice(start, start + block.shape[1]))
            start += block.shape[1]

    def link(self, h: int, c: Any, last: bool, place: Any, unit_end: bool, static: int | None = None) -> BoundaryLink:
        """What the chain's link for chunk ``c`` (an int, or a compiled loop's run-time scalar) of value head ``h``
        does at the boundary after it (``BoundaryLink``): the rows its state is stored to and the next chunk's
        entry offset (both read now, ahead of the link), in the chunk's boundary tile (``place``: its
        ``ChunkTiles``); ``unit_end``: the entry is copied into the next unit's tile. ``last``: the lane's last
        chunk (no next chunk to start)."""
        stores = [self._entry(self.store_row, c, static)]
        if self.end_copy_row is not None:  # a last checkpoint at its sequence's end: a second store, from SBUF
            stores.append(self._entry(self.end_copy_row, c, static))
        if last:
            return BoundaryLink(self.pool, h, stores, v_first=self.v_first)
        offset = self._entry(self.entry_offset, c + 1, None if static is None else static + 1)
        return BoundaryLink(self.pool, h, stores, place.after, place.boundary, offset, unit_end, self.v_first)

    def _load_initial(
        self, table: Any, c: Any, static: int | None, h: int, dst: Any, cols: slice | None = None
    ) -> None:
        """DMA columns ``cols`` (all) of value head ``h`` of the gathered initial state that column ``c`` of the
        slot table names into ``dst`` (slot N, past the copy: skipped, ``dst`` unchanged)."""
        self.initial.gather(h)
        slot = self._entry(table, c, static)
        cols = slice(0, dst.shape[1]) if cols is None else cols
        nisa.dma_copy(dst=dst, src=head_columns(self.initial.tensor, slot, h, cols), oob_mode=nisa.oob_mode.skip)


@dataclass
class BoundaryLink:
    """The boundary after one chunk: the rows its state goes to, the views the state after the chunk is written
    into (``after``, per column block: the first third of the chunk's boundary tiles ``boundary``; None after a
    lane's last chunk, where the state is written in place and only stored), and the run-time column ``offset`` in
    each boundary tile of the next chunk's entry state, which a unit's last link (``unit_end``) copies into the
    next unit's entry tile."""

    pool: Any
    h: int
    rows: list[Any]
    after: list[Any] | None = None
    boundary: list[Any] | None = None
    offset: Any = None
    unit_end: bool = False
    v_first: bool = False

    @property
    def selects(self) -> bool:
        """The next chunk reads its entry state from the boundary tile itself, at the run-time offset."""
        return self.offset is not None and not self.unit_end

    def entry(self, j: int) -> Any:
        """Column block ``j`` of the next chunk's entry state: a view of its boundary tile at the offset (in units
        of the block's width)."""
        width = self.after[j].shape[1]
        return self.boundary[j][:, nl.ds(self.offset * width, width)]

    def entry_high_half(self, j: int) -> Any:
        """The bf16 high halves of ``entry(j)`` (``tiles.high_half``): the boundary tile reinterpreted and its
        upper halves taken first, the run-time column offset applied last — ``NkiTensor.view`` is "Not supported
        after dynamic / vector select" (SDK 2.31-2.32), and truncation commutes with the select."""
        width = self.after[j].shape[1]
        return tiles.high_half(self.boundary[j])[:, nl.ds(self.offset * width, width)]

    def entry_state(self, dtype: Any, tiles_of: State | None) -> State:
        """The next chunk's entry state as views of the boundary tiles at the run-time offset, one per column block
        (with bf16 compute, their high halves too: ``entry_high_half``); its parts and decayed copies made in
        ``tiles_of``'s tiles (a compiled loop's ring tile), else fresh ones."""
        blocks = [self.entry(j) for j in range(len(self.after))]
        high = [self.entry_high_half(j) for j in range(len(self.after))] if dtype != FP32 else None
        if tiles_of is None:
            return State(blocks, None, dtype, high=high)
        tiles_of.written()
        return State(blocks, None, dtype, lo=tiles_of.lo, decayed_tiles=tiles_of.decayed_tiles, high=high)

    def after_chunk(self, block: Any, j: int) -> Any:
        """Where the link writes column block ``j`` of the state after the chunk (``block``: the next chunk's entry
        state's block)."""
        return block if self.after is None else self.after[j]

    def finish(self, block: Any, j: int) -> None:
        """At a unit's end, copy column block ``j`` of the next chunk's entry state into ``block`` (the next unit's
        entry tile); nothing otherwise."""
        if self.unit_end and self.offset is not None:
            tiles.copy_to(block, self.entry(j), engine=engines.VECTOR)

    def store(self, whole: Any) -> None:
        """Store the state after the chunk to each row (skipped where the row is P): one DMA per column block, or
        one for the whole [Dk, Dv] ``whole``, the state tile the link wrote in place (a lane's last chunk)."""
        sources = [whole] if self.after is None else self.after
        if self.v_first:  # each block transposed once (SBUF to SBUF), stored to every row as [w, Dk] rows
            sources = [_transposed(src) for src in sources]
        for row in self.rows:
            start = 0
            for src in sources:
                width = src.shape[0] if self.v_first else src.shape[1]
                cols = slice(start, start + width)
                dst = (
                    v_major_rows(self.pool, row, self.h, cols)
                    if self.v_first
                    else head_columns(self.pool, row, self.h, cols)
                )
                nisa.dma_copy(dst=dst, src=src, oob_mode=nisa.oob_mode.skip)
                start = cols.stop


def _column(table: Any, c: Any) -> Any:
    """Column ``c`` of a table: a static slice, or a run-time ``nl.ds`` start on the free axis."""
    return table[:, c : c + 1] if isinstance(c, int) else table[:, nl.ds(c, 1)]


def build(
    chunk_bounds: Any,
    state_indices: Any,
    pool: Any,
    n_chunks: int,
    checkpoint_every: int = 0,
    checkpoint_indices: Any = None,
    read_indices: Any = None,
    v_first: bool = False,
) -> ChunkBoundaries:
    """The tables of a bucket of ``n_chunks`` chunks from the kernel's device tensors.

    Args:
        chunk_bounds (nl.NkiTensor): [N + 1] int32 @ HBM, sequence i is chunks ``chunk_bounds[i] ..
            chunk_bounds[i + 1] − 1``; non-decreasing, from 0, at most ``n_chunks``.
        state_indices (nl.NkiTensor): [N] int32 @ HBM, pool row per sequence, −1 = none.
        pool (PoolRows): [P, Hv, Dk, Dv] fp32 @ HBM, or [P, Hv, Dv, Dk] with ``v_first`` (``common.pool_rows``:
            the pool, or a row-strided pool's span).
        n_chunks (int): chunks of the bucket.
        checkpoint_every (int): chunks between checkpoints (0: none).
        checkpoint_indices (nl.NkiTensor): [N, K] int32 @ HBM, pool row of checkpoint k (after ``(k + 1) ·
            checkpoint_every`` chunks of sequence i), −1 = none.
        read_indices (nl.NkiTensor): [N] int32 @ HBM, the pool row sequence i starts from when it is not the row
            its final state goes to (a prefix-cache hit resumes from a cache row it must not overwrite), −1 =
            zero; None: ``state_indices``.
        v_first (bool): the pool is V-major (``common.state_layout``): its rows are read and written in that
            layout; the gathered initial states and the chain's tiles are K-major.

    Returns:
        ChunkBoundaries: the tables, in SBUF.
    """
    seqs = state_indices.shape[0]
    rows_total = pool.view.shape[0]
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
    # A live sequence's entry third: 2 − has_read, the loaded state (1) or the zeros (2)
    offset_weight = tiles.sbuf((seqs, 1), FP32)
    nisa.tensor_scalar(dst=offset_weight, data=has_read, op0=nl.multiply, operand0=-1.0, op1=nl.add, operand1=2.0)
    nisa.tensor_tensor(dst=offset_weight, data1=offset_weight, data2=live, op=nl.multiply)

    end_row = _sum_table(row_weight, ends, rows_total)
    end_copy_row = None
    if checkpoint_every:
        end_row, end_copy_row = _with_checkpoints(
            end_row, checkpoint_indices, seqs, width, rows_total, checkpoint_every, first, end, ends, has_row, live
        )
    initial = _initial_states(pool, reads, seqs, v_first)
    return ChunkBoundaries(
        pool, initial, _sum_table(slot_weight, starts, seqs), end_row, _sum_table(offset_weight, starts, 0),
        end_copy_row, v_first=v_first,
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
    """[N, Hv, Dk, Dv] fp32 @ HBM: slot i holds pool row ``read_indices[i]`` (``state_indices`` when none; not read
    for −1: the DMA skips the row outside the pool); gathered one value head at a time (``gather``).

    The chain's loads read this copy and never the pool its stores write: a load and a store of the pool addressed
    at run time could be the same row for all the program can tell, and would be ordered one after the other on
    the chain's path. A head is gathered when its lane's first chunks are loaded, before any of its states is
    stored (the stores before it write other heads), one DMA per slot: the first lane waits for its own [Dk, Dv]
    states only, and no copy of a later head's sits in the DMA queues ahead of the first chunks' loads.

    Ordering this relies on and no page states (the end-checkpoint copy's question, issue 40 item 3): the chain's
    load of slot ``i`` reads this tensor at a run-time slot what the gather's DMA wrote at a trace-time address
    (read after write), and the gather reads pool row ``rows[i]`` at a run-time address before the chain's stores
    write the pool at run-time rows (write after read). nki-cpu orders DMAs whose resolved bytes overlap
    (COST_MODEL.md item 3), so both hold there; on hardware they hold if the compiler orders a run-time-addressed
    access against every access to its tensor. Not made explicit yet: gathering into SBUF instead would take
    N · Dv · 4 bytes per partition per head.
    """

    pool: Any
    rows: Any  # [1, N] int32 tile: the slots' pool rows
    tensor: Any
    gathered: set[int] = field(default_factory=set)
    v_first: bool = False  # the pool is V-major; ``tensor`` is K-major either way

    def gather(self, h: int) -> None:
        """Copy value heads ``h`` and ``h + 1`` of each slot's pool row (once per head): the next lane's states a
        lane ahead, so its first chunk does not wait out a gather's latency."""
        for head in (h, h + 1):
            if head not in self.gathered and head < self.tensor.shape[1]:
                self._gather(head)

    def _gather(self, h: int) -> None:
        self.gathered.add(h)
        seqs, dk, dv = self.rows.shape[1], self.tensor.shape[2], self.tensor.shape[3]
        for i in range(seqs):
            row = nisa.scalar_load(self.rows[:, i : i + 1])
            if not self.v_first:
                nisa.dma_copy(dst=self.tensor[i, h, :, :], src=head_columns(self.pool, row, h, slice(0, dv)),
                              oob_mode=nisa.oob_mode.skip)  # fmt: skip
                continue
            # V-major: the head's rows as they lie into SBUF (the run-time address on the copy), transposed there,
            # then into the K-major slot (a row outside the pool: nothing loaded, and its slot is never read)
            staged = tiles.sbuf((dv, dk), FP32)
            nisa.dma_copy(dst=staged, src=v_major_rows(self.pool, row, h, slice(0, dv)), oob_mode=nisa.oob_mode.skip)
            nisa.dma_copy(dst=self.tensor[i, h, :, :], src=_transposed(staged))


def _transposed(block: Any) -> Any:
    """[a, b] fp32 SBUF -> a new [b, a] SBUF tile by one ``dma_transpose`` (2-D, axes (1, 0), a trace-time
    address)."""
    rows, cols = block.shape
    out = tiles.sbuf((cols, rows), FP32)
    nisa.dma_transpose(dst=out, src=block)
    return out


def _initial_states(pool: Any, read_indices: Any, seqs: int, v_first: bool = False) -> InitialStates:
    """The launch's ``InitialStates`` (K-major whatever the pool's layout), nothing gathered yet."""
    _, heads, dk, dv = kmajor_shape(pool.view.shape, v_first)
    tensor = nl.ndarray((seqs, heads, dk, dv), dtype=FP32, buffer=nl.shared_hbm)
    return InitialStates(pool, _row_table(read_indices, seqs), tensor, v_first=v_first)


def _row_table(indices: Any, seqs: int) -> Any:
    """[1, N] int32 tile: an [N] int32 HBM tensor of pool rows on one partition (``nisa.scalar_load`` reads it)."""
    rows = tiles.sbuf((1, seqs), INT32)
    nisa.dma_copy(dst=rows, src=indices.ap(pattern=[[seqs, 1], [1, seqs]], offset=0))
    return rows


def _sum_table(weight: Any, found: Any, total: int) -> Any:
    """[1, width] int32: ``total + Σ_i weight_i · found[i, c]``."""
    sums = tiles.psum((1, found.shape[1]))
    nisa.nc_matmul(dst=sums, stationary=weight, moving=found)
    table = tiles.sbuf((1, found.shape[1]), INT32)
    nisa.tensor_scalar(dst=table, data=sums, op0=nl.add, operand0=float(total))
    return table


def _with_checkpoints(
    end_row: Any,
    checkpoint_indices: Any,
    seqs: int,
    width: int,
    rows_total: int,
    every: int,
    first: Any,
    end: Any,
    ends: Any,
    has_row: Any,
    live: Any,
) -> tuple[Any, Any]:
    """The store table with the checkpoints in it, and the per-chunk rows a final state is stored to as well.

    Checkpoint k of sequence i follows chunk ``first_i + (k + 1)·every − 1``, when that chunk is the sequence's.
    One chunk holds at most one sequence's end and checkpoints, so each chunk stores its state to ONE row: the
    end's where there is one (and a state row), else the checkpoint's. Only where a sequence's last checkpoint is
    its end, with a state row, does the checkpoint need a second store: ``end_copy_row[c]`` names its row at the
    chunk the sequence ends (else P), and the link stores the state after the chunk there too, from SBUF. Not a
    copy of the pool row the end was stored to once the chain is done: that copy would read, at a run-time address,
    what a DMA at a run-time address wrote, and no page says the two are ordered (docs/nki-sources.md §6.26).

    The checkpoints' table is a sum over the sequences on partitions, one checkpoint index k at a time
    (accumulating in PSUM); the per-checkpoint columns are made for all k at once ([N, K] tiles) and the K
    comparisons are independent of each other, so the table is a few instructions deep whatever K (the first
    chain link reads it).

    Returns:
        ``([1, width] int32 store rows, [1, width] int32 second store rows)``.
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
    return store_row, _sum_table(copy_weight, ends, rows_total)
