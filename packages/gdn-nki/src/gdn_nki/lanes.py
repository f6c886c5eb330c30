"""Emitting the work of all lanes as a software pipeline, and splitting lanes over an SPMD launch grid.

The work of one lane is cut into *units* of up to ``group_size`` chunks. A unit has two parts:

- ``prepare``: loads, per-chunk operands, the grouped inverse and the chunk transitions — all state independent;
- ``advance``: the sequential state chain over the unit's chunks (and the state load/store at lane ends).

Each engine executes its instructions in the order they are issued, so issuing a unit's chain right after its
own preparation would leave the tensor engine waiting on every link of the chain. Instead ``prepare(i + 1)`` is
issued interleaved with ``advance(i)``: while one unit's chain waits on a vector-engine op, the engines have the
next unit's independent work queued behind it. Units run across lane boundaries too, so short sequences with many
lanes pipeline as well as long ones. Both parts are generators that yield between steps; :func:`interleave`
decides the issue order. Only the order changes — every instruction and its operands are the same as in a plain
prepare-then-advance loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from . import stages, tiles
from .backend import nl
from .stages import Chunk, Constants, Lane

# Units whose loads are in flight ahead of the one being prepared: the DMA rings run in issue order, so loads
# issued a unit early are not queued behind the previous unit's output stores.
LOAD_AHEAD = 2
# PSUM budget for the grouped inverse's fp32 accumulators, in chunks: 8 banks x 2 KiB hold 32 [C, C] fp32 tiles
# per partition; half is left for everything else in flight.
PSUM_INVERSE_CHUNKS = 16

InvertGroup = Callable[[list[Chunk], Constants, Any], Iterator[None]]


def program_lanes(batch: int, value_heads: int) -> list[tuple[int, int]]:
    """The (b, h) lanes this program owns: an even contiguous split of B·Hv lanes over the launch grid."""
    programs, pid = nl.num_programs(axes=0), nl.program_id(axis=0)
    total = batch * value_heads
    per_program = -(-total // programs)
    first = pid * per_program
    return [divmod(lane, value_heads) for lane in range(first, min(total, first + per_program))]


def group_layout(n_chunks: int, group_size: int) -> list[tuple[int, int]]:
    """(first chunk, width) of each group: full groups of ``group_size`` then one residual group."""
    width = min(group_size, n_chunks)
    return [(first, min(width, n_chunks - first)) for first in range(0, n_chunks, width)]


@dataclass
class Unit:
    """Up to ``group_size`` consecutive chunks of one lane."""

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


def lane_units(lanes: list[Lane], group_size: int) -> list[Unit]:
    """Cut every lane into units of ``group_size`` chunks, in lane order."""
    units = []
    for lane in lanes:
        layout = group_layout(lane.query.shape[2] // lane.chunk, group_size)
        for k, (first, width) in enumerate(layout):
            units.append(Unit(lane, first, width, starts_lane=k == 0, ends_lane=k == len(layout) - 1))
    return units


def load(unit: Unit, inputs: LaneInputs) -> None:
    """Issue every DMA load of a unit (gates and all chunks' q, k, v) and nothing else: compute that waited on
    these loads would block its engine's queue while they are in flight."""
    lane = unit.lane
    unit.gate_rows = stages.load_gate_rows(
        inputs.g_log, inputs.beta, lane.b, lane.h, unit.first, unit.width, lane.chunk
    )
    unit.chunks = stages.load_chunks(lane, unit.first, unit.width)


def prepare(unit: Unit, inputs: LaneInputs) -> Iterator[None]:
    """State-independent compute of a loaded unit; yields between steps."""
    lane = unit.lane
    gates = stages.gate_columns(*unit.gate_rows)
    yield
    yield from lockstep([stages.chunk_operands(lane, chunk, gates, j) for j, chunk in enumerate(unit.chunks)])
    yield from inputs.invert_group(unit.chunks, lane.consts, lane.dtype)
    yield from lockstep([stages.chunk_transition(lane, chunk) for chunk in unit.chunks])


def advance(unit: Unit, inputs: LaneInputs, carried: list[stages.State]) -> Iterator[None]:
    """The state chain of a unit; ``carried[0]`` holds the lane's state between units."""
    lane = unit.lane
    if unit.starts_lane:
        dk, dv = lane.key.shape[3], lane.value.shape[3]
        carried[0] = stages.initial_state(inputs.recurrent_state, lane.b, lane.h, dk, dv)
    outputs = tiles.sbuf((lane.chunk, unit.width, lane.value.shape[3]), lane.dtype)
    for j, chunk in enumerate(unit.chunks):
        carried[0] = stages.state_step(lane, chunk, carried[0], outputs[:, j, :])
        yield
    stages.store_outputs(lane, outputs, unit.first, unit.width)
    unit.chunks = []  # the unit's tiles are dead once its chain has read them
    if unit.ends_lane:
        nl.store(inputs.final_state[lane.b, lane.h, :, :], carried[0].master)


def lockstep(steps: list[Iterator[None]]) -> Iterator[None]:
    """Advance several step generators together, one step of each in turn (step-major), yielding per round."""
    active = list(steps)
    while active:
        active = [gen for gen in active if next(gen, StopIteration) is not StopIteration]
        yield


def prepare_depth(group_size: int) -> int:
    """How many units may be in preparation at once: two, unless their inverse accumulators (group_size fp32
    [C, C] PSUM tiles each, half a bank per chunk) would then take more than half of PSUM."""
    return 2 if 2 * group_size <= PSUM_INVERSE_CHUNKS else 1


def run_lanes(lanes: list[Lane], group_size: int, inputs: LaneInputs) -> None:
    """Issue all units as a software pipeline.

    Each round issues one step of every unit in preparation (up to :func:`prepare_depth` of them) and one step
    of the state chain of the oldest prepared unit. Loads run ``LOAD_AHEAD`` units ahead of preparation. The
    chain takes units strictly in order, so each lane's state passes from unit to unit as in a plain loop.
    """
    units = lane_units(lanes, group_size)
    depth = prepare_depth(group_size)
    carried: list[stages.State] = [None]  # type: ignore[list-item]
    loaded = prepared_upto = next_prepare = next_chain = 0
    preparing: list[tuple[int, Iterator[None]]] = []
    chain: Iterator[None] | None = None
    while next_chain < len(units) or chain is not None:
        while len(preparing) < depth and next_prepare < len(units):
            while loaded < min(len(units), next_prepare + LOAD_AHEAD + 1):
                load(units[loaded], inputs)
                loaded += 1
            preparing.append((next_prepare, prepare(units[next_prepare], inputs)))
            next_prepare += 1
        if chain is None and next_chain < prepared_upto:
            chain = advance(units[next_chain], inputs, carried)
            next_chain += 1
        for index, gen in list(preparing):
            if next(gen, StopIteration) is StopIteration:
                preparing.remove((index, gen))
                prepared_upto = index + 1 if not preparing else min(i for i, _ in preparing)
        if chain is not None and next(chain, StopIteration) is StopIteration:
            chain = None
