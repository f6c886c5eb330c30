"""Compiled (hardware) loops: the body is one program, however many times it runs.

NKI 0.7 (Neuron SDK 2.33) has two kinds of loop (NKI Loops deep dive; nki.language.fori_loop and
nki.language.dynamic_range pages, SDK 2.33): Python ``for``/``while`` and the deprecated ``affine_range`` /
``sequential_range`` / ``static_range`` are unrolled when the kernel is specialized, so every iteration is new
program text; ``fori_loop`` and ``dynamic_range`` are compiled into a hardware loop, one copy of the body that the
NeuronCore iterates. An eager interpreter runs the body once per iteration either way; this module keeps the
difference visible:

- every instruction a compiled loop's body issues after its first iteration is recorded with ``repeat=True``, so
  ``Trace.static_instructions`` counts what the compiled program holds and ``len(trace.records)`` what it runs;
- every iteration must issue the same instructions (opcode, engine, shape, dtypes) as the first: a body whose
  instructions depend on the iteration in Python could not be one program, so it is rejected rather than counted.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from nki_cpu import state
from nki_cpu.cost.record import InstructionRecord


def _shape_of(record: InstructionRecord) -> tuple[Any, ...]:
    """What makes two instructions the same instruction of a program, up to the addresses they touch."""
    return (record.opcode, record.engine.value, record.partitions, record.free_elems, record.dtypes)


def compiled_iterations(values: Iterable[Any], construct: str) -> Iterator[Any]:
    """Yield ``values`` as the iterations of one compiled loop (see the module docstring).

    Args:
        values: the iteration values, in order.
        construct: the loop's name for error messages (``"fori_loop"``, ``"dynamic_range"``).

    Raises:
        AssertionError: an iteration issued different instructions from the first.
    """
    launch = state.current()
    records = launch.trace.records
    first: list[tuple[Any, ...]] | None = None
    repeating = False
    try:
        for n, value in enumerate(values):
            if n == 1:
                launch.loop_repeats += 1
                repeating = True
            start = len(records)
            yield value
            body = [_shape_of(r) for r in records[start:]]
            if first is None:
                first = body
            elif body != first:
                raise AssertionError(_mismatch(construct, n, first, body))
    finally:
        if repeating:
            launch.loop_repeats -= 1


def _mismatch(construct: str, n: int, first: list[tuple[Any, ...]], body: list[tuple[Any, ...]]) -> str:
    at = next((j for j, (a, b) in enumerate(zip(first, body, strict=False)) if a != b), min(len(first), len(body)))
    got = body[at] if at < len(body) else "nothing"
    want = first[at] if at < len(first) else "nothing"
    return (
        f"{construct} body: iteration {n} issued {len(body)} instructions, iteration 0 issued {len(first)}; they "
        f"differ at instruction {at} ({got} vs {want}). A compiled loop's body is one program traced once, so its "
        "instructions cannot depend on the iteration: use the loop index only as an offset (ds, ap scalar_offset)"
    )
