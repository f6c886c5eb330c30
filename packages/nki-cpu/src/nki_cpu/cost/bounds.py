"""Lower bounds on the makespan of a trace: what no issue order of the same instructions can beat.

``estimate`` schedules one order (the kernel's, or a reordering compiler's, ``reorder``); these bounds hold for
*every* order the data dependencies allow, so their distance from a schedule's makespan is the most any reordering
could still win, and a target above them is out of reach for the instructions as written.

- **Dependencies** (``dependency_bound_ns``): the longest chain of RAW dependencies, each link the producer's
  duration plus its engine's dependency latency (a DMA's duration includes its fixed latency). Engines are
  unlimited.
- **Each engine** (``engine_bounds_ns``): the engine's own work, placed as early as dependencies let it start and
  followed by the shortest dependent chain that must still run after it. Every instruction ``i`` gets a *head*
  (its start in the dependency bound, the earliest any schedule can start it), a *length* and a *tail* (the
  longest RAW chain from its end to the end of the trace). On one engine the preemptive one-machine schedule that
  always runs the released instruction with the longest tail (Jackson's rule) minimises ``max(end + tail)`` over
  all preemptive schedules, and every real (non-preemptive) schedule is one of those: its value bounds the
  makespan from below. The tensor engine may run instructions on disjoint PE tiles side by side (``scheduler``),
  so its lengths are each instruction's duration times the share of the array's cells it occupies (the fluid
  relaxation: the cells' total busy time cannot exceed the makespan); the DMA engine pool likewise counts each
  transfer's time times the share of the pool's engines it occupies, released after its fixed latency.

Compiled loops' barriers hold in every order (the compiler moves instructions only within an iteration), so they
enter both: an instruction after a barrier starts no earlier than every instruction before it could end, plus the
barrier's cost (``scheduler.loop_barriers``). Tails leave them out (a shorter tail keeps a bound a bound).

The floor is the largest of them (``makespan_floor``). Ignored, so the floor stays a bound: program order, the
tensor engine's in-order starts, DMA queues, WAR / WAW conflicts, memory capacity.

Notes:
    Dependencies are found as the scheduler finds them: per allocation, among recent boxes, with the oldest half
    of a long list merged into one box (``reorder.predecessors``, ``scheduler.MAX_BOXES``). A merged box can add
    a false dependency, so on traces that touch one allocation in more than ``MAX_BOXES`` live pieces the bounds
    are bounds of the schedule the cost model computes, not of the hardware.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from nki_cpu.cost.durations import dma_engines_used, dma_times, duration_ns
from nki_cpu.cost.figures import Figures
from nki_cpu.cost.record import Engine, InstructionRecord, Trace
from nki_cpu.cost.reorder import predecessors
from nki_cpu.cost.scheduler import loop_barriers, pe_cells

DEPENDENCIES = "dependencies"  # makespan_floor's name for the dependency bound


@dataclass(frozen=True)
class Floor:
    """The makespan no issue order of a trace can beat, and what sets it.

    Attributes:
        ns: the floor, the largest of ``parts``.
        binding: the name of the part that sets it (``DEPENDENCIES`` when the dependency bound reaches it, else an
            engine's value).
        parts: each bound in ns: ``DEPENDENCIES`` and one per engine that ran an instruction (``engine_bounds_ns``).
    """

    ns: float
    binding: str
    parts: dict[str, float]


@dataclass(frozen=True)
class _Paths:
    """Per instruction (by position): earliest start, duration and tail (ns), all over RAW dependencies only."""

    head: list[float]
    length: list[float]
    tail: list[float]


def _paths(trace: Trace, figures: Figures) -> _Paths:
    records = trace.records
    latency = {engine: figures.cycles_to_ns(c, engine) for engine, c in figures.dependency_latency_cycles.items()}
    before = [pred for pred, _ in predecessors(records, raw_only=True)]
    length = [duration_ns(record, figures) for record in records]
    link = [length[i] + latency.get(record.engine, 0.0) for i, record in enumerate(records)]
    head = [0.0] * len(records)
    barriers = loop_barriers(trace)
    fence = last_end = 0.0  # the latest barrier's end; the latest end so far
    for i, pred in enumerate(before):
        if i in barriers:
            fence = max(fence, last_end) + barriers[i] * figures.loop_barrier_ns
        head[i] = max(fence, max((head[j] + link[j] for j in pred), default=0.0))
        last_end = max(last_end, head[i] + length[i])
    tail = [0.0] * len(records)
    for i in range(len(records) - 1, -1, -1):
        after_i = length[i] + tail[i]
        for j in before[i]:
            tail[j] = max(tail[j], link[j] - length[j] + after_i)
    return _Paths(head, length, tail)


def dependency_bound_ns(trace: Trace, figures: Figures) -> float:
    """The makespan if every instruction started as soon as the data it reads was ready: the longest chain of RAW
    dependencies, each link the producer's duration plus its engine's dependency latency (DMA: plus the fixed
    latency).

    A lower bound on any schedule of the same instructions: engine queues, program order, engine and DMA capacity,
    and the WAR / WAW conflicts of reused memory (which more memory would remove) are all left out. Its distance
    from the makespan is what ordering and placement could still win; its distance from zero is what only fewer
    dependent steps can.
    """
    paths = _paths(trace, figures)
    return max((h + d for h, d in zip(paths.head, paths.length, strict=True)), default=0.0)


def jackson_bound(jobs: Sequence[tuple[float, float, float]]) -> float:
    """``max(end + tail)`` of the preemptive one-machine schedule of ``(release, length, tail)`` jobs that always
    runs the released job with the longest tail: the least value any schedule of the jobs on one machine can have
    (Jackson's rule is optimal for the preemptive problem, which relaxes the non-preemptive one)."""
    pending = sorted(jobs)
    ready: list[list[float]] = []  # [-tail, remaining length]
    now, best, k = 0.0, 0.0, 0
    while k < len(pending) or ready:
        if not ready:
            now = max(now, pending[k][0])
        while k < len(pending) and pending[k][0] <= now:
            _, length, tail = pending[k]
            heapq.heappush(ready, [-tail, length])
            k += 1
        next_release = pending[k][0] if k < len(pending) else float("inf")
        job = ready[0]
        ran = min(job[1], next_release - now)
        now += ran
        if ran >= job[1]:
            heapq.heappop(ready)
            best = max(best, now - job[0])
        else:
            job[1] -= ran
    return best


def engine_bounds_ns(trace: Trace, figures: Figures) -> dict[str, float]:
    """Per engine that ran an instruction (``pe``, ``vector``, ``scalar``, ``gpsimd``, ``dma``): the least
    makespan any order allows, given that engine's work and the dependencies around it (module docstring)."""
    return _engine_bounds(trace.records, _paths(trace, figures), figures)


def _engine_bounds(records: Sequence[InstructionRecord], paths: _Paths, figures: Figures) -> dict[str, float]:
    quantum = max(1, figures.pe_tile_quantum)
    side = max(1, figures.partitions // quantum)
    jobs: dict[str, list[tuple[float, float, float]]] = {}
    for i, record in enumerate(records):
        head, length, tail = paths.head[i], paths.length[i], paths.tail[i]
        if record.engine is Engine.DMA:
            fixed, transfer = dma_times(record, figures)
            share = dma_engines_used(record.partitions, figures) / figures.dma_engines
            job = (head + fixed, transfer * share, tail)
        elif record.engine is Engine.PE:
            job = (head, length * len(pe_cells(record, quantum, side)) / (side * side), tail)
        else:
            job = (head, length, tail)
        jobs.setdefault(record.engine.value, []).append(job)
    return {engine: jackson_bound(engine_jobs) for engine, engine_jobs in jobs.items()}


def makespan_floor(trace: Trace, figures: Figures) -> Floor:
    """The largest of the dependency bound and every engine's bound: no issue order of ``trace`` ends sooner."""
    paths = _paths(trace, figures)
    parts = {DEPENDENCIES: max((h + d for h, d in zip(paths.head, paths.length, strict=True)), default=0.0)}
    parts.update(_engine_bounds(trace.records, paths, figures))
    floor = max(parts.values())
    # An engine's bound includes every dependency chain through its instructions, so it often ties with the
    # dependency bound: the floor is then the chain's, the engines' work adds nothing to it.
    binding = next(name for name, ns in parts.items() if ns >= floor * (1 - 1e-9))
    return Floor(floor, binding, parts)
