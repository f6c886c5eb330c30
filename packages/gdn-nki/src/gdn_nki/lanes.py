"""Emitting the work of all lanes as a software pipeline, and splitting lanes over an SPMD launch grid.

The chunks of all lanes are cut into *units* of ``group_size`` chunks (a unit may span lanes). A unit has two
parts:

- ``load`` and ``prepare``: loads, per-chunk operands, the grouped inverse and the chunk transitions — all state
  independent;
- ``advance``: the sequential state chain over the unit's chunks (and the state load/store at lane ends).

Each engine executes its instructions in the order they are issued, so issuing a unit's chain right after its
own preparation would leave the tensor engine waiting on every link of the chain. Instead the next units'
preparation is issued interleaved with ``advance(i)``: while one unit's chain waits on a vector-engine op, the
engines have independent work queued behind it. Units run across lane boundaries too, so short sequences with
many lanes pipeline as well as long ones. Both parts are generators that yield between steps; :func:`run_lanes`
decides the issue order (and :func:`lockstep` runs the chunks of one unit step-major). Only the order changes —
every instruction and its operands are the same as in a plain prepare-then-advance loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from . import stages
from .backend import nl
from .stages import Chunk, Constants, Lane

# Chunks whose loads are in flight ahead of the unit being prepared (two units at the default group size): the
# DMA rings run in issue order, so loads issued a unit early are not queued behind the previous unit's output
# stores. At least one unit, at most two, so the loaded-but-unprepared tiles stay within the on-chip budget.
LOAD_AHEAD_CHUNKS = 16
# PSUM budget for the grouped inverse, in chunks: a chunk holds at most one fp32 [C, C] tile's worth of PSUM at a
# time there (half a bank; each level's products are fresh tiles, no accumulation group stays open), 8 banks x 2 KiB
# hold 32 such tiles per partition, and half is left for everything else in flight.
PSUM_INVERSE_CHUNKS = 16

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
    """Consecutive chunks of one lane inside a unit."""

    lane: Lane
    first: int
    width: int
    starts_lane: bool
    ends_lane: bool
    chunks: list[Chunk] = field(default_factory=list)
    gate_rows: tuple = ()


@dataclass
class LaneInputs:
    """The kernel arguments every unit reads besides its lane's tensors."""

    g_log: Any
    beta: Any
    recurrent_state: Any
    final_state: Any
    invert_group: InvertGroup
    # Constant loads the operand stage does not need (e.g. schur's merge planes), issued right after the first
    # burst of unit loads so they do not delay the pipeline's start on the DMA rings.
    deferred_loads: Callable[[], None] | None = None


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


def load(unit: Unit, inputs: LaneInputs) -> None:
    """Issue every DMA load of a unit (gates and all chunks' q, k, v) and nothing else: compute that waited on
    these loads would block its engine's queue while they are in flight."""
    for seg in unit:
        lane = seg.lane
        seg.gate_rows = stages.load_gate_rows(inputs.g_log, inputs.beta, lane, seg.first, seg.width)
        seg.chunks = stages.load_chunks(lane, seg.first, seg.width)


def prepare(unit: Unit, inputs: LaneInputs) -> Iterator[None]:
    """State-independent compute of a loaded unit; yields between steps."""
    gates = [stages.gate_columns(*seg.gate_rows) for seg in unit]
    for seg in unit:
        seg.gate_rows = ()  # the rows are dead once turned into columns
    yield
    operands = [
        stages.chunk_operands(seg.lane, chunk, seg_gates, j)
        for seg, seg_gates in zip(unit, gates, strict=True)
        for j, chunk in enumerate(seg.chunks)
    ]
    yield from lockstep(operands)
    chunks = [chunk for seg in unit for chunk in seg.chunks]
    lane = unit[0].lane  # constants and dtypes are the same for every lane of a launch
    yield from inputs.invert_group(chunks, lane.consts, lane.dtype)
    yield from lockstep([stages.chunk_transition(seg.lane, chunk) for seg in unit for chunk in seg.chunks])


def advance(unit: Unit, inputs: LaneInputs, carried: list[stages.State]) -> Iterator[None]:
    """The state chain of a unit's chunks in order; ``carried[0]`` holds the current lane's state.

    Each chunk's output is issued after the NEXT chunk's state update (software-pipelined one chunk behind), so
    the chain's links follow each other on the engines without the output's instructions between them.
    """
    for seg in unit:
        lane = seg.lane
        if seg.starts_lane:
            carried[0] = stages.initial_state(inputs.recurrent_state, lane)
        pending = None
        for chunk in seg.chunks:
            entry = carried[0]
            final = seg.ends_lane and chunk is seg.chunks[-1]
            carried[0] = stages.advance_state(lane, chunk, entry, final)
            if pending is not None:
                stages.emit_output(lane, *pending)
            pending = (chunk, entry)
            yield
        if seg.ends_lane:  # the final state is ready before the last output: store it first
            stages.store_state(inputs.final_state, lane, carried[0])
        if pending is not None:
            stages.emit_output(lane, *pending)
        seg.chunks = []  # the segment's tiles are dead once its chain has read them


def lockstep(steps: list[Iterator[None]]) -> Iterator[None]:
    """Advance several step generators together, one step of each in turn (step-major), yielding per round."""
    active = list(steps)
    while active:
        active = [gen for gen in active if next(gen, StopIteration) is not StopIteration]
        yield


def prepare_depth(group_size: int) -> int:
    """How many units may be in preparation at once: two, unless their grouped inverses (at most one fp32 [C, C]
    PSUM tile per chunk at a time, half a bank) would then take more than half of PSUM."""
    return 2 if 2 * group_size <= PSUM_INVERSE_CHUNKS else 1


def load_ahead(group_size: int) -> int:
    """How many units' loads are issued ahead of the unit being prepared: ``LOAD_AHEAD_CHUNKS`` worth, one or two."""
    return min(2, max(1, LOAD_AHEAD_CHUNKS // group_size))


def run_lanes(lanes: list[Lane], group_size: int, inputs: LaneInputs) -> None:
    """Issue all units as a software pipeline.

    Each round issues one step of every unit in preparation (up to :func:`prepare_depth` of them) and one step
    of the state chain of the oldest prepared unit. Loads run :func:`load_ahead` units ahead of preparation. The
    chain takes units strictly in order, so each lane's state passes from unit to unit as in a plain loop.

    On-chip memory is bounded by the pipeline's depth, not by the launch's length: a unit holds its tiles from
    its loads until its chain, and at any time at most ``1 + depth + load_ahead`` units are between the two (the
    one in its chain, ``depth`` prepared or in preparation, the loaded ones). Preparation therefore never runs
    more than ``depth`` units ahead of the chain, however much faster it is.
    """
    units = lane_units(lanes, group_size)
    depth, ahead = prepare_depth(group_size), load_ahead(group_size)
    carried: list[stages.State] = [None]  # type: ignore[list-item]
    loaded = prepared_upto = next_prepare = next_chain = 0
    preparing: list[tuple[int, Iterator[None]]] = []
    chain: Iterator[None] | None = None
    deferred = inputs.deferred_loads
    while next_chain < len(units) or chain is not None:
        while len(preparing) < depth and next_prepare < min(len(units), next_chain + depth + 1):
            while loaded < min(len(units), next_prepare + ahead + 1):
                load(units[loaded], inputs)
                loaded += 1
            if deferred is not None:
                deferred()
                deferred = None
            preparing.append((next_prepare, prepare(units[next_prepare], inputs)))
            next_prepare += 1
        if chain is None and next_chain < prepared_upto:
            chain = advance(units[next_chain], inputs, carried)
            next_chain += 1
        for index, gen in list(preparing):
            if next(gen, StopIteration) is StopIteration:
                preparing.remove((index, gen))
                # every unit before the oldest one still in preparation is ready for its chain
                prepared_upto = min((i for i, _ in preparing), default=next_prepare)
        if chain is not None and next(chain, StopIteration) is StopIteration:
            chain = None
