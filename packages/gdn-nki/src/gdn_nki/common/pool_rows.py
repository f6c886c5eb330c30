"""How a kernel addresses a state pool whose rows lie at their own stride: vLLM's hybrid cache.

vLLM allocates one page per block for a Mamba-type layer and views each of the layer's states as a pool over those
pages: a GDN layer's conv state, then its recurrent (SSM) state, each pool [P, *row] with strides (page elements,
the row's dense strides) and a storage offset of the states before it (vllm-project/vllm 00b08dc4,
``vllm/model_executor/layers/mamba/abstract.py``, ``MambaBase.bind_kv_cache``: ``pages[:, offset : offset +
nbytes].view(dtype).view(-1, *shape)``; earlier releases built the same views with ``torch.as_strided`` in
``gpu_model_runner._reshape_kv_cache_tensors``). So the two pools interleave, each pool's rows one page apart,
each row contiguous inside. Such a pool is not a dense tensor, so it reaches a kernel as its SPAN: the 1-D run of
elements from its first row's first element to its last row's last, (P − 1)·stride + row elements, the other
pool's bytes between the rows included and never addressed.

A row is then found at a run-time offset ``row · stride`` on the span ("NKI Scalar Values", SDK 2.33: arithmetic on
an ``NkiScalar`` is traced, and a scalar is the ``scalar_offset`` of an HBM access pattern), the kernel's row
pattern at that offset unchanged ("NKI Access Patterns", SDK 2.33: ``.ap(pattern, offset, scalar_offset,
indirect_dim)`` on the argument). The rows one past the pool's end that padding requests address start at
P·stride, past the span's end: the DMA skips them (``oob_mode.skip``) as for a dense pool. The rules and the shapes
read the pool's [P, *row] view (``pool_view``, a trace-time access pattern: no data moves).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .kernel_assert import kernel_assert


def pool_view(pool: Any, row_stride: int | None, row_shape: tuple[int, ...]) -> Any:
    """The [P, *row_shape] pool a kernel argument holds: ``pool`` itself when dense (``row_stride`` None), else the
    pool's view over its span (``pool`` 1-D, rows ``row_stride`` elements apart, each row dense)."""
    if row_stride is None:
        return pool
    kernel_assert(all(isinstance(n, int) for n in row_shape), f"a strided pool's row shape must be given, got "
                  f"{row_shape}")  # fmt: skip
    row = math.prod(row_shape)
    span = pool.shape[0] if len(pool.shape) == 1 else -1
    kernel_assert(span >= row and row_stride >= row and (span - row) % row_stride == 0,
                  f"a strided pool is passed as its span: 1-D, (P - 1)·{row_stride} + {row} elements (rows "
                  f"{row_stride} apart, each {row} dense), got shape {tuple(pool.shape)}")  # fmt: skip
    pattern = [[row_stride, (span - row) // row_stride + 1]]
    inner = row
    for size in row_shape:
        inner //= size
        pattern.append([inner, size])
    return pool.ap(pattern=pattern, offset=0)


def row_offset(row: Any, row_stride: int) -> Any:
    """Where row ``row`` (a trace-time int or a run-time ``NkiScalar``) of a strided pool starts in its span."""
    return row * row_stride


@dataclass(frozen=True)
class PoolRows:
    """A pool argument as a kernel addresses its rows at run-time offsets: ``tensor`` the argument (the pool, or a
    strided pool's span), ``view`` its [P, *row] view (shapes and rules), ``row_stride`` None for a dense pool."""

    tensor: Any
    view: Any
    row_stride: int | None = None

    @classmethod
    def of(cls, pool: Any, row_stride: int | None, row_shape: tuple[int, ...]) -> PoolRows:
        return cls(pool, pool_view(pool, row_stride, row_shape), row_stride)

    def row(self, row: Any, pattern: list[list[int]], offset: int = 0) -> Any:
        """``pattern`` at ``offset`` within row ``row`` (a run-time scalar): a dense pool's row is the
        ``scalar_offset`` of dim 0; a span's starts at row · stride."""
        start = row if self.row_stride is None else row_offset(row, self.row_stride)
        return self.tensor.ap(pattern=pattern, offset=offset, scalar_offset=start, indirect_dim=0)

    def row_start(self, row: Any) -> Any:
        """Where row ``row`` starts, in elements of the argument."""
        return row_offset(row, math.prod(self.view.shape[1:]) if self.row_stride is None else self.row_stride)

    def at(self, start: Any, pattern: list[list[int]]) -> Any:
        """``pattern`` from element ``start`` (a run-time scalar) of the argument: the ``scalar_offset`` of its last
        dim, whose stride is one element."""
        return self.tensor.ap(pattern=pattern, offset=0, scalar_offset=start, indirect_dim=len(self.tensor.shape) - 1)


def as_pool_rows(pool: Any) -> PoolRows:
    """``pool`` as its ``PoolRows``: itself, or a dense pool tensor's."""
    return pool if isinstance(pool, PoolRows) else PoolRows(pool, pool)
