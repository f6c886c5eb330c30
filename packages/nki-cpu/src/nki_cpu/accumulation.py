"""Matmul accumulation groups: how many are outstanding at once (at most 8 on every NeuronCore generation).

PSUM has 8 banks of 2 KiB per partition, and the architecture guides count one in-flight matmul accumulation group
per bank (docs/nki-sources.md §4.2, ARCH PSUM section). nki-cpu's reading (README, known unknown 20): a *group* is a
run of ``nc_matmul`` writes into one PSUM region where every write after the first adds onto the previous ones; it is
*outstanding* from its first to its last matmul. A region written by a single matmul is not a group. The check
fires at the matmul that makes more than ``LIMIT`` groups outstanding at one instruction of the trace.

Bookkeeping is incremental: when a group's last matmul moves from instruction ``p0`` to ``t``, only the points in
``(p0, t]`` gain coverage, and the number of intervals covering a point can only rise at an interval's start, so
checking the first new point and every other group's start in that range is exact.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

LIMIT = 8  # PSUM banks: one outstanding accumulation group per bank


@dataclass
class Group:
    """One accumulation group: its region, first and last matmul (trace indices), matmul count."""

    key: tuple[Any, ...]
    storage: Any  # weakref to the PSUM Storage (a dead storage closes the group)
    start: int
    last: int
    matmuls: int = 1
    open: bool = True


class Groups:
    """The accumulation groups of one program's trace."""

    def __init__(self) -> None:
        self.by_key: dict[tuple[Any, ...], Group] = {}
        self.groups: list[Group] = []  # groups that may still cover a point a future check looks at
        self.writes = 0

    def matmul(self, key: tuple[Any, ...], storage: Any, index: int, accumulates: bool) -> int:
        """Record one ``nc_matmul`` into the PSUM region ``key`` at trace index ``index``.

        Args:
            key: the written region (storage id, partition range, byte range).
            storage: the region's Storage object.
            index: the matmul's position in the trace.
            accumulates: True when it adds onto an earlier matmul's result in that region.

        Returns:
            The largest number of groups outstanding at one instruction among the points this matmul newly covers
            (0 when it starts a group).
        """
        self.writes += 1
        if self.writes % 64 == 0:
            self._prune()
        group = self.by_key.get(key)
        if not accumulates or group is None or not group.open:
            if group is not None:
                group.open = False
            group = Group(key, weakref.ref(storage), index, index)
            self.by_key[key] = group
            self.groups.append(group)
            return 0
        first_new = group.start if group.matmuls == 1 else group.last + 1
        group.last = index
        group.matmuls += 1
        points = [first_new] + [g.start for g in self.groups if g.matmuls > 1 and first_new < g.start <= index]
        return max(self._covering(p) for p in points)

    def _covering(self, point: int) -> int:
        return sum(1 for g in self.groups if g.matmuls > 1 and g.start <= point <= g.last)

    def _prune(self) -> None:
        """Drop groups no future check can count: closed (or dead-storage) groups ending before every open one."""
        for g in self.groups:
            if g.open and g.storage() is None:
                g.open = False
                self.by_key.pop(g.key, None)
        open_lasts = [g.last for g in self.groups if g.open]
        horizon = min(open_lasts) if open_lasts else None
        self.groups = [g for g in self.groups if g.open or (horizon is not None and g.last >= horizon)]
