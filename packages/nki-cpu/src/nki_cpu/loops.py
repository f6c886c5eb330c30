"""Compiled (hardware) loops: the body is one program, traced once, however many times it runs.

NKI 0.7 (Neuron SDK 2.33) has two kinds of loop (NKI Loops deep dive; nki.language.fori_loop page, SDK 2.33):
Python ``for``/``while`` and the deprecated ``affine_range`` / ``sequential_range`` / ``static_range`` are
unrolled when the kernel is specialized, so every iteration is new program text; ``fori_loop`` and ``while_loop``
are compiled into a hardware loop, one copy of the body that the NeuronCore iterates. (``dynamic_range`` and bare
``while register:`` loops were removed in 0.7.0: "Migrating from NKI 0.6.0 to NKI 0.7.0".) The tracer runs the
body's Python ONCE and hands it the iteration value as a run-time scalar; "other loop state" must be carried
through SBUF/HBM (fori_loop page). An eager interpreter runs the body once per iteration, so this module checks
that doing so computes what the traced-once program would:

- every instruction a body issues after its first iteration is recorded with ``repeat=True``, so
  ``Trace.static_instructions`` counts what the compiled program holds and ``len(trace.records)`` what it runs;
- every iteration must issue the same instructions (``cost.record.static_form``: opcode, engine, shape, dtypes,
  static attributes, immediates and every offset not addressed at run time) on the same tiles as the first: a
  tile allocated before the loop at the same position, or the same-numbered allocation of the iteration's own.
  Instructions, tiles, offsets or constants chosen by Python state that changes between iterations could not be
  one program, so they are rejected rather than counted;
- a loop that runs zero times still holds its body: it is traced once as a trace-only pass (checked, entered in
  ``Trace.program``, every write and record undone);
- a tile allocated inside a body is one allocation reused by every iteration, so an instruction may touch it only
  in the iteration that allocated it (and, after the loop, only the last iteration's): reading a previous
  iteration's tile would read what the program overwrote. Values that cross iterations live in tiles allocated
  before the loop;
- the cost model sees that one allocation: the n-th allocation of every iteration gets fresh storage in the
  interpreter (fresh NaN, so a read before a write still shows), but its instructions' records name the first
  iteration's (``state.Launch.allocate``), so an iteration's first write waits for the previous iteration's last
  read of the same buffer, as on hardware ("Tensors allocated inside the loop body are allocated once and reused
  across iterations": "NKI Dynamic Loops" deep dive, SDK documentation sources, date-modified 03/31/2026).
"""

from __future__ import annotations

import contextlib
import copy
import itertools
from collections.abc import Iterable, Iterator
from typing import Any

from nki_cpu import checks, state
from nki_cpu.cost.record import InstructionRecord, static_form
from nki_cpu.tensor import live_storages

_loop_ids = itertools.count(1)


class LoopFrame:
    """One running compiled loop: its id, current iteration, and the allocations of the current iteration."""

    def __init__(self) -> None:
        self.id = next(_loop_ids)
        self.iteration = 0
        self.ordinals: dict[int, int] = {}  # storage id -> its allocation number within the iteration
        # allocation number within an iteration -> the storage id the hardware's one buffer of that allocation is
        # known by (the first iteration's; ``state.Launch.allocate``)
        self.buffers: dict[int, int] = {}

    def allocated(self, storage_id: int) -> None:
        self.ordinals[storage_id] = len(self.ordinals)

    def operand(self, storage_id: int) -> tuple[str, int]:
        """What an operand is, up to the iteration: the n-th tile of this iteration, or a tile from outside."""
        ordinal = self.ordinals.get(storage_id)
        return ("iteration tile", ordinal) if ordinal is not None else ("tile", storage_id)


def _instruction(record: InstructionRecord, frame: LoopFrame) -> tuple[Any, ...]:
    """What makes two instructions the same instruction of a program: ``static_form`` (opcode, engine, sizes,
    dtypes, static attrs, immediates, static offsets) with each operand's allocation named up to the iteration."""
    form = static_form(record)
    operands = tuple(
        (*frame.operand(op[0]), *op[1:]) if isinstance(op, tuple) and op and isinstance(op[0], int) else op
        for op in form[-1]
    )
    return (*form[:-1], operands)


def compiled_iterations(values: Iterable[Any], construct: str, trace_value: Any) -> Iterator[Any]:
    """Yield ``values`` as the iterations of one compiled loop (see the module docstring).

    Args:
        values: the iteration values, in order.
        construct: the loop's name for error messages (``"fori_loop"``).
        trace_value: the value to trace the body with when ``values`` is empty: the body is still program text,
            so it is run once as a trace-only pass — checked and entered in ``Trace.program``, its records and every
            write it made undone, run-time indices not bounds-checked.

    Raises:
        checks.NkiValidationError: an iteration issued different instructions, or touched other tiles, than the first.
    """
    launch = state.current()
    if launch.no_reorder_block is not None:
        checks.rule(
            "loop_in_no_reorder",
            f"{construct} inside nl.no_reorder(): a compiled loop is not supported in a no_reorder block "
            "(nki.language.no_reorder, v2.32.0 and latest); move the loop out of the block, or use a Python for "
            "loop, which is unrolled",
            launch.relaxed,
        )
    records = launch.trace.records
    frame = LoopFrame()
    launch.loops.append(frame)
    launch.trace.program.append(("loop", construct))
    first: list[tuple[Any, ...]] | None = None
    repeating = False
    try:
        for n, value in enumerate(values):
            frame.iteration, frame.ordinals = n, {}
            if n == 1:
                launch.loop_repeats += 1
                repeating = True
            start = len(records)
            launch.trace.boundaries.append(start)
            yield value
            body = [_instruction(r, frame) for r in records[start:]]
            if first is None:
                first = body
            elif body != first:
                checks.fail(_mismatch(construct, n, first, body))
        if first is None:
            with _undone(launch):
                yield trace_value
    finally:
        launch.trace.boundaries.append(len(records))
        launch.trace.program.append(("end",))
        if repeating:
            launch.loop_repeats -= 1
        launch.loops.remove(frame)
        launch.ended_loops[frame.id] = frame.iteration


@contextlib.contextmanager
def _undone(launch: state.Launch) -> Iterator[None]:
    """Run a block as a trace-only pass: afterwards every allocation's bytes, the engines' accumulators, the matmul
    groups and the trace's records are as before (``Trace.program`` keeps the block's instructions)."""
    saved = [(s, s._raw.copy(), None if s.matmul_written is None else s.matmul_written.copy()) for s in live_storages()]
    accumulators = {k: v.copy() for k, v in launch.accumulators.items()}
    accumulation = copy.deepcopy(launch.accumulation)
    length = len(launch.trace.records)
    launch.dry_run = True
    try:
        yield
    finally:
        launch.dry_run = False
        del launch.trace.records[length:]
        for storage, raw, flags in saved:
            storage._raw[...] = raw
            storage.matmul_written = flags
        launch.accumulators = accumulators
        launch.accumulation = accumulation


def _mismatch(construct: str, n: int, first: list[tuple[Any, ...]], body: list[tuple[Any, ...]]) -> str:
    at = next((j for j, (a, b) in enumerate(zip(first, body, strict=False)) if a != b), min(len(first), len(body)))
    got = body[at] if at < len(body) else "nothing"
    want = first[at] if at < len(first) else "nothing"
    return (
        f"{construct} body: iteration {n} issued {len(body)} instructions, iteration 0 issued {len(first)}; they "
        f"differ at instruction {at} ({got} vs {want}). A compiled loop's body is one program traced once, so its "
        "instructions and tiles cannot depend on the iteration: use the iteration value only as an offset (nl.ds, "
        ".ap(scalar_offset=)) and allocate tiles that cross iterations before the loop"
    )
