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
  boundaries (``Trace.boundaries``). A hardware loop's body is one program, so its iterations get one order: the
  scheduler runs the first iteration under the union of every iteration's constraints (an iteration's conflicts
  can depend on its index, through the HBM offsets it addresses), and every iteration takes that order.
- **Dependencies.** Two instructions of a region keep their order when one writes bytes the other reads or
  writes (RAW, WAR, WAW on overlapping regions of one allocation); the instructions of one ``no_reorder`` block
  keep their order among themselves.
- **Memory.** An allocation that lives only inside the region is live from the start of the first instruction
  touching it to the end of the last; an instruction that would make one live waits while its buffer (SBUF,
  PSUM) has no room for it beside the allocations that live across the region's edges. So the reordered program
  never needs more on-chip memory, by liveness, than the chip has (PSUM banks and accumulation groups are not
  modelled here).
- **The list scheduler** simulates the region alone on an idle machine with the cost model's durations and
  dependency latencies: each compute engine runs one instruction at a time (the tensor engine one per set of PE
  cells, as in ``scheduler``); a DMA is issued as soon as it is ready (its transfer then waits for its queue and
  the DMA engines it needs: ``scheduler``'s round-robin queues, taken in the new order, and its engine pool).
  Whenever a compute engine is free it starts, among its ready instructions, the one ``heuristic`` prefers:
  ``"critical_path"`` the one with the longest path (durations plus latencies) to the end of the region,
  ``"asap"`` the one that has been ready longest. The new order is the order in which the simulation started
  them; the in-order scheduler replays it (exactly, for a region alone without ``no_reorder`` blocks, whose
  start-after-start rule it does not apply, and with fewer than ``MAX_BOXES`` boxes per allocation, beyond which
  it merges boxes into false dependencies).
- **Never worse than the kernel's order.** When the list schedule of a region (alone, on an idle machine) ends
  later than the kernel's own order of it, the region keeps the kernel's order: greedy list scheduling with a
  memory limit can paint itself into a corner (every byte held by allocations that wait on allocations not yet
  made; the simulation then opens the next one in program order regardless of room), and a compiler whose
  reordering lost would not ship it.
- ``depends_on`` is accepted by the interpreter and ignored here (it is not recorded).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from nki_cpu.cost.durations import dma_engines_used, dma_times, duration_ns
from nki_cpu.cost.figures import Figures
from nki_cpu.cost.record import NO_REORDER, Engine, InstructionRecord, Trace
from nki_cpu.cost.scheduler import MAX_BOXES, EnginePool, pe_cells, schedule

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
    lifetimes = trace.lifetimes()
    order: list[int] = []
    for group in _bodies(records, regions(len(records), trace.boundaries)):
        start, end = group[0]
        # one order for every iteration of a loop body: the union of every iteration's constraints
        constraints = _union([predecessors(records[a:b]) for a, b in group])
        memory = _region_memory(trace, lifetimes, start, end, figures)
        local = list_schedule(records[start:end], figures, heuristic, constraints, memory)[0]
        if _alone_ns(records, start, end, local, figures) > _alone_ns(records, start, end, range(end - start), figures):
            local = list(range(end - start))  # the heuristic loses to the kernel's own order: keep that
        for a, _ in group:
            order.extend(a + i for i in local)
    out = dataclasses.replace(trace, records=[])
    for position in order:
        out.append(dataclasses.replace(records[position], attrs={**records[position].attrs, PROGRAM_INDEX: position}))
    return out


def _alone_ns(
    records: Sequence[InstructionRecord], start: int, end: int, order: Sequence[int], figures: Figures
) -> float:
    """Makespan of one region's records issued in ``order`` (positions within the region), the region alone."""
    alone = Trace()
    for i in order:
        alone.append(dataclasses.replace(records[start + i]))
    placed = schedule(alone, figures)
    return max(placed.end_ns, default=0.0)


def _bodies(records: Sequence[InstructionRecord], spans: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """``spans`` grouped into runs of one compiled loop's iterations: a span of repeated records (``repeat``) with
    the same instructions as the span before it joins that span's group."""
    groups: list[list[tuple[int, int]]] = []
    for a, b in spans:
        if groups and all(r.repeat for r in records[a:b]):
            first_a, first_b = groups[-1][0]
            same = [(r.opcode, r.engine) for r in records[a:b]] == [
                (r.opcode, r.engine) for r in records[first_a:first_b]
            ]
            if same:
                groups[-1].append((a, b))
                continue
        groups.append([(a, b)])
    return groups


def _union(all_preds: list[list[tuple[list[int], int | None]]]) -> list[tuple[list[int], int | None]]:
    """Position-wise union of the constraints of several iterations of one body."""
    first = all_preds[0]
    if len(all_preds) == 1:
        return first
    out = []
    for position, (before, previous) in enumerate(first):
        merged = set(before).union(*(set(other[position][0]) for other in all_preds[1:]))
        out.append((sorted(merged), None if previous in merged else previous))
    return out


@dataclass
class _Memory:
    """On-chip memory of one region for the list scheduler: the allocations that live only inside it (storage id
    -> (buffer, bytes per partition)) and the bytes per partition left for them in each buffer (capacity minus the
    allocations that live across the region's edges)."""

    local: dict[int, tuple[str, int]]
    room: dict[str, int]


def _region_memory(
    trace: Trace, lifetimes: dict[int, tuple[int, int]], start: int, end: int, figures: Figures
) -> _Memory:
    room = {"sbuf": figures.sbuf_bytes_per_partition, "psum": figures.psum_bytes_per_partition}
    local: dict[int, tuple[str, int]] = {}
    for storage_id, (first, last) in lifetimes.items():
        if last < start or first >= end:
            continue
        buffer, nbytes = trace.allocations[storage_id]
        if start <= first and last < end:
            local[storage_id] = (buffer, nbytes)
        elif buffer in room:
            room[buffer] -= nbytes
    return _Memory(local, room)


def regions(count: int, boundaries: Sequence[int]) -> list[tuple[int, int]]:
    """The half-open ranges ``[start, end)`` of ``count`` records between sorted, distinct ``boundaries``."""
    cuts = sorted({0, count, *(b for b in boundaries if 0 < b < count)})
    return list(itertools.pairwise(cuts))


def predecessors(records: Sequence[InstructionRecord], raw_only: bool = False) -> list[tuple[list[int], int | None]]:
    """For each record (by position), the earlier positions it must follow: the records it conflicts with (RAW, WAR,
    WAW on overlapping bytes of one allocation; with ``raw_only``, the writers of what it reads), and the previous
    record of its ``no_reorder`` block (or None).

    Notes:
        A write drops the boxes it fully covers from the lists it is checked against: any later conflict with them
        also conflicts with the write, which already follows them. A list longer than ``scheduler.MAX_BOXES``
        merges its oldest half into one bounding box that keeps all their positions (as the scheduler does: at
        worst an order kept that was not needed, never a conflict missed).
    """
    writers: dict[int, list[_Entry]] = {}
    readers: dict[int, list[_Entry]] = {}
    last_in_block: dict[int, int] = {}
    out: list[tuple[list[int], int | None]] = []
    for position, record in enumerate(records):
        before: set[int] = set()
        for region in record.reads:
            _conflicts(writers.get(region.storage_id, ()), _box(region), before)
        for region in () if raw_only else record.writes:
            box = _box(region)
            _conflicts(writers.get(region.storage_id, ()), box, before)
            _conflicts(readers.get(region.storage_id, ()), box, before)
        block = record.attrs.get(NO_REORDER)
        previous = last_in_block.get(block) if block is not None else None
        if block is not None:
            last_in_block[block] = position
        for region in record.reads:
            _push(readers.setdefault(region.storage_id, []), (_box(region), (position,)))
        for region in record.writes:
            box = _box(region)
            for table in (writers, readers):
                if region.storage_id in table:
                    table[region.storage_id] = [e for e in table[region.storage_id] if not _covers(box, e[0])]
            _push(writers.setdefault(region.storage_id, []), (box, (position,)))
        before.discard(position)
        out.append((sorted(before), None if previous in before else previous))
    return out


_Entry = tuple[_Box, tuple[int, ...]]  # a box and the positions of the records that touched it


def _push(entries: list[_Entry], entry: _Entry) -> None:
    entries.append(entry)
    if len(entries) > MAX_BOXES:
        half = entries[: len(entries) // 2]
        merged = (
            (
                min(e[0][0] for e in half),
                max(e[0][1] for e in half),
                min(e[0][2] for e in half),
                max(e[0][3] for e in half),
            ),
            tuple(p for e in half for p in e[1]),
        )
        entries[: len(half)] = [merged]


def _box(region: object) -> _Box:
    return (*region.partitions, *region.byte_range)  # type: ignore[attr-defined]


def _conflicts(entries: Sequence[_Entry], box: _Box, into: set[int]) -> None:
    p0, p1, b0, b1 = box
    for (q0, q1, c0, c1), positions in entries:
        if p0 < q1 and q0 < p1 and b0 < c1 and c0 < b1:
            into.update(positions)


def _covers(outer: _Box, inner: _Box) -> bool:
    if inner[0] >= inner[1] or inner[2] >= inner[3]:  # an empty box: the scheduler still counts it as touched
        return False
    return outer[0] <= inner[0] and inner[1] <= outer[1] and outer[2] <= inner[2] and inner[3] <= outer[3]


def list_schedule(
    records: Sequence[InstructionRecord],
    figures: Figures,
    heuristic: str,
    constraints: list[tuple[list[int], int | None]] | None = None,
    memory: _Memory | None = None,
) -> tuple[list[int], list[float], list[float]]:
    """The list scheduler's simulation of ``records`` (one region; module docstring).

    Args:
        records: the region's records in program order.
        figures: durations, latencies, PE cells and DMA queues and engines to simulate.
        heuristic: ``"critical_path"`` or ``"asap"``.
        constraints: ``predecessors(records)`` or a superset (a loop body's union over its iterations).
        memory: the region's own allocations and the room left for them; None: memory is not limited.

    Returns:
        The positions in the order the simulation started them (the new program order: start times never decrease
        along it), and each one's start and end (ns; a DMA's start is its issue).
    """
    n = len(records)
    preds = constraints if constraints is not None else predecessors(records)
    # (successor, True for a data conflict / False for an order-only no_reorder edge)
    succs: list[list[tuple[int, bool]]] = [[] for _ in range(n)]
    for position, (before, previous) in enumerate(preds):
        for p in before:
            succs[p].append((position, True))
        if previous is not None:
            succs[previous].append((position, False))
    latency = {e: figures.cycles_to_ns(c, e) for e, c in figures.dependency_latency_cycles.items()}
    duration = [duration_ns(r, figures) for r in records]
    link = [duration[i] + latency.get(records[i].engine, 0.0) for i in range(n)]
    priority = [0.0] * n
    for i in range(n - 1, -1, -1):  # program order is a topological order
        priority[i] = link[i] + max((priority[s] for s, _ in succs[i]), default=0.0)
    quantum = max(1, figures.pe_tile_quantum)
    side = max(1, figures.partitions // quantum)
    cells = [pe_cells(r, quantum, side) if r.engine is Engine.PE else [] for r in records]
    cell_mask = [sum(1 << c for c in need) for need in cells]
    fits = _MemoryTracker(records, memory if memory is not None else _Memory({}, {}))
    waiting = [len(before) + (previous is not None) for before, previous in preds]
    ready_at = [0.0] * n
    start = [0.0] * n
    finish = [0.0] * n
    begun: list[int] = []
    pending: list[tuple[float, int]] = [(0.0, i) for i in range(n) if not waiting[i]]
    heapq.heapify(pending)
    queues: dict[Engine, list[tuple[float, int]]] = {}
    engine_free: dict[Engine, float] = {}
    cell_free = [0.0] * side * side
    pool = EnginePool(figures.dma_engines)
    queue_free = [0.0] * max(1, figures.dma_queues)
    dma_issued = 0

    def key(i: int) -> tuple[float, int]:
        return (-priority[i], i) if heuristic == "critical_path" else (ready_at[i], i)

    def begin(i: int, t: float, end: float) -> None:
        start[i], finish[i] = t, end
        begun.append(i)
        fits.take(i, end)
        done = end + latency.get(records[i].engine, 0.0)
        for s, data in succs[i]:
            # a data conflict waits for the result (end + latency); a no_reorder edge only for a later start
            ready_at[s] = max(ready_at[s], done if data else t)
            waiting[s] -= 1
            if not waiting[s]:
                heapq.heappush(pending, (ready_at[s], s))

    def start_dma(i: int, t: float) -> None:
        nonlocal dma_issued
        fixed, transfer = dma_times(records[i], figures)
        engines = dma_engines_used(records[i].partitions, figures)
        lane = dma_issued % len(queue_free)
        dma_issued += 1
        at = pool.earliest(max(t + fixed, queue_free[lane]), transfer, engines)
        pool.reserve(at, at + transfer, engines)
        queue_free[lane] = at + transfer
        begin(i, t, at + transfer)

    t = 0.0
    while len(begun) < n:
        fits.release(t)
        while pending and pending[0][0] <= t:
            _, i = heapq.heappop(pending)
            heapq.heappush(queues.setdefault(records[i].engine, []), key(i))
        progressed = False
        for engine, queue in queues.items():
            held = []
            free_mask: int | None = None
            while queue:
                entry = heapq.heappop(queue)
                i = entry[1]
                if engine is Engine.PE:
                    if min(cell_free) > t:
                        held.append(entry)
                        break
                    if free_mask is None:  # the cells free at t, as a bit mask (computed once per pass)
                        free_mask = sum(1 << c for c, f in enumerate(cell_free) if f <= t)
                    free_now = not cell_mask[i] & ~free_mask
                elif engine is Engine.DMA:
                    free_now = True  # a transfer waits for its queue and engines inside start_dma
                else:
                    free_now = engine_free.get(engine, 0.0) <= t
                    if not free_now:
                        held.append(entry)
                        break
                if not free_now or not fits.room_for(i):
                    held.append(entry)
                    continue
                progressed = True
                if engine is Engine.DMA:
                    start_dma(i, t)
                    continue
                begin(i, t, t + duration[i])
                if engine is Engine.PE:
                    for c in cells[i]:
                        cell_free[c] = t + duration[i]
                    free_mask = None
                else:
                    engine_free[engine] = t + duration[i]
            for entry in held:
                heapq.heappush(queue, entry)
        if len(begun) == n or progressed:
            continue  # a zero-length instruction may have freed its engine at t
        later = [pending[0][0]] if pending else []
        later += [f for f in (*cell_free, *engine_free.values(), *fits.release_times()) if f > t]
        if later:
            t = min(later)
            continue
        # Nothing runs and nothing will free memory: the program order fitted, so take the waiting instruction
        # that comes first in it, whatever the room (only reachable when constraints leave no fitting choice).
        engine, queue = min(((e, q) for e, q in queues.items() if q), key=lambda eq: min(x[1] for x in eq[1]))
        entry = min(queue, key=lambda x: x[1])
        queue.remove(entry)
        heapq.heapify(queue)
        fits.force(entry[1])
        heapq.heappush(queue, entry)
    return begun, start, finish


class _MemoryTracker:
    """Live bytes of a region's own allocations during the simulation: an allocation is live from the start of the
    first instruction touching it to the end of the last one; an instruction that would make one live waits while
    its buffer has no room (``_Memory``)."""

    def __init__(self, records: Sequence[InstructionRecord], memory: _Memory) -> None:
        self.memory = memory
        self.live = {"sbuf": 0, "psum": 0}
        self.left: dict[int, int] = {}  # allocation -> touching instructions not yet started
        self.touches: list[list[int]] = []  # the region's own allocations each instruction touches
        for record in records:
            touched = sorted({r.storage_id for r in (*record.reads, *record.writes) if r.storage_id in memory.local})
            for storage_id in touched:
                self.left[storage_id] = self.left.get(storage_id, 0) + 1
            self.touches.append(touched)
        self.opened: set[int] = set()
        self.ends: dict[int, float] = {}  # opened allocation -> latest end of its instructions so far
        self.closing: list[tuple[float, int]] = []  # (end, allocation) of allocations all of whose instructions ran
        self.forced: set[int] = set()
        self.epoch = 0  # counts releases: a refusal stays valid until memory is freed
        self.refused: dict[int, int] = {}

    def room_for(self, i: int) -> bool:
        if i in self.forced or not self.touches[i]:
            return True
        if self.refused.get(i) == self.epoch:
            return False
        need = {"sbuf": 0, "psum": 0}
        for storage_id in self.touches[i]:
            if storage_id not in self.opened:
                buffer, nbytes = self.memory.local[storage_id]
                need[buffer] = need.get(buffer, 0) + nbytes
        fits = all(self.live.get(b, 0) + v <= self.memory.room.get(b, 0) or v == 0 for b, v in need.items())
        if not fits:
            self.refused[i] = self.epoch
        return fits

    def force(self, i: int) -> None:
        self.forced.add(i)

    def take(self, i: int, end: float) -> None:
        for storage_id in self.touches[i]:
            if storage_id not in self.opened:
                self.opened.add(storage_id)
                buffer, nbytes = self.memory.local[storage_id]
                self.live[buffer] = self.live.get(buffer, 0) + nbytes
            self.ends[storage_id] = max(self.ends.get(storage_id, 0.0), end)
            self.left[storage_id] -= 1
            if not self.left[storage_id]:
                heapq.heappush(self.closing, (self.ends[storage_id], storage_id))

    def release(self, t: float) -> None:
        while self.closing and self.closing[0][0] <= t:
            _, storage_id = heapq.heappop(self.closing)
            buffer, nbytes = self.memory.local[storage_id]
            self.live[buffer] -= nbytes
            self.epoch += 1

    def release_times(self) -> list[float]:
        return [end for end, _ in self.closing]
