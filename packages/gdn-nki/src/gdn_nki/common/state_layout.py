"""How a kernel addresses a state pool held K-major ([.., Hv, Dk, Dv], FLA's default) or V-major ([.., Hv, Dv, Dk]).

V-major ("K-last") pools are what SGLang's GDN backend and vLLM's newer fused-gating kernel keep (gdn-nki README,
"State pool layout"). The kernels compute on [Dk, Dv] state tiles either way; only the DMAs that move a pool row
between HBM and SBUF change, so no copy of the pool (host or HBM) is made. The rules and every static index read a
K-major view (``kmajor_view``).

A DMA access pattern may walk a V-major row in K-major order ("NKI Access Patterns", SDK 2.33: ``.ap()`` "can
express any access pattern the hardware supports"), but it moves single elements (4-byte runs), far below the DMA's
peak ("DMA bandwidth guide", NKI deep dives: runs "< 256 B severely overhead-bound"). So where a state moves whole, it moves as
it lies — [Dv, Dk], runs of Dk·4 bytes — and is transposed by the DMA engines at a trace-time SBUF or HBM address
(``nki.isa.dma_transpose``, SDK 2.33: "src - the source of transpose, must be a tile in HBM or SBUF", 2-D axes
(1, 0) and 3-D (2, 1, 0); only the hardware-DGE lowering needs 2-byte dtypes): ``load_head`` / ``store_head`` here,
``cte.boundaries`` for the bucket's gather and stores (rows at
run-time addresses: the transpose stays on the SBUF side and the run-time address on a ``dma_copy``, which documents
one; ``dma_transpose`` documents none, "DMA Direct / Indirect Transpose Constraints", SDK 2.33). Decode's tiles are
turned by the tensor engine instead (``tkg.pipeline.turn_state_tile``: transpose-mode matmuls, bit-exact in fp32). PERFORMANCE.md, "V-major state pools", has the measured costs, the element-wise first form's too.
"""

from __future__ import annotations

from typing import Any

from .backend import nisa
from .pool_rows import as_pool_rows
from .tiles import FP32, sbuf


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


def head_columns(pool: Any, row: Any, h: int, cols: slice) -> Any:
    """Columns ``cols`` of value head ``h`` of K-major pool row ``row`` (a run-time scalar) as a [Dk, cols] view, on
    the pool argument itself (``.ap`` on an argument, never on a view). ``pool``: the tensor, or its ``PoolRows``
    (a row-strided pool's span, ``common.pool_rows``)."""
    rows = as_pool_rows(pool)
    _, _, dk, dv = rows.view.shape
    return rows.row(row, [[dv, dk], [1, cols.stop - cols.start]], h * dk * dv + cols.start)


def v_major_rows(pool: Any, row: Any, h: int, cols: slice) -> Any:
    """Rows ``cols`` (value dims) of value head ``h`` of V-major pool row ``row`` (a run-time scalar) as they lie:
    [cols, Dk], one contiguous block. ``pool`` as ``head_columns``'."""
    rows = as_pool_rows(pool)
    _, _, dv, dk = rows.view.shape
    return rows.row(row, [[dk, cols.stop - cols.start], [1, dk]], h * dk * dv + cols.start * dk)


def decode_tile_pattern(heads: int, parts_per_head: int, rows: int, dv: int) -> list[list[int]]:
    """The HBM access pattern of one K-major decode state tile within a pool row (``tkg.state_tiles``' layout:
    partition h·G + dk_hi, free (dk_lo, dv)): one run of rows·Dv elements a partition. (Its V-major twin, element
    (dk, dv) of head h at h·Dv·Dk + dv·Dk + dk walked as [[Dv·Dk, H], [rows, G], [1, rows], [Dk, Dv]], moves 4-byte
    runs: ``tkg.pipeline.load_state_tile`` stages, ``turn_state_tile`` transposes instead.)"""
    return [[rows * dv, heads * parts_per_head], [1, rows * dv]]


def is_v_major(view: Any) -> bool:
    """Whether a [Dk, Dv] HBM view of a state is one of ``kmajor_view``'s V-major views (its Dv axis not the
    contiguous one)."""
    return view.get_pattern()[-1][0] != 1


def load_head(dst: Any, view: Any) -> None:
    """DMA one head's [Dk, Dv] state (an HBM view at a trace-time address, ``kmajor_view``'s) into ``dst`` [Dk, Dv]
    fp32 SBUF: a copy, or for a V-major view one ``dma_transpose`` of the [Dv, Dk] rows as they lie."""
    if is_v_major(view):
        nisa.dma_transpose(dst=dst, src=view.permute((1, 0)))
    else:
        nisa.dma_copy(dst=dst, src=view)


def store_head(view: Any, src: Any) -> None:
    """``load_head`` in reverse: ``src`` [Dk, Dv] SBUF into the HBM view (V-major: transposed into an SBUF tile
    first, ``dma_transpose`` writing SBUF only, then stored in runs of Dk·4 bytes)."""
    if not is_v_major(view):
        nisa.dma_copy(dst=view, src=src)
        return
    dk, dv = src.shape
    staged = sbuf((dv, dk), FP32)
    nisa.dma_transpose(dst=staged, src=src)
    nisa.dma_copy(dst=view.permute((1, 0)), src=staged)
