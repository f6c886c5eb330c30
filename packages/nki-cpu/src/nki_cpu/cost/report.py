"""The cost report of one kernel launch and the public entry :func:`estimate`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field
from functools import cached_property

from nki_cpu.cost.bounds import Floor, dependency_bound_ns, makespan_floor
from nki_cpu.cost.critical import PathStep, critical_path
from nki_cpu.cost.durations import opcode_name
from nki_cpu.cost.figures import DEFAULT_TARGET, Figures, get_figures
from nki_cpu.cost.record import Engine, InstructionRecord, Trace, site_label
from nki_cpu.cost.reorder import HEURISTICS, compiler_order
from nki_cpu.cost.scheduler import Schedule, schedule

COMPUTE_TRACKS = ("pe", "vector", "scalar", "gpsimd")
ORDERS = ("program", *HEURISTICS)  # estimate(order=...): the kernel's order, or a reordering compiler's
DMA_ANY = "dma"  # the union of all DMA queues in the per-engine view
PE_TRACK = "pe"
# Short dtype names for instruction-kind labels (others print as recorded).
SHORT_DTYPES = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16", "tfloat32": "tf32"}


def _union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by possibly overlapping intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


@dataclass
class CostReport:
    """Estimated timing of one kernel launch on one NeuronCore.

    Notes:
        Times are ns. ``track_*`` maps each timeline (``pe``, ``vector``, ``scalar``, ``gpsimd``, ``dma.q<n>``)
        that ran at least one instruction; ``engine_busy_ns`` is per engine, DMA being the time during which at
        least one queue was transferring. High-water marks are bytes per partition, as recorded in the trace.
    """

    target: str
    figures: Figures
    trace: Trace
    schedule: Schedule
    makespan_ns: float
    track_busy_ns: dict[str, float] = field(default_factory=dict)
    track_counts: dict[str, int] = field(default_factory=dict)
    engine_busy_ns: dict[str, float] = field(default_factory=dict)
    engine_counts: dict[str, int] = field(default_factory=dict)
    opcode_counts: dict[str, int] = field(default_factory=dict)
    dma_bytes: int = 0
    sbuf_high_water: int = 0
    psum_high_water: int = 0
    order: str = "program"  # the issue order scheduled (estimate's ``order``)

    @property
    def instructions(self) -> int:
        """Number of scheduled instructions (the dynamic count: every executed instruction)."""
        return len(self.schedule.end_ns)

    @property
    def static_instructions(self) -> int:
        """Instructions of the compiled program: each compiled loop's body once (``Trace.static_instructions``)."""
        return self.trace.static_instructions

    @property
    def busy_share(self) -> dict[str, float]:
        """Per-engine busy time as a fraction of the makespan."""
        span = self.makespan_ns or 1.0
        return {name: busy / span for name, busy in self.engine_busy_ns.items()}

    @property
    def track_share(self) -> dict[str, float]:
        """Per-track busy time as a fraction of the makespan."""
        span = self.makespan_ns or 1.0
        return {name: busy / span for name, busy in self.track_busy_ns.items()}

    def site_breakdown(self, skip_files: Collection[str] = ()) -> list[SiteTime]:
        """Busy time per engine grouped by the kernel source line that issued it (:func:`site_breakdown`)."""
        return site_breakdown(self, skip_files)

    def pe_breakdown(self) -> list[PeKindTime]:
        """Tensor-engine busy time grouped by instruction kind, largest first (:func:`pe_breakdown`)."""
        return pe_breakdown(self)

    @cached_property
    def dependency_bound_ns(self) -> float:
        """The makespan with every instruction started as soon as its operands were ready
        (``bounds.dependency_bound_ns``; computed on first use: one more pass over the trace)."""
        return dependency_bound_ns(self.trace, self.figures)

    @cached_property
    def makespan_floor(self) -> Floor:
        """The makespan no issue order of these instructions can beat, and the bound that sets it: dependencies
        or one engine's work (``bounds.makespan_floor``; computed on first use)."""
        return makespan_floor(self.trace, self.figures)

    @cached_property
    def critical_path(self) -> list[PathStep]:
        """The instructions the makespan waited on, and why (``critical.critical_path``)."""
        return critical_path(self.schedule)

    def __str__(self) -> str:
        return "\n".join(self._lines())

    def _lines(self) -> list[str]:
        lines = [
            f"nki-cpu cost estimate ({self.target}, {self.order} order): makespan {self.makespan_ns / 1000:.3f} us, "
            f"{self.instructions} instructions executed, {self.static_instructions} in the program",
            f"{'engine':<12}{'instrs':>9}{'busy us':>12}{'share':>8}",
        ]
        share = self.busy_share
        for name, busy in self.engine_busy_ns.items():
            lines.append(f"{name:<12}{self.engine_counts[name]:>9}{busy / 1000:>12.3f}{share[name]:>8.1%}")
            if name == DMA_ANY:
                lines.extend(self._queue_lines())
        lines.append(f"DMA bytes {self.dma_bytes:,}")
        lines.append(self._memory_line("SBUF", self.sbuf_high_water, self.figures.sbuf_bytes_per_partition))
        lines.append(self._memory_line("PSUM", self.psum_high_water, self.figures.psum_bytes_per_partition))
        top = sorted(self.opcode_counts.items(), key=lambda item: (-item[1], item[0]))
        lines.append("opcodes " + ", ".join(f"{name} {count}" for name, count in top))
        return lines

    def _queue_lines(self) -> list[str]:
        share = self.track_share
        return [
            f"  {name:<10}{self.track_counts[name]:>9}{busy / 1000:>12.3f}{share[name]:>8.1%}"
            for name, busy in self.track_busy_ns.items()
            if name.startswith("dma.")
        ]

    @staticmethod
    def _memory_line(name: str, high_water: int, capacity: int) -> str:
        return f"{name} high water {high_water:,} B/partition ({high_water / capacity:.1%} of {capacity:,})"


@dataclass(frozen=True)
class PeKind:
    """A kind of tensor-engine instruction: the facts its cost-model duration depends on.

    Notes:
        ``contraction`` is K (the partitions of both operands), ``stationary_free`` M and ``moving_free`` N (elements
        per partition). A PE transpose is the matmul of its data (stationary) with a [K, K] identity (moving).
        ``tile_position`` / ``tile_size`` are the PE tiling of ``nc_matmul`` when the instruction set them, else None.
    """

    opcode: str
    dtype: str  # the operands' dtype, short name ("bf16", "fp32", ...)
    transpose: bool
    contraction: int
    stationary_free: int
    moving_free: int
    hints: tuple[str, ...] = ()  # speed hints that change the duration: "onezero", "double_row"
    tile_position: tuple[int, ...] | None = None
    tile_size: tuple[int, ...] | None = None

    def __str__(self) -> str:
        words = [self.opcode, self.dtype]
        if self.transpose and self.opcode != "nc_transpose":  # nc_matmul in transpose mode
            words.append("transpose")
        words.append(
            f"stationary {self.contraction}x{self.stationary_free} moving {self.contraction}x{self.moving_free}"
        )
        words.extend(self.hints)
        if self.tile_position is not None:
            words.append(f"tile_position {self.tile_position}")
        if self.tile_size is not None:
            words.append(f"tile_size {self.tile_size}")
        return " ".join(words)

    @classmethod
    def of(cls, record: InstructionRecord) -> PeKind:
        """The kind of one tensor-engine record (``nc_matmul``, PE ``nc_transpose`` and other PE opcodes)."""
        attrs = record.attrs
        dtype = record.dtypes[0] if record.dtypes else "?"
        hints = tuple(hint for hint in ("onezero", "double_row") if attrs.get(hint))
        return cls(
            opcode=opcode_name(record),
            dtype=SHORT_DTYPES.get(dtype, dtype),
            transpose=bool(attrs.get("is_transpose", False)),
            contraction=record.partitions,
            stationary_free=int(attrs.get("stationary_free", 0)),
            moving_free=int(attrs.get("moving_free", record.free_elems)),
            hints=hints,
            tile_position=_tiling(attrs.get("tile_position")),
            tile_size=_tiling(attrs.get("tile_size")),
        )


def _tiling(value: object) -> tuple[int, ...] | None:
    """A recorded ``tile_position`` / ``tile_size`` as a tuple of ints; None when unset (absent or empty)."""
    if not value:
        return None
    return tuple(int(v) for v in value)  # type: ignore[union-attr]


@dataclass(frozen=True)
class PeKindTime:
    """The tensor-engine time of one :class:`PeKind` in a launch."""

    kind: PeKind
    count: int  # instructions of this kind (dynamic count)
    busy_ns: float  # its part of the PE busy time (time shared with concurrent PE tiles split evenly)
    duration_ns: float  # its instructions' summed durations (more than busy_ns when they ran beside others)
    share: float  # busy_ns as a fraction of the launch's PE busy time


def pe_breakdown(report: CostReport) -> list[PeKindTime]:
    """Tensor-engine busy time of a launch grouped by instruction kind, largest first.

    Args:
        report: an :func:`estimate` result.

    Returns:
        One entry per :class:`PeKind` that ran on the PE track; the busy times add up to
        ``report.engine_busy_ns["pe"]`` and the shares to 1 (an empty list when no PE instruction ran).

    Notes:
        Matmuls on disjoint PE tiles can run at the same time (``nc_matmul`` tiling mode): every instant of PE
        busy time is split evenly among the instructions running then, so a kind's ``busy_ns`` is what it adds
        to the PE's busy time and ``duration_ns`` what its instructions would take one after another. To report
        per unit of work (per chunk, per tile), divide ``count`` and the times by the number of units.
    """
    placed = report.schedule
    attributed = _pe_busy_parts(report)
    kinds = {i: PeKind.of(report.trace.records[i]) for i in attributed}
    counts: Counter[PeKind] = Counter(kinds.values())
    busy: dict[PeKind, float] = dict.fromkeys(counts, 0.0)
    duration: dict[PeKind, float] = dict.fromkeys(counts, 0.0)
    for i, kind in kinds.items():
        busy[kind] += attributed[i]
        duration[kind] += placed.end_ns[i] - placed.start_ns[i]
    total = sum(busy.values()) or 1.0
    ranked = sorted(counts, key=lambda kind: (-busy[kind], str(kind)))
    return [PeKindTime(kind, counts[kind], busy[kind], duration[kind], busy[kind] / total) for kind in ranked]


@dataclass(frozen=True)
class SiteTime:
    """The time one engine spent on the instructions one kernel source line issued."""

    engine: str  # "pe", "vector", "scalar", "gpsimd" or "dma" (every queue)
    site: str  # "file.py:line function" (``record.site_label``)
    count: int  # instructions (dynamic count)
    busy_ns: float  # PE: its part of the PE busy time (concurrent tiles split evenly); else summed durations
    share: float  # busy_ns over the engine's total busy_ns in this breakdown


def site_breakdown(report: CostReport, skip_files: Collection[str] = ()) -> list[SiteTime]:
    """Each engine's time grouped by the kernel source line that issued it, per engine largest first.

    Args:
        report: an :func:`estimate` result (its records carry ``site``, the call stack the interpreter saw).
        skip_files: base names of the kernel's helper modules (e.g. ``{"tiles.py"}``): a record is charged to the
            innermost frame of its site outside them, the line that called the helper.

    Returns:
        Entries ordered by engine (pe, vector, scalar, gpsimd, dma), then by busy time. The tensor engine's
        entries add up to its busy time (``engine_busy_ns["pe"]``); the others' to the summed durations of the
        engine's instructions (for DMA, transfers of all queues: more than the union of their busy time).

    Notes:
        A trace built by hand, or by an interpreter that records no call stack, groups everything under ``"?"``.
        Divide ``count`` and ``busy_ns`` by your unit of work (chunks, tiles) for per-unit figures.
    """
    placed = report.schedule
    pe_part = _pe_busy_parts(report)
    time: dict[tuple[str, str], float] = {}
    count: Counter[tuple[str, str]] = Counter()
    for record in report.trace.records:
        key = (record.engine.value, site_label(record, skip_files))
        i = record.index
        ns = pe_part[i] if i in pe_part else placed.end_ns[i] - placed.start_ns[i]
        time[key] = time.get(key, 0.0) + ns
        count[key] += 1
    engines = [engine.value for engine in (Engine.PE, Engine.VECTOR, Engine.SCALAR, Engine.GPSIMD, Engine.DMA)]
    totals = {engine: sum(ns for (e, _), ns in time.items() if e == engine) or 1.0 for engine in engines}
    ranked = sorted(time, key=lambda key: (engines.index(key[0]), -time[key], key[1]))
    return [SiteTime(e, site, count[(e, site)], time[(e, site)], time[(e, site)] / totals[e]) for e, site in ranked]


def _pe_busy_parts(report: CostReport) -> dict[int, float]:
    """Each tensor-engine instruction's part of the PE busy time, by trace index (concurrent tiles split evenly)."""
    placed = report.schedule
    on_pe = [r.index for r in report.trace.records if placed.track[r.index] == PE_TRACK]
    return _split_among_concurrent({i: (placed.start_ns[i], placed.end_ns[i]) for i in on_pe})


def _split_among_concurrent(intervals: dict[int, tuple[float, float]]) -> dict[int, float]:
    """Each interval's part of their union: every instant goes in equal parts to the intervals covering it."""
    events = sorted(
        [(start, 1, key) for key, (start, _) in intervals.items()]
        + [(end, 0, key) for key, (_, end) in intervals.items()]
    )  # at equal times ends (0) come before starts (1)
    part = dict.fromkeys(intervals, 0.0)
    active: set[int] = set()
    previous = 0.0
    for time, starts, key in events:
        if active and time > previous:
            each = (time - previous) / len(active)
            for running in active:
                part[running] += each
        previous = time
        if starts:
            active.add(key)
        else:
            active.discard(key)
    return part


def _track_order(name: str) -> tuple[int, int]:
    if name in COMPUTE_TRACKS:
        return (COMPUTE_TRACKS.index(name), 0)
    return (len(COMPUTE_TRACKS), int(name.split("q")[-1]))


def build_report(trace: Trace, figures: Figures, placed: Schedule) -> CostReport:
    """Aggregate a schedule into a :class:`CostReport`.

    Args:
        trace: the scheduled trace.
        figures: figures used for the schedule.
        placed: its schedule.

    Returns:
        The report (busy times, counts, DMA bytes, high-water marks).
    """
    busy: dict[str, float] = {}
    counts: Counter[str] = Counter()
    dma_intervals: list[tuple[float, float]] = []
    pe_intervals: list[tuple[float, float]] = []
    for start, end, track in zip(placed.start_ns, placed.end_ns, placed.track, strict=True):
        busy[track] = busy.get(track, 0.0) + (end - start)
        counts[track] += 1
        if track.startswith("dma."):
            dma_intervals.append((start, end))
        elif track == Engine.PE.value:
            pe_intervals.append((start, end))
    if pe_intervals:  # matmuls on disjoint PE tiles overlap: busy is the time at least one runs
        busy[Engine.PE.value] = _union_length(pe_intervals)
    tracks = sorted(busy, key=_track_order)
    engine_busy = {name: busy[name] for name in tracks if name in COMPUTE_TRACKS}
    engine_counts = {name: counts[name] for name in tracks if name in COMPUTE_TRACKS}
    if dma_intervals:
        engine_busy[DMA_ANY] = _union_length(dma_intervals)
        engine_counts[DMA_ANY] = len(dma_intervals)
    return CostReport(
        target=figures.name,
        figures=figures,
        trace=trace,
        schedule=placed,
        makespan_ns=placed.makespan_ns,
        track_busy_ns={name: busy[name] for name in tracks},
        track_counts={name: counts[name] for name in tracks},
        engine_busy_ns=engine_busy,
        engine_counts=engine_counts,
        opcode_counts=dict(Counter(opcode_name(r) for r in trace.records)),
        dma_bytes=sum(r.nbytes for r in trace.records if r.engine is Engine.DMA),
        sbuf_high_water=trace.sbuf_high_water,
        psum_high_water=trace.psum_high_water,
    )


def estimate(
    trace: Trace,
    target: str = DEFAULT_TARGET,
    figures: Figures | None = None,
    *,
    dma_queues: str = "round_robin",
    order: str = "program",
) -> CostReport:
    """Estimate the run time of a recorded kernel launch.

    Args:
        trace: the records the interpreter appended, in program order.
        target: generation whose figures to use (``"trn2"`` default, ``"trn3"``, ``"trn1"``).
        figures: explicit figures overriding ``target`` (e.g. a ``dataclasses.replace`` variant).
        dma_queues: queue assignment of DMA instructions, ``"round_robin"`` over ``figures.dma_queues`` or
            ``"recorded"`` (see ``scheduler.schedule``).
        order: the issue order to schedule: ``"program"`` (the kernel's own order, what ``nl.no_reorder()``
            guarantees) or the order a reordering compiler would issue, found by list scheduling with the
            ``"critical_path"`` or ``"asap"`` heuristic (``cost.reorder``; the report's trace is then the
            reordered copy).

    Returns:
        The :class:`CostReport`; ``str(report)`` is a readable table.

    Raises:
        ValueError: ``order`` is not one of ``ORDERS``, or reorders with recorded DMA queues.
    """
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    if order != "program" and dma_queues != "round_robin":
        raise ValueError(
            f"order={order!r} needs dma_queues='round_robin': the reordered program's DMAs are assigned to queues "
            f"in their new order, so recorded queues (dma_queues={dma_queues!r}) no longer apply"
        )
    chosen = figures if figures is not None else get_figures(target)
    if order != "program":
        trace = compiler_order(trace, chosen, heuristic=order)
    report = build_report(trace, chosen, schedule(trace, chosen, dma_queues=dma_queues))
    report.order = order
    return report
