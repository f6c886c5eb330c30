"""The output stage: one chunk's out = scale · (attn U + Q_eff h) from its entry state, stored to HBM (normalized
and gated first in ``gdn_cte_normed``: ``normed.output_stage``).

gdn_ref twin: the outputs ``gdn_ref.chunked._state_chain`` returns beside the states it carries.
"""

from __future__ import annotations

from typing import Any

from ..common import tiles
from ..common.backend import nisa, nl
from . import products
from .chunks import Chunk, Lane
from .state import State, column_blocks


class Output:
    """One chunk's output, out = scale · (attn U + Q_eff h) from its entry state, block by block of Dv: the
    products into PSUM, their evacuations into one SBUF tile and its store to HBM."""

    def __init__(self, lane: Lane, chunk: Chunk, entry_state: State) -> None:
        self.lane, self.chunk, self.entry_state = lane, chunk, entry_state
        self.psum: Any = None
        self.norm_tiles = None
        if lane.norm is None:
            self.tile = tiles.sbuf((lane.chunk, lane.value.shape[3]), lane.dtype)
        else:  # the fused norm (``normed.output_stage``): its z rows and gate issued now, ahead of the products they follow
            self.norm_tiles = lane.norm.tiles(lane.dtype)
            lane.norm.load_gate(self.norm_tiles, lane.b, lane.h, chunk.token, lane.chunk)
            self.tile = self.norm_tiles.x[: lane.chunk, 0, :]

    def block_products(self, j: int, cols: slice) -> tuple[Any, list[tuple]]:
        """Block j's PSUM tile and the terms of its products (``products.issue``)."""
        chunk = self.chunk
        self.psum = tiles.psum((self.lane.chunk, cols.stop - cols.start))
        return self.psum, products.terms(chunk.attn_t, chunk.u[:, cols], chunk.q_eff_t, self.entry_state, j)

    def evacuate(self, cols: slice) -> None:
        # Either engine (the balancer's choice): fixed on the vector engine it would queue behind the chain's
        # updates
        tiles.copy_to(self.tile[:, cols], self.psum, scale=self.lane.scale)

    def store(self) -> None:
        """Store the tile; with the fused norm, hand it over instead (its norm and store follow at later links)."""
        lane = self.lane
        dst = lane.out[lane.b, lane.h, nl.ds(self.chunk.token, lane.chunk), :]
        if lane.norm is None:
            nisa.dma_copy(dst=dst, src=self.tile)
        else:
            lane.norm.push(self.norm_tiles, lane.chunk, dst)


def emit_output(lane: Lane, chunk: Chunk, entry_state: State) -> None:
    """The chunk's output from its entry state, stored to HBM, on its own: a lane's last chunk, whose chain link
    is already issued (every other chunk's output is issued with the next chunk's link, ``advance_state``)."""
    output = Output(lane, chunk, entry_state)
    for j, cols in enumerate(column_blocks(lane.value.shape[3])):
        products.issue([output.block_products(j, cols)])
        output.evacuate(cols)
    output.store()
