"""One program's share of a decode launch's requests, run as a compiled loop of groups: what both decode kernels
(``gdn_step`` on a pool, ``gdn_tkg`` on its batch rows) split over the launch grid and loop over.

Program p of a grid of G runs requests p, p + G, p + 2G, … (``nl.program_id`` / ``nl.num_programs``, "NKI
Programming Model", SDK 2.33); its share runs ``group`` requests an iteration of ``nl.fori_loop`` ("NKI Loops" and
``nki.language.fori_loop``, SDK 2.33) with the request index a run-time value, so the program does not grow with the
requests. One group is issued without a loop (every index a trace-time int).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..common.backend import nl


@dataclass(frozen=True)
class ProgramShare:
    """This program's requests: ``first``, ``first + step``, … below ``requests``, ``group`` an iteration, over
    ``trips`` iterations (the last may run slots past ``requests``: their rows are past their tensors' ends)."""

    requests: int
    first: int
    step: int
    group: int
    trips: int

    @property
    def slots(self) -> int:
        """Request slots the launch addresses: every slot any iteration runs, and one spare when it loops, so that
        the program (the tails' memsets included) is the same whatever the requests."""
        return max(self.requests, self.first + (self.trips * self.group - 1) * self.step + 1) + (self.trips > 1)

    def base(self, iteration: Any) -> Any:
        """The first request of an iteration, less ``first`` (a trace-time int, or a run-time loop value)."""
        return iteration * (self.group * self.step)

    def members(self, base: Any) -> Iterator[tuple[int, Any]]:
        """The iteration's requests as (static slot offset, request index): ``base + first + j·step``, j < group;
        the index a trace-time int when ``base`` is."""
        for j in range(self.group):
            static = self.first + j * self.step
            yield static, static if isinstance(base, int) else base + static

    def run(self, iteration: Callable[[Any], None]) -> None:
        """``iteration(g)`` for every iteration: once as Python when there is one, else as a compiled loop."""
        if self.trips == 1:
            iteration(0)
        else:
            nl.fori_loop(0, self.trips, iteration)


def program_share(requests: int, per_iteration: int) -> ProgramShare | None:
    """This program's share of ``requests`` requests, ``per_iteration`` at most an iteration; None when it has none
    (fewer requests than programs: N = 1 at launch grid 2)."""
    first, step = nl.program_id(0), nl.num_programs(0)
    count = len(range(first, requests, step))
    if count == 0:
        return None
    group = min(per_iteration, count)
    return ProgramShare(requests=requests, first=first, step=step, group=group, trips=-(-count // group))
