"""Dependency-aware list scheduling of a trace onto parallel engine and DMA-queue timelines (docs/nki-sources.md §4.2).

Each instruction starts at the later of (a) its track's free time — tracks are the four compute engines and one
per DMA queue, each in program order — and (b) the ready time of every earlier instruction it depends on through a
RAW, WAR or WAW conflict on overlapping :class:`~nki_cpu.cost.record.Region` boxes. The ready time of an
instruction is its end plus the producing engine's dependency latency (semaphore + pipeline drain; figures).

TensorE tiling (ISA ``nc_matmul`` "Tiling mode", v2.33.0; docs/nki-sources.md §3.3): a matmul recorded with a PE
tile (``pe_rows`` / ``pe_cols`` attrs) occupies only the cells of the 128×128 array its tile covers, rounded out to
``figures.pe_tile_quantum``; every other PE instruction occupies the whole array. PE instructions are still issued
in program order (none starts before the previous one started), but one may run while an earlier one still runs on
disjoint cells — "multiple nc_matmul instructions … run in parallel" in the doc's words. Each keeps its own
documented duration (known unknown 21: whether concurrent tiles share an input or output datapath is not stated).

DMA (INFER from DMA §4.4, see COST_MODEL.md "DMA queues and engines"):

- **Queues.** The interpreter records no queue; the scheduler assigns each DMA instruction to one of
  ``figures.dma_queues`` (16) queues, round-robin in program order (``dma_queues="recorded"`` uses
  ``InstructionRecord.queue`` instead, e.g. for hand-made traces). A queue is in-order: an instruction is issued
  when its dependencies are ready and the queue's previous instruction was issued, so a store waiting for compute
  blocks only the later DMAs of *its* queue.
- **Engines.** A transfer over P partitions occupies ``min(16, ceil(P/8))`` of the 16 DMA engines for its whole
  transfer time ("each engine processes one transfer at a time"). Engines are interchangeable: the pool is a
  usage profile over time, and a transfer starts at the earliest time, not before its fixed latency and the end
  of its queue's previous transfer, at which enough engines stay free for its whole duration (it may use a gap
  before transfers placed earlier in program order, e.g. while a store waits for compute).
  Two 128-partition transfers therefore never overlap (each needs all 16 engines), while narrow ones do.
  Latencies of queued transfers overlap (descriptors are processed ahead; the 1.3 µs figure is
  "descriptor/semaphore-to-start"); bandwidth does not.

Compiled loops (``nl.fori_loop`` / ``nl.while_loop``; "NKI Dynamic Loops" deep dive, SDK documentation sources,
date-modified 03/31/2026, section "Iterations Do Not Overlap"): "The compiler ends every iteration of a dynamic
loop ... with a drain and a barrier across all engines, and resets the semaphores before the next iteration
starts". At every boundary the interpreter records (``Trace.boundaries``: each iteration's start and the loop's
end) no later instruction starts before every earlier one has ended and ``figures.loop_barrier_ns`` has passed
(:func:`loop_barriers`). The page states the barrier at each iteration's end, the last one included (the loop's
exit); nki-cpu reads it at the loop's entry too, since the body is one copy whose semaphore waits cannot tell its
first iteration from the others, so what it waits on from before the loop must be done when it starts: a loop of
n iterations pays n + 1 barriers (a loop that runs zero times one). A barrier after the launch's last instruction
adds nothing (the launch ends when its last instruction does).

Notes:
    Conflicts are found per allocation (``storage_id``) in short lists of recent reader and writer boxes. A write
    drops every older box it fully covers (any later conflict with the old box also conflicts with the new write,
    which already waited for it). When a list still grows beyond ``MAX_BOXES`` its oldest half is merged into one
    bounding box with the latest ready time: this can only add false dependencies on old, usually already passed,
    times — never drop a true one. Cost is O(n · MAX_BOXES) for n instructions.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass, field

from nki_cpu.cost.durations import compute_cycles, dma_engines_used, dma_times
from nki_cpu.cost.figures import Figures
from nki_cpu.cost.record import Engine, InstructionRecord, Region, Trace

MAX_BOXES = 48  # per storage and access kind; beyond this the oldest half is merged (see module notes)

# A box is [p0, p1, b0, b1, ready_ns, index]: partition range, byte range, ready time, producing instruction.
Box = list


@dataclass
class Schedule:
    """Placement of every instruction of a trace.

    Notes:
        Lists are indexed by ``InstructionRecord.index``. ``issue_ns`` equals ``start_ns`` for compute
        instructions; for DMA it is when the transfer was issued (``start - issue`` ≥ the fixed latency).
        ``waited_on`` is the instruction whose ready time set the start (-1 if the track's free time did);
        ``queued_behind`` the instruction that held the track when its free time set the start (-1 if the data did,
        or nothing held it): the previous instruction of the engine or DMA queue, for the tensor engine the one
        whose PE cells were freed last, or the previous PE instruction when in-order issue held it. Where a
        compiled loop's barrier set the start, ``after_barrier`` is true and ``waited_on`` names the instruction
        that ended last before it.
    """

    start_ns: list[float] = field(default_factory=list)
    end_ns: list[float] = field(default_factory=list)
    issue_ns: list[float] = field(default_factory=list)
    track: list[str] = field(default_factory=list)
    waited_on: list[int] = field(default_factory=list)
    queued_behind: list[int] = field(default_factory=list)
    # True where a compiled loop's barrier set the start (``waited_on`` is then the instruction that ended last
    # before the barrier)
    after_barrier: list[bool] = field(default_factory=list)

    @property
    def makespan_ns(self) -> float:
        """End of the last instruction (0 for an empty trace)."""
        return max(self.end_ns, default=0.0)


DMA_QUEUE_POLICIES = ("round_robin", "recorded")


def loop_barriers(trace: Trace) -> dict[int, int]:
    """Position -> how many compiled-loop barriers every instruction from that position on waits for (module
    docstring): one per ``Trace.boundaries`` entry before an instruction (iteration starts and loop ends; nested
    loops and back-to-back loops add theirs), none after the last instruction."""
    count = len(trace.records)
    return dict(Counter(b for b in trace.boundaries if 0 <= b < count))


def track_name(record: InstructionRecord, queue: int | None = None) -> str:
    """Timeline a record runs on: the engine name, or ``dma.q<queue>`` for DMA (``queue`` defaults to the record's)."""
    if record.engine is Engine.DMA:
        return f"dma.q{record.queue if queue is None else queue}"
    return record.engine.value


def _latest(boxes: list[Box], region: Region, ready: float, waited: int) -> tuple[float, int]:
    """Latest ready time among ``boxes`` overlapping ``region`` (and the given current best)."""
    p0, p1 = region.partitions
    b0, b1 = region.byte_range
    for box in boxes:
        if box[0] < p1 and p0 < box[1] and box[2] < b1 and b0 < box[3] and box[4] > ready:
            ready, waited = box[4], box[5]
    return ready, waited


def _merge_oldest(boxes: list[Box]) -> None:
    """Replace the oldest half of ``boxes`` by their bounding box carrying the latest ready time."""
    half = len(boxes) // 2
    old = boxes[:half]
    latest = max(old, key=lambda box: box[4])
    merged = [
        min(box[0] for box in old),
        max(box[1] for box in old),
        min(box[2] for box in old),
        max(box[3] for box in old),
        latest[4],
        latest[5],
    ]
    boxes[:half] = [merged]


def _drop_covered(boxes: list[Box], region: Region) -> list[Box]:
    """Boxes not fully inside ``region``."""
    p0, p1 = region.partitions
    b0, b1 = region.byte_range
    return [box for box in boxes if not (p0 <= box[0] and box[1] <= p1 and b0 <= box[2] and box[3] <= b1)]


class EnginePool:
    """Usage profile of the DMA engines: ``used[i]`` engines busy on ``[times[i], times[i+1])``, last segment open."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.times: list[float] = [0.0]
        self.used: list[int] = [0]

    def earliest(self, t0: float, duration: float, engines: int) -> float:
        """Earliest start ≥ ``t0`` with ``engines`` engines free during ``[start, start + duration)``."""
        times, used, cap = self.times, self.used, self.capacity - engines
        i = max(0, bisect_right(times, t0) - 1)
        start = max(t0, times[0])
        while True:
            j, end = i, start + duration
            while j < len(times) and (times[j] < end or j == i):
                if used[j] > cap:
                    break
                j += 1
            else:
                return start
            i, start = j + 1, times[j + 1]  # the profile ends with a free segment, so j + 1 exists

    def reserve(self, start: float, end: float, engines: int) -> None:
        """Mark ``engines`` engines busy on ``[start, end)``."""
        if end <= start:
            return
        first, last = self._split(start), self._split(end)
        for k in range(first, last):
            self.used[k] += engines

    def prune(self, before: float) -> None:
        """Forget segments that end before ``before`` (no later transfer can start that early)."""
        k = bisect_right(self.times, before) - 1
        if k > 0:
            del self.times[:k], self.used[:k]

    def _split(self, t: float) -> int:
        k = bisect_right(self.times, t) - 1
        if k >= 0 and self.times[k] == t:
            return k
        if k < 0:  # before the (pruned) profile start: cannot happen for starts ≥ the prune horizon
            self.times.insert(0, t)
            self.used.insert(0, 0)
            return 0
        self.times.insert(k + 1, t)
        self.used.insert(k + 1, self.used[k])
        return k + 1


def pe_cells(record: InstructionRecord, quantum: int, side: int) -> list[int]:
    """Cells of a ``side`` × ``side`` grid of ``quantum``-square PE cells that a PE instruction occupies: its
    recorded tile rounded out to whole cells, else the whole array."""
    rows, cols = record.attrs.get("pe_rows"), record.attrs.get("pe_cols")
    if rows is None or cols is None:
        return list(range(side * side))
    r0, r1 = rows[0] // quantum, -(-rows[1] // quantum)
    c0, c1 = cols[0] // quantum, -(-cols[1] // quantum)
    return [r * side + c for r in range(r0, min(r1, side)) for c in range(c0, min(c1, side))]


class _PeArray:
    """Free time of each cell (a ``quantum``-square block) of the PE array and the instruction holding it, and the
    start of the last PE instruction."""

    def __init__(self, figures: Figures) -> None:
        self.quantum = max(1, figures.pe_tile_quantum)
        self.side = max(1, figures.partitions // self.quantum)
        self.free = [0.0] * (self.side * self.side)
        self.owner = [-1] * (self.side * self.side)
        self.last_start = 0.0
        self.last = -1

    def cells(self, record: InstructionRecord) -> list[int]:
        """Cells a PE instruction occupies (:func:`pe_cells`)."""
        return pe_cells(record, self.quantum, self.side)

    def earliest(self, cells: list[int]) -> tuple[float, int]:
        """When all ``cells`` are free and the previous PE instruction has been issued, and the instruction whose
        end (cells) or start (issue order) that is."""
        cell = max(cells, key=self.free.__getitem__)
        if self.free[cell] >= self.last_start:
            return self.free[cell], self.owner[cell]
        return self.last_start, self.last

    def occupy(self, cells: list[int], start: float, end: float, index: int) -> float:
        """Mark ``cells`` busy until ``end`` by instruction ``index``; returns when the whole array is free."""
        self.last_start, self.last = start, index
        for c in cells:
            self.free[c] = end
            self.owner[c] = index
        return max(self.free)


class _Conflicts:
    """Recent reader and writer boxes per storage id."""

    def __init__(self) -> None:
        self.readers: dict[int, list[Box]] = {}
        self.writers: dict[int, list[Box]] = {}

    def ready_time(self, record: InstructionRecord, raw_only: bool = False) -> tuple[float, int]:
        """Latest ready time among the RAW, WAW and WAR predecessors of ``record`` (``raw_only``: RAW only)."""
        ready, waited = 0.0, -1
        for region in record.reads:
            ready, waited = _latest(self.writers.get(region.storage_id, ()), region, ready, waited)
        if raw_only:
            return ready, waited
        for region in record.writes:
            ready, waited = _latest(self.writers.get(region.storage_id, ()), region, ready, waited)
            ready, waited = _latest(self.readers.get(region.storage_id, ()), region, ready, waited)
        return ready, waited

    def add(self, record: InstructionRecord, ready: float) -> None:
        """Record the accesses of ``record`` (ready at ``ready``), pruning boxes its writes cover."""
        for region in record.reads:
            self._push(self.readers, region, ready, record.index)
        for region in record.writes:
            sid = region.storage_id
            if sid in self.readers:
                self.readers[sid] = _drop_covered(self.readers[sid], region)
            if sid in self.writers:
                self.writers[sid] = _drop_covered(self.writers[sid], region)
            self._push(self.writers, region, ready, record.index)

    @staticmethod
    def _push(table: dict[int, list[Box]], region: Region, ready: float, index: int) -> None:
        boxes = table.setdefault(region.storage_id, [])
        boxes.append([*region.partitions, *region.byte_range, ready, index])
        if len(boxes) > MAX_BOXES:
            _merge_oldest(boxes)


def schedule(trace: Trace, figures: Figures, *, dma_queues: str = "round_robin") -> Schedule:
    """Place every instruction of ``trace`` on its engine or DMA-queue timeline.

    Args:
        trace: records in program order.
        figures: hardware figures of the target generation.
        dma_queues: ``"round_robin"`` (default: the i-th DMA instruction goes to queue ``i % figures.dma_queues``)
            or ``"recorded"`` (``InstructionRecord.queue``).

    Returns:
        The :class:`Schedule` (per-instruction start/end in ns).
    """
    if dma_queues not in DMA_QUEUE_POLICIES:
        raise ValueError(f"dma_queues must be one of {DMA_QUEUE_POLICIES}, got {dma_queues!r}")
    conflicts = _Conflicts()
    free: dict[str, float] = {}
    last_on: dict[str, int] = {}
    issued: dict[str, float] = {}
    pool = EnginePool(figures.dma_engines)
    pe_array = _PeArray(figures)
    queues = max(1, figures.dma_queues)
    dma_seen = 0
    out = Schedule()
    latency_ns = {e: figures.cycles_to_ns(c, e) for e, c in figures.dependency_latency_cycles.items()}
    barriers = loop_barriers(trace)
    fence, last_end, last_ended = 0.0, 0.0, -1  # the latest barrier's end; the latest end so far, and whose
    for position, record in enumerate(trace.records):
        if record.index != position:
            record.index = position
        if position in barriers:  # a compiled loop's drain and barrier: everything before has ended
            fence = max(fence, last_end) + barriers[position] * figures.loop_barrier_ns
        deps_ready, waited = conflicts.ready_time(record)
        held = fence > deps_ready
        if held:
            deps_ready, waited = fence, last_ended
        if record.engine is Engine.DMA:
            queue = record.queue if dma_queues == "recorded" else dma_seen % queues
            dma_seen += 1
            track = track_name(record, queue)
            track_free, holder = free.get(track, 0.0), last_on.get(track, -1)
            fixed, transfer = dma_times(record, figures)
            issue = max(deps_ready, issued.get(track, 0.0))
            issued[track] = issue
            engines = dma_engines_used(record.partitions, figures)
            start = pool.earliest(max(issue + fixed, track_free), transfer, engines)
            end = start + transfer
            pool.reserve(start, end, engines)
            if dma_queues == "round_robin" and dma_seen % queues == 0 and dma_seen >= queues:
                # every queue has issued: no later transfer can start before the earliest of their issue times
                pool.prune(min(issued.values()))
        elif record.engine is Engine.PE:
            track = track_name(record)
            cells = pe_array.cells(record)
            track_free, holder = pe_array.earliest(cells)
            issue = start = max(deps_ready, track_free)
            end = start + figures.cycles_to_ns(compute_cycles(record, figures), record.engine)
            end_all = pe_array.occupy(cells, start, end, position)
        else:
            track = track_name(record)
            track_free, holder = free.get(track, 0.0), last_on.get(track, -1)
            issue = start = max(deps_ready, track_free)
            end = start + figures.cycles_to_ns(compute_cycles(record, figures), record.engine)
        free[track] = end_all if record.engine is Engine.PE else end
        last_on[track] = position
        conflicts.add(record, end + latency_ns.get(record.engine, 0.0))
        out.start_ns.append(start)
        out.end_ns.append(end)
        out.issue_ns.append(issue)
        out.track.append(track)
        out.waited_on.append(waited if deps_ready >= track_free else -1)
        out.queued_behind.append(holder if deps_ready < track_free else -1)
        out.after_barrier.append(held and deps_ready >= track_free)
        if end > last_end:
            last_end, last_ended = end, position
    return out
