"""Per-launch interpreter state: the active trace, the program id, and on-chip allocation accounting.

One :class:`Launch` exists per program of a ``simulate`` call; ``current()`` returns it (or a detached default
state outside any launch, so tensors can be built and instructions run in plain Python, e.g. in tests).
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nki_cpu import checks
from nki_cpu.checks import PSUM_BYTES_PER_PARTITION, SBUF_BYTES_PER_PARTITION
from nki_cpu.cost.record import NO_REORDER, InstructionRecord, Region, Trace, caller_site

_storage_ids = itertools.count(1)


def next_storage_id() -> int:
    """A process-unique id for a new allocation."""
    return next(_storage_ids)


@dataclass
class Launch:
    """State of one running program (one NeuronCore of a launch)."""

    program_id: int = 0
    num_programs: int = 1
    program_ndim: int = 0
    trace: Trace = field(default_factory=Trace)
    check_capacity: bool = True
    # documented rules turned into warnings for this launch (checks.RULES names; simulate(relax=...))
    relaxed: frozenset[str] = frozenset()
    # open matmul accumulation groups (nki_cpu.accumulation.Groups), created on the first nc_matmul
    accumulation: Any = None
    sbuf_capacity: int = SBUF_BYTES_PER_PARTITION
    psum_capacity: int = PSUM_BYTES_PER_PARTITION
    live: dict[str, int] = field(default_factory=lambda: {"sbuf": 0, "psum": 0})
    active: bool = False
    accumulators: dict[str, np.ndarray] = field(default_factory=dict)
    # shared_hbm allocations of a grid launch, shared by all programs (the n-th allocation of every program is the
    # same tensor, as on LNC2 hardware where both cores see one shared HBM buffer).
    shared_pool: list[Any] = field(default_factory=list)
    shared_cursor: int = 0
    # Compiled loops currently past their first iteration: their instructions repeat the loop's body
    # (``nki_cpu.loops``) instead of adding to the program.
    loop_repeats: int = 0
    # Compiled loops being run, innermost last (``nki_cpu.loops.LoopFrame``), and the on-chip allocations made
    # inside their bodies: storage id -> ((loop id, iteration), ...) of every loop running at the allocation.
    loops: list[Any] = field(default_factory=list)
    body_allocations: dict[int, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    # An allocation a later iteration of a compiled loop's body made: storage id -> the id of the allocation the
    # program reuses for it (the first iteration's); records name that one (``buffer_regions``).
    buffer_of: dict[int, int] = field(default_factory=dict)
    # The ``nl.no_reorder()`` block being run (its id; nested blocks are one block), or None: its instructions keep
    # their program order when the cost model reorders as the compiler does (``cost.reorder``).
    no_reorder_block: int | None = None
    no_reorder_blocks: int = 0
    # Compiled loops that have ended: loop id -> index of their last iteration.
    ended_loops: dict[int, int] = field(default_factory=dict)
    # Inside the trace-only pass of a compiled loop that runs zero times (``nki_cpu.loops``): its body is checked
    # and enters the program, but no iteration runs, so run-time indices are not bounds-checked.
    dry_run: bool = False

    def accumulator(self, engine: str) -> np.ndarray:
        """The per-lane fp32 accumulator registers of ``engine`` (``"vector"`` or ``"scalar"``), 128 lanes."""
        if engine not in self.accumulators:
            self.accumulators[engine] = np.zeros(128, dtype=np.float32)
        return self.accumulators[engine]

    def record(self, rec: InstructionRecord) -> InstructionRecord:
        """Append one instruction record to this launch's trace (marked a repeat inside a compiled loop's later
        iterations)."""
        if self.loop_repeats:
            rec.repeat = True
        rec.site = caller_site()
        if self.no_reorder_block is not None:
            rec.attrs[NO_REORDER] = self.no_reorder_block
        if self.body_allocations:
            self.check_body_tiles(rec)
        if self.buffer_of:
            self.buffer_regions(rec)
        if not rec.repeat:
            self.trace.program.append(rec)
        self.trace.append(rec)
        return rec

    def check_body_tiles(self, record: InstructionRecord) -> None:
        """Reject an instruction touching a tile a compiled loop's body allocated in another iteration (module
        docstring of ``nki_cpu.loops``); called for every record while such tiles exist."""
        running = {frame.id: frame.iteration for frame in self.loops}
        for region in (*record.reads, *record.writes):
            tag = self.body_allocations.get(region.storage_id)
            if tag is None:
                continue
            for loop_id, iteration in tag:
                now = running.get(loop_id)
                if now is not None and now != iteration:
                    checks.fail(
                        f"{record.opcode}: touches a tile allocated in iteration {iteration} of a compiled loop's body, "
                        f"in iteration {now}. The body is traced once (nki.language.fori_loop, SDK 2.33): its tiles are "
                        "one allocation that every iteration reuses, so a previous iteration's tile holds this "
                        "iteration's data. Fix: allocate tiles whose values cross iterations before the loop"
                    )
                last = self.ended_loops.get(loop_id)
                if now is None and last is not None and iteration != last:
                    checks.fail(
                        f"{record.opcode}: touches a tile allocated in iteration {iteration} of a compiled loop that "
                        f"ended after iteration {last}. The body is traced once, so after the loop its tiles hold the "
                        "last iteration's data. Fix: allocate tiles whose values outlive the loop before it"
                    )

    def buffer_regions(self, record: InstructionRecord) -> None:
        """Name, in ``record``'s regions, the one buffer the program has for an allocation a later iteration of a
        compiled loop's body made (``buffer_of``): the cost model then orders that iteration's accesses after the
        previous iterations' accesses to the same buffer (``nki_cpu.loops``)."""
        buffer_of = self.buffer_of

        def renamed(regions: tuple[Region, ...]) -> tuple[Region, ...]:
            if not any(r.storage_id in buffer_of for r in regions):
                return regions
            return tuple(
                dataclasses.replace(r, storage_id=buffer_of[r.storage_id]) if r.storage_id in buffer_of else r
                for r in regions
            )

        record.reads, record.writes = renamed(record.reads), renamed(record.writes)

    def _reused_buffer(self, storage_id: int, buffer: str, bytes_per_partition: int) -> int:
        """The storage id of the allocation the program reuses for a new allocation inside compiled loops: the
        innermost loop past its first iteration maps the allocation's number within its iteration to the first
        iteration's allocation; a loop in its first iteration defers to the loop around it (the first iteration
        of an inner loop is, to the outer loop, the same position of its body every time). An allocation of
        another buffer or size than the one it maps to keeps its own id (no false sharing)."""
        reused = storage_id
        for frame in reversed(self.loops):
            if frame.iteration > 0:
                candidate = frame.buffers.get(frame.ordinals[storage_id], storage_id)
                if self.trace.allocations.get(candidate) == (buffer, bytes_per_partition):
                    reused = candidate
                break
        for frame in self.loops:
            if frame.iteration == 0:
                frame.buffers[frame.ordinals[storage_id]] = reused
        return reused

    def allocate(self, buffer: str, bytes_per_partition: int, owner: Any) -> None:
        """Account an on-chip allocation; raise when the per-partition capacity is exceeded.

        Args:
            buffer: ``"sbuf"`` or ``"psum"``.
            bytes_per_partition: the allocation's bytes in each partition.
            owner: the storage object (its id keys ``Trace.allocations``); its garbage collection frees the
                bytes (``owner.release`` is set to a callable that the owner's ``__del__`` calls: cheaper than a
                ``weakref.finalize`` per allocation).
        """
        cap = self.sbuf_capacity if buffer == "sbuf" else self.psum_capacity
        live = self.live
        live[buffer] += bytes_per_partition
        if self.check_capacity and live[buffer] > cap:
            checks.capacity(buffer, live[buffer], cap, bytes_per_partition)
        if buffer == "sbuf":
            if live[buffer] > self.trace.sbuf_high_water:
                self.trace.sbuf_high_water = live[buffer]
        elif live[buffer] > self.trace.psum_high_water:
            self.trace.psum_high_water = live[buffer]
        owner.release = (self, buffer, bytes_per_partition)
        self.trace.allocations[owner.id] = (buffer, bytes_per_partition)
        if self.loops:
            self.body_allocations[owner.id] = tuple((frame.id, frame.iteration) for frame in self.loops)
            for frame in self.loops:
                frame.allocated(owner.id)
            reused = self._reused_buffer(owner.id, buffer, bytes_per_partition)
            if reused != owner.id:
                self.buffer_of[owner.id] = reused

    def free(self, buffer: str, nbytes: int, storage_id: int = 0) -> None:
        """Return ``nbytes`` per partition of ``buffer`` (called when an allocation is garbage-collected)."""
        self.live[buffer] -= nbytes
        self.body_allocations.pop(storage_id, None)
        self.buffer_of.pop(storage_id, None)


_local = threading.local()
_detached = Launch()


def current() -> Launch:
    """The launch running on this thread, or the detached default state."""
    return getattr(_local, "launch", None) or _detached


def push(launch: Launch) -> Launch | None:
    """Make ``launch`` current; return the previous one (for :func:`pop`)."""
    previous = getattr(_local, "launch", None)
    launch.active = True
    _local.launch = launch
    return previous


def pop(previous: Launch | None) -> None:
    """Restore the launch that was current before :func:`push`."""
    cur = getattr(_local, "launch", None)
    if cur is not None:
        cur.active = False
    _local.launch = previous


def in_kernel() -> bool:
    """True while a ``simulate`` launch runs on this thread."""
    return getattr(_local, "launch", None) is not None


def reset_detached() -> Launch:
    """Replace the detached state with a fresh one (fresh trace) and return it."""
    global _detached
    _detached = Launch()
    return _detached


def seal(rule: str, what: str, fix: str) -> None:
    """Refuse kernel Python a device value: inside a launch only nki-cpu itself reads device data.

    Called first thing by every public accessor of device data (a tile's elements, a register's or scalar's value,
    a run-time view's resolved offset). On Trainium there is no data while the kernel's Python runs (the kernel is
    traced once: "NKI Scalar Values" and ``nki.isa.VirtualRegister``, SDK 2.32-2.33), so a kernel that reads one
    here would be specialised on data it cannot have. The accessor's caller is the kernel when its module is not
    part of nki-cpu (the instructions read their operands through the same accessors). Host code before and after
    the launch reads freely.

    Args:
        rule: the ``checks.RULES`` name (relaxable for one launch: the value is then returned with a warning).
        what: the accessor, as the kernel wrote it (``"tile._read()"``).
        fix: the documented form to use instead.
    """
    launch = getattr(_local, "launch", None)
    if launch is None:
        return
    caller = sys._getframe(2).f_globals.get("__name__", "")
    if caller == "nki_cpu" or caller.startswith("nki_cpu."):
        return
    checks.rule(
        rule,
        f"{what} inside a kernel reads a device value the kernel's Python cannot have: on Trainium the kernel is "
        f"traced once, before any data exists. Fix: {fix}",
        launch.relaxed,
        checks.SealedValueError,
    )
