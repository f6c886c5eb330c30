"""The compiler's instruction scheduling, modelled: a new issue order for a trace, found by list scheduling.

The compiler reorders a kernel's independent instructions unless they sit in an ``nl.no_reorder()`` block
(docs/nki-sources.md §4.6); the engines then run the compiled order, each queue in order. :func:`estimate`
schedules the program order by default — the order the kernel wrote, which ``no_reorder`` guarantees —, and with
``estimate(trace, order="critical_path")`` (or ``"asap"``) it first passes the trace through
:func:`compiler_order`, the order a dependency-aware list scheduler would compile, and schedules that. Which
heuristic the compiler uses is not published (known unknown 23); the two offered are those the latest pages name
for NKI's own scheduler (§4.6).

How the order is found (COST_MODEL.md, "Issue order"):

- **Regions.** Instructions move only within a region: the straight-line code between compiled-loop iteration
  boundaries (``Trace.boundaries``), so a hardware loop's body is reordered as one program and each iteration gets
  the order of the first (every iteration issues the same instructions on the same tiles, and the scheduler is
  deterministic).
- **Dependencies.** Two instructions of a region keep their order when one writes bytes the other reads or
  writes (RAW, WAR, WAW on overlapping regions of one allocation); the instructions of one ``no_reorder`` block
  keep their order among themselves.
- **The list scheduler** simulates the region alone on an idle machine with the cost model's durations and
  dependency latencies: each compute engine runs one instruction at a time (the tensor engine one per set of PE
  cells, as in ``scheduler``), a DMA transfer waits for its queue and the DMA engines it needs (``scheduler``'s
  round-robin queues, taken in the new order, and its engine pool). Whenever an engine is free it starts, among
  its instructions whose inputs are ready, the one ``heuristic`` prefers: ``"critical_path"`` the one with the
  longest path (durations plus latencies) to the end of the region, ``"asap"`` the one that has been ready
  longest. The new order is the order in which the simulation started them, so the in-order scheduler replays a region
  that runs alone exactly as simulated.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections.abc import Sequence

from nki_cpu.cost.durations import compute_cycles, dma_engines_used, dma_times
from nki_cpu.cost.figures import Figures
from nki_cpu.cost.record import NO_REORDER, Engine, InstructionRecord, Trace
from nki_cpu.cost.scheduler import EnginePool

HEURISTICS = ("critical_path", "asap")
PROGRAM_INDEX = "program_index"  # attrs key of a reordered copy: the record's position in the kernel's own order

_Box = tuple[int, int, int, int]


def compiler_order(trace: Trace, figures: Figures, heuristic: str = "critical_path") -> Trace:
    """A copy of ``trace`` in the order a list-scheduling compiler would issue it (module docstring).

    Args:
        trace: records in program order (not modified).
        figures: hardware figures whose durations and latencies guide the scheduler.
        heuristic: ``"critical_path"`` or ``"asap"``.

    Returns:
        A new :class:`Trace` with copies of the records in the new order (their ``index`` set to the new
        positions, ``attrs[PROGRAM_INDEX]`` to the old), the same allocations, high-water marks and boundaries.

    Raises:
        ValueError: ``heuristic`` is not one of ``HEURISTICS``.
    """
    if heuristic not in HEURISTICS:
        raise ValueError(f"heuristic must be one of {HEURISTICS}, got {heuristic!r}")
    records = trace.records
    order: list[int] = []
    for start, end in regions(len(records), trace.boundaries):
        order.extend(start + i for i in _region_order(records[start:end], figures, heuristic))
    out = dataclasses.replace(trace, records=[])
    for position in order:
        out.append(dataclasses.replace(records[position], attrs={**records[position].attrs, PROGRAM_INDEX: position}))
    return out


def regions(count: int, boundaries: Sequence[int]) -> list[tuple[int, int]]:
    """The half-open ranges ``[start, end)`` of ``count`` records between sorted, distinct ``boundaries``."""
    cuts = sorted({0, count, *(b for b in boundaries if 0 < b < count)})
    return list(itertools.pairwise(cuts))


def predecessors(records: Sequence[InstructionRecord]) -> list[tuple[list[int], int | None]]:
    """For each record (by position), the earlier positions it must follow: the records it conflicts with (RAW, WAR,
    WAW on overlapping bytes of one allocation), and the previous record of its ``no_reorder`` block (or None).

    Notes:
        A write drops the boxes it fully covers from the lists it is checked against: any later conflict with them
        also conflicts with the write, which already follows them.
    """
    writers: dict[int, list[tuple[_Box, int]]] = {}
    readers: dict[int, list[tuple[_Box, int]]] = {}
    last_in_block: dict[int, int] = {}
    out: list[tuple[list[int], int | None]] = []
    for position, record in enumerate(records):
        before: set[int] = set()
        for region in record.reads:
            _conflicts(writers.get(region.storage_id, ()), _box(region), before)
        for region in record.writes:
            box = _box(region)
            _conflicts(writers.get(region.storage_id, ()), box, before)
            _conflicts(readers.get(region.storage_id, ()), box, before)
        block = record.attrs.get(NO_REORDER)
        previous = last_in_block.get(block) if block is not None else None
        if block is not None:
            last_in_block[block] = position
        for region in record.reads:
            readers.setdefault(region.storage_id, []).append((_box(region), position))
        for region in record.writes:
            box = _box(region)
            for table in (writers, readers):
                if region.storage_id in table:
                    table[region.storage_id] = [(b, p) for b, p in table[region.storage_id] if not _covers(box, b)]
            writers.setdefault(region.storage_id, []).append((box, position))
        before.discard(position)
        out.append((sorted(before), None if previous in before else previous))
    return out


def _box(region: object) -> _Box:
    return (*region.partitions, *region.byte_range)  # type: ignore[attr-defined]


def _conflicts(boxes: Sequence[tuple[_Box, int]], box: _Box, into: set[int]) -> None:
    p0, p1, b0, b1 = box
    for (q0, q1, c0, c1), position in boxes:
        if p0 < q1 and q0 < p1 and b0 < c1 and c0 < b1:
            into.add(position)


def _covers(outer: _Box, inner: _Box) -> bool:
    return outer[0] <= inner[0] and inner[1] <= outer[1] and outer[2] <= inner[2] and inner[3] <= outer[3]


def _pe_cells(record: InstructionRecord, figures: Figures) -> tuple[int, ...]:
    """The PE cells an instruction holds (its recorded tile rounded out to cells; untiled: all of them)."""
    quantum = max(1, figures.pe_tile_quantum)
    side = max(1, figures.partitions // quantum)
    rows, cols = record.attrs.get("pe_rows"), record.attrs.get("pe_cols")
    if rows is None or cols is None:
        return tuple(range(side * side))
    r0, r1 = rows[0] // quantum, min(-(-rows[1] // quantum), side)
    c0, c1 = cols[0] // quantum, min(-(-cols[1] // quantum), side)
    return tuple(r * side + c for r in range(r0, r1) for c in range(c0, c1))


def _region_order(records: Sequence[InstructionRecord], figures: Figures, heuristic: str) -> list[int]:
    """Positions of ``records`` (one region) in the order the list scheduler starts them (module docstring)."""
    return list_schedule(records, figures, heuristic)[0]


def list_schedule(
    records: Sequence[InstructionRecord], figures: Figures, heuristic: str
) -> tuple[list[int], list[float], list[float]]:
    """The list scheduler's simulation of ``records`` (one region; module docstring): the positions in the order
    it started them (the new program order: start times never decrease along it), and each one's start and end
    (ns)."""
    n = len(records)
    preds = predecessors(records)
    # (successor, True for a data conflict / False for an order-only no_reorder edge)
    succs: list[list[tuple[int, bool]]] = [[] for _ in range(n)]
    for position, (before, previous) in enumerate(preds):
        for p in before:
            succs[p].append((position, True))
        if previous is not None:
            succs[previous].append((position, False))
    latency = {e: figures.cycles_to_ns(c, e) for e, c in figures.dependency_latency_cycles.items()}
    duration = [_duration(r, figures) for r in records]
    link = [duration[i] + latency.get(records[i].engine, 0.0) for i in range(n)]
    priority = [0.0] * n
    for i in range(n - 1, -1, -1):  # program order is a topological order
        priority[i] = link[i] + max((priority[s] for s, _ in succs[i]), default=0.0)
    waiting = [len(before) + (previous is not None) for before, previous in preds]
    ready_at = [0.0] * n
    start = [0.0] * n
    finish = [0.0] * n
    begun: list[int] = []
    pending: list[tuple[float, int]] = [(0.0, i) for i in range(n) if not waiting[i]]
    heapq.heapify(pending)
    queues: dict[Engine, list[tuple[float, float, int]]] = {}
    engine_free: dict[Engine, float] = {}
    cell_free = [0.0] * (figures.partitions // max(1, figures.pe_tile_quantum)) ** 2
    pool = EnginePool(figures.dma_engines)
    queue_free = [0.0] * max(1, figures.dma_queues)
    dma_issued = 0

    def key(i: int) -> tuple[float, float, int]:
        return (-priority[i], 0.0, i) if heuristic == "critical_path" else (ready_at[i], 0.0, i)

    def begin(i: int, t: float, end: float) -> None:
        start[i], finish[i] = t, end
        begun.append(i)
        done = end + latency.get(records[i].engine, 0.0)
        for s, data in succs[i]:
            # a data conflict waits for the result (end + latency); a no_reorder edge only for a later start
            ready_at[s] = max(ready_at[s], done if data else t)
            waiting[s] -= 1
            if not waiting[s]:
                heapq.heappush(pending, (ready_at[s], s))

    t, started = 0.0, 0
    while started < n:
        while pending and pending[0][0] <= t:
            _, i = heapq.heappop(pending)
            heapq.heappush(queues.setdefault(records[i].engine, []), key(i))
        for engine, queue in queues.items():
            if engine is Engine.DMA:  # the scheduler's queues (round-robin in the new order) and engine pool
                while queue:
                    i = heapq.heappop(queue)[2]
                    fixed, transfer = dma_times(records[i], figures)
                    engines = dma_engines_used(records[i].partitions, figures)
                    lane = dma_issued % len(queue_free)
                    dma_issued += 1
                    at = pool.earliest(max(t + fixed, queue_free[lane]), transfer, engines)
                    pool.reserve(at, at + transfer, engines)
                    queue_free[lane] = at + transfer
                    begin(i, t, at + transfer)
                    started += 1
            elif engine is Engine.PE:
                held = []
                while queue:
                    entry = heapq.heappop(queue)
                    need = _pe_cells(records[entry[2]], figures)
                    if all(cell_free[c] <= t for c in need):
                        i = entry[2]
                        begin(i, t, t + duration[i])
                        started += 1
                        for c in need:
                            cell_free[c] = t + duration[i]
                    else:
                        held.append(entry)
                for entry in held:
                    heapq.heappush(queue, entry)
            elif queue and engine_free.get(engine, 0.0) <= t:
                i = heapq.heappop(queue)[2]
                begin(i, t, t + duration[i])
                started += 1
                engine_free[engine] = t + duration[i]
        if started == n:
            break
        later = [pending[0][0]] if pending else []
        for engine, queue in queues.items():
            if queue:
                frees = cell_free if engine is Engine.PE else [engine_free.get(engine, 0.0)]
                later.extend(f for f in frees if f > t)
        t = min(later)
    return begun, start, finish


def _duration(record: InstructionRecord, figures: Figures) -> float:
    if record.engine is Engine.DMA:
        fixed, transfer = dma_times(record, figures)
        return fixed + transfer
    return figures.cycles_to_ns(compute_cycles(record, figures), record.engine)
