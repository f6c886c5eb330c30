"""The chain stage: the sequential state update of a lane, chunk by chunk, with the previous chunk's output
issued beside each link.

gdn_ref twin: ``gdn_ref.chunked._state_chain``.
"""

from __future__ import annotations

from typing import Any

from ..common import engines, tiles
from ..common.backend import nl
from . import products
from .chunks import Chunk, Lane
from .output import Output
from .state import State, column_blocks, state_tile


def advance_state(
    lane: Lane,
    chunk: Chunk,
    state: State,
    final: bool = False,
    dst: State | None = None,
    next_decay: Any = None,
    pending: tuple[Chunk, State] | None = None,
    boundary: Any = None,
) -> State:
    """One link of the sequential chain: h' = e^{γ_last} h + (Tᵀ)ᵀ h + K_decᵀ U, per column block of h, into ``dst``
    (a reused state tile; else a fresh one); with ``pending`` (the previous chunk and its entry state), that chunk's
    output too, its products alternating with the chain's on the tensor engine (``products.issue``).

    Each new block is split into its matmul parts right after its update — issued at first use instead, the split
    waits in GpSimd's queue behind later work — except the lane's ``final`` state, which is only stored. Given the
    next chunk's e^{γ_last} (``next_decay``: the unit's chain goes on), the block's decayed copy is made then too
    (``State.decay_for_next``), so the next link adds it to its PSUM product in one single-pass vector op instead
    of a two-pass scalar_tensor_tensor that also scales. Both forms round e^{γ_last}·h to fp32 once before the add.
    (Figures: PERFORMANCE.md, "Figures behind the kernel's comments".)
    """
    dv = lane.value.shape[3]
    if boundary is not None and boundary.selects:  # a bucket within a unit: the entry read from the chunk's pair
        following = boundary.entry_state(lane.dtype, dst)
    else:
        following = dst.written() if dst is not None else state_tile(lane)
    output = None if pending is None else Output(lane, *pending)
    for j, (cols, new) in enumerate(zip(column_blocks(dv), following.blocks, strict=True)):
        update = tiles.psum((chunk.k_decay.shape[1], cols.stop - cols.start))
        groups = [(update, products.terms(chunk.k_decay, chunk.u[:, cols], chunk.transition_t, state, j))]
        if output is not None:
            groups.append(output.block_products(j, cols))
        products.issue(groups)
        # The chain's one vector op per block, on the vector engine like every chain link, so no other engine's
        # queue holds an instruction that waits on the chain (the split's one GpSimd op excepted, see split_block).
        after = new if boundary is None else boundary.after_chunk(new, j)
        if state.zero:
            tiles.copy_to(after, update, engine=engines.VECTOR)
        elif j in state.decayed:
            tiles.combine(after, update, state.decayed[j], nl.add, engine=engines.VECTOR)
        else:
            tiles.scale_add(after, state.blocks[j], chunk.decay_last, update)
        if boundary is not None:
            boundary.finish(new, j)
        if not final:
            following.parts(j)
            if next_decay is not None:
                following.decay_for_next(j, next_decay)
        if output is not None:
            output.evacuate(cols)
    if boundary is not None:
        boundary.store(following.whole)
    if output is not None:
        output.store()
    return following
