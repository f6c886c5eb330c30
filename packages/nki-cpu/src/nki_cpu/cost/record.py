"""What the interpreter tells the cost model about one executed instruction.

This module is the contract between the instruction implementations (``nki_cpu.isa``) and the cost
model (``nki_cpu.cost``): an instruction appends one :class:`InstructionRecord` to the active
:class:`Trace`; the cost model turns records into durations and schedules them. Nothing here knows
any instruction's semantics.
"""

from __future__ import annotations

import enum
import hashlib
import os
import sys
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any


class Engine(enum.Enum):
    """Execution resources the scheduler keeps one timeline for (DMA queues get one each)."""

    PE = "pe"  # tensor engine: nc_matmul, nc_transpose (PE path)
    VECTOR = "vector"  # DVE
    SCALAR = "scalar"  # ACT
    GPSIMD = "gpsimd"  # POOL
    DMA = "dma"  # one of the DMA queues; the queue index is InstructionRecord.queue


# ``InstructionRecord.attrs`` key: the id of the ``nl.no_reorder()`` block an instruction was issued in
NO_REORDER = "no_reorder"
SITE_DEPTH = 6  # frames of the kernel's call stack kept per record: enough to see past a kernel's own helpers
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # nki_cpu/


def caller_site(depth: int = SITE_DEPTH) -> tuple[tuple[str, int, str], ...]:
    """The kernel's part of the current call stack, innermost first, at most ``depth`` frames: from the first
    frame outside the nki_cpu package (where the kernel issued the instruction being recorded) to the last before
    nki-cpu's launcher, which called the kernel."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
    site = []
    while frame is not None and len(site) < depth and not frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        code = frame.f_code
        site.append((code.co_filename, frame.f_lineno, code.co_name))
        frame = frame.f_back
    return tuple(site)


def site_label(record: InstructionRecord, skip_files: Collection[str] = ()) -> str:
    """``"file.py:line function"`` of the innermost frame of a record's site whose file name (base name) is not in
    ``skip_files`` (a kernel's helper modules, to name the line that called them); ``"?"`` without one."""
    for filename, line, function in record.site:
        name = os.path.basename(filename)
        if name not in skip_files:
            return f"{name}:{line} {function}"
    return "?"


@dataclass(frozen=True)
class Region:
    """A bounding box of bytes one operand touches in one allocation.

    ``storage_id`` identifies the allocation (two views of one allocation share it).
    ``partitions`` is the half-open partition range [lo, hi) (HBM tensors use (0, 1)).
    ``byte_range`` is the half-open byte range [lo, hi) within each partition (HBM: within the flat buffer).
    Bounding boxes over-approximate strided views; the scheduler may therefore see false dependencies,
    never miss a true one.
    """

    storage_id: int
    buffer: str  # "hbm" | "sbuf" | "psum"
    partitions: tuple[int, int]
    byte_range: tuple[int, int]

    def overlaps(self, other: Region) -> bool:
        return (
            self.storage_id == other.storage_id
            and self.partitions[0] < other.partitions[1]
            and other.partitions[0] < self.partitions[1]
            and self.byte_range[0] < other.byte_range[1]
            and other.byte_range[0] < self.byte_range[1]
        )


@dataclass
class InstructionRecord:
    """One executed instruction as the cost model sees it.

    Fields the cost formulas use:
    - ``partitions``: partition count of the main operand (dst for compute; SBUF side for DMA).
    - ``free_elems``: elements per partition of the main input stream (N in the documented formulas).
    - ``dtypes``: dtype names of (inputs..., dst), e.g. ("bfloat16", "bfloat16", "float32").
    - ``nbytes``: bytes moved (DMA) or written (compute).
    - ``attrs``: instruction-specific facts, e.g. nc_matmul: {"stationary_free": int, "moving_free": int,
      "fp32": bool, "is_transpose": bool, "tile_position" / "tile_size": tuple (only when set)}; dma: {"transpose":
      bool, "contiguous_bytes": int (per-descriptor run), "descriptors": int, "src": "hbm"|"sbuf", "dst": ...};
      vector ops: {"psum_input": bool, "unit_stride": bool, "op": opcode name}.
    """

    opcode: str
    engine: Engine
    partitions: int
    free_elems: int
    dtypes: tuple[str, ...]
    nbytes: int
    reads: tuple[Region, ...]
    writes: tuple[Region, ...]
    queue: int = 0
    attrs: dict[str, Any] = field(default_factory=dict)
    index: int = -1  # position in the trace, set by Trace.append
    # A later iteration of a compiled loop's body (nki_cpu.loops): executed, but not a new instruction of the program.
    repeat: bool = False
    # Where the kernel issued it: the kernel's call stack, innermost first, as (file, line, function), at most
    # SITE_DEPTH frames (``caller_site``); ``site_label`` names one, ``cost.report.site_breakdown`` groups time by it
    site: tuple[tuple[str, int, str], ...] = ()
    # The instruction as the program text holds it, independent of run-time values: per tensor operand (reads,
    # then writes) ``(storage id, dtype, shape, strides, offset)`` with the offset ``"runtime"`` for a view
    # addressed at run time, then the immediates (Python numbers) it was given. Empty for records built without
    # operands (then ``reads`` / ``writes`` stand in). ``nki_cpu.loops`` and ``Trace.fingerprint`` compare it.
    operands: tuple[Any, ...] = ()


def static_form(record: InstructionRecord) -> tuple[Any, ...]:
    """What makes two records the same instruction of a program (storage ids still raw): opcode, engine, sizes,
    dtypes, the static attrs, and the operands without their run-time addresses."""
    attrs = tuple((k, v) for k, v in record.attrs.items() if k != NO_REORDER)  # compared with ==, hashed by repr
    operands = record.operands or tuple(
        ("register",) if r.buffer == "register" else (r.storage_id, r.partitions, r.byte_range)
        for r in (*record.reads, *record.writes)
    )
    return (record.opcode, record.engine.value, record.partitions, record.free_elems, record.dtypes, attrs, operands)


@dataclass
class Trace:
    """Ordered records of one kernel launch (program order = issue order per engine)."""

    records: list[InstructionRecord] = field(default_factory=list)
    sbuf_high_water: int = 0  # bytes per partition
    psum_high_water: int = 0  # bytes per partition
    # storage id -> (buffer, bytes per partition) of every on-chip allocation of the launch
    allocations: dict[int, tuple[str, int]] = field(default_factory=dict)
    # positions where an iteration of a compiled loop starts or ends: the compiler's scheduler reorders instructions
    # only between two of them (``cost.reorder``)
    boundaries: list[int] = field(default_factory=list)
    # The static program: each instruction the program holds (its record; a compiled loop's body once, also when
    # it ran zero times) and ``("loop", construct)`` / ``("end",)`` around each compiled loop.
    program: list[InstructionRecord | tuple[str, ...]] = field(default_factory=list)

    @property
    def static_instructions(self) -> int:
        """Instructions the compiled program holds: each compiled loop's body counted once, also a body that ran
        zero times (``len(records)`` is the dynamic count, every executed instruction)."""
        if not self.program:  # a trace assembled by hand, not by a launch
            return sum(1 for record in self.records if not record.repeat)
        return sum(1 for entry in self.program if isinstance(entry, InstructionRecord))

    def fingerprint(self) -> str:
        """A hash of the static program: instructions, engines, shapes, dtypes, static attrs and offsets, which
        allocation each operand is (numbered by first use), and the compiled-loop structure — not run-time
        addresses, trip counts or data. Two launches of one compiled program give one fingerprint; a kernel whose
        Python specialised on a value gives another."""
        numbers: dict[int, int] = {}

        def renumber(item: Any) -> Any:
            if isinstance(item, tuple) and item and isinstance(item[0], int) and not isinstance(item[0], bool):
                return (numbers.setdefault(item[0], len(numbers)), *item[1:])
            return item

        canonical = []
        for entry in self.program:
            if isinstance(entry, InstructionRecord):
                form = static_form(entry)
                entry = (*form[:-1], tuple(renumber(op) for op in form[-1]))
            canonical.append(entry)
        return hashlib.sha256(repr(canonical).encode()).hexdigest()

    def lifetimes(self) -> dict[int, tuple[int, int]]:
        """First and last position of an instruction touching each on-chip allocation (``allocations``) that some
        instruction touches."""
        span: dict[int, tuple[int, int]] = {}
        for position, record in enumerate(self.records):
            for region in (*record.reads, *record.writes):
                if region.storage_id in self.allocations:
                    first, _ = span.get(region.storage_id, (position, position))
                    span[region.storage_id] = (first, position)
        return span

    def liveness_high_water(self, buffer: str) -> int:
        """Peak bytes per partition of ``buffer`` ("sbuf" or "psum") if each allocation lived only from the first
        to the last instruction touching it — what liveness-based placement needs, against ``*_high_water``'s
        Python-reference lifetime (an upper bound of it). Allocations no instruction touches count for nothing."""
        change = [0] * (len(self.records) + 1)
        for storage_id, (first, last) in self.lifetimes().items():
            if self.allocations[storage_id][0] != buffer:
                continue
            nbytes = self.allocations[storage_id][1]
            change[first] += nbytes
            change[last + 1] -= nbytes
        live = peak = 0
        for delta in change:
            live += delta
            peak = max(peak, live)
        return peak

    def append(self, record: InstructionRecord) -> None:
        record.index = len(self.records)
        self.records.append(record)
