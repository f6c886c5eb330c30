"""Row tiles: a row-major [..., D] HBM tensor cut into [P, R, D] tiles whose partitions each hold R consecutive rows
(one contiguous run of R·D elements), and per-column constants ([D] vectors) on every partition — the layout of the
elementwise row kernels (``norm.kernel``'s gated RMSNorm, ``gating.kernel``'s gates).
"""

from __future__ import annotations

from typing import Any

from .backend import nisa
from .tiles import matmul, psum, sbuf

RUN_BYTES = 4096  # contiguous bytes per partition per DMA: where descriptor efficiency saturates (§4.4)
# A launch of few rows is cut into at least this many tiles (shorter runs), so the pipeline overlaps them.
MIN_TILES = 4
BANK = 512  # fp32 columns of one PSUM bank: a matmul's largest moving free size (docs/nki-sources.md §2.9)


def rows_per_partition(rows: int, dim: int, itemsize: int) -> int:
    """R: rows per partition of a full tile — a ``RUN_BYTES`` run, fewer when the launch has too few rows to make
    ``MIN_TILES`` tiles of 128 partitions with it (decode: N·Hv rows), never below 1."""
    return max(1, min(RUN_BYTES // (dim * itemsize), rows // (128 * MIN_TILES)))


def tile_plan(rows: int, per_part: int) -> list[tuple[int, int, int]]:
    """The launch's tiles as (first row, partitions, rows per partition): full [128, R] tiles, then the rest as
    one [rest // R, R] tile and one [rest % R, 1] tile (each row in exactly one tile, in order)."""
    plan = []
    full = 128 * per_part
    start = 0
    while rows - start >= full:
        plan.append((start, 128, per_part))
        start += full
    rest = rows - start
    if rest // per_part:
        plan.append((start, rest // per_part, per_part))
        start += rest // per_part * per_part
    if rows - start:
        plan.append((start, rows - start, 1))
    return plan


def spread_to_partitions(vector: Any, dim: int) -> Any:
    """A [dim] HBM vector on every partition: [128, dim] fp32 in PSUM, from one HBM row spread by a 0/1 matmul
    (exact: one nonzero term per product)."""
    raw = sbuf((1, dim), vector.dtype)
    nisa.dma_copy(dst=raw, src=vector.ap(pattern=[[dim, 1], [1, dim]], offset=0))
    ones = sbuf((1, 128), vector.dtype)  # a matmul's operands share a precision (ISA nc_matmul)
    nisa.memset(dst=ones, value=1.0)
    spread = psum((128, dim))
    for first in range(0, dim, BANK):
        cols = slice(first, min(dim, first + BANK))
        matmul(ones, raw[:, cols], dst=spread[:, cols], stationary_onezero=True)
    return spread


def repeat_rows(tile: Any, dim: int, parts: int, run: int) -> Any:
    """A [≥parts, dim] tile as [parts, run, dim]: each partition's row repeated ``run`` times (stride 0)."""
    return tile.ap(pattern=[[dim, parts], [0, run], [1, dim]], offset=0)


def rows_view(tensor: Any, start: int, parts: int, run: int) -> Any:
    """Rows ``start ..`` of a row-major [..., D] tensor as [parts, run, D]: partition p holds rows start + p·run ..
    start + p·run + run − 1, one contiguous run of run·D elements."""
    dim = tensor.shape[-1]
    return tensor.ap(pattern=[[run * dim, parts], [dim, run], [1, dim]], offset=start * dim)
