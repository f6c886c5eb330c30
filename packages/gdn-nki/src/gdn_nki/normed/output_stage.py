"""The gated RMSNorm folded into the output stage (``gdn_cte_normed``): each chunk's out tile, as rounded to the
compute dtype, normalized per token and gated by act(z) before its store, so the launch writes y instead of o.

A chunk's out tile is [C tokens, Dv] for one (sequence, value head) lane: each partition holds one token's head
vector, so the norm's rows are the tile's partitions, one row each (``norm.kernel``'s tiles with R = 1). z comes
in the layout the layer holds it, seq-first [B, S, Hv, Dv] (HF's ``Qwen3NextGatedDeltaNet`` splits it from the
projection as [batch, seq, heads, head_v_dim]): the chunk's rows of one head are C runs of Dv elements, one per
partition, Hv·Dv apart. The arithmetic is ``norm.kernel``'s operation for operation in fp32 (some on other engines:
``_InFlight.issue_stage``), so y is bit for bit what ``gdn_gated_rms_norm`` makes of the stored o and the same z
rows. The norm's dependent steps are spread over the chain links that follow the chunk's (``OutputNorm.push``).

gdn_ref twin: ``gdn_ref.norm.gated_rms_norm_oracle`` of ``gdn_ref.chunked``'s outputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..common.backend import nisa, nl
from ..common.engines import GPSIMD, VECTOR
from ..norm.kernel import GATES, NormConstants, NormTiles


@dataclass
class OutputNorm:
    """What every lane's output stage reads to normalize its chunks: z ([B, S, Hv, Dv] @ HBM, the compute dtype),
    the launch's constants (the weight on every partition, eps) and the gate's activation function."""

    z: Any
    constants: NormConstants
    gate_op: Any
    in_flight: list = field(default_factory=list)  # chunks whose norm is under way (``push``)

    @classmethod
    def allocate(cls, z: Any, weight: Any, eps: float, activation: str) -> OutputNorm:
        """The launch's constants, issued once before the lanes (the weight's load and spread)."""
        return cls(z, NormConstants(weight, z.shape[3], 1, eps), GATES[activation])

    def tiles(self, dtype: Any) -> NormTiles:
        """A chunk's norm tiles, one row per partition; its ``x[:, 0]`` is the out tile the evacuation writes."""
        return NormTiles(dtype, 1, self.z.shape[3], True)

    def load_gate(self, tile: NormTiles, b: int, h: int, token: Any, rows: int) -> None:
        """DMA the z rows of tokens ``token ..`` of head h (``token``: an int, or a compiled loop's run-time scalar):
        issued with the chunk's products, so it has arrived by the time act(z) is issued (``push``)."""
        nisa.dma_copy(dst=tile.z[:rows], src=_seq_first_rows(self.z, b, h, token, rows))

    def push(self, tile: NormTiles, rows: int, dst: Any) -> None:
        """Every chunk in flight one stage on (``advance``), then the evacuated out tile ``tile`` in: its norm
        stages follow at the next chain links, its y stored to ``dst`` after the last."""
        self.advance()
        self.in_flight.append(_InFlight(tile, rows, dst))

    def advance(self) -> None:
        """Issue the next stage of every chunk in flight, the oldest first; drop the ones stored."""
        for chunk in self.in_flight:
            chunk.issue_stage(self.constants, self.gate_op)
        self.in_flight = [chunk for chunk in self.in_flight if chunk.stage < STAGES]

    def flush(self) -> None:
        """Issue what is left of every chunk in flight (a unit's chain ends: nothing crosses a period)."""
        while self.in_flight:
            self.advance()


# The norm's dependent steps, one stage per chain link (``OutputNorm.advance``): each stage reads what the one
# before wrote a link earlier, so no engine's queue holds a step waiting on another engine's step issued beside it
# (the engines run their queues in order: issued back to back, each step would hold the chain's next instructions
# behind it). The vector engine, which runs the chain's links, gets one step (x̂); the five stages' order and engines
# are the fastest of those measured (PERFORMANCE.md, "Gated RMSNorm").
STAGES = 5


@dataclass
class _InFlight:
    """One chunk's out tile between its evacuation and its store: ``stage`` is the next to issue."""

    tile: NormTiles
    rows: int
    dst: Any
    stage: int = 0

    def issue_stage(self, constants: NormConstants, gate_op: Any) -> None:
        """Issue stage ``stage`` and move on (``STAGES`` in all). The same fp32 operations as
        ``gdn_gated_rms_norm``'s, some on other engines, so y keeps its bits: act(z), and x² with its row sums in one
        scalar ``activation_reduce`` (the norm kernel's GpSimd product and vector reduce: the vector engine carries
        the chain's links); weight · act(z) on GpSimd and rsqrt(mean + eps); x̂ = x · rsqrt as the vector engine's
        per-partition scalar multiply; y; its store."""
        tile, rows = self.tile, self.rows
        x = tile.x[:rows, 0]
        if self.stage == 0:
            tile.activate_gate(gate_op, rows, 1)
            nisa.activation_reduce(dst=tile.work[:rows, 0], op=nl.square, data=x, reduce_op=nl.add,
                                   reduce_res=tile.sums[:rows, 0:1])  # fmt: skip
        elif self.stage == 1:
            if constants.weight_sbuf is not None:  # GpSimd reads the weight's SBUF copy
                gate = tile.gate[:rows, 0]
                weight = constants.weight_rows(rows, 1, in_psum=False)[:, 0]
                nisa.tensor_tensor(dst=gate, data1=gate, data2=weight, op=nl.multiply, engine=GPSIMD)
            tile.inverse_rms_of(constants, rows, 1)
        elif self.stage == 2:
            nisa.tensor_scalar(dst=tile.work[:rows, 0], data=x, op0=nl.multiply,
                               operand0=tile.inverse_rms[:rows, 0:1], engine=VECTOR)  # fmt: skip
        elif self.stage == 3:
            tile.gate_output(constants, rows, 1)
        else:
            nisa.dma_copy(dst=self.dst, src=tile.y[:rows, 0, :])
        self.stage += 1


def _seq_first_rows(z: Any, b: int, h: int, token: Any, rows: int) -> Any:
    """Tokens ``token .. token + rows − 1`` of head h of batch row b of a seq-first [B, S, Hv, D] tensor as
    [rows, 1, D]: token t's head vector on partition t. A run-time ``token`` is the access pattern's scalar offset
    in rows of the S dimension (``indirect_dim=1``), on the argument itself as ``hbm._chunk_major`` explains."""
    _, seq_len, heads, dim = z.shape
    pattern = [[heads * dim, rows], [dim, 1], [1, dim]]
    base = (b * seq_len * heads + h) * dim
    if isinstance(token, int):
        return z.ap(pattern=pattern, offset=base + token * heads * dim)
    return z.ap(pattern=pattern, offset=base, scalar_offset=token, indirect_dim=1)
