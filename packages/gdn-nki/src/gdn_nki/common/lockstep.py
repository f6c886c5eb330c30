"""Running instruction-issuing step generators side by side, so independent work interleaves in issue order."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any


def lockstep(
    steps: list[Generator[None, None, Any]], yield_after_last: bool = True
) -> Generator[None, None, list[Any]]:
    """Advance several step generators together, one step of each in turn (step-major), yielding per round;
    returns what each returned, in the order given.

    ``yield_after_last``: also yield after the round in which the last generator finished (the prefill pipeline's
    periods count that round; the decode pipeline's dependency levels do not).
    """
    results: list[Any] = [None] * len(steps)
    active = list(enumerate(steps))
    while active:
        running = []
        for index, gen in active:
            try:
                next(gen)
            except StopIteration as done:
                results[index] = done.value
            else:
                running.append((index, gen))
        active = running
        if active or yield_after_last:
            yield
    return results
