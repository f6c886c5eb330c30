"""The accumulating products with the state that the chain and the output issue together on the tensor engine."""

from __future__ import annotations

import itertools
from typing import Any

from ..common import tiles
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
    Alternating beats issuing the chain's products after the output's, and beats putting the chain's first two
    terms ahead of the output's (PERFORMANCE.md).
    """
    for k, row in enumerate(itertools.zip_longest(*(terms for _, terms in groups))):
        for (dst, _), term in zip(groups, row, strict=True):
            if term is not None:
                tiles.matmul(*term, dst=dst, accumulate=k > 0)
