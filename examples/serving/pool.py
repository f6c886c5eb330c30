"""One state pool shared by every request and layer: rows with owners, NaN poison on every free row.

A row number names two buffers, a GDN layer's recurrent state and its conv window (the last W − 1 inputs of its
causal conv1d), owned together: the kernels read and write both at the same row numbers, so allocation, prefix-cache
checkpoints, rollback, release and poison cover both at once.

A row is owned by one request (or by a prefix-cache entry) from allocation to release; released rows are filled
with NaN, so a kernel that read one would either refuse it (gdn-nki scans the rows it reads and rejects NaN) or
carry NaN into an output, which the engine checks after every call.
"""

from __future__ import annotations

from collections.abc import Hashable

import torch


class PoolExhaustedError(RuntimeError):
    """No free rows: the scheduler keeps the request waiting."""


class PoolViolationError(AssertionError):
    """A row read or written by someone it does not belong to, or poison where state should be (a bug)."""


def check(condition: object, message: str) -> None:
    """Raise PoolViolationError unless ``condition`` holds (an explicit check, which ``python -O`` keeps)."""
    if not condition:
        raise PoolViolationError(message)


class StatePool:
    """``rows`` fp32 states [rows, Hv, K, V] and conv windows [rows, C, W − 1] (``conv``: (C, W − 1, dtype), the
    model's; (0, 0, ...) without), each row free (NaN) or owned by one hashable owner."""

    def __init__(
        self, rows: int, heads: int, dk: int, dv: int, conv: tuple[int, int, torch.dtype] = (0, 0, torch.float32)
    ) -> None:
        self.states = torch.full((rows, heads, dk, dv), float("nan"), dtype=torch.float32)
        self.conv = torch.full((rows, conv[0], conv[1]), float("nan"), dtype=conv[2])
        self.owner: list[Hashable | None] = [None] * rows
        self.high_water = 0
        self.allocations: list[tuple[int, Hashable]] = []  # (row, owner), in order: a row listed twice was reused

    @property
    def in_use(self) -> int:
        return sum(o is not None for o in self.owner)

    def allocate(self, owner: Hashable, count: int) -> list[int]:
        """``count`` free rows for ``owner``, zeroed (a fresh sequence's state), or PoolExhaustedError."""
        free = [r for r, o in enumerate(self.owner) if o is None][:count]
        if len(free) < count:
            raise PoolExhaustedError(f"{count} rows wanted, {len(free)} free")
        for r in free:
            self.owner[r] = owner
            self.states[r] = 0.0
            self.conv[r] = 0.0
            self.allocations.append((r, owner))
        self.high_water = max(self.high_water, self.in_use)
        return free

    def release(self, owner: Hashable, rows: list[int]) -> None:
        """Give ``rows`` back, poisoned with NaN."""
        self.assert_owned(rows, owner)
        for r in rows:
            self.owner[r] = None
            self.states[r] = float("nan")
            self.conv[r] = float("nan")

    def assert_owned(self, rows: list[int], owner: Hashable) -> None:
        """Fail loudly when a request would touch a row that is not its own."""
        for r in rows:
            check(self.owner[r] == owner, f"pool row {r} is owned by {self.owner[r]!r}, not by {owner!r}")

    def rows_of(self, owner: Hashable) -> list[int]:
        return [r for r, o in enumerate(self.owner) if o == owner]

    def audit(self) -> None:
        """Every free row still all NaN (nothing wrote it) and every owned row finite (no poison reached it), in
        both buffers."""
        for r, o in enumerate(self.owner):
            for what, row in (("state", self.states[r]), ("conv window", self.conv[r])):
                if o is None:
                    check(torch.isnan(row).all(), f"free pool row {r}'s {what} was written")
                else:
                    check(torch.isfinite(row).all(), f"pool row {r}'s {what} of {o!r} holds NaN/Inf")
