"""The gated RMSNorm folded into the output stage (``gdn_cte_normed``): each chunk's out tile, as rounded to the
compute dtype, normalized per token and gated by act(z) before its store, so the launch writes y instead of o.

A chunk's out tile is [C tokens, Dv] for one (sequence, value head) lane: each partition holds one token's head
vector, so the norm's rows are the tile's partitions, one row each (``norm.kernel``'s tiles with R = 1). z comes
in the layout the layer holds it, seq-first [B, S, Hv, Dv] (HF's ``Qwen3NextGatedDeltaNet`` splits it from the
projection as [batch, seq, heads, head_v_dim]): the chunk's rows of one head are C runs of Dv elements, one per
partition, Hv·Dv apart. The arithmetic is ``norm.kernel``'s instruction for instruction (its ``NormTiles``
methods), so y is bit for bit what ``gdn_gated_rms_norm`` makes of the stored o and the same z rows.

gdn_ref twin: ``gdn_ref.norm.gated_rms_norm_oracle`` of ``gdn_ref.chunked``'s outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..common.backend import nisa
from ..norm.kernel import GATES, NormConstants, NormTiles


@dataclass
class OutputNorm:
    """What every lane's output stage reads to normalize its chunks: z ([B, S, Hv, Dv] @ HBM, the compute dtype),
    the launch's constants (the weight on every partition, eps) and the gate's activation function."""

    z: Any
    constants: NormConstants
    gate_op: Any

    @classmethod
    def allocate(cls, z: Any, weight: Any, eps: float, activation: str) -> OutputNorm:
        """The launch's constants, issued once before the lanes (the weight's load and spread)."""
        return cls(z, NormConstants(weight, z.shape[3], 1, eps), GATES[activation])

    def tiles(self, dtype: Any) -> NormTiles:
        """A chunk's norm tiles, one row per partition; its ``x[:, 0]`` is the out tile the evacuation writes."""
        return NormTiles(dtype, 1, self.z.shape[3], True)

    def load_gate(self, tile: NormTiles, b: int, h: int, token: Any, rows: int) -> None:
        """DMA the z rows of tokens ``token ..`` of head h (``token``: an int, or a compiled loop's run-time scalar)
        and issue act(z) · weight: neither waits on the chunk's products."""
        nisa.dma_copy(dst=tile.z[:rows], src=_seq_first_rows(self.z, b, h, token, rows))
        tile.activate_gate(self.gate_op, rows, 1)
        tile.weigh_gate(self.constants, rows, 1)

    def finish(self, tile: NormTiles, rows: int) -> Any:
        """The norm of the evacuated out tile: x², the row sums, rsqrt(mean + eps), x̂ and y; returns y [rows, Dv]."""
        tile.square(rows, 1)
        tile.sum_squares(rows, 1)
        tile.inverse_rms_of(self.constants, rows, 1)
        tile.output(self.constants, rows, 1)
        return tile.y[:rows, 0, :]


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
