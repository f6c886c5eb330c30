"""The recurrent state a lane's chain carries: an fp32 master in column blocks, and its matmul operands.

gdn_ref twin: the state ``gdn_ref.chunked._state_chain`` carries (float64 there).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..common import engines, tiles
from ..common.backend import nl
from ..common.tiles import FP32
from .chunks import Lane, column_blocks


@dataclass
class State:
    """The recurrent state of a lane: an fp32 master whatever the compute dtype, held as column blocks.

    The state carries the whole sequence, so its master never passes through the compute dtype. Its two products
    (with Tᵀ and with Q_effᵀ) read each block as ``parts(j)``: with fp32 compute the master itself; with bf16 two
    bf16 operands whose sum is the master to ~16 bits (``split_block``), so each product is two matmuls at the bf16
    rate instead of one at the fp32 rate, a quarter of it. Column block j of h' = e^{γ_last}h + Th + K_decᵀU depends
    only on column block j of h, so the chain is two independent chains over halves of Dv: the next chunk's product on
    one half starts while the vector engine still updates the other, halving the chain's exposed latency.

    A lane without an initial state starts from a state known to be zero: its products vanish and are not issued.

    Within a unit's chain, each block's decayed copy e^{γ_last}·h for the NEXT chunk (``decayed``) is made right
    after the block is written, beside its split and off the vector engine, so the next link's chain op is a plain
    add of it to the PSUM product (see ``advance_state``).

    A state tile reused by a compiled loop (``lanes.py``'s state ring, ``state_tile(reused=True)``) also holds the
    tiles its parts and decayed copies are made in (``lo``, ``decayed_tiles``), so nothing it holds is allocated
    inside the loop.
    """

    blocks: list[Any] | None  # the master's column blocks (views of ``whole``); None for the zero state
    whole: Any = None  # [Dk, Dv] fp32 tile
    operand_dtype: Any = FP32  # dtype of the products' state operands: the compute dtype
    _parts: dict[int, list[Any]] = field(default_factory=dict, repr=False)
    lo: list[Any] | None = None  # per block, the tile its low part is made in (None: a fresh tile)
    decayed_tiles: list[Any] | None = None  # per block, the tile its decayed copy is made in (None: a fresh tile)
    decayed: dict[int, Any] = field(default_factory=dict, repr=False)  # block -> e^{γ_last}·h for the next chunk
    # Per block, the bf16 high halves of ``blocks`` when the blocks are views at a run-time offset (a bucket's entry
    # state, read from its boundary tile): reinterpreted before the run-time select, since no page allows it after
    # ("Not supported after dynamic / vector select", ``NkiTensor.view``). None: taken from the blocks.
    high: list[Any] | None = None

    @property
    def zero(self) -> bool:
        return self.blocks is None

    def parts(self, j: int) -> list[Any]:
        """Block j's matmul operands, made on first use (after the state is written: ``written``)."""
        if j not in self._parts:
            self._parts[j] = split_block(self.blocks[j], self.operand_dtype, self.lo[j] if self.lo else None,
                                         None if self.high is None else self.high[j])  # fmt: skip
        return self._parts[j]

    def written(self) -> State:
        """Forget the parts and decayed copies made from the tile's previous contents (a reused tile was just
        written)."""
        self._parts.clear()
        self.decayed.clear()
        return self

    def decay_for_next(self, j: int, decay_last: Any) -> None:
        """Make block j times the next chunk's e^{γ_last} ([Dk, 1] fp32), on GpSimd.

        GpSimd, not the balancer's pick of GpSimd or the scalar engine: an SBUF-only multiply is the one kind of
        work that can leave the scalar engine, which evacuates PSUM and sets the floor from S = 4096 on, for the
        engine with the most room (the gate-span scaling, moved there too, gains less, so it stays balanced).
        """
        block = self.blocks[j]
        dst = self.decayed_tiles[j] if self.decayed_tiles else tiles.sbuf(tuple(block.shape), FP32)
        self.decayed[j] = tiles.scale_rows(block, decay_last, FP32, dst=dst, among=(engines.GPSIMD,))


def split_block(block: Any, dtype: Any, lo: Any = None, hi: Any = None) -> list[Any]:
    """The matmul operands of an fp32 state block for the compute ``dtype``, which sum to the block.

    fp32: ``[block]``. bf16: ``[hi, lo]`` with ``hi`` the block truncated to bf16 — the upper half of each fp32
    element, read in place (``tiles.high_half``, no instruction) — and ``lo = bf16(block − hi)``, one GpSimd
    instruction (``block − hi`` is exact in fp32; its rounding to bf16 is the split's only error, below 2⁻¹⁶ of
    the element). GpSimd: the one engine with room in the chain's period (on the vector engine, in line with the
    chain's update, it makes a chain link more than twice as long). ``lo`` is made in the given tile (else a fresh
    one); ``hi`` is given for a block at a run-time offset (``State.high``).
    """
    if dtype == FP32:
        return [block]
    hi = tiles.high_half(block) if hi is None else hi
    lo = lo if lo is not None else tiles.sbuf(tuple(block.shape), dtype)
    return [hi, tiles.combine(lo, block, hi, nl.subtract, engine=engines.GPSIMD)]


def state_tile(lane: Lane, reused: bool = False) -> State:
    """A fresh [Dk, Dv] fp32 state tile for ``lane``'s shapes; ``reused``: with its parts' tiles too (for a tile a
    compiled loop writes again and again)."""
    dk, dv = lane.key.shape[3], lane.value.shape[3]
    whole = tiles.sbuf((dk, dv), FP32)
    blocks = [whole[:, cols] for cols in column_blocks(dv)]
    if not reused:
        return State(blocks, whole, lane.dtype)

    def per_block(dtype: Any) -> list[Any]:
        return [tiles.sbuf((dk, cols.stop - cols.start), dtype) for cols in column_blocks(dv)]

    lo = per_block(lane.dtype) if lane.dtype != FP32 else None
    return State(blocks, whole, lane.dtype, lo=lo, decayed_tiles=per_block(FP32))
