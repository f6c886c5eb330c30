"""How a kernel addresses a state pool held K-major ([.., Hv, Dk, Dv], FLA's default) or V-major ([.., Hv, Dv, Dk]).

V-major ("K-last") pools are what SGLang's GDN backend and vLLM's newer fused-gating kernel keep (gdn-nki README,
"State pool layout"). The kernels compute on [Dk, Dv] state tiles either way; only the DMAs that move a pool row
between HBM and SBUF change: their HBM access pattern walks the V-major row in the K-major tile's element order, so
no copy of the pool (host or HBM) and no transposing instruction is needed. A DMA access pattern is any list of
``[step, num]`` pairs over the tensor ("NKI Access Patterns", SDK 2.33: "``.ap()`` ... can express any access
pattern the hardware supports"); ``nki.isa.dma_transpose`` cannot serve here, since a pool row is addressed at run
time and that instruction documents no run-time start address ("DMA Direct / Indirect Transpose Constraints",
``nki.isa.dma_transpose``, SDK 2.33).

The price is the DMA's run length: a K-major [Dk, cols] view moves runs of cols·4 bytes a partition, the V-major
one single elements (4 bytes), which the DMA moves far below its peak ("DMA bandwidth guide", NKI deep dives: runs
"< 256 B severely overhead-bound"); PERFORMANCE.md, "V-major state pools", has the measured cost.
"""

from __future__ import annotations

from typing import Any


def kmajor_shape(shape: tuple[int, ...], v_first: bool) -> tuple[int, ...]:
    """``shape`` of a state tensor as its K-major twin's ([.., Dk, Dv]): the last two swapped when ``v_first``."""
    shape = tuple(shape)
    return (*shape[:-2], shape[-1], shape[-2]) if v_first else shape


def kmajor_view(tensor: Any, v_first: bool) -> Any:
    """A K-major view ([.., Hv, Dk, Dv]) of a state tensor: the tensor itself, or (V-major) its last two dims
    swapped (``NkiTensor.permute``, a view: no data moves). For static indexing (``view[row, h]`` is a [Dk, Dv]
    view every DMA reads in K-major order) and the shape rules; run-time-addressed views use ``head_columns``."""
    if tensor is None or not v_first:
        return tensor
    order = list(range(len(tensor.shape)))
    order[-2], order[-1] = order[-1], order[-2]
    return tensor.permute(order)


def head_columns(pool: Any, row: Any, h: int, cols: slice, v_first: bool) -> Any:
    """Columns ``cols`` of value head ``h`` of pool row ``row`` (a run-time scalar) as a [Dk, cols] view, on the
    pool argument itself (``.ap`` on an argument, never on a view)."""
    n = cols.stop - cols.start
    if v_first:
        _, _, dv, dk = pool.shape
        pattern, offset = [[1, dk], [dk, n]], h * dk * dv + cols.start * dk
    else:
        _, _, dk, dv = pool.shape
        pattern, offset = [[dv, dk], [1, n]], h * dk * dv + cols.start
    return pool.ap(pattern=pattern, offset=offset, scalar_offset=row, indirect_dim=0)


def decode_tile_pattern(heads: int, parts_per_head: int, rows: int, dk: int, dv: int, v_first: bool) -> list[list[int]]:
    """The HBM access pattern of one decode state tile within a pool row (``tkg.state_tiles``' layout: partition
    h·G + dk_hi, free (dk_lo, dv) = element [h][dk_hi·rows + dk_lo, dv]), in the tile's row-major order.

    K-major: one run of rows·Dv elements a partition. V-major: element (dk, dv) of head h sits at
    h·Dv·Dk + dv·Dk + dk, so the pattern walks (h, dk_hi, dk_lo, dv) with dv innermost at step Dk.
    """
    if not v_first:
        return [[rows * dv, heads * parts_per_head], [1, rows * dv]]
    return [[dv * dk, heads], [rows, parts_per_head], [1, rows], [dk, dv]]
