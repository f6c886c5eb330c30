"""Running one (batch, value head) lane end to end, and splitting lanes over an SPMD launch grid."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import stages
from .backend import nl
from .stages import Chunk, Constants, Lane

InvertGroup = Callable[[list[Chunk], Constants, Any], None]


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


def run_lane(
    lane: Lane,
    g_log: Any,
    beta: Any,
    state: stages.State,
    group_size: int,
    invert_group: InvertGroup,
) -> stages.State:
    """Process every chunk of a lane, group by group, and return the final state.

    Per group: gates → per-chunk operands → the grouped inverse → transitions → the sequential state chain.
    """
    seq_len = lane.query.shape[2]
    for first, width in group_layout(seq_len // lane.chunk, group_size):
        gates = stages.load_gates(g_log, beta, lane.b, lane.h, first, width, lane.chunk)
        chunks = [stages.load_chunk(lane, first + j) for j in range(width)]
        for j, chunk in enumerate(chunks):
            stages.chunk_operands(lane, chunk, gates, j)
        invert_group(chunks, lane.consts, lane.dtype)
        for chunk in chunks:
            stages.chunk_transition(lane, chunk)
        for chunk in chunks:
            state = stages.state_step(lane, chunk, state)
    return state
