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
- every iteration must issue the same instructions (opcode, engine, shape, dtypes) on the same tiles as the
  first: a tile allocated before the loop at the same position, or the same-numbered allocation of the
  iteration's own. Instructions or tiles chosen by Python state that changes between iterations could not be one
  program, so they are rejected rather than counted;
- a tile allocated inside a body is one allocation reused by every iteration, so an instruction may touch it only
  in the iteration that allocated it (and, after the loop, only the last iteration's): reading a previous
  iteration's tile would read what the program overwrote. Values that cross iterations live in tiles allocated
  before the loop.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

from nki_cpu import checks, state
from nki_cpu.cost.record import InstructionRecord

_loop_ids = itertools.count(1)


class LoopFrame:
    """One running compiled loop: its id, current iteration, and the allocations of the current iteration."""

    def __init__(self) -> None:
        self.id = next(_loop_ids)
        self.iteration = 0
        self.ordinals: dict[int, int] = {}  # storage id -> its allocation number within the iteration

    def allocated(self, storage_id: int) -> None:
        self.ordinals[storage_id] = len(self.ordinals)

    def operand(self, storage_id: int) -> tuple[str, int]:
        """What an operand is, up to the iteration: the n-th tile of this iteration, or a tile from outside."""
        ordinal = self.ordinals.get(storage_id)
        return ("iteration tile", ordinal) if ordinal is not None else ("tile", storage_id)


def _instruction(record: InstructionRecord, frame: LoopFrame) -> tuple[Any, ...]:
    """What makes two instructions the same instruction of a program, up to the offsets they address."""
    operands = tuple(frame.operand(r.storage_id) for r in (*record.reads, *record.writes))
    return (record.opcode, record.engine.value, record.partitions, record.free_elems, record.dtypes, operands)


def compiled_iterations(values: Iterable[Any], construct: str) -> Iterator[Any]:
    """Yield ``values`` as the iterations of one compiled loop (see the module docstring).

    Args:
        values: the iteration values, in order.
        construct: the loop's name for error messages (``"fori_loop"``).

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
    finally:
        launch.trace.boundaries.append(len(records))
        if repeating:
            launch.loop_repeats -= 1
        launch.loops.remove(frame)
        launch.ended_loops[frame.id] = frame.iteration


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
