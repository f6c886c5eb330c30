"""The cost report of one kernel launch and the public entry :func:`estimate`."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from nki_cpu.cost.durations import opcode_name
from nki_cpu.cost.figures import DEFAULT_TARGET, Figures, get_figures
from nki_cpu.cost.record import Engine, Trace
from nki_cpu.cost.scheduler import Schedule, schedule

COMPUTE_TRACKS = ("pe", "vector", "scalar", "gpsimd")
DMA_ANY = "dma"  # the union of all DMA queues in the per-engine view


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

    def __str__(self) -> str:
        return "\n".join(self._lines())

    def _lines(self) -> list[str]:
        lines = [
            f"nki-cpu cost estimate ({self.target}): makespan {self.makespan_ns / 1000:.3f} us, "
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
    for start, end, track in zip(placed.start_ns, placed.end_ns, placed.track, strict=True):
        busy[track] = busy.get(track, 0.0) + (end - start)
        counts[track] += 1
        if track.startswith("dma."):
            dma_intervals.append((start, end))
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
    trace: Trace, target: str = DEFAULT_TARGET, figures: Figures | None = None, *, dma_queues: str = "round_robin"
) -> CostReport:
    """Estimate the run time of a recorded kernel launch.

    Args:
        trace: the records the interpreter appended, in program order.
        target: generation whose figures to use (``"trn2"`` default, ``"trn3"``, ``"trn1"``).
        figures: explicit figures overriding ``target`` (e.g. a ``dataclasses.replace`` variant).
        dma_queues: queue assignment of DMA instructions, ``"round_robin"`` over ``figures.dma_queues`` or
            ``"recorded"`` (see ``scheduler.schedule``).

    Returns:
        The :class:`CostReport`; ``str(report)`` is a readable table.
    """
    chosen = figures if figures is not None else get_figures(target)
    return build_report(trace, chosen, schedule(trace, chosen, dma_queues=dma_queues))
