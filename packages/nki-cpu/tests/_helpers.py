"""Small builders shared by the nki-cpu tests: on-chip tiles from numpy arrays."""

from __future__ import annotations

import numpy as np

from nki_cpu import language as nl
from nki_cpu.tensor import NkiTensor


def tile(values: np.ndarray, dtype: object = None, buffer: object = nl.sbuf) -> NkiTensor:
    """An SBUF (or PSUM) tile holding ``values`` rounded to ``dtype`` (default: the array's dtype)."""
    values = np.asarray(values)
    t = nl.ndarray(values.shape, dtype or values.dtype, buffer=buffer)
    t.write(values)
    return t


def empty(shape: tuple[int, ...], dtype: object = nl.float32, buffer: object = nl.sbuf) -> NkiTensor:
    """A fresh tile (NaN-filled)."""
    return nl.ndarray(shape, dtype, buffer=buffer)


def rng(seed: int = 0) -> np.random.Generator:
    """Seeded numpy generator."""
    return np.random.default_rng(seed)
