"""The constant tiles one launch loads or builds once: identities and the masks every stage multiplies by.

gdn_ref twin: ``gdn_ref.masks`` (the mask pack these are loaded from) and the masks ``gdn_ref.chunked`` builds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gdn_ref.masks import PLANE_EYE, PLANE_TRIL_STRICT

from ..common import engines, tiles
from ..common.backend import nisa, nl
from ..common.tiles import FP32


@dataclass
class Constants:
    """Constant tiles one kernel launch loads or builds once.

    Attributes:
        eye32: [C, C] fp32 identity (moving operand of the gate broadcast).
        eye: [C, C] identity in the compute dtype (seeds and transposes of the inverse).
        after: [C, C] fp32, 1 where row t > column j: the gates a decay from token j spans start after j.
        through: [C, C] fp32, 1 where row t <= column i: ... and end at token i (the moving operand, 0/1).
        planes: algorithm-specific masks (schur: off-block planes; neumann: block masks).
    """

    eye32: Any
    eye: Any
    after: Any
    through: Any
    planes: dict[str, Any] = field(default_factory=dict)


def constants_from_pack(mask_pack: Any, chunk: int, dtype: Any) -> Constants:
    """Load the shared constants from the host-built mask pack (one DMA each, no on-device mask building)."""
    eye32 = nl.load(mask_pack[PLANE_EYE, 0:chunk, 0:chunk], dtype=FP32)
    eye = tiles.sbuf((chunk, chunk), dtype)
    tiles.copy_to(eye, eye32)
    after = nl.load(mask_pack[PLANE_TRIL_STRICT, 0:chunk, 0:chunk], dtype=FP32)  # 1 where column < row
    return Constants(eye32=eye32, eye=eye, after=after, through=_complement(after))


def constants_on_device(chunk: int, dtype: Any) -> Constants:
    """Build the shared constants with GpSimd selects (for the algorithm that takes no mask pack)."""
    ones = tiles.sbuf((chunk, chunk), FP32)
    nisa.memset(dst=ones, value=1.0)
    eye32 = tiles.select_by_diagonal(tiles.sbuf((chunk, chunk), FP32), ones, 0.0, nl.equal)
    eye = tiles.copy_to(tiles.sbuf((chunk, chunk), dtype), eye32)
    after = tiles.select_by_diagonal(tiles.sbuf((chunk, chunk), FP32), ones, 0.0, nl.less)
    return Constants(eye32=eye32, eye=eye, after=after, through=_complement(after))


def _complement(mask: Any) -> Any:
    """1 − mask for a 0/1 tile (exact), in one vector-engine instruction (GpSimd's tensor_scalar is rsqrt-only)."""
    out = tiles.sbuf(tuple(mask.shape), FP32)
    engines.active().charge(engines.VECTOR, engines.stream_ns(engines.VECTOR, mask.shape[1]))
    nisa.tensor_scalar(
        dst=out, data=mask, op0=nl.multiply, operand0=-1.0, op1=nl.add, operand1=1.0, engine=engines.VECTOR
    )
    return out
