"""Emitting the work of all lanes as a software pipeline of periods, each lane's steady state one compiled loop,
and splitting lanes over an SPMD launch grid.

The chunks of all lanes are cut into *units* of ``group_size`` chunks (a unit may span lanes). A unit passes
through three stages, one per period, each reading what the one before wrote into the unit's *slot set* (tiles
allocated once per launch, one slot per chunk position of a unit, ``stages.ChainSlot``):

- ``load`` and ``stage1``: the loads and the per-chunk operands (decays, Ãᵀ, attnᵀ, scaled q and k), all state
  independent;
- ``invert``: the grouped inverse of the unit's Ãᵀ, latency bound (a chain of tensor ↔ elementwise round trips);
- ``chain_of``: stage 3, the chunk transitions (U, W, Tᵀ, Q_effᵀ), then the sequential state chain over the
  unit's chunks (and the state store at a lane's end).

Period p issues stage 1 of unit p, the inverse of unit p − 1 and the chain of unit p − 2, step by step
interleaved (``run_period``). Each engine executes its instructions in the order they are issued, so one unit's
stages issued back to back would leave the engines waiting on each dependency in turn; three units' independent
stages side by side give every engine work queued behind each wait: the inverse's latency-bound steps run beside
stage 1's throughput-bound ones and the chain's links (measured, one lane bf16 schur, against stage 1 and the
inverse of unit p beside the chain of unit p − 1: S = 2048 37.4 -> 35.4 µs, S = 8192 132.7 -> 118.2 µs). Units
p, p + 3, p + 6, … share a slot set, so a unit's tiles live until its chain without any copy; a launch whose
three sets would not fit in SBUF runs the two-stage form (stage 1 and the inverse of unit p in one period,
``pipeline_depth``). Units run across lane boundaries too, so short sequences with many lanes pipeline as well
as long ones.

Every period issues the same steps in the same order, so ``depth`` consecutive periods of a lane's steady state
are one ``nl.fori_loop`` body (``run_lanes``): the program holds them once, whatever the sequence's length.
Only the order of instructions differs from a plain unit-by-unit loop, not the instructions or their operands'
values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from . import engines, stages
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
    chunks: list[Chunk] = field(default_factory=list)  # the stage at hand's view of its chunks
    gate_rows: tuple = ()
    state: stages.State | None = None  # the lane's initial state, loaded with the unit that starts the lane
    start: Any = None

    @property
    def token(self) -> Any:
        """The segment's first token in q/k/v, the gates and out."""
        return self.start if self.start is not None else self.lane.offset + self.first * self.lane.chunk

    def token_of(self, j: int) -> Any:
        """The first token of the segment's chunk j."""
        return self.token + j * self.lane.chunk


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
    # Rounds stage 1 sits out after its first operand phase (the inverse's choice: it depends on how its steps
    # line up with stage 1's), so its later phases queue behind the inverse's and the chain's next steps instead
    # of ahead of them — those are latency-bound and bound the period, stage 1 has slack.
    stage1_idle_rounds: int = 0


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


PIPELINE_DEPTH = 3  # periods from a unit's stage 1 to its chain: stage 1, the inverse, stage 3 and the chain


@dataclass
class Pipeline:
    """What one launch's periods share: the kernel's inputs, the slot sets (unit p's tiles are ``slots(p)``), the
    state rings of the lanes that run a compiled loop, and the state the chain carries."""

    inputs: LaneInputs
    group_size: int
    sets: list[list[stages.ChainSlot]]
    rings: dict[int, list[stages.State]] = field(default_factory=dict)  # id(lane) -> its state tiles
    ring_order: list[int] = field(default_factory=list)  # which ring tile holds the state after chunk j of a unit
    carried: list[stages.State | None] = field(default_factory=lambda: [None])
    deferred: Callable[[], Iterator[None]] | None = None
    before_inverse: Iterator[None] | None = None  # the deferred constants' on-chip work, until the first inverse

    @property
    def depth(self) -> int:
        """Periods from a unit's stage 1 to its chain (one slot set per unit in flight)."""
        return len(self.sets)

    def slots(self, unit_index: int) -> list[stages.ChainSlot]:
        """The slot set of the unit with this index (in the launch's order of units)."""
        return self.sets[unit_index % self.depth]


@dataclass(frozen=True)
class Work:
    """One unit and its slot set, as one stage of a period sees it."""

    unit: Unit
    slots: list[stages.ChainSlot]


def load(work: Work, pipe: Pipeline) -> None:
    """Issue the DMA loads stage 1 reads (gates, q, k) and the initial state of each lane the unit starts; give
    each chunk its chain slot (by position in the unit)."""
    inputs = pipe.inputs
    for seg, positions in _slot_ranges(work.unit):
        lane = seg.lane
        seg.gate_rows = stages.load_gate_rows(inputs.g_log, inputs.beta, lane, seg.token, seg.width)
        seg.chunks = stages.load_chunks(lane, seg.token, seg.width)
        for chunk, slot in zip(seg.chunks, work.slots[positions], strict=True):
            chunk.slot = slot
        if seg.starts_lane:
            ring = pipe.rings.get(id(lane))
            seg.state = stages.initial_state(inputs.recurrent_state, lane, ring[0] if ring else None)


def stage1(work: Work, idle_rounds: int = 0) -> Iterator[None]:
    """Stage 1 of a loaded unit, into its slots: v loaded, the gate columns, every chunk's operands (phases in
    lockstep); yields between steps, and ``idle_rounds`` times more after the first operand phase
    (``LaneInputs.stage1_idle_rounds``)."""
    slots = work.slots
    gates = []
    for seg, positions in _slot_ranges(work.unit):
        stages.load_values(seg.lane, seg.token, seg.width, slots[0].values[:, positions, :])
        gates.append(stages.gate_columns(*seg.gate_rows, dst=slots[0].gates[:, :, positions]))
        seg.gate_rows = ()  # the rows are dead once turned into columns
    yield
    operands = [
        stages.chunk_operands(seg.lane, chunk, seg_gates, j)
        for seg, seg_gates in zip(work.unit, gates, strict=True)
        for j, chunk in enumerate(seg.chunks)
    ]
    for phase, _ in enumerate(lockstep(operands)):
        yield
        if phase == 0:
            yield from range(idle_rounds)  # rounds in which stage 1 issues nothing
    for seg in work.unit:
        seg.chunks = []  # what later stages read is in the slots


def invert(work: Work, pipe: Pipeline) -> Iterator[None]:
    """The grouped inverse of a unit from its slots' Ãᵀ into their ``inverse_t``; yields between steps. The
    deferred constants' on-chip work (``LaneInputs.deferred_loads``) is issued first if it is still pending."""
    if pipe.before_inverse is not None:
        _finish(pipe.before_inverse)
        pipe.before_inverse = None
    width = sum(seg.width for seg in work.unit)
    chunks = [slot.system(None) for slot in work.slots[:width]]
    lane = work.unit[0].lane  # constants and dtypes are the same for every lane of a launch
    yield from pipe.inputs.invert_group(chunks, lane.consts, lane.dtype)


def _slot_ranges(unit: Unit) -> Iterator[tuple[Segment, slice]]:
    """Each segment of a unit with the chain-slot positions its chunks take (segment k after segments 0..k−1)."""
    position = 0
    for seg in unit:
        yield seg, slice(position, position + seg.width)
        position += seg.width


def publish(work: Work) -> Iterator[None]:
    """Stage 3 of an inverted unit (U, W, Tᵀ, Q_effᵀ) from its slots into them; yields between steps.

    Issued in the period of the unit's chain, ahead of it (the same generator, ``chain_of``); its instructions
    interleave with the other units' steps instead of closing the period on their own.
    """
    for seg, positions in _slot_ranges(work.unit):
        seg.chunks = [slot.prepared(seg.token_of(j)) for j, slot in enumerate(work.slots[positions])]
    yield from lockstep([stages.chunk_transition(seg.lane, chunk) for seg in work.unit for chunk in seg.chunks])


def advance(unit: Unit, pipe: Pipeline) -> Iterator[None]:
    """The state chain of a unit's chunks in order; ``pipe.carried[0]`` holds the current lane's state.

    Each chunk's output is issued with the NEXT chunk's state update (software-pipelined one chunk behind): its
    products alternate with that link's on the tensor engine and its evacuations follow the link's vector ops, so
    no output instruction sits between two links. The next chunk's e^{γ_last} goes with each link but a unit's last
    (``stages.advance_state``'s ``next_decay``). A lane
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
            following = seg.chunks[k + 1] if k + 1 < len(seg.chunks) else None
            next_decay = following.decay_last if following is not None else None
            pipe.carried[0] = stages.advance_state(lane, chunk, entry, final, dst, next_decay, pending)
            pending = (chunk, entry)
            yield
        if seg.ends_lane:  # the final state is ready before the last output: store it first
            stages.store_state(final_state, lane, pipe.carried[0])
        if pending is not None:
            stages.emit_output(lane, *pending)
        seg.chunks = []


def chain_of(work: Work, pipe: Pipeline) -> Iterator[None]:
    """An inverted unit's stage 3 (``publish``), then its state chain (``advance``), as one step generator."""
    yield from publish(work)
    yield from advance(work.unit, pipe)


def lockstep(steps: list[Iterator[None]]) -> Iterator[None]:
    """Advance several step generators together, one step of each in turn (step-major), yielding per round."""
    active = list(steps)
    while active:
        active = [gen for gen in active if next(gen, StopIteration) is not StopIteration]
        yield


def _in_order(*steps: Iterator[None]) -> Iterator[None]:
    """One step generator running the given ones one after another."""
    for gen in steps:
        yield from gen


def run_period(pipe: Pipeline, first: Work | None, middle: Work | None, last: Work | None) -> None:
    """One period of the pipeline: the loads and stage 1 of ``first`` (the newest unit), the inverse of ``middle``
    and stage 3 and the chain of ``last`` (the oldest), their steps interleaved round by round.

    With ``depth`` 3 the three are consecutive units, so a unit's latency-bound inverse runs beside the next
    unit's throughput-bound stage 1 and the previous unit's chain; with ``depth`` 2 ``middle`` is ``first``,
    inverted right after its stage 1. Every period issues the same steps in the same order, whatever the units:
    that is what lets a lane's steady-state periods be one compiled loop body (``run_lanes``).
    """
    if first is not None:
        load(first, pipe)
    if pipe.deferred is not None:
        pipe.before_inverse = pipe.deferred()
        next(pipe.before_inverse, None)  # its loads
        pipe.deferred = None
    if first is not None and middle is first:
        steps = [_in_order(stage1(first, pipe.inputs.stage1_idle_rounds), invert(first, pipe))]
    else:
        # The chain first, then the inverse, then stage 1, in every round (measured, one lane bf16 schur, S = 2048
        # / 8192 µs, against chain, stage 1, inverse: 36.4 / 120.1 -> 35.4 / 118.2; the other four orders 34.9 /
        # 124.6 to 36.4 / 126.7)
        steps = [invert(middle, pipe)] if middle is not None else []
        if first is not None:
            steps.append(stage1(first, pipe.inputs.stage1_idle_rounds))
    if last is not None:
        steps.insert(0, chain_of(last, pipe))
    for _ in lockstep(steps):
        pass


def _finish(steps: Iterator[None]) -> None:
    """Run a step generator to its end."""
    for _ in steps:
        pass


def period_work(units: list[Unit], p: int, pipe: Pipeline) -> tuple[Work | None, Work | None, Work | None]:
    """What period ``p`` issues: stage 1 of unit p, the inverse of unit p − depth + 2, the chain of unit
    p − depth + 1 (None where there is no such unit)."""

    def work(index: int) -> Work | None:
        return Work(units[index], pipe.slots(index)) if 0 <= index < len(units) else None

    first, last = work(p), work(p - pipe.depth + 1)
    middle = first if pipe.depth == 2 else work(p - pipe.depth + 2)
    return first, middle, last


@dataclass(frozen=True)
class SteadyState:
    """Periods ``first .. last`` (inclusive) of one lane, each issuing the stages of whole units of the lane: one
    compiled loop of ``(last − first + 1) / depth`` iterations of ``depth`` periods."""

    lane: Lane
    first: int
    last: int


def steady_states(units: list[Unit], group_size: int, depth: int = PIPELINE_DEPTH) -> list[SteadyState]:
    """The runs of periods that can be one compiled loop each, as whole loop iterations of ``depth`` periods.

    Period p (stage 1 of unit p, the chain of unit p − depth + 1) qualifies when units p − depth + 1 .. p are all
    one full segment of the same lane and the oldest starts at a unit boundary of the lane (its state then starts
    in tile 0 of the lane's ring, and so does every unit's chain: ``state_ring_order``). Lane starts and ends, units
    shared by lanes, and the periods left over after whole iterations stay unrolled.
    """
    if state_ring_order(group_size) is None:
        return []

    def whole(unit: Unit) -> Lane | None:
        return unit[0].lane if len(unit) == 1 and unit[0].width == group_size else None

    def steady(p: int) -> Lane | None:
        lane = whole(units[p - depth + 1])
        if lane is None or units[p - depth + 1][0].first % group_size:
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
        iterations = (last - p + 1) // depth
        if iterations:
            found.append(SteadyState(lane, p, p + iterations * depth - 1))
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
    ``nl.fori_loop`` whose body is ``depth`` periods.

    At most ``depth`` units are between their loads and their chain, each in its own slot set, so on-chip memory
    does not depend on the launch's length (``pipeline_depth``). The chain takes units strictly in order, so each
    lane's state passes from unit to unit as in a plain loop.

    The loop's iteration value is the token offset of the unit its first period loads (step: ``depth`` units of
    tokens), so its HBM accesses need no other arithmetic; what crosses periods lives in tiles allocated before
    the loop (the slot sets and the lane's state ring); the engine balancer decides once for the body. The
    program therefore holds each lane's steady state once, whatever its length.
    """
    units = lane_units(lanes, group_size)
    if not units:
        return
    depth = pipeline_depth(lanes[0], group_size)
    sets = stages.chain_slots(group_size, lanes[0], depth)
    pipe = Pipeline(inputs, group_size, sets, deferred=inputs.deferred_loads)
    loops = {run.first: run for run in steady_states(units, group_size, depth)}
    if loops:
        pipe.ring_order = state_ring_order(group_size) or []
        rings = [[stages.state_tile(lanes[0], reused=True) for _ in range(STATE_RING)] for _ in range(2)]
        for run in loops.values():  # consecutive loop lanes alternate: one loads its state while one chains
            pipe.rings.setdefault(id(run.lane), rings[len(pipe.rings) % 2])
    p, periods = 0, len(units) + depth - 1
    while p < periods:
        run = loops.get(p)
        if run is None:
            run_period(pipe, *period_work(units, p, pipe))
            p += 1
            continue
        _compiled_steady_state(pipe, run, units)
        p = run.last + 1
    if pipe.before_inverse is not None:  # a launch with nothing to invert
        _finish(pipe.before_inverse)


def pipeline_depth(lane: Lane, group_size: int) -> int:
    """``PIPELINE_DEPTH`` slot sets when they fit beside the rest of a launch's on-chip memory, else two.

    Three sets of fp32 slots for 16-chunk groups at head dim 128 (57.6 KB each) and the loads and working tiles
    beside them would not fit in SBUF; the two-stage pipeline needs one set less.
    """
    set_bytes = group_size * stages.slot_bytes(lane)
    return PIPELINE_DEPTH if PIPELINE_DEPTH * set_bytes <= SLOT_SETS_BUDGET else 2


# Per-partition SBUF bytes the slot sets may take (of 212,984): the rest holds the shared stage-3 tiles, the loads
# and every stage's working tiles — measured at most ~70 KB at head dim 128 and group 16 in fp32.
SLOT_SETS_BUDGET = 120 * 1024


def _compiled_steady_state(pipe: Pipeline, run: SteadyState, units: list[Unit]) -> None:
    """Periods ``run.first .. run.last`` as one ``nl.fori_loop`` over the token offsets of the units whose stage 1
    opens each iteration."""
    lane, group, depth = run.lane, pipe.group_size, pipe.depth
    unit_tokens = group * lane.chunk
    ring = pipe.rings[id(lane)]
    decisions: list[Any] = []

    def unit_at(token: Any, offset: int) -> Unit:
        return [Segment(lane, -1, group, False, False, start=token + offset * unit_tokens)]

    def body(token: Any) -> None:
        with engines.BALANCER.fixed(decisions):
            for k in range(depth):
                p = run.first + k
                pipe.carried[0] = ring[0]
                first = Work(unit_at(token, k), pipe.slots(p))
                oldest = p - depth + 1
                last = Work(unit_at(token, k - depth + 1), pipe.slots(oldest))
                middle = first if depth == 2 else Work(unit_at(token, k - 1), pipe.slots(p - 1))
                run_period(pipe, first, middle, last)

    start = units[run.first][0].token
    periods = run.last - run.first + 1
    nl.fori_loop(start, start + periods * unit_tokens, body, step=depth * unit_tokens)
    pipe.carried[0] = ring[0]  # after the loop the lane's state is in its ring's tile 0
