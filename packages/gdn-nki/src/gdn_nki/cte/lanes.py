"""Emitting the work of all lanes as a software pipeline of periods, each lane's steady state one compiled loop,
and splitting lanes over an SPMD launch grid.

Vocabulary:

| name | what it is |
|---|---|
| ``Span`` (``plan.Span``) | one sequence of a launch: its token range in a batch row and its state row |
| ``Lane`` (``chunks.Lane``) | one (sequence, value head): what every stage of its chunks reads |
| unit | ``group_size`` consecutive chunks in lane order, the grain of the grouped inverse; it may span lanes |
| ``Segment`` | the chunks of one lane inside a unit |
| tile set | the tiles a unit's chunks keep between periods, one ``chunks.ChunkTiles`` per position in the unit |
| ``Work`` | one unit and its tile set, as a stage sees it |
| period | one round of issue: the stages of up to ``depth`` units, their steps interleaved (``run_period``) |
| depth | periods from a unit's operand stage to its chain: 3, or 2 when three tile sets do not fit |
| ``Pipeline`` | what the periods of a launch share: inputs, the engine balancer, tile sets, state rings |
| state ring | the state tiles a lane in a compiled loop writes in turn (``state_ring_order``) |
| ``SteadyState`` | periods of one lane that issue whole units of it: one ``nl.fori_loop`` |

Levels, outermost first: each program of the launch grid takes a contiguous share of the lanes
(``program_lanes``); a program's lanes are cut into units (``lane_units``); units are issued in periods
(``run_period``), in which the stages of different units advance together one step per round (``lockstep``); a
lane's steady-state periods are one compiled loop (``SteadyState``). The state a unit's chain leaves is handed to
the unit chained next (``hand_over``), as a value, not through shared state.

A unit passes through its stages in this order, each reading what the one before wrote into the unit's tile set.
Unit p's stage is issued in period p + offset:

| stage | what it computes | module | offset, depth 3 | offset, depth 2 |
|---|---|---|---|---|
| load | DMA of the gates, q, k and the initial state of each lane the unit starts | ``hbm`` | 0 | 0 |
| operands | v, the gate columns, per chunk the decays, Ãᵀ, attnᵀ, K_dec, diag(e^γ)K, (diag(e^γ)Q)ᵀ | ``operands`` | 0 | 0 |
| inverse | the grouped inverse (I + Ãᵀ)⁻¹ of the unit's chunks, latency bound | ``schur`` / ``neumann`` | 1 | 0 |
| transition | U, W and from them Tᵀ and Q_effᵀ | ``transition`` | 2 | 1 |
| chain | the state after each chunk, in order (and the state store at a lane's end) | ``chain`` | 2 | 1 |
| output | each chunk's out, issued with the next chunk's chain link | ``output`` | 2 | 1 |

Each engine executes its instructions in the order they are issued, so one unit's stages issued back to back
would leave the engines waiting on each dependency in turn; three units' independent stages side by side give
every engine work queued behind each wait: the inverse's latency-bound steps run beside the operand stage's
throughput-bound ones and the chain's links. Units p, p + 3, p + 6, … share a tile set, so a unit's tiles live
until its chain without any copy; a launch whose three sets would not fit in SBUF runs the two-stage form (the
operands and the inverse of unit p in one period, ``pipeline_depth``). Units run across lane boundaries too, so
short sequences with many lanes pipeline as well as long ones.

Every period issues the same steps in the same order, so ``depth`` consecutive periods of a lane's steady state
are one ``nl.fori_loop`` body (``run_lanes``): the program holds them once, whatever the sequence's length.
Only the order of instructions differs from a plain unit-by-unit loop, not the instructions or their operands'
values.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..common import engines
from ..common.backend import nl
from ..common.lockstep import lockstep
from ..common.loop_plan import loop_plan
from . import chain, hbm, operands, output, transition
from .chunks import Chunk, ChunkTiles, Lane, allocate_tile_sets, chunk_tiles_bytes
from .constant_tiles import Constants
from .plan import Span
from .state import State, state_tile

InvertGroup = Callable[[list[Chunk], Constants, Any], Iterator[None]]


def program_lanes(spans: list[Span], value_heads: int) -> list[tuple[Span, int]]:
    """The (sequence, value head) lanes this program owns: an even contiguous split of all lanes, sequence-major,
    over the launch grid."""
    programs, pid = nl.num_programs(axes=0), nl.program_id(axis=0)
    total = len(spans) * value_heads
    per_program = -(-total // programs)
    begin = pid * per_program
    lanes = [divmod(lane, value_heads) for lane in range(begin, min(total, begin + per_program))]
    return [(spans[s], h) for s, h in lanes]


@dataclass
class Segment:
    """Consecutive chunks of one lane inside a unit.

    Its chunks are the lane's chunks ``begin .. begin + width − 1``; its first token is ``lane.offset +
    begin·chunk``, or ``start`` when that is a compiled loop's run-time value.
    """

    lane: Lane
    begin: int
    width: int
    starts_lane: bool
    ends_lane: bool
    chunks: list[Chunk] = field(default_factory=list)  # the stage at hand's view of its chunks
    gate_rows: tuple = ()
    initial: State | None = None  # the lane's initial state, loaded with the unit that starts the lane
    entry: State | None = None  # the state the previous unit's chain left (``hand_over``), for the first segment
    start: Any = None
    first_chunk: Any = None  # with ``start``: the lane's chunk index of ``start`` (a bucket's boundary tables read it)
    # with ``first_chunk`` in a compiled loop's body: its offset from the iteration's chunk index (a trace-time int)
    chunk_offset: int | None = None

    @property
    def token(self) -> Any:
        """The segment's first token in q/k/v, the gates and out."""
        return self.start if self.start is not None else self.lane.offset + self.begin * self.lane.chunk

    def token_of(self, j: int) -> Any:
        """The first token of the segment's chunk j."""
        return self.token + j * self.lane.chunk

    def chunk_index(self, j: int) -> Any:
        """The index of the segment's chunk j among its batch row's chunks (an int, or a run-time scalar)."""
        if self.first_chunk is not None:
            return self.first_chunk + j
        return self.lane.offset // self.lane.chunk + self.begin + j

    def chunk_static(self, j: int) -> int | None:
        """In a compiled loop's body, chunk j's index less the iteration's (a trace-time int); else None."""
        return None if self.chunk_offset is None else self.chunk_offset + j


@dataclass
class LaneInputs:
    """The kernel arguments every unit reads besides its lane's tensors."""

    g_log: Any
    beta: Any
    recurrent_state: Any
    final_state: Any
    invert_group: InvertGroup
    # Constants the operand stage does not need (e.g. schur's merge planes), as a step generator: its first step
    # issues the loads, right after the first burst of unit loads so they do not delay the pipeline's start on the
    # DMA rings; the rest (on-chip work on what they loaded) is issued right before the first unit's inverse, which
    # reads it: behind the first unit's operands in every engine's queue, not ahead of it waiting on the DMAs.
    deferred_loads: Callable[[], Iterator[None]] | None = None
    # Rounds the operand stage sits out after its first phase (the inverse's choice: it depends on how its steps
    # line up with the operand stage's), so its later phases queue behind the inverse's and the chain's next steps
    # instead of ahead of them — those are latency-bound and bound the period, the operand stage has slack.
    operand_idle_rounds: int = 0
    # A bucketed launch's sequence boundaries (``boundaries.ChunkBoundaries``): initial states come from the pool
    # rows its tables name and every chain link stores and blends at the boundary after it; None: a lane is one
    # sequence (its initial state from ``recurrent_state``, its final state stored at its end).
    boundaries: Any = None


Unit = list[Segment]


def lane_units(lanes: list[Lane], group_size: int) -> list[Unit]:
    """Cut the chunks of all lanes, in lane order, into units of ``group_size`` chunks.

    A unit may span lanes: chunks are independent until the state chain, so short sequences over many lanes
    (one chunk each, say) still fill the grouped inverse. Every unit is full except the last.
    """
    units: list[Unit] = [[]]
    room = group_size
    for lane in lanes:
        n_chunks = lane.n_chunks
        begin = 0
        while begin < n_chunks:
            if room == 0:
                units.append([])
                room = group_size
            width = min(room, n_chunks - begin)
            units[-1].append(Segment(lane, begin, width, begin == 0, begin + width == n_chunks))
            begin += width
            room -= width
    return [unit for unit in units if unit]


PIPELINE_DEPTH = 3  # periods from a unit's operands to its chain: operands, inverse, transition and chain
# The compiler ends every compiled-loop iteration with a drain and a barrier across all engines, and the loop's entry
# and exit with one too ("NKI Dynamic Loops", SDK documentation sources, 03/31/2026; nki-cpu's ``loop_barrier_ns``,
# 3.97 µs): a loop of n iterations pays n + 1, each also draining the pipeline. The page's remedy is fewer, longer
# iterations, or no loop. A lane's program holds this many unit groups less a period of its steady periods (``depth``
# periods a group): a run that fits is unrolled whole (no barrier: one lane S = 8192, 121.4 -> 109.5 µs), a longer
# one loops over the body that leaves the fewest iterations with the body and the periods left over after whole
# iterations still within it (S = 32768: two iterations of five groups). Six groups is what the earlier rule (a body
# of up to three groups, up to a body's worth left over) already reached (PERFORMANCE.md, "Hardware loops").
STEADY_GROUPS = 6
# Per-partition SBUF bytes the tile sets may take (of 212,984): the rest holds the shared transition outputs, the
# loads and every stage's working tiles, which take at most ~70 KB at head dim 128 and group 16 in fp32.
TILE_SETS_BUDGET = 120 * 1024
# Per-partition SBUF bytes the two tile sets of the two-stage pipeline may take: beside them the rest needs ~70 KB
# at head dim 128 and group 16 in fp32, of 212,984. A bucketed launch, whose tile sets also hold the boundary
# tiles, runs a smaller group where its group's two sets would take more (``bucket_group``).
TWO_SETS_LIMIT = 140 * 1024


@dataclass
class Pipeline:
    """What one launch's periods share: the kernel's inputs, the launch's engine balancer, the tile sets (unit p's
    are ``tile_set(p)``) and the state rings of the lanes that run a compiled loop. The state the chain carries
    is not here: it passes from period to period as a value (``run_period``)."""

    inputs: LaneInputs
    balancer: engines.Balancer
    group_size: int
    tile_sets: list[list[ChunkTiles]]
    rings: dict[int, list[State]] = field(default_factory=dict)  # id(lane) -> its state tiles
    ring_order: list[int] = field(default_factory=list)  # which ring tile holds the state after chunk j of a unit
    deferred: Callable[[], Iterator[None]] | None = None
    before_inverse: Iterator[None] | None = None  # the deferred constants' on-chip work, until the first inverse

    @property
    def depth(self) -> int:
        """Periods from a unit's operands to its chain (one tile set per unit in flight)."""
        return len(self.tile_sets)

    def tile_set(self, unit_index: int) -> list[ChunkTiles]:
        """The tile set of the unit with this index (in the launch's order of units)."""
        return self.tile_sets[unit_index % self.depth]


@dataclass(frozen=True)
class Work:
    """One unit and its tile set, as one stage of a period sees it."""

    unit: Unit
    tiles: list[ChunkTiles]


def load(work: Work, pipe: Pipeline) -> None:
    """Issue the DMA loads the operand stage reads (gates, q, k) and the initial state of each lane the unit
    starts; give each chunk its place in the tile set (by position in the unit)."""
    inputs = pipe.inputs
    for seg, positions in _positions(work.unit):
        lane = seg.lane
        seg.gate_rows = hbm.load_gate_rows(inputs.g_log, inputs.beta, lane, seg.token, seg.width)
        seg.chunks = hbm.load_chunks(lane, seg.token, seg.width)
        for chunk, place in zip(seg.chunks, work.tiles[positions], strict=True):
            chunk.place = place
        if inputs.boundaries is not None:  # the state each chunk's successor may start from, loaded ahead
            for j, place in enumerate(work.tiles[positions]):
                inputs.boundaries.load_next_initial(lane.h, seg.chunk_index(j), place.initial, seg.chunk_static(j))
        if seg.starts_lane:
            ring = pipe.rings.get(id(lane))
            dst = ring[0] if ring else None
            if inputs.boundaries is not None:
                seg.initial = hbm.initial_state_from(
                    lambda tile, h=lane.h: inputs.boundaries.initial_state(h, tile), lane, dst
                )
            else:
                seg.initial = hbm.initial_state(inputs.recurrent_state, lane, dst)


def prepare_operands(work: Work, idle_rounds: int = 0) -> Iterator[None]:
    """The operand stage of a loaded unit, into its tile set: v loaded, the gate columns, every chunk's operands
    (phases in lockstep); yields between steps, and ``idle_rounds`` times more after the first operand phase
    (``LaneInputs.operand_idle_rounds``)."""
    tile_set = work.tiles
    gates = []
    for seg, positions in _positions(work.unit):
        hbm.load_values(seg.lane, seg.token, seg.width, tile_set[0].values[:, positions, :])
        gates.append(operands.gate_columns(*seg.gate_rows, dst=tile_set[0].gates[:, :, positions]))
        seg.gate_rows = ()  # the rows are dead once turned into columns
    yield
    per_chunk = [
        operands.chunk_operands(seg.lane, chunk, seg_gates, j)
        for seg, seg_gates in zip(work.unit, gates, strict=True)
        for j, chunk in enumerate(seg.chunks)
    ]
    for phase, _ in enumerate(lockstep(per_chunk)):
        yield
        if phase == 0:
            yield from range(idle_rounds)  # rounds in which the operand stage issues nothing
    for seg in work.unit:
        seg.chunks = []  # what later stages read is in the tile set


def invert(work: Work, pipe: Pipeline) -> Iterator[None]:
    """The grouped inverse of a unit from its tile set's Ãᵀ into its ``inverse_t``; yields between steps. The
    deferred constants' on-chip work (``LaneInputs.deferred_loads``) is issued first if it is still pending."""
    if pipe.before_inverse is not None:
        _finish(pipe.before_inverse)
        pipe.before_inverse = None
    width = sum(seg.width for seg in work.unit)
    chunks = [place.for_inverse(None) for place in work.tiles[:width]]
    lane = work.unit[0].lane  # constants and dtypes are the same for every lane of a launch
    yield from pipe.inputs.invert_group(chunks, lane.consts, lane.dtype)


def _positions(unit: Unit) -> Iterator[tuple[Segment, slice]]:
    """Each segment of a unit with the positions in the tile set its chunks take (segment k after segments
    0..k−1)."""
    position = 0
    for seg in unit:
        yield seg, slice(position, position + seg.width)
        position += seg.width


def transitions(work: Work) -> Iterator[None]:
    """The transition stage of an inverted unit (U, W, Tᵀ, Q_effᵀ) from its tile set into it; yields between
    steps.

    Issued in the period of the unit's chain, ahead of it (the same generator, ``transitions_and_chain``); its
    instructions interleave with the other units' steps instead of closing the period on their own.
    """
    for seg, positions in _positions(work.unit):
        seg.chunks = [place.for_transition(seg.token_of(j)) for j, place in enumerate(work.tiles[positions])]
    yield from lockstep([transition.chunk_transition(seg.lane, chunk) for seg in work.unit for chunk in seg.chunks])


def advance(
    unit: Unit, pipe: Pipeline, state: State | None, tile_set: list[ChunkTiles] | None = None
) -> Generator[None, None, State | None]:
    """The state chain of a unit's chunks in order, from ``state`` (the state after the previous unit's chain; a
    segment that starts its lane starts from the lane's initial state instead); returns the state after the
    unit's last chunk.

    Each chunk's output is issued with the NEXT chunk's state update (software-pipelined one chunk behind): its
    products alternate with that link's on the tensor engine and its evacuations follow the link's vector ops, so
    no output instruction sits between two links. The next chunk's e^{γ_last} goes with each link but a unit's last
    (``chain.advance_state``'s ``next_decay``). A lane with a state ring writes the state after chunk j to tile
    ``ring_order[j + 1]`` (every unit starts from tile 0).
    """
    final_state, boundaries = pipe.inputs.final_state, pipe.inputs.boundaries
    order = pipe.ring_order
    for seg, positions in _positions(unit):
        lane = seg.lane
        ring = pipe.rings.get(id(lane))
        if seg.starts_lane:
            state = seg.initial
            seg.initial = None
        pending = None
        last = len(seg.chunks) - 1
        # A bucket's boundary links, each reading its run-time rows and offset now: the scalar loads sit in their
        # engine's queue ahead of the chain's work, not between a link and the next chunk's first use of its state
        links = [
            boundaries.link(lane.h, seg.chunk_index(k), seg.ends_lane and k == last, tile_set[positions.start + k],
                            unit_end=k == last, static=seg.chunk_static(k))
            for k in range(len(seg.chunks))
        ] if boundaries is not None else [None] * len(seg.chunks)  # fmt: skip
        for k, chunk in enumerate(seg.chunks):
            entry = state
            final = seg.ends_lane and k == last
            dst = ring[order[k + 1]] if ring else None
            following = seg.chunks[k + 1] if k < last else None
            next_decay = following.decay_last if following is not None else None
            state = chain.advance_state(lane, chunk, entry, final, dst, next_decay, pending, links[k])
            pending = (chunk, entry)
            yield
        if seg.ends_lane and boundaries is None:  # the final state is ready before the last output: store it first
            hbm.store_state(final_state, lane, state)
        if pending is not None:
            output.emit_output(lane, *pending)
        seg.chunks = []
    if (
        unit[0].lane.norm is not None
    ):  # the fused norm's chunks in flight (``normed.output_stage``): none crosses a period
        unit[0].lane.norm.flush()
    return state


def transitions_and_chain(work: Work, pipe: Pipeline) -> Generator[None, None, State | None]:
    """An inverted unit's transition stage (``transitions``), then its state chain (``advance``) from the state
    handed to its first segment, as one step generator returning the state after the unit.

    The handed state is taken from the segment as the chain is set up, so nothing but the chain holds it: it is
    freed as soon as its last reader (the first chunk's output) is issued.
    """
    leading = work.unit[0]
    chain_steps = advance(work.unit, pipe, leading.entry, work.tiles)  # a generator: nothing is issued until it runs
    leading.entry = None
    yield from transitions(work)
    return (yield from chain_steps)


def _in_order(*steps: Iterator[None]) -> Iterator[None]:
    """One step generator running the given ones one after another."""
    for gen in steps:
        yield from gen


def run_period(pipe: Pipeline, newest: Work | None, middle: Work | None, oldest: Work | None) -> State | None:
    """One period of the pipeline: the loads and the operands of ``newest``, the inverse of ``middle`` and the
    transitions and the chain of ``oldest``, their steps interleaved round by round; returns the state the chain
    leaves (None when no unit chains).

    With ``depth`` 3 the three are consecutive units, so a unit's latency-bound inverse runs beside the next
    unit's throughput-bound operand stage and the previous unit's chain; with ``depth`` 2 ``middle`` is ``newest``,
    inverted right after its operands. Every period issues the same steps in the same order, whatever the units:
    that is what lets a lane's steady-state periods be one compiled loop body (``run_lanes``).
    """
    if newest is not None:
        load(newest, pipe)
    if pipe.deferred is not None:
        pipe.before_inverse = pipe.deferred()
        next(pipe.before_inverse, None)  # its loads
        pipe.deferred = None
    if newest is not None and middle is newest:
        steps = [_in_order(prepare_operands(newest, pipe.inputs.operand_idle_rounds), invert(newest, pipe))]
    else:
        # The chain first, then the inverse, then the operands, in every round: the latency-bound steps ahead of
        # the throughput-bound ones in every engine's queue (the fastest of the six orders, PERFORMANCE.md)
        steps = [invert(middle, pipe)] if middle is not None else []
        if newest is not None:
            steps.append(prepare_operands(newest, pipe.inputs.operand_idle_rounds))
    if oldest is not None:
        steps.insert(0, transitions_and_chain(oldest, pipe))
    results = _finish(lockstep(steps))
    return results[0] if oldest is not None else None


def _finish(steps: Generator[None, None, Any]) -> Any:
    """Run a step generator to its end; returns what it returns."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def period_work(units: list[Unit], p: int, pipe: Pipeline) -> tuple[Work | None, Work | None, Work | None]:
    """What period ``p`` issues: the operands of unit p, the inverse of unit p − depth + 2, the transitions and
    the chain of unit p − depth + 1 (None where there is no such unit)."""

    def work(index: int) -> Work | None:
        return Work(units[index], pipe.tile_set(index)) if 0 <= index < len(units) else None

    newest, oldest = work(p), work(p - pipe.depth + 1)
    middle = newest if pipe.depth == 2 else work(p - pipe.depth + 2)
    return newest, middle, oldest


@dataclass(frozen=True)
class SteadyState:
    """Periods ``first_period .. last_period`` (inclusive) of one lane, each issuing the stages of whole units of
    the lane: one compiled loop of ``(last_period − first_period + 1) / (depth · unroll)`` iterations of
    ``depth · unroll`` periods (``steady_states``)."""

    lane: Lane
    first_period: int
    last_period: int
    unroll: int = 1


def steady_states(
    units: list[Unit], group_size: int, depth: int = PIPELINE_DEPTH, steady_groups: int = 1
) -> list[SteadyState]:
    """The runs of periods that are one compiled loop each, as whole loop iterations of ``depth · u`` periods
    (``loop_plan``, the program holding at most ``depth · steady_groups − 1`` steady periods: a run that fits is
    not a loop).

    Period p (the operands of unit p, the chain of unit p − depth + 1) qualifies when units p − depth + 1 .. p are all
    one full segment of the same lane and the oldest starts at a unit boundary of the lane (its state then starts
    in tile 0 of the lane's ring, and so does every unit's chain: ``state_ring_order``). Lane starts and ends, units
    shared by lanes, the periods left over after whole iterations and the runs left unrolled stay unrolled.
    """
    if state_ring_order(group_size) is None:
        return []

    def whole(unit: Unit) -> Lane | None:
        return unit[0].lane if len(unit) == 1 and unit[0].width == group_size else None

    def steady(p: int) -> Lane | None:
        lane = whole(units[p - depth + 1])
        if lane is None or units[p - depth + 1][0].begin % group_size:
            return None
        return lane if all(whole(units[q]) is lane for q in range(p - depth + 2, p + 1)) else None

    found: list[SteadyState] = []
    p = depth - 1
    while p < len(units):
        lane = steady(p)
        if lane is None:
            p += 1
            continue
        last = p
        while last + 1 < len(units) and steady(last + 1) is lane:
            last += 1
        u = loop_plan(last - p + 1, depth, depth * steady_groups - 1)
        if u:
            iterations = (last - p + 1) // (depth * u)
            found.append(SteadyState(lane, p, p + iterations * depth * u - 1, u))
        p = last + 1
    return found


STATE_RING = 4  # state tiles per lane in a compiled loop


def state_ring_order(group_size: int) -> list[int] | None:
    """Which of ``STATE_RING`` tiles holds the state after each chunk of a unit (entry 0: before the first), from
    tile 0 back to tile 0, or None when there is no such order (``group_size`` 1 and 2).

    The chain writes the state after chunk j + 1 while the output of chunk j − 1, issued next, still reads the
    state before chunk j: three states are live at once, so each tile must differ from the two before it. Among
    the tiles allowed, the least recently written is taken (the longest time for its readers to finish).
    """

    def extend(order: list[int]) -> list[int] | None:
        if len(order) == group_size + 1:
            return order if order[-1] == 0 else None
        recent = order[-2:]
        candidates = [t for t in range(STATE_RING) if t not in recent]
        candidates.sort(key=lambda t: max((i for i, u in enumerate(order) if u == t), default=-1))
        for tile in candidates:
            found = extend([*order, tile])
            if found is not None:
                return found
        return None

    return extend([0]) if group_size > 2 else None


def run_lanes(lanes: list[Lane], group_size: int, inputs: LaneInputs, balancer: engines.Balancer) -> None:
    """Issue all units as a software pipeline of periods (``run_period``), each lane's steady state unrolled when
    the program can hold it (``STEADY_GROUPS``), else as one ``nl.fori_loop`` whose body is a whole number of
    ``depth``-period groups (``steady_states``).

    At most ``depth`` units are between their loads and their chain, each in its own tile set, so on-chip memory
    does not depend on the launch's length (``pipeline_depth``). The chain takes units strictly in order, so each
    lane's state passes from unit to unit as in a plain loop.

    The loop's iteration value is the token offset of the unit its first period loads (step: the body's units of
    tokens), so its HBM accesses need no other arithmetic; what crosses periods lives in tiles allocated before
    the loop (the tile sets and the lane's state ring); ``balancer`` (the launch's, the one the tile helpers
    consult) decides once for the body. The program therefore holds at most ``STEADY_GROUPS`` groups of each
    lane's steady state, whatever its length.
    """
    bucketed = inputs.boundaries is not None
    if bucketed and lanes:
        group_size = bucket_group(lanes[0], group_size)
    units = lane_units(lanes, group_size)
    if not units:
        return
    depth = pipeline_depth(lanes[0], group_size, bucketed)
    tile_sets = allocate_tile_sets(group_size, lanes[0], depth, initial=bucketed)
    pipe = Pipeline(inputs, balancer, group_size, tile_sets, deferred=inputs.deferred_loads)
    loops = {run.first_period: run for run in steady_states(units, group_size, depth, STEADY_GROUPS)}
    if loops:
        pipe.ring_order = state_ring_order(group_size) or []
        rings = [[state_tile(lanes[0], reused=True) for _ in range(STATE_RING)] for _ in range(2)]
        for run in loops.values():  # consecutive loop lanes alternate: one loads its state while one chains
            pipe.rings.setdefault(id(run.lane), rings[len(pipe.rings) % 2])
    p, periods = 0, len(units) + depth - 1
    while p < periods:
        run = loops.get(p)
        if run is None:
            hand_over(units, p - depth + 2, run_period(pipe, *period_work(units, p, pipe)))
            p += 1
            continue
        hand_over(units, run.last_period - depth + 2, _compiled_steady_state(pipe, run, units))
        p = run.last_period + 1
    if pipe.before_inverse is not None:  # a launch with nothing to invert
        _finish(pipe.before_inverse)


def hand_over(units: list[Unit], index: int, state: State | None) -> None:
    """Give the state a unit's chain left to the unit chained next (``units[index]``), which starts from it unless
    its first segment starts a lane; no unit: the launch's chain is done."""
    if state is not None and 0 <= index < len(units):
        units[index][0].entry = state


def bucket_group(lane: Lane, group_size: int) -> int:
    """The largest group up to ``group_size`` whose two tile sets with boundary tiles fit ``TWO_SETS_LIMIT`` (fp32
    at head dim 128: 13 where 16 is asked). The group is a schedule, not a numerical choice: each chunk's inverse
    and state update are the same in any group, so results are bit-identical (``test_nki_bucket.py``)."""
    per_chunk = 2 * chunk_tiles_bytes(lane, initial=True)
    return max(1, min(group_size, TWO_SETS_LIMIT // per_chunk))


def pipeline_depth(lane: Lane, group_size: int, initial: bool = False) -> int:
    """``PIPELINE_DEPTH`` tile sets when they fit beside the rest of a launch's on-chip memory, else two.

    Three fp32 tile sets for 16-chunk groups at head dim 128 (57.6 KB each) and the loads and working tiles
    beside them would not fit in SBUF; the two-stage pipeline needs one set less.
    """
    set_bytes = group_size * chunk_tiles_bytes(lane, initial)
    return PIPELINE_DEPTH if PIPELINE_DEPTH * set_bytes <= TILE_SETS_BUDGET else 2


def _compiled_steady_state(pipe: Pipeline, run: SteadyState, units: list[Unit]) -> State:
    """Periods ``run.first_period .. run.last_period`` as one ``nl.fori_loop`` over the token offsets of the
    units whose operands open each iteration; returns the lane's state after them (its ring's tile 0, where every
    period's chain starts and ends)."""
    lane, group, depth = run.lane, pipe.group_size, pipe.depth
    unit_tokens = group * lane.chunk
    ring = pipe.rings[id(lane)]
    decisions: list[Any] = []

    by_chunk = pipe.inputs.boundaries is not None  # a bucket's loop runs over chunk indices (its tables' columns)

    def unit_at(index: Any, offset: int, entry: State | None = None) -> Unit:
        if by_chunk:
            first = index + offset * group
            return [Segment(lane, -1, group, False, False, entry=entry, start=first * lane.chunk, first_chunk=first,
                            chunk_offset=offset * group)]  # fmt: skip
        return [Segment(lane, -1, group, False, False, entry=entry, start=index + offset * unit_tokens)]

    span = depth * run.unroll  # periods per iteration

    def body(token: Any) -> None:
        if by_chunk:  # the chunks of the iteration's units, and each one's successor: their table columns
            pipe.inputs.boundaries.open_window(token, -(depth - 1) * group, span * group + 1)
        with pipe.balancer.fixed(decisions):
            for k in range(span):
                p = run.first_period + k
                newest = Work(unit_at(token, k), pipe.tile_set(p))
                oldest = Work(unit_at(token, k - depth + 1, ring[0]), pipe.tile_set(p - depth + 1))
                middle = newest if depth == 2 else Work(unit_at(token, k - 1), pipe.tile_set(p - 1))
                run_period(pipe, newest, middle, oldest)
        if by_chunk:
            pipe.inputs.boundaries.close_window()

    units[run.first_period - depth + 1][0].entry = None  # the loop's chains start from the ring's tile 0 instead
    periods = run.last_period - run.first_period + 1
    if by_chunk:
        start = units[run.first_period][0].chunk_index(0)
        nl.fori_loop(start, start + periods * group, body, step=span * group)
    else:
        start = units[run.first_period][0].token
        nl.fori_loop(start, start + periods * unit_tokens, body, step=span * unit_tokens)
    return ring[0]
