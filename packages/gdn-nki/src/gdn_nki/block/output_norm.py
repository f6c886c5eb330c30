"""The block's output stage: the gated RMSNorm of every (token, value head) row, RMSNorm(o)·norm_weight·silu(z)
(Hugging Face's ``Qwen3NextRMSNormGated``: eps 1e-6, fp32 arithmetic), 128 rows a tile, with the recurrence's
per-row arithmetic (``tkg.recurrence.gated_rms_norm``). A padding request's o is zeros, so its rows stay zeros."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gdn_ref.decode import RMS_NORM_EPS

from ..common.backend import nisa
from ..common.tiles import FP32, sbuf
from ..tkg.recurrence import gated_rms_norm

PARTITIONS = 128


@dataclass(frozen=True)
class _Rows:
    """What ``gated_rms_norm`` reads of its launch: the head dim, the eps column and the weight on every partition."""

    dv: int
    rms_eps: Any
    norm_weight: Any


def gated_norm(o: Any, z: Any, norm_weight: Any, out: Any) -> None:
    """``out [R, Dv] = RMSNorm(o) · norm_weight · silu(z)`` row by row (o, z [R, Dv] in HBM, any float dtype; the
    DMA widens to fp32 and narrows the result)."""
    rows, dv = o.shape
    eps = sbuf((PARTITIONS, 1), FP32)
    nisa.memset(dst=eps, value=RMS_NORM_EPS)
    weight = sbuf((PARTITIONS, dv), FP32)
    nisa.dma_copy(dst=weight, src=norm_weight.ap(pattern=[[0, PARTITIONS], [1, dv]], offset=0))
    consts = _Rows(dv=dv, rms_eps=eps, norm_weight=weight)
    for r0 in range(0, rows, PARTITIONS):
        count = min(PARTITIONS, rows - r0)
        normed, gate = sbuf((count, dv), FP32), sbuf((count, dv), FP32)
        nisa.dma_copy(dst=normed, src=o[r0 : r0 + count, :])
        nisa.dma_copy(dst=gate, src=z[r0 : r0 + count, :])
        gated_rms_norm(consts, normed, gate, consts)
        nisa.dma_copy(dst=out[r0 : r0 + count, :], src=normed)
