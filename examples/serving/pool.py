"""One state pool shared by every request and layer: rows with owners, NaN poison on every free row.

A row holds two states of one GDN layer: the recurrent state (``states``, fp32) and the causal conv's window
(``windows``, the last W − 1 inputs of q|k|v, in the model's dtype); one row number names both, so the kernels
address, checkpoint and roll back both with the same indices. A row is owned by one request (or by a prefix-cache
entry) from allocation to release; released rows are filled with NaN, so a kernel that read one would either refuse
it (gdn-nki scans the rows it reads and rejects NaN) or carry NaN into an output, which the engine checks after
every call.
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
    """``rows`` fp32 states [rows, Hv, K, V] and conv windows [rows, C, L] (``windows``: (C, L, dtype)), each row
    free (NaN) or owned by one hashable owner."""

    def __init__(self, rows: int, heads: int, dk: int, dv: int, windows: tuple[int, int, torch.dtype]) -> None:
        self.states = torch.full((rows, heads, dk, dv), float("nan"), dtype=torch.float32)
        channels, length, dtype = windows
        self.windows = torch.full((rows, channels, length), float("nan"), dtype=dtype)
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
            self.windows[r] = 0.0
            self.allocations.append((r, owner))
        self.high_water = max(self.high_water, self.in_use)
        return free

    def release(self, owner: Hashable, rows: list[int]) -> None:
        """Give ``rows`` back, poisoned with NaN."""
        self.assert_owned(rows, owner)
        for r in rows:
            self.owner[r] = None
            self.states[r] = float("nan")
            self.windows[r] = float("nan")

    def assert_owned(self, rows: list[int], owner: Hashable) -> None:
        """Fail loudly when a request would touch a row that is not its own."""
        for r in rows:
            check(self.owner[r] == owner, f"pool row {r} is owned by {self.owner[r]!r}, not by {owner!r}")

    def rows_of(self, owner: Hashable) -> list[int]:
        return [r for r, o in enumerate(self.owner) if o == owner]

    def audit(self) -> None:
        """Every free row still all NaN (nothing wrote it) and every owned row finite (no poison reached it)."""
        for r, o in enumerate(self.owner):
            for kind, row in (("state", self.states[r]), ("conv window", self.windows[r])):
                if o is None:
                    check(torch.isnan(row).all(), f"free pool row {r} ({kind}) was written")
                else:
                    check(torch.isfinite(row).all(), f"pool row {r} ({kind}) of {o!r} holds NaN/Inf")

    def snapshot(self, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Both states of ``rows``, copied (NaN kept comparable)."""
        return self.states[rows].nan_to_num(7.0), self.windows[rows].float().nan_to_num(7.0)
