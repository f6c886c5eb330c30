"""Every DMA between HBM and the stages' tiles: the gate rows, q/k/v of a run of chunks, a lane's initial state
and its final state.

A run's first token is an int, or a compiled loop's run-time scalar (``lanes``); both address the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..common import tiles
from ..common.backend import nisa, nl
from ..common.state_layout import is_v_major, load_head, store_head
from ..common.tiles import FP32
from .chunks import Chunk, Lane
from .state import State, column_blocks, state_tile


def load_gate_rows(g_log: Any, beta: Any, lane: Lane, start: Any, width: int) -> tuple:
    """DMA ``width`` chunks' g_log and β from token ``start`` (an int, or a compiled loop's run-time scalar) as
    rows (one row per chunk): the chunk-local cumsum then runs on the free axis."""
    chunk = lane.chunk
    tokens = nl.ds(start, width * chunk)
    g_rows = tiles.sbuf((width, chunk), FP32)
    nisa.dma_copy(dst=g_rows, src=g_log[lane.b, lane.h, tokens])
    beta_rows = tiles.sbuf((width, chunk), FP32)
    nisa.dma_copy(dst=beta_rows, src=beta[lane.b, lane.h, tokens])
    return g_rows, beta_rows


def load_chunks(lane: Lane, start: Any, width: int) -> list[Chunk]:
    """DMA ``width`` consecutive chunks of q and k from token ``start`` (an int, or a compiled loop's run-time
    scalar), transposed ([Dk, width·C]); the chunks get views. (v goes straight to the tile set: ``load_values``.)

    From a trace-time start, q and k are transposed on the way in from HBM, and the token-major key is a
    tensor-engine transpose of k_t (``chunk_operands``): its 256-byte token rows would make a second, token-major
    load ~2× slower per byte than the transposing one. A DMA transpose from a run-time start is not a documented
    form (nki-cpu README, rule ``indirect_transpose``), so from a compiled loop's start q and k are loaded
    token-major (``dma_copy`` documents dynamic start addresses) and transposed SBUF to SBUF by a second
    DMA, from a tile whose address is fixed (ISA ``dma_transpose``: src "a tile in HBM or SBUF", v2.33.0). The
    token-major key is then kept, so the tensor engine transposes nothing (faster than tensor-engine transposes of
    both loads).
    """
    c, dtype = lane.chunk, lane.dtype
    dk = lane.key.shape[3]
    if isinstance(start, int):
        tokens = nl.ds(start, width * c)
        q_t = tiles.sbuf((dk, width * c), dtype)
        nisa.dma_transpose(dst=q_t, src=lane.query[lane.b, lane.kh, tokens, :])
        k_t = tiles.sbuf((dk, width * c), dtype)
        nisa.dma_transpose(dst=k_t, src=lane.key[lane.b, lane.kh, tokens, :])
        return [
            Chunk(token=start + j * c, q_t=q_t[:, j * c : (j + 1) * c], k_t=k_t[:, j * c : (j + 1) * c])
            for j in range(width)
        ]
    query, key = (tiles.sbuf((c, width, dk), dtype) for _ in range(2))
    nisa.dma_copy(dst=query, src=_chunk_major(lane.query, lane.b, lane.kh, start, width, c))
    nisa.dma_copy(dst=key, src=_chunk_major(lane.key, lane.b, lane.kh, start, width, c))
    q_t, k_t = (tiles.sbuf((dk, width, c), dtype) for _ in range(2))  # [d, j, t]: chunk j's transposed tile
    nisa.dma_transpose(dst=q_t, src=query)
    nisa.dma_transpose(dst=k_t, src=key)
    return [Chunk(token=start + j * c, q_t=q_t[:, j, :], k_t=k_t[:, j, :], key=key[:, j, :]) for j in range(width)]


def load_values(lane: Lane, start: Any, width: int, dst: Any) -> None:
    """DMA ``width`` chunks of v from token ``start`` token-major into ``dst`` ([C, width, Dv], chunk j at free-axis
    position j): views of the tile set (``ChunkTiles.values``), where the transition stage reads them — v is
    read nowhere else."""
    nisa.dma_copy(dst=dst, src=_chunk_major(lane.value, lane.b, lane.h, start, width, lane.chunk))


def _chunk_major(tensor: Any, b: int, head: int, start: Any, width: int, chunk: int) -> Any:
    """View of row ``b``, head ``head`` of a token-major [B, H, S, D] HBM argument from token ``start`` as
    [chunk, width, D]: token t of chunk j at [t, j, :]. A run-time ``start`` is the access pattern's scalar offset,
    counted in rows of the S dimension (``indirect_dim=2``).

    ``.ap`` is called on the argument itself, never on an indexed view of it, with the (b, head) row's offset
    written out: the NKI pages disagree on what ``.ap`` on a view counts from — the ``NkiTensor.ap`` reference
    adds ``offset`` to the view's own offset and reads ``indirect_dim`` in the view's shape, the "NKI Access
    Patterns" deep dive interprets both against the underlying tensor — and on the argument itself both readings
    address the same bytes (docs/nki-sources.md §2.6; nki-cpu rule ``ap_scalar_offset_view``).
    """
    _, heads, seq_len, dim = tensor.shape
    row = (b * heads + head) * seq_len
    pattern = [[dim, chunk], [chunk * dim, width], [1, dim]]
    if isinstance(start, int):
        return tensor.ap(pattern=pattern, offset=(row + start) * dim)
    return tensor.ap(pattern=pattern, offset=row * dim, scalar_offset=start, indirect_dim=2)


def initial_state(recurrent_state: Any, lane: Lane, dst: State | None = None) -> State:
    """Load the lane's row of the caller's state (aliased in/out), or the zero state (nothing emitted).

    Into ``dst`` (a reused state tile), the zero state is written (memset) and the parts are made at once, so a
    compiled loop finds the same state tile, parts made, at the start of every iteration.
    """
    if dst is not None:
        if recurrent_state is None:
            nisa.memset(dst=dst.whole, value=0.0)
        else:
            load_head(dst.whole, recurrent_state[lane.state_row, lane.h, :, :])
        return _ready(dst)
    if recurrent_state is None:
        return State(None, operand_dtype=lane.dtype)
    view = recurrent_state[lane.state_row, lane.h, :, :]
    if is_v_major(view):
        state = state_tile(lane)
        load_head(state.whole, view)
        return state
    whole = nl.load(view, dtype=FP32)
    return State([whole[:, cols] for cols in column_blocks(whole.shape[1])], whole, lane.dtype)


def initial_state_from(load: Callable[[Any], None], lane: Lane, dst: State | None = None) -> State:
    """A lane's initial state written by ``load`` (given the [Dk, Dv] fp32 tile) into ``dst`` (a reused state tile,
    its parts made at once as ``initial_state`` does) or a fresh state tile."""
    if dst is not None:
        load(dst.whole)
        return _ready(dst)
    state = state_tile(lane)
    load(state.whole)
    return state


def _ready(dst: State) -> State:
    """A reused state tile just written, its parts made (what a compiled loop expects at every iteration)."""
    dst.written()
    for j in range(len(dst.blocks)):
        dst.parts(j)
    return dst


def store_state(final_state: Any, lane: Lane, state: State) -> None:
    """Write the lane's final state to its row of the caller's buffer (or the allocated output): one DMA (V-major: a
    transpose and a DMA, ``common.state_layout.store_head``)."""
    view = final_state[lane.state_row, lane.h, :, :]
    if is_v_major(view):
        store_head(view, state.whole)
    else:
        nl.store(view, state.whole)
