"""The host's side of a pool whose rows lie at their own stride (vLLM's hybrid cache, ``common.pool_rows``): which
layouts the kernels address in place, and the span a kernel takes for one.

A pool [P, *row] is addressed in place when each row is dense (its inner strides row-major) and the rows lie a
positive stride apart, no smaller than a row (rows never overlap). The kernel then takes the pool's span, the 1-D
run from its first element to its last (``span``: a view, no copy), and the row stride; every rule and value scan
still reads the caller's [P, *row] view. A span's rows are found at run-time offsets row·stride computed in int32
(``nki.isa.scalar_load`` of an int32 tile): the padding row one past the end, P·stride, must fit too.
"""

from __future__ import annotations

import math

import numpy as np

from gdn_ref.contract import Violation

INT32_MAX = 2**31 - 1


def strided_rows(shape: tuple[int, ...], strides: tuple[int, ...]) -> int | None:
    """The row stride (elements) of a pool of ``shape`` and element ``strides`` the kernels address as a span, or
    None when no kernel can: a row not dense inside, rows at a stride below a row's size, zero or negative."""
    if len(shape) < 2:
        return None
    dense = 1
    for size, stride in zip(reversed(shape[1:]), reversed(strides[1:]), strict=True):
        if size > 1 and stride != dense:
            return None
        dense *= size
    if shape[0] > 1 and strides[0] < dense:
        return None
    return int(strides[0]) if shape[0] > 1 else dense


def span_violations(rows: int, row_stride: int, argument: str, api: str) -> list[Violation]:
    """A strided pool of ``rows`` rows whose padding row's offset (rows·stride) overflows the kernels' int32 row
    offsets."""
    if rows * row_stride <= INT32_MAX:
        return []
    return [Violation("state_pool.span", argument, f"{rows} rows {row_stride} elements apart",
                      f"a strided pool's row offsets (row · stride, up to P · stride) must fit in int32 "
                      f"({INT32_MAX})", f"pass a pool of fewer rows, or a contiguous {argument}", api)]  # fmt: skip


def numpy_span(pool: np.ndarray) -> tuple[np.ndarray, int | None]:
    """``pool`` as a kernel takes it: itself when C-contiguous, else (when its rows are addressable,
    ``strided_rows``) its 1-D span over the same memory and the row stride. Any other layout is returned as it is
    (nki-cpu stages it: the torch drop-ins refuse such a pool first)."""
    if not isinstance(pool, np.ndarray) or pool.ndim < 2 or pool.flags.c_contiguous or pool.size == 0:
        return pool, None  # not a pool the rules accept (they name it), or addressed as it is
    itemsize = pool.dtype.itemsize
    stride = strided_rows(pool.shape, tuple(s // itemsize for s in pool.strides))
    if stride is None or any(s % itemsize for s in pool.strides):
        return pool, None
    length = (pool.shape[0] - 1) * stride + math.prod(pool.shape[1:])
    span = np.lib.stride_tricks.as_strided(pool, shape=(length,), strides=(itemsize,), writeable=pool.flags.writeable)
    return span, stride
