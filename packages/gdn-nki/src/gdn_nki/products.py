"""The accumulating products with the state that the chain and the output issue together on the tensor engine."""

from __future__ import annotations

import itertools
from typing import Any

from . import tiles
from .state import State


def terms(stationary: Any, moving: Any, state_stationary: Any, state: State, j: int) -> list[tuple]:
    """The (stationary, moving) operands of ``stationaryᵀ·moving + state_stationaryᵀ·h[:, block j]``, summed in this
    order in one PSUM tile: the first product, then one term per part of the state's block (none for zero)."""
    found = [(stationary, moving)]
    if not state.zero:
        found += [(state_stationary, part) for part in state.parts(j)]
    return found


def issue(groups: list[tuple[Any, list[tuple]]]) -> None:
    """Issue each ``(psum tile, terms)`` group's accumulating matmuls, the groups' terms alternating.

    Each group's terms still accumulate in their own order (the same sums, bit for bit); the alternation only puts
    an independent matmul between two that accumulate into one tile, so the tensor engine does not wait out a
    result's latency (nki-cpu: 64 PE cycles, the pipeline fill, an inference from the PERF guide) before each.
    Measured, one lane bf16 schur, the chain's products beside the previous chunk's output products instead of
    after them: S = 2048 / 4096 / 8192 / 16384 34.8 / 62.3 / 114.5 / 222.0 -> 33.9 / 60.2 / 111.0 / 214.6 µs, fp32
    S = 2048 / 8192 67.4 / 243.2 -> 66.1 / 237.4; with the chain's first two terms ahead of the output's (its link
    ends one matmul sooner): S = 2048 / 8192 34.3 / 112.2.
    """
    for k, row in enumerate(itertools.zip_longest(*(terms for _, terms in groups))):
        for (dst, _), term in zip(groups, row, strict=True):
            if term is not None:
                tiles.matmul(*term, dst=dst, accumulate=k > 0)
