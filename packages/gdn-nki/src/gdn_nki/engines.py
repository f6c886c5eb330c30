"""Trace-time engine assignment: give each flexible instruction to the engine with the least work queued so far.

Vector (DVE), scalar (ACT) and GpSimd (POOL) engines each run their instructions in issue order. Many of this
kernel's elementwise instructions can run on more than one of them (a PSUM evacuation on ACT or DVE; an SBUF
multiply on POOL or DVE), and a fixed assignment leaves one engine with a long queue while another idles. The
balancer keeps a running estimate of the time issued to each engine and places every flexible instruction where
it would finish first; fixed instructions are charged to their engine so the estimate stays honest.

The estimates use the documented per-instruction formulas (docs/nki-sources.md §4.5: ``max(MIN_II, N)`` engine cycles for
streaming ops, ×2 for two-operand vector ops without a perf mode, bf16 perf modes on DVE; engine clocks §4.1).
They only rank engines; the cost model, not this module, is what measures the kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .backend import nisa

VECTOR = nisa.engine.vector
SCALAR = nisa.engine.scalar
GPSIMD = nisa.engine.gpsimd

MIN_II = 64  # cycles, minimum initiation interval of a streaming instruction (§4.2)
CLOCK_GHZ = {VECTOR: 0.96, SCALAR: 1.2, GPSIMD: 1.2}  # Trn2 engine clocks (§4.1)
GPSIMD_START = 150  # cycles before a GpSimd select/iota streams (§4.5)
# How far an engine's issued work may trail the busiest engine's (about ten 128-element instructions): enough to
# absorb the next step's burst, too little to bank a whole phase of idleness (measured best of 0.5–8 µs).
IDLE_CREDIT_NS = 1000.0


def stream_ns(engine: Any, elements: int, passes: float = 1.0, start: int = 0) -> float:
    """Estimated time of a streaming instruction over ``elements`` per partition on ``engine``."""
    return (start + max(MIN_II, elements * passes)) / CLOCK_GHZ[engine]


class Balancer:
    """Running per-engine load estimates (ns of issued work) for one kernel trace."""

    def __init__(self) -> None:
        self.load = dict.fromkeys(CLOCK_GHZ, 0.0)

    def charge(self, engine: Any, ns: float) -> Any:
        """Record ``ns`` of work issued to a fixed ``engine``; returns the engine.

        An engine cannot bank idle time: its load is kept within ``IDLE_CREDIT_NS`` of the busiest engine's. Without
        this, an engine left idle through one phase would be handed a long burst of the next phase's work, and the
        other engines, waiting on its results in issue order, would idle in turn.
        """
        self.load[engine] += ns
        floor = max(self.load.values()) - IDLE_CREDIT_NS
        for other in self.load:
            self.load[other] = max(self.load[other], floor)
        return engine

    def pick(self, options: Sequence[tuple[Any, float]]) -> Any:
        """Choose the engine among ``(engine, estimated ns)`` options that would finish first, and charge it."""
        engine, ns = min(options, key=lambda option: self.load[option[0]] + option[1])
        return self.charge(engine, ns)


BALANCER = Balancer()


def reset() -> None:
    """Start a new trace with empty queues (called once per kernel launch)."""
    BALANCER.__init__()


def free_elements(tile: Any) -> int:
    """Elements per partition of a tile or view."""
    count = 1
    for dim in tuple(tile.shape)[1:]:
        count *= int(dim)
    return count
