"""The critical path of a schedule: the instructions the makespan waited on, and what each of them waited for.

Walking back from the instruction that ends last, each step goes to what set the current instruction's start: the
producer of its latest operand (it waited on *data*) or the instruction holding its track (it waited in the
*queue*: the previous instruction of its engine or DMA queue, for the tensor engine the holder of the cells it
needed or the previous PE instruction) or a compiled loop's *barrier* (the instruction that ended last before it).
Each step is charged the time from its predecessor's end to its own end, so the charges sum to the makespan: a
data step carries the dependency latency and its own duration, a queue step its own duration, a barrier step the
barrier's cost and its own duration.

A path made mostly of queue steps on one engine says that engine's program order held the makespan; one made of
data steps that the dependencies did (compare ``bounds.dependency_bound_ns``).
"""

from __future__ import annotations

from dataclasses import dataclass

from nki_cpu.cost.scheduler import Schedule

DATA = "data"
QUEUE = "queue"
BARRIER = "barrier"  # a compiled loop's drain and barrier: the step waited for every earlier instruction
START = "start"  # the first step: nothing before it on the path


@dataclass(frozen=True)
class PathStep:
    """One instruction of the critical path: its trace index, track, why it started when it did, and the time it
    is charged (ns from the previous step's end to its own end)."""

    index: int
    track: str
    cause: str
    charged_ns: float


def critical_path(placed: Schedule) -> list[PathStep]:
    """The critical path of ``placed``, first instruction first (empty for an empty schedule).

    Args:
        placed: a schedule from ``scheduler.schedule``.

    Returns:
        The steps; their ``charged_ns`` sum to ``placed.makespan_ns``.
    """
    if not placed.end_ns:
        return []
    backwards: list[tuple[int, str]] = []
    i = max(range(len(placed.end_ns)), key=placed.end_ns.__getitem__)
    while i >= 0:
        producer, holder = placed.waited_on[i], placed.queued_behind[i]
        if producer >= 0:
            backwards.append((i, BARRIER if placed.after_barrier[i] else DATA))
            i = producer
        elif holder >= 0:
            backwards.append((i, QUEUE))
            i = holder
        else:
            backwards.append((i, START))
            i = -1
    steps, previous_end = [], 0.0
    for index, cause in reversed(backwards):
        end = placed.end_ns[index]
        steps.append(PathStep(index, placed.track[index], cause, end - previous_end))
        previous_end = end
    return steps


def path_summary(steps: list[PathStep]) -> dict[tuple[str, str], tuple[int, float]]:
    """Steps and charged ns per (track, cause), largest charge first; DMA queues are merged into ``dma``."""
    totals: dict[tuple[str, str], tuple[int, float]] = {}
    for step in steps:
        key = ("dma" if step.track.startswith("dma.") else step.track, step.cause)
        count, ns = totals.get(key, (0, 0.0))
        totals[key] = (count + 1, ns + step.charged_ns)
    return dict(sorted(totals.items(), key=lambda item: -item[1][1]))
