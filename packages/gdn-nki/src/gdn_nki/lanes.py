"""Emitting the work of all lanes as a software pipeline of periods, each lane's steady state one compiled loop,
and splitting lanes over an SPMD launch grid.

The chunks of all lanes are cut into *units* of ``group_size`` chunks (a unit may span lanes). A unit has three
parts:

- ``load`` and ``prepare``: loads, per-chunk operands and the grouped inverse — all state independent — written
  into the chain slots (tiles allocated once per launch, one per chunk position of a unit) where stage 3 reads
  them, and the stage-1 values the chain reads copied there (``copy_stage1``);
- ``publish``: the chunk transitions (U, W, Tᵀ, Q_effᵀ), from the chain slots into them;
- ``advance``: the sequential state chain over the unit's chunks (and the state store at a lane's end).

Each engine executes its instructions in the order they are issued, so issuing a unit's chain right after its
own preparation would leave the tensor engine waiting on every link of the chain. Instead period p issues unit
p's loads, then its preparation step by step interleaved with the stage 3 and chain of unit p − 1
(``run_period``): while one unit's chain waits on a vector-engine op, the engines have independent work queued
behind it, and unit p − 1's stage 3 runs beside unit p's first, latency-bound, steps instead of closing period
p − 1 on its own (measured, one lane bf16 S=8192: 163.8 -> 159.4 µs). Units run across lane boundaries too, so
short sequences with many lanes pipeline as well as long ones.

Every period issues the same steps in the same order, so the periods of a lane's steady state — the chain of
one whole unit of the lane and the preparation of the next — are one ``nl.fori_loop`` body (``run_lanes``): the
program holds them once, whatever the sequence's length. Only the order of instructions differs from a plain
prepare-then-advance loop, not the instructions or their operands' values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from . import engines, stages, tiles
from .backend import nl
from .stages import Chunk, Constants, Lane

InvertGroup = Callable[[list[Chunk], Constants, Any], Iterator[None]]


@dataclass(frozen=True)
class Span:
    """One sequence of a launch: tokens ``[offset, offset + n_chunks·chunk)`` of batch row ``b``, with its
    initial and final state in row ``slot`` of the state tensors (trace-time integers)."""

    b: int
    offset: int
    n_chunks: int
    slot: int


def dense_spans(batch: int, seq_len: int, chunk: int) -> list[Span]:
    """One sequence per batch row, each the whole row, its state in the same row (gdn_cte's layout)."""
    return [Span(b, 0, seq_len // chunk, b) for b in range(batch)]


def packed_spans(seq_chunks: tuple[int, ...], chunk: int, slots: tuple[int, ...]) -> list[Span]:
    """Sequences packed back to back in batch row 0, sequence i ``seq_chunks[i]`` chunks long, its state in row
    ``slots[i]``."""
    starts = [0]
    for n in seq_chunks[:-1]:
        starts.append(starts[-1] + n * chunk)
    return [Span(0, start, n, slot) for start, n, slot in zip(starts, seq_chunks, slots, strict=True)]


def program_lanes(spans: list[Span], value_heads: int) -> list[tuple[Span, int]]:
    """The (sequence, value head) lanes this program owns: an even contiguous split of all lanes, sequence-major,
    over the launch grid."""
    programs, pid = nl.num_programs(axes=0), nl.program_id(axis=0)
    total = len(spans) * value_heads
    per_program = -(-total // programs)
    first = pid * per_program
    lanes = [divmod(lane, value_heads) for lane in range(first, min(total, first + per_program))]
    return [(spans[s], h) for s, h in lanes]


@dataclass
class Segment:
    """Consecutive chunks of one lane inside a unit.

    Its first token is ``lane.offset + first·chunk``, or ``start`` when that is a compiled loop's run-time value.
    """

    lane: Lane
    first: int
    width: int
    starts_lane: bool
    ends_lane: bool
    chunks: list[Chunk] = field(default_factory=list)
    gate_rows: tuple = ()
    state: stages.State | None = None  # the lane's initial state, loaded with the unit that starts the lane
    start: Any = None
    stage1_copied: bool = False  # its chunks' stage-1 chain values are in the chain slots
    beta: Any = None  # [C, width] β columns of its chunks (stage 3 reads them, from the chain slots)

    @property
    def token(self) -> Any:
        """The segment's first token in q/k/v, the gates and out."""
        return self.start if self.start is not None else self.lane.offset + self.first * self.lane.chunk


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
    # reads it: behind the first unit's stage 1 in every engine's queue, not ahead of it waiting on the DMAs.
    deferred_loads: Callable[[], Iterator[None]] | None = None


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
        first = 0
        while first < n_chunks:
            if room == 0:
                units.append([])
                room = group_size
            width = min(room, n_chunks - first)
            units[-1].append(Segment(lane, first, width, first == 0, first + width == n_chunks))
            first += width
            room -= width
    return [unit for unit in units if unit]


@dataclass
class Pipeline:
    """What one launch's periods share: the kernel's inputs, the chain slots (one per chunk position of a unit),
    the state rings of the lanes that run a compiled loop, and the state the chain carries."""

    inputs: LaneInputs
    group_size: int
    slots: list[stages.ChainSlot]
    rings: dict[int, list[stages.State]] = field(default_factory=dict)  # id(lane) -> its state tiles
    ring_order: list[int] = field(default_factory=list)  # which ring tile holds the state after chunk j of a unit
    carried: list[stages.State | None] = field(default_factory=lambda: [None])
    deferred: Callable[[], Iterator[None]] | None = None


def load(unit: Unit, pipe: Pipeline) -> None:
    """Issue every DMA load of a unit: gates, q, k, v, and the initial state of each lane the unit starts."""
    inputs = pipe.inputs
    for seg in unit:
        lane = seg.lane
        seg.gate_rows = stages.load_gate_rows(inputs.g_log, inputs.beta, lane, seg.token, seg.width)
        seg.chunks = stages.load_chunks(lane, seg.token, seg.width)
        if seg.starts_lane:
            ring = pipe.rings.get(id(lane))
            seg.state = stages.initial_state(inputs.recurrent_state, lane, ring[0] if ring else None)


def prepare(unit: Unit, pipe: Pipeline, before_inverse: Iterator[None] | None = None) -> Iterator[None]:
    """State-independent compute of a loaded unit up to its inverses; yields between steps.

    Its first step loads the unit's v straight into the chain slots (``stages.load_values``): issued after the
    first step of the previous unit's stage 3 (``run_period``), the one that reads them. ``before_inverse`` (the
    deferred constants' on-chip work, ``LaneInputs.deferred_loads``) is run to its end right before the inverse.
    Measured against issuing it after the first unit's gate columns and two stage-1 phases (one lane bf16 schur,
    S = 2048 / 8192 µs; 32 lanes S = 128): 39.9 / 135.8, 72.1 -> 38.8 / 134.8, 71.8; fp32 S = 2048 70.0 both.
    """
    inputs = pipe.inputs
    for seg, positions in _slot_ranges(unit):
        values = pipe.slots[0].values[:, positions, :]
        stages.load_values(seg.lane, seg.token, seg.width, values)
        for j, chunk in enumerate(seg.chunks):
            chunk.value = values[:, j, :]
    gates = [stages.gate_columns(*seg.gate_rows) for seg in unit]
    for seg, seg_gates in zip(unit, gates, strict=True):
        seg.gate_rows = ()  # the rows are dead once turned into columns
        seg.beta = seg_gates.beta
    yield
    operands = [
        stages.chunk_operands(seg.lane, chunk, seg_gates, j)
        for seg, seg_gates in zip(unit, gates, strict=True)
        for j, chunk in enumerate(seg.chunks)
    ]
    yield from lockstep(operands)
    chunks = [chunk for seg in unit for chunk in seg.chunks]
    lane = unit[0].lane  # constants and dtypes are the same for every lane of a launch
    if before_inverse is not None:
        _finish(before_inverse)
    yield from inputs.invert_group(chunks, lane.consts, lane.dtype)
    for chunk in chunks:  # Ãᵀ is dead once inverted: free it before the next period's preparation makes its own
        chunk.release("a_t")


def _slot_ranges(unit: Unit) -> Iterator[tuple[Segment, slice]]:
    """Each segment of a unit with the chain-slot positions its chunks take (segment k after segments 0..k−1)."""
    position = 0
    for seg in unit:
        yield seg, slice(position, position + seg.width)
        position += seg.width


def assign_slots(unit: Unit, pipe: Pipeline) -> None:
    """Give each chunk of a loaded unit its chain slot (by position in the unit): the preparation writes what stage
    3 reads there (``stages.ChainSlot``)."""
    chunks = [chunk for seg in unit for chunk in seg.chunks]
    for chunk, slot in zip(chunks, pipe.slots, strict=False):
        chunk.slot = slot


def publish(unit: Unit) -> Iterator[None]:
    """Stage 3 of a prepared unit (U, W, Tᵀ, Q_effᵀ) from its chain slots into them; yields between steps.

    Issued in the period after the unit's preparation, ahead of its chain (the same generator, ``chain_of``): the
    previous unit's chain is done, and its instructions interleave with the next unit's first preparation steps
    instead of closing the period on their own.
    """
    yield from lockstep([stages.chunk_transition(seg.lane, chunk) for seg in unit for chunk in seg.chunks])


def copy_stage1(unit: Unit, pipe: Pipeline) -> None:
    """Copy the stage-1 values the chain reads into the unit's chain slots (and read them from there on), if they
    are all made and not yet copied. Only once the previous unit's chain is done: it reads the same slots."""
    chunks = [chunk for seg in unit for chunk in seg.chunks]
    values = [[getattr(chunk, name) for name in stages.STAGE1_CHAIN_VALUES] for chunk in chunks]
    if any(value is None for row in values for value in row) or any(seg.stage1_copied for seg in unit):
        return
    for chunk, row, slot in zip(chunks, values, pipe.slots, strict=False):
        for name, value in zip(stages.STAGE1_CHAIN_VALUES, row, strict=True):
            setattr(chunk, name, tiles.copy_to(getattr(slot, name), value))
    for seg, positions in _slot_ranges(unit):  # β: one copy of each segment's gate columns, not one per chunk
        tiles.copy_to(pipe.slots[0].betas[:, positions], seg.beta)
        for chunk, slot in zip(seg.chunks, pipe.slots[positions], strict=True):
            chunk.beta = slot.beta
        seg.stage1_copied = True


def _renumber_slots(unit: Unit, pipe: Pipeline) -> None:
    """Point each segment's chunks at the unit's consecutive slots (segment k starts after segments 0..k−1)."""
    for seg, positions in _slot_ranges(unit):
        seg.chunks = [slot.chunk(chunk.token) for chunk, slot in zip(seg.chunks, pipe.slots[positions], strict=True)]


def advance(unit: Unit, pipe: Pipeline) -> Iterator[None]:
    """The state chain of a unit's chunks in order; ``pipe.carried[0]`` holds the current lane's state.

    Each chunk's output is issued after the NEXT chunk's state update (software-pipelined one chunk behind), so
    the chain's links follow each other on the engines without the output's instructions between them. A lane
    with a state ring writes the state after chunk j to tile ``ring_order[j + 1]`` (every unit starts from tile 0).
    """
    final_state = pipe.inputs.final_state
    order = pipe.ring_order
    for seg in unit:
        lane = seg.lane
        ring = pipe.rings.get(id(lane))
        if seg.starts_lane:
            pipe.carried[0] = seg.state
            seg.state = None
        pending = None
        for k, chunk in enumerate(seg.chunks):
            entry = pipe.carried[0]
            final = seg.ends_lane and k == len(seg.chunks) - 1
            dst = ring[order[k + 1]] if ring else None
            pipe.carried[0] = stages.advance_state(lane, chunk, entry, final, dst)
            if pending is not None:
                stages.emit_output(lane, *pending)
            pending = (chunk, entry)
            yield
        if seg.ends_lane:  # the final state is ready before the last output: store it first
            stages.store_state(final_state, lane, pipe.carried[0])
        if pending is not None:
            stages.emit_output(lane, *pending)
        seg.chunks = []  # the segment's tiles are dead once its chain has read them


def chain_of(unit: Unit, pipe: Pipeline) -> Iterator[None]:
    """A prepared unit's stage 3 (``publish``), then its state chain (``advance``), as one step generator."""
    yield from publish(unit)
    _renumber_slots(unit, pipe)
    yield from advance(unit, pipe)


def lockstep(steps: list[Iterator[None]]) -> Iterator[None]:
    """Advance several step generators together, one step of each in turn (step-major), yielding per round."""
    active = list(steps)
    while active:
        active = [gen for gen in active if next(gen, StopIteration) is not StopIteration]
        yield


def run_period(pipe: Pipeline, chain_unit: Unit | None, prep_unit: Unit | None) -> None:
    """One period of the pipeline: the loads and preparation of ``prep_unit`` interleaved step by step with stage 3
    and the state chain of ``chain_unit`` (the unit before it), then ``prep_unit``'s stage-1 chain values copied to
    the chain slots.

    While one unit's chain waits on a vector-engine op, the engines have the next unit's independent work queued
    behind it. Every period issues the same steps in the same order, whatever the units: that is what lets the
    periods of a lane's steady state be one compiled loop body (``run_lanes``).
    """
    if prep_unit is not None:
        load(prep_unit, pipe)
        assign_slots(prep_unit, pipe)
    deferred = None
    if pipe.deferred is not None:
        deferred = pipe.deferred()
        next(deferred, None)  # its loads
        pipe.deferred = None
    chain = chain_of(chain_unit, pipe) if chain_unit is not None else None
    prep = None
    if prep_unit is not None:
        prep, deferred = prepare(prep_unit, pipe, before_inverse=deferred), None
    while chain is not None or prep is not None:
        if chain is not None and next(chain, StopIteration) is StopIteration:
            chain = None
        if prep is not None and next(prep, StopIteration) is StopIteration:
            prep = None
    if deferred is not None:  # a launch with nothing to prepare
        _finish(deferred)
    if prep_unit is not None:
        copy_stage1(prep_unit, pipe)


def _finish(steps: Iterator[None]) -> None:
    """Run a step generator to its end."""
    for _ in steps:
        pass


@dataclass(frozen=True)
class SteadyState:
    """Periods ``first .. last`` (inclusive) of one lane, each the chain of a full unit of the lane and the
    preparation of the next: one compiled loop."""

    lane: Lane
    first: int
    last: int


def steady_states(units: list[Unit], group_size: int) -> list[SteadyState]:
    """The runs of periods that can be one compiled loop body each.

    Period p (chain of unit p − 1, preparation of unit p) qualifies when both units are one full segment of the
    same lane, and the lane's first unit is such a unit too (its state then starts in tile 0 of its ring, and so
    does every unit's chain: ``state_ring_order``). Lane starts and ends, and units shared by lanes, stay unrolled.
    """
    if state_ring_order(group_size) is None:
        return []

    def whole(unit: Unit) -> Lane | None:
        return unit[0].lane if len(unit) == 1 and unit[0].width == group_size else None

    found: list[SteadyState] = []
    p = 1
    while p < len(units):
        lane = whole(units[p - 1])
        starts_whole = lane is not None and units[p - 1][0].first % group_size == 0
        if not (starts_whole and whole(units[p]) is lane):
            p += 1
            continue
        last = p
        while last + 1 < len(units) and whole(units[last + 1]) is lane:
            last += 1
        found.append(SteadyState(lane, p, last))
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


def run_lanes(lanes: list[Lane], group_size: int, inputs: LaneInputs) -> None:
    """Issue all units as a software pipeline of periods (``run_period``), each lane's steady state as one
    ``nl.fori_loop`` whose body is one period.

    Period p prepares unit p while unit p − 1's chain runs, so at most two units are between their loads and their
    chain: on-chip memory does not depend on the launch's length. The chain takes units strictly in order, so each
    lane's state passes from unit to unit as in a plain loop.

    The loop's iteration value is the token offset of the unit it prepares (step: one unit of tokens), so its HBM
    accesses need no other arithmetic; what crosses iterations lives in tiles allocated before the loop (the chain
    slots and the lane's state ring); the engine balancer decides once for the body. The program therefore holds
    each lane's steady state once, whatever its length.
    """
    units = lane_units(lanes, group_size)
    if not units:
        return
    pipe = Pipeline(inputs, group_size, stages.chain_slots(group_size, lanes[0]), deferred=inputs.deferred_loads)
    loops = {run.first: run for run in steady_states(units, group_size)}
    if loops:
        pipe.ring_order = state_ring_order(group_size) or []
        rings = [[stages.state_tile(lanes[0], reused=True) for _ in range(STATE_RING)] for _ in range(2)]
        for run in loops.values():  # consecutive loop lanes alternate: one loads its state while one chains
            pipe.rings.setdefault(id(run.lane), rings[len(pipe.rings) % 2])
    p = 0
    while p <= len(units):
        run = loops.get(p)
        if run is None:
            run_period(pipe, units[p - 1] if p > 0 else None, units[p] if p < len(units) else None)
            p += 1
            continue
        _compiled_steady_state(pipe, run, units)
        p = run.last + 1


def _compiled_steady_state(pipe: Pipeline, run: SteadyState, units: list[Unit]) -> None:
    """Periods ``run.first .. run.last`` as one ``nl.fori_loop`` over the token offsets of the units prepared."""
    lane, group = run.lane, pipe.group_size
    unit_tokens = group * lane.chunk
    ring = pipe.rings[id(lane)]
    decisions: list[Any] = []

    def period(token: Any) -> None:
        chain = Segment(lane, -1, group, False, False, start=token - unit_tokens)
        chain.chunks = [pipe.slots[j].prepared(chain.token + j * lane.chunk) for j in range(group)]
        pipe.carried[0] = ring[0]
        with engines.BALANCER.fixed(decisions):
            run_period(pipe, [chain], [Segment(lane, -1, group, False, False, start=token)])

    first = units[run.first][0].token
    nl.fori_loop(first, first + (run.last - run.first + 1) * unit_tokens, period, step=unit_tokens)
    # After the loop the last prepared unit waits in the slots and the lane's state in its ring's tile 0.
    (seg,) = units[run.last]
    seg.chunks = [pipe.slots[j].prepared(seg.token + j * lane.chunk) for j in range(seg.width)]
    pipe.carried[0] = ring[0]
