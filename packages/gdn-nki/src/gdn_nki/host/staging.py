"""All-or-nothing writes to a caller's state: a launch works on a private copy of the rows it reads and writes,
copied back only once it has completed, so a launch that fails part-way (after some lanes stored) leaves the
caller's state as it was."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def stage(state: np.ndarray | None, rows: object) -> np.ndarray | None:
    """A private C-contiguous float32 copy of ``state[rows]`` (``...``: the whole state), or None without a state."""
    return None if state is None else np.array(state[rows], dtype=np.float32, order="C", copy=True)


def commit(state: np.ndarray, rows: object, staged: np.ndarray, on_commit: Callable[[], None] | None) -> None:
    """Write a completed launch's staged rows into ``state[rows]``; ``on_commit`` first: it may refuse (raise), and
    then nothing is written."""
    if on_commit is not None:
        on_commit()
    state[rows] = staged
