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

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from typing import Any

from .backend import nisa
from .kernel_assert import kernel_assert

VECTOR = nisa.engine.vector
SCALAR = nisa.engine.scalar
GPSIMD = nisa.engine.gpsimd

MIN_II = 64  # cycles, minimum initiation interval of a streaming instruction (§4.2)
CLOCK_GHZ = {VECTOR: 0.96, SCALAR: 1.2, GPSIMD: 1.2}  # Trn2 engine clocks (§4.1)
GPSIMD_START = 150  # cycles before a GpSimd select/iota streams (§4.5)
# Time from an instruction's end to a dependent instruction's start on another engine (semaphore + pipeline drain):
# PERF measured dependent ScalarE instructions every ~264 cycles, MIN_II of them streaming (§4.2), so ~200 cycles,
# ~200 ns at these clocks (INFER; nki-cpu charges the same). Used to rank a form that waits on one instruction more;
# of the values swept (PERFORMANCE.md), 200 ns gives the shortest estimated makespans.
DEPENDENCY_NS = 200.0
# How far an engine's issued work may trail the busiest engine's (about ten 128-element instructions): enough to
# absorb the next step's burst, too little to bank a whole phase of idleness (a tuning knob: of the values swept
# over bf16 and fp32, one lane and 32 lanes, schur and neumann, 1000 ns is never far from the best; PERFORMANCE.md).
IDLE_CREDIT_NS = 1000.0


def stream_ns(engine: Any, elements: int, passes: float = 1.0, start: int = 0) -> float:
    """Estimated time of a streaming instruction over ``elements`` per partition on ``engine``."""
    return (start + max(MIN_II, elements * passes)) / CLOCK_GHZ[engine]


class Balancer:
    """Running per-engine load estimates (ns of issued work) for one kernel trace.

    Inside a compiled loop's body the balancer decides once: the tracer runs the body's Python once, so every
    iteration runs the engines chosen then (``fixed``).
    """

    def __init__(self) -> None:
        self.load = dict.fromkeys(CLOCK_GHZ, 0.0)
        self._recording: list[Any] | None = None
        self._replaying: Iterator[Any] | None = None

    @contextlib.contextmanager
    def fixed(self, decisions: list[Any]) -> Iterator[None]:
        """Decide as usual and append each decision to ``decisions`` when it is empty (the body's one trace);
        otherwise hand back the recorded decisions in order and leave the estimates untouched (nki-cpu running the
        same body again for a later iteration)."""
        if decisions:
            self._replaying = iter(decisions)
        else:
            self._recording = decisions
            busiest = max(self.load.values())
            self.load = dict.fromkeys(self.load, busiest)
        try:
            yield
        finally:
            self._recording = self._replaying = None

    def decide(self, choice: Any) -> Any:
        """``choice`` (computed from the estimates), or the recorded one when replaying a compiled body."""
        if self._replaying is not None:
            return next(self._replaying)
        if self._recording is not None:
            self._recording.append(choice)
        return choice

    def charge(self, engine: Any, ns: float) -> Any:
        """Record ``ns`` of work issued to a fixed ``engine``; returns the engine.

        An engine cannot bank idle time: its load is kept within ``IDLE_CREDIT_NS`` of the busiest engine's. Without
        this, an engine left idle through one phase would be handed a long burst of the next phase's work, and the
        other engines, waiting on its results in issue order, would idle in turn.
        """
        if self._replaying is not None:
            return engine
        self.load[engine] += ns
        floor = max(self.load.values()) - IDLE_CREDIT_NS
        for other in self.load:
            self.load[other] = max(self.load[other], floor)
        return engine

    def pick(self, options: Sequence[tuple[Any, float]]) -> Any:
        """Choose the engine among ``(engine, estimated ns)`` options that would finish first, and charge it."""
        engine, ns = min(options, key=lambda option: self.load[option[0]] + option[1])
        engine = self.decide(engine)
        return self.charge(engine, ns)


_ACTIVE: contextvars.ContextVar[Balancer] = contextvars.ContextVar("gdn_nki_balancer")


@contextlib.contextmanager
def balancing(balancer: Balancer) -> Iterator[Balancer]:
    """Make ``balancer`` the one the tile helpers (``tiles``) charge and ask while the block runs: a launch creates
    its own (``cte.kernel.emit``) and hands it to the pipeline, so no estimate outlives or leaks between traces."""
    token = _ACTIVE.set(balancer)
    try:
        yield balancer
    finally:
        _ACTIVE.reset(token)


def active() -> Balancer:
    """The balancer of the launch being traced (``balancing``)."""
    balancer = _ACTIVE.get(None)
    kernel_assert(balancer is not None, "gdn_nki: no engine balancer is active; issue kernel work inside "
                  "engines.balancing(Balancer())")  # fmt: skip
    return balancer


def free_elements(tile: Any) -> int:
    """Elements per partition of a tile or view."""
    count = 1
    for dim in tuple(tile.shape)[1:]:
        count *= int(dim)
    return count
