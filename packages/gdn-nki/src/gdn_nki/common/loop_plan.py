"""How much of a run of identical steps one compiled-loop iteration takes, or whether the run loops at all.

The compiler ends every iteration of a compiled loop (``nl.fori_loop``) with a drain and a barrier across all
engines, and the loop's entry and exit with one too ("NKI Dynamic Loops", SDK documentation sources, 03/31/2026;
nki-cpu's ``loop_barrier_ns``, 3.97 µs, and COST_MODEL.md item 6): a loop of n iterations pays n + 1 barriers, and
each drains the kernel's software pipeline. The page's remedy is more work per iteration; a run short enough for
the program to hold whole needs no loop at all.
"""

from __future__ import annotations


def loop_plan(periods: int, depth: int, room: int) -> int:
    """Steps of ``depth`` periods per iteration of the compiled loop over a run of ``periods`` periods, or 0: none.

    Dimensions:
        A step is ``depth`` periods (a unit group of the prefill's pipeline; a round of the conv decode's groups).

    Args:
        periods: the run's periods, each the same program text given its iteration value.
        depth: periods per step; a body is whole steps.
        room: the most periods of the run the program may hold (a loop body and the periods left over after
            whole iterations, or the run unrolled).

    Returns:
        0 when the run fits ``room`` (it is unrolled: no loop, no barrier); else the body that leaves the fewest
        iterations (barriers: iterations + 1) with the body plus the periods left over within ``room``, the
        smaller program among equals; 1 (the smallest program) when no body fits.

    Notes:
        A loop computes what the same periods unrolled compute (``test_nki_program.py``, ``test_conv_step.py``),
        so the plan is a schedule, not a numerical choice.
    """
    if periods <= room:
        return 0

    def held(u: int) -> int:  # periods the program holds: the body and the periods left over
        return depth * u + periods % (depth * u)

    fitting = [u for u in range(1, periods // depth + 1) if held(u) <= room]
    return min(fitting, key=lambda u: (periods // (depth * u), held(u))) if fitting else 1
