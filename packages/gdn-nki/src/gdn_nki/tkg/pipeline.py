"""The decode requests as a software pipeline: loads, preparation and steps of N requests, interleaved.

A request's state tiles and inputs are loaded ahead (``load_request``), its state-independent operands are issued
one dependency level at a time between the steps of the requests before it (``prepare_request``, ``lockstep``),
and its tiles are stepped token by token with the outputs and states stored (``finish_request``);
``emit_requests`` runs the three over a sequence of requests. The per-token math is ``recurrence``'s, the per-tile
math ``state_tiles``'.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..common.backend import nisa, nl
from ..common.lockstep import lockstep as run_side_by_side
from ..common.state_layout import decode_tile_pattern
from ..common.tiles import FP32, psum, sbuf
from .chunk import ChunkOperands, chunk_columns, chunk_deltas, chunk_write, prepare_chunk
from .recurrence import (
    Constants,
    Gates,
    OutputNorm,
    Shapes,
    copy_rows,
    gate_operands,
    gated_rms_norm,
    load_gates,
    load_keys,
    row_view,
    token_gates,
    token_keys,
)
from .state_tiles import (
    PSUM_BANK_FP32,
    Steps,
    block_operands,
    chunk_form_fits,
    column_outputs,
    tile_columns,
    tile_update_from_columns,
)

# Requests whose loads and preparation are under way while one is stepped: a preparation is a chain of about 15
# dependent instructions spread one level per step of the requests before it (8 steps a request at Qwen3-Next's
# heads, T = 1), and a request's state tiles are in SBUF from its loads to its stores (3 requests at a time).
PREPARED_AHEAD = 2
# The step of the next request after which a request's gated RMSNorm is issued: its outputs reach the norm's rows
# by an SBUF-to-SBUF DMA (a fixed latency of ~1.3 µs), which two tile steps cover, so the in-order vector engine
# does not wait on it.
WRITE_BEHIND = 2  # steps between a tile's deltas and its write (``finish_request``, chunk form)
NORM_AFTER_STEP = 2
# The engines that copy a V-major tile's transposes out of PSUM: a load's on the scalar engine, which the steps
# leave the least busy, a store's on the vector engine; at Qwen3-Next's heads the four choices span 28.6–28.8 µs
# (N = 1) and 164.7–165.1 µs (N = 8), this one 28.8 / 164.7 (bench_state_layout.py).
LOAD_TURN_ENGINE = nisa.scalar_engine
STORE_TURN_ENGINE = nisa.vector_engine
_DONE = object()


@dataclass(frozen=True)
class Request:
    """Where one request's state comes from and goes (``n``: the request, a trace-time int or an ``NkiScalar``):
    ``source`` / ``target`` HBM tensors of rows
    [.., Hv, Dk, Dv]; ``read_row`` a trace-time int or an NkiScalar; ``token_rows`` the row the state after
    each token is written to (None: only the final state, to ``final_row``); ``out_row`` the request's row of
    ``out`` (None: ``n``); ``zeros`` (row, ``zero_rows`` tile): zeros written to that row of ``out`` after the
    request's steps (the outputs of a padding request). A run-time row outside its tensor (one past its end: padding)
    makes every transfer addressed by it a no-op (``oob_mode.skip``): nothing read, nothing written."""

    n: Any
    source: Any
    target: Any
    read_row: Any
    final_row: Any = None
    token_rows: tuple[Any, ...] | None = None
    out_row: Any = None
    zeros: tuple[Any, Any] | None = None
    v_first: bool = False  # ``source`` / ``target`` rows are V-major [.., Hv, Dv, Dk] (``common.state_layout``)
    row_stride: int | None = None  # ``source`` / ``target`` are a strided pool's span (``common.pool_rows``)


def state_tile_pattern(layout: Any) -> list[list[int]]:
    """The access pattern of one K-major state tile within a pool row."""
    return decode_tile_pattern(layout.heads, layout.parts_per_head, layout.rows, layout.dv)


def load_state_tile(layout: Any, request: Request, tile: int) -> Any:
    """Issue the load of state tile ``tile`` of ``request``'s read row into SBUF: K-major, the tile itself
    ([partitions, free] fp32, ``state_tiles``' layout), one DMA, a run of rows·Dv fp32 a partition; V-major, the
    tile's heads as they lie in HBM ([Dv, H, Dk]: Dv on partitions, each head's Dk contiguous; one DMA, runs of
    Dk·4 bytes), which ``turn_state_tile`` makes the tile of.

    Element by element from HBM instead (``decode_tile_pattern``'s V-major twin) moves 4-byte runs: 98× the K-major
    step (PERFORMANCE.md, "V-major state pools").
    """
    within_row = tile * layout.partitions * layout.free
    if not request.v_first:
        state = sbuf((layout.partitions, layout.free), FP32)
        copy_rows(
            state,
            row_view(request.source, request.read_row, state_tile_pattern(layout), within_row, request.row_stride),
        )
        return state
    staged = sbuf((layout.dv, layout.heads, layout.dk), FP32)
    copy_rows(
        staged, row_view(request.source, request.read_row, _v_major_pattern(layout), within_row, request.row_stride)
    )
    return staged


def turn_state_tile(layout: Any, staged: Any, identities: Any) -> Any:
    """The state tile ([partitions, free] fp32) of a V-major tile's staged rows [Dv, H, Dk] (``load_state_tile``).

    Per dk_lo one transpose-mode matmul whose stationary is every head's columns dk_hi·rows + dk_lo ([Dv, H, G], a
    strided view) puts element (dv, dk) at partition h·G + dk_hi, column dv (``_turn``). Transpose mode passes
    fp32 through bit-exactly ("nki.isa.nc_matmul", SDK 2.33, ``is_transpose``: "bit-accurate", "2x faster fp32
    transposes"), so the tile is the K-major one bit for bit. ``finish_request`` turns a request's tiles when its
    steps begin, not at its loads (issued two requests ahead: the in-order tensor engine would wait on them before
    the steps between). The DMA engines' SBUF-to-SBUF ``dma_transpose`` did the same at ≤ 50 % of copy bandwidth:
    3.1× the K-major step (PERFORMANCE.md, "V-major state pools").

    Args:
        identities: the launch's ``LayoutConstants`` (its ``value_identity`` is the moving).
    """
    state = sbuf((layout.partitions, layout.free), FP32)
    columns = staged.reshape((layout.dv, layout.heads, layout.parts_per_head, layout.rows))
    rows = state.reshape((layout.partitions, layout.rows, layout.dv))
    _turn(lambda lo: columns[:, :, :, lo], identities.value_identity, lambda los: rows[:, los, :], layout.rows,
          LOAD_TURN_ENGINE)  # fmt: skip
    return state


def store_state_tile(layout: Any, request: Request, row: Any, tile: int, state: Any, identities: Any) -> None:
    """Write state tile ``tile`` to pool row ``row`` of ``request``'s target (``load_state_tile`` in reverse:
    V-major, per dk_lo one transpose-mode matmul of the tile's columns dk_lo ([P, Dv]) into [Dv, P], copied to the
    staging tile's (h, dk_hi·rows + dk_lo) columns, then one DMA in runs of Dk·4 bytes)."""
    within_row = tile * layout.partitions * layout.free
    if not request.v_first:
        copy_rows(row_view(request.target, row, state_tile_pattern(layout), within_row, request.row_stride), state)
        return
    staged = sbuf((layout.dv, layout.heads, layout.dk), FP32)
    columns = staged.reshape((layout.dv, layout.heads, layout.parts_per_head, layout.rows))
    rows = state.reshape((layout.partitions, layout.rows, layout.dv))
    _turn(lambda lo: rows[:, lo, :], identities.partition_identity,
          lambda los: columns[:, :, :, los].permute((0, 3, 1, 2)), layout.rows, STORE_TURN_ENGINE)  # fmt: skip
    copy_rows(row_view(request.target, row, _v_major_pattern(layout), within_row, request.row_stride), staged)


def _v_major_pattern(layout: Any) -> list[list[int]]:
    """A tile's H heads within a V-major pool row as they lie: [Dv, H, Dk], runs of Dk elements."""
    return [[layout.dk, layout.dv], [layout.dv * layout.dk, layout.heads], [1, layout.dk]]


def _turn(source: Callable[[int], Any], identity: Any, target: Callable[[slice], Any], rows: int, engine: Any) -> None:
    """``source(lo)`` [K, M...] transposed into slice lo of ``target`` for every dk_lo = lo < ``rows``: one
    transpose-mode matmul a lo (``identity`` [K, K] the moving) into a PSUM tile [M, lo's, K] of as many lo as one
    bank holds, each bank copied by ``engine`` to ``target(los)``, an [M, len(los), K...] view."""
    sample = source(0)
    width, height = sample.shape[0], sample.free_elems
    per_bank = max(1, min(rows, PSUM_BANK_FP32 // width))
    for first in range(0, rows, per_bank):
        los = range(first, min(rows, first + per_bank))
        turned = psum((height, len(los), width))
        for i, lo in enumerate(los):
            nisa.nc_matmul(dst=turned[:, i, :], stationary=source(lo), moving=identity, is_transpose=True)
        nisa.tensor_copy(dst=target(slice(los.start, los.stop)), src=turned, engine=engine)


@dataclass
class Loaded:
    """A request's transfers in flight: per token the q/k rows, gate tiles and each block's value rows; the state
    tiles in order (V-major: their staged rows, ``load_state_tile``); with an output norm, per token its z rows [Hv, Dv] fp32."""

    request: Request
    keys: list[Any]
    gates: list[tuple[Any, Any]]
    values: list[list[Any]]
    states: list[Any]
    z_rows: list[Any] | None = None


def load_request(shapes: Shapes, tensors: tuple[Any, Any, Any, Any], gates: Gates, consts: Constants,
                 request: Request, norm: OutputNorm | None = None) -> Loaded:  # fmt: skip
    """Issue every load of one request: its tokens' inputs first (small, needed first), then its state tiles, then
    (with ``norm``) its tokens' z rows, needed only once its outputs are made."""
    query, key, value, _ = tensors
    dv, hv, n, layout = shapes.dv, shapes.value_heads, request.n, consts.layout
    tokens = range(shapes.tokens)
    keys = [load_keys(shapes, query, key, n, t) for t in tokens]
    gate_tiles = [load_gates(shapes, gates, layout.lanes, n, t) for t in tokens]
    block = layout.block_heads
    values = []
    for h0 in range(0, hv, block):
        per_token = []
        for t in tokens:
            rows = sbuf((block, dv), FP32)
            copy_rows(rows, row_view(value, n, [[dv, block], [1, dv]], (t * hv + h0) * dv))
            per_token.append(rows)
        values.append(per_token)
    states = [load_state_tile(layout, request, tile) for tile in range(layout.tiles)]
    z_rows = None
    if norm is not None:
        z_rows = []
        for t in tokens:
            rows = sbuf((hv, dv), FP32)
            copy_rows(rows, row_view(norm.z, n, [[dv, hv], [1, dv]], t * hv * dv))
            z_rows.append(rows)
    return Loaded(request=request, keys=keys, gates=gate_tiles, values=values, states=states, z_rows=z_rows)


@dataclass
class Prepared:
    """A loaded request with every state-independent operand: ``operands[b][t]`` block b's ``BlockOperands``
    for token t."""

    loaded: Loaded
    operands: list[list[Any]]


def prepare_request(
    shapes: Shapes, gates: Gates, consts: Constants, loaded: Loaded, scale: float, l2norm: bool, into: deque[Any]
) -> Steps:
    """Issue a loaded request's operands (q/k, gates, the blocks' selection products), every token's in
    lockstep, one dependency level per step (``Steps``); appends the ``Prepared`` request to ``into``."""
    layout = consts.layout
    firsts = range(0, shapes.value_heads, layout.block_heads)

    def token(t: int) -> Steps:
        keys, gates_ = yield from lockstep([token_keys(shapes, loaded.keys[t], consts, scale, l2norm),
                                            token_gates(gates, consts, loaded.gates[t])])  # fmt: skip
        columns, scaled_beta = yield from gate_operands(shapes, keys, *gates_, consts)
        token_gates_ = (*gates_, scaled_beta)
        blocks = [block_operands(layout, consts.tiles, columns, token_gates_, loaded.values[b][t], h0)
                  for b, h0 in enumerate(firsts)]  # fmt: skip
        return (yield from lockstep(blocks))

    if uses_chunk_form(shapes, consts, loaded.request):
        blocks = yield from prepare_chunk(shapes, gates, consts, loaded, scale, l2norm)
        into.append(Prepared(loaded=loaded, operands=blocks))
        return
    per_token = yield from lockstep([token(t) for t in range(shapes.tokens)])
    operands = [[per_token[t][b] for t in range(shapes.tokens)] for b in range(len(firsts))]
    into.append(Prepared(loaded=loaded, operands=operands))


def uses_chunk_form(shapes: Shapes, consts: Constants, request: Request) -> bool:
    """A request verifies its T tokens in chunk form (``chunk``) when only its final state is kept and the shapes
    fit; else token by token."""
    return request.token_rows is None and chunk_form_fits(shapes.tokens, consts.layout)


def lockstep(steps: list[Steps]) -> Steps:
    """Run ``Steps`` generators side by side, one dependency level of each per level; returns their results in
    order (``lockstep.lockstep``, no step after the last level)."""
    return (yield from run_side_by_side(steps, yield_after_last=False))


def finish_request(
    shapes: Shapes, tensors: tuple[Any, Any, Any, Any], consts: Constants, prepared: Prepared,
    norm: OutputNorm | None = None, between: Callable[[], None] | None = None,
    earlier: list[Callable[[], None]] | None = None,
) -> list[Callable[[], None]]:  # fmt: skip
    """Advance every tile of a prepared request through its tokens (token by token, tile by tile), store the
    outputs, and store each tile after its last token (or after every token, with ``token_rows``).

    The products of the next (token, tile) step are issued before this step's update whenever they touch another
    tile, so the tensor engine does not wait on this step's PSUM evacuation (it issues in program order);
    ``between`` is called after every step (``emit_requests`` advances the next requests' preparations one
    dependency level), so the in-order engines interleave them with this request's steps.

    With ``norm`` every tile's outputs are gathered into one [Hv, Dv] tile per token, and the gated RMSNorm of
    all Hv rows and their store are returned as closures, for the caller to issue later (``earlier``: a previous
    request's, issued after this request's ``NORM_AFTER_STEP``-th step): one norm per token instead of one per tile
    (the vector engine's time goes by the free size, whatever the partitions), and no engine waits on the gather.
    """
    out = tensors[3]
    dv, hv, layout = shapes.dv, shapes.value_heads, consts.layout
    h, request, states = layout.heads, prepared.loaded.request, prepared.loaded.states
    if request.v_first:  # the staged V-major rows turned into tiles, all before the first products
        states = [turn_state_tile(layout, staged, consts.tiles) for staged in states]
    out_row = request.n if request.out_row is None else request.out_row
    per_block = layout.tiles_per_block
    chunked = isinstance(prepared.operands[0], ChunkOperands)
    # each token's [u; o] columns of every tile: [Dv, tiles, 2, H] a token, or [Dv, tiles, 2, T, H] in chunk form
    if chunked:
        collected = sbuf((dv, layout.tiles, 2, shapes.tokens, h), FP32)
        outputs_of = [collected[:, :, 1, t, :] for t in range(shapes.tokens)]
        steps = [(shapes.tokens - 1, tile) for tile in range(layout.tiles)]
    else:
        columns = [sbuf((dv, layout.tiles, 2, h), FP32) for _ in range(shapes.tokens)]
        outputs_of = [columns[t][:, :, 1, :] for t in range(shapes.tokens)]
        steps = [(t, tile) for t in range(shapes.tokens) for tile in range(layout.tiles)]
    steps_done = 0

    def products(step: tuple[int, int], between: Callable[[int], None] | None = None) -> Any:
        t, tile = step
        if chunked:
            ops = prepared.operands[tile // per_block]
            return chunk_columns(layout, consts.tiles, ops, tile % per_block, tile, states[tile], shapes.tokens,
                                 between)  # fmt: skip
        return tile_columns(layout, prepared.operands[tile // per_block][t], tile % per_block, states[tile])

    # V-major stores turn the tile on the in-order tensor engine: issued one step late, after the next step's
    # products, so those do not queue behind transposes waiting on this step's update (and before the tile's next
    # update, ``flush``): 28.8 µs at N = 1 against 32.8 µs at once and 29.5 µs two steps late.
    late: list[tuple[int, Callable[[], None]]] = []

    def store(row: Any, tile: int) -> None:
        late.append((tile, lambda: store_state_tile(layout, request, row, tile, states[tile], consts.tiles)))
        while len(late) > (1 if request.v_first else 0):
            late.pop(0)[1]()

    def flush(tile: int | None = None) -> None:  # the late stores (of ``tile``), before anything changes it
        for entry in [e for e in late if tile is None or e[0] == tile]:
            late.remove(entry)
            entry[1]()

    def stored(step: tuple[int, int]) -> None:  # the tile's state out, then the caller's work between steps
        nonlocal steps_done
        t, tile = step
        if request.token_rows is not None:
            store(request.token_rows[t], tile)
        elif t == shapes.tokens - 1:
            store(request.final_row, tile)
        if between is not None:
            between()
        steps_done += 1
        if earlier and steps_done == NORM_AFTER_STEP:
            for tail in earlier:
                tail()
            earlier.clear()

    def finish(step: tuple[int, int], mixed: Any) -> None:
        t, tile = step
        ops = prepared.operands[tile // per_block][t]
        flush(tile)
        tile_update_from_columns(layout, consts.tiles, ops, tile % per_block, states[tile], mixed, columns[t][:, tile])
        stored(step)

    if chunked:
        # Three stages a tile, one tile apart on the in-order tensor engine: products of tile k, the deltas of
        # tile k − 1 (their evacuation had tile k's products to land), the write of tile k − 2 (its deltas' had a
        # step too). Each tile is stepped once, so no stage waits on another tile's state.
        # Four stages a tile, one tile apart on the in-order tensor engine: products of tile k, the deltas of tile
        # k − 1 (their evacuation had tile k's products to land), the write of tile k − 3, its rows between tile
        # k's product matmuls (each waits out the accumulation latency of the one before it), its deltas turned two
        # steps before. Each tile is stepped once, so no stage waits on another tile's state.
        turning, written = None, deque()
        for step in [*steps, *([None] * (1 + WRITE_BEHIND))]:
            writing = written.popleft() if written and (len(written) >= WRITE_BEHIND or step is None) else None
            write_row = None
            if writing is not None:
                (_, tile), deltas = writing
                ops = prepared.operands[tile // per_block]

                def write_row(lo: int, ops: Any = ops, tile: int = tile, deltas: Any = deltas) -> None:
                    chunk_write(layout, ops, tile % per_block, states[tile], deltas, rows=(lo,))

            mixed = None if step is None else products(step, write_row)
            if writing is not None:
                if step is None:
                    for lo in range(layout.rows):
                        write_row(lo)
                stored(writing[0])
            if turning is not None:
                (_, tile), turned = turning
                written.append((turning[0], chunk_deltas(layout, consts.tiles, tile, turned, collected[:, tile, 1],
                                                         shapes.tokens)))  # fmt: skip
            turning = None if step is None else (step, mixed)
    else:
        pending = None
        for step in steps:
            if pending is not None and pending[0][1] == step[1]:
                finish(*pending)  # the same tile: its update must land before these products read it
                pending = None
            mixed = products(step)
            if pending is not None:
                finish(*pending)
            pending = (step, mixed)
        finish(*pending)
    flush()
    if earlier:  # a request of fewer steps than NORM_AFTER_STEP
        for tail in earlier:
            tail()
        earlier.clear()
    if request.zeros is not None:  # last: its row is computed while the steps run
        row, zeros = request.zeros
        copy_rows(row_view(out, row, [[zeros.shape[1], zeros.shape[0]], [1, zeros.shape[1]]], 0), zeros)

    def outputs(t: int) -> Callable[[], None]:
        def tail() -> None:
            rows = sbuf((hv, dv), FP32)
            nisa.activation(dst=rows, op=nl.copy, data=column_outputs(layout, consts.tiles, outputs_of[t]))
            if norm is not None:
                gated_rms_norm(shapes, rows, prepared.loaded.z_rows[t], consts)
            copy_rows(row_view(out, out_row, [[dv, hv], [1, dv]], t * hv * dv), rows)

        return tail

    return [outputs(t) for t in range(shapes.tokens)]


def emit_requests(
    shapes: Shapes,
    tensors: tuple[Any, Any, Any, Any],
    gates: Gates,
    consts: Constants,
    requests: Iterable[Request],
    scale: float,
    l2norm: bool,
    norm: OutputNorm | None = None,
) -> None:
    """Every request as a software pipeline: request n + ``PREPARED_AHEAD``'s loads are issued before request n's
    steps, and the preparations under way advance one dependency level after each of them (``finish_request``'s
    ``between``), so the DMA queues and the in-order engines reach the next requests while this one computes,
    and no engine waits on a preparation's chain of dependent instructions.

    Args:
        tensors: (query [N, T, Hk, Dk], key, value [N, T, Hv, Dv], out [N, T, Hv, Dv]) in HBM.
    """
    prepared: deque[Prepared] = deque()
    preparing: list[Steps] = []
    waiting = iter(requests)

    def start() -> None:  # the next request's loads, and its preparation queued
        request = next(waiting, None)
        if request is not None:
            loaded = load_request(shapes, tensors, gates, consts, request, norm)
            preparing.append(prepare_request(shapes, gates, consts, loaded, scale, l2norm, prepared))

    def advance() -> None:  # one level of every preparation under way
        for generator in list(preparing):
            if next(generator, _DONE) is _DONE:
                preparing.remove(generator)

    for _ in range(PREPARED_AHEAD):
        start()
    tails: list[Callable[[], None]] = []  # the previous request's output norms
    while preparing or prepared:
        while not prepared:
            advance()
        start()
        tails = finish_request(shapes, tensors, consts, prepared.popleft(), norm, advance, tails)
    for tail in tails:
        tail()
