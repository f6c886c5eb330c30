"""Serving launches for the varlen area: packed sequences in a bucket (T tokens, N slots) on rows of a state pool
(−1 = no row) with checkpoint rows, built from seeded cases, and what each sequence must give.

A kernel declaring ``bucket``, ``state_pool``, ``checkpoints`` or ``read_rows`` (``core.Capabilities``) gets the
keywords it declares and no other: without ``state_pool`` each sequence has its own row of ``recurrent_state``
([n, Hv, Dk, Dv], no ``state_indices``); without ``bucket`` no empty sequence is drawn and no ``bucket`` is passed;
without ``read_rows`` no ``read_indices``. The layout rules a valid call keeps, and a rejected one breaks, are
gdn-ref's (``gdn_ref.bucketed``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from gdn_ref.bucketed import bucket_violations
from gdn_ref.contract import Violation
from gdn_ref.packed import pool_row_violations

from .core import Capabilities
from .regimes import Case, Geometry, make_case

TOKEN_TENSORS = ("query", "key", "value", "g_log", "beta")
# The bucket every serving check runs in, in chunks and slots: room for one long sequence beside short ones and
# for empty slots, small enough that a simulated kernel runs a layout in a fraction of a second.
BUCKET_CHUNKS, BUCKET_SLOTS = 6, 4
# Pool rows: the slots' rows, checkpoint rows and rows no call names (which must keep their bytes). The last row
# is never named: a kernel that indexes the pool with −1 as a Python index reads and writes it, and it holds a
# state far from zero so that a read shows in the output of the sequence that should have started from zero.
POOL_ROWS = 16
ALIASED_ROW_SCALE = 50.0


@dataclass(frozen=True)
class Layout:
    """Sequence lengths in tokens (0: an empty sequence), their pool rows (−1: none; None: no pool) and the rows they
    start from (``read_indices``: −1 = zero; None: each starts from its own row)."""

    label: str
    lengths: tuple[int, ...]
    rows: tuple[int, ...] | None
    reads: tuple[int, ...] | None = None


@dataclass
class ServingCall:
    """A serving call (gdn_cte's keywords plus the serving ones), the cases it packs, and the pool as it was."""

    layout: Layout
    cases: list[Case | None]  # None: an empty sequence
    call: dict[str, Any]
    bounds: np.ndarray  # [n + 1] token offsets of the sequences in the packed call
    state_before: np.ndarray  # the pool (or the per-sequence states) before the call
    checkpoint_rows: np.ndarray | None = None  # [n, K] as passed
    checkpoint_every: int | None = None

    def row_of(self, i: int) -> int | None:
        """The state row sequence i writes (and reads, without read rows): its pool row, None for −1, i without a
        pool."""
        if self.layout.rows is None:
            return i
        row = self.layout.rows[i]
        return None if row < 0 else row

    def start_row_of(self, i: int) -> int | None:
        """The state row sequence i starts from: its read row (None for −1) where the layout has read rows, else
        ``row_of``."""
        if self.layout.reads is None:
            return self.row_of(i)
        row = self.layout.reads[i]
        return None if row < 0 else row

    def written_rows(self) -> set[int]:
        """Rows the call may change: each non-empty sequence's row and each stored checkpoint's row."""
        rows = {self.row_of(i) for i, n in enumerate(self.layout.lengths) if n > 0} - {None}
        for i, k, _ in self.stored_checkpoints():
            rows.add(int(self.checkpoint_rows[i, k]))
        return {int(r) for r in rows}

    def stored_checkpoints(self) -> list[tuple[int, int, int]]:
        """(sequence, checkpoint, tokens) of every checkpoint the call must store: a row >= 0 and within the
        sequence's length."""
        if self.checkpoint_rows is None:
            return []
        return [
            (i, k, (k + 1) * self.checkpoint_every)
            for i, n in enumerate(self.layout.lengths)
            for k in range(self.checkpoint_rows.shape[1])
            if self.checkpoint_rows[i, k] >= 0 and (k + 1) * self.checkpoint_every <= n
        ]


def bucket_of(chunk: int) -> tuple[int, int]:
    """The serving checks' bucket (T, N) for an algorithm's chunk."""
    return BUCKET_CHUNKS * chunk, BUCKET_SLOTS


def edge_layouts(caps: Capabilities, chunk: int, seed: int, random_draws: int = 1) -> list[Layout]:
    """The layouts every serving kernel must get right, then ``random_draws`` random ones.

    One sequence filling the bucket; N sequences of one token; fewer sequences than slots with an empty one among
    them; then random lengths (some ending inside a chunk, some empty) on random rows. With a pool, one sequence
    of each layout but the first has no row (−1). Without ``bucket`` the empty sequences are dropped (a plain
    varlen call has none); without ``state_pool`` there are no rows.
    """
    tokens, slots = bucket_of(chunk)
    rng = np.random.default_rng(seed)
    lengths = [(tokens,), (1,) * slots, (chunk + 5, 0, 45)]
    labels = ["one sequence filling the bucket", f"{slots} sequences of one token", "empty slots, an empty sequence"]
    for draw in range(random_draws):
        n = int(rng.integers(1, slots + 1))
        chunks = rng.multinomial(int(rng.integers(n, tokens // chunk + 1)), [1 / n] * n)
        lengths.append(tuple(0 if c == 0 else int(rng.integers((c - 1) * chunk + 1, c * chunk + 1)) for c in chunks))
        labels.append(f"random layout {draw}")
    layouts = []
    for index, (label, sizes) in enumerate(zip(labels, lengths, strict=True)):
        if not caps.bucket:
            sizes = tuple(n for n in sizes if n > 0)
        rows = None
        if caps.state_pool:
            drawn = [int(r) for r in rng.permutation(POOL_ROWS - 1)[: len(sizes)]]
            if index > 0:
                drawn[int(rng.integers(len(drawn)))] = -1
            rows = tuple(drawn)
        layouts.append(Layout(label, sizes, rows))
    return layouts


def serving_call(
    caps: Capabilities,
    layout: Layout,
    geometry: Geometry,
    dtype: str,
    algorithm: str,
    chunk: int,
    seed: int,
    call_args: Any,
    bucket: tuple[int, int] | None = None,
    target: Case | None = None,
    target_at: int | None = None,
) -> ServingCall:
    """The serving call of ``layout``: one case per non-empty sequence (seeds ``seed``, ``seed`` + 1, …; a
    sequence with a row to start from starts from the regime's random state, one without from zero), packed into
    one B = 1 call with ``cu_seqlens``, the pool (or per-sequence states) and, where declared, the bucket. With
    read rows (``layout.reads``, passed as ``read_indices``) the state goes into the read row, and sequences
    sharing one start from the first one's state; their own rows hold other values, which they must not read.

    Args:
        caps (Capabilities): what the kernel declares (which keywords it gets).
        layout (Layout): lengths and rows.
        geometry (Geometry): B = 1, the heads and head dims (S is each sequence's length).
        dtype, algorithm: the compute dtype and algorithm of the call.
        chunk (int): the algorithm's chunk.
        seed (int): seed of the first sequence's case.
        call_args: ``suite._support.call_args`` (case, algorithm) -> gdn_cte keywords.
        bucket: (T, N) for a kernel declaring ``bucket`` (default ``bucket_of(chunk)``).
        target, target_at: put this case at sequence ``target_at`` instead of a fresh one (batch invariance).

    Returns:
        ServingCall: the call (fresh arrays), the cases, offsets, and the state before.
    """
    cases: list[Case | None] = []
    for i, n in enumerate(layout.lengths):
        if target is not None and i == target_at:
            cases.append(target)
            continue
        start = layout.reads if layout.reads is not None else layout.rows
        starts_from_row = start is None or start[i] >= 0
        shape = replace(geometry, S=n)
        cases.append(make_case("initial_state" if starts_from_row else "random", shape, dtype, seed + i) if n else None)
    live = [c for c in cases if c is not None]
    call = call_args(live[0], algorithm)
    for name in TOKEN_TENSORS:
        call[name] = np.ascontiguousarray(np.concatenate([c.kernel[name] for c in live], axis=2))
    bounds = np.concatenate([[0], np.cumsum(layout.lengths)]).astype(np.int64)
    call["cu_seqlens"] = bounds.copy()
    state_shape = (geometry.Hv, geometry.Dk, geometry.Dv)
    rng = np.random.default_rng(seed ^ 0x9001)
    if layout.rows is None:
        states = rng.standard_normal((len(cases), *state_shape)).astype(np.float32)
    else:
        states = rng.standard_normal((POOL_ROWS, *state_shape)).astype(np.float32)
        states[-1] *= ALIASED_ROW_SCALE
        call["state_indices"] = np.asarray(layout.rows, np.int32)
        if layout.reads is not None:
            call["read_indices"] = np.asarray(layout.reads, np.int32)
    filled: set[int] = set()
    for i, c in enumerate(cases):
        row = i if layout.rows is None else (layout.rows if layout.reads is None else layout.reads)[i]
        if c is None or row < 0:
            continue
        if row in filled:  # a second sequence resuming from one row: it starts from that row's state
            cases[i] = c = starting_from(c, states[row])
        states[row] = c.kernel["recurrent_state"][0]
        filled.add(row)
    call["recurrent_state"] = states
    if caps.bucket:
        call["bucket"] = bucket or bucket_of(chunk)
    return ServingCall(layout, cases, call, bounds, states.copy())


def with_checkpoints(served: ServingCall, every: int, table: np.ndarray) -> ServingCall:
    """``served`` with ``checkpoint_every`` and ``checkpoint_indices`` = ``table`` [n, K]."""
    served.call["checkpoint_every"] = every
    served.call["checkpoint_indices"] = np.asarray(table, np.int32).copy()
    served.checkpoint_rows = np.asarray(table, np.int32).copy()
    served.checkpoint_every = every
    return served


def starting_from(case: Case, state: np.ndarray) -> Case:
    """The case with its initial state replaced by ``state`` [Hv, Dk, Dv] fp32 (the oracle's: the same values)."""
    kernel = {**case.kernel, "recurrent_state": state[None].astype(np.float32)}
    oracle = {**case.oracle, "initial_state": state[None].astype(np.float64)}
    return replace(case, kernel=kernel, oracle=oracle)


def truncated(case: Case, tokens: int) -> Case:
    """The case cut to its first ``tokens`` tokens (the same values: the oracle of a checkpoint)."""
    cut = {name: x if x is None or name in ("recurrent_state", "initial_state") else x[:, :, :tokens]
           for name, x in case.kernel.items()}  # fmt: skip
    oracle = {name: x if x is None or name == "initial_state" else x[:, :, :tokens] for name, x in case.oracle.items()}
    return replace(case, geometry=replace(case.geometry, S=tokens), kernel=cut, oracle=oracle)


def layout_violations(call: dict[str, Any], chunk: int) -> list[Violation]:
    """gdn-ref's rules broken by a serving ``call``: the bucketed layout's (a bucket-less call: every rule but the
    bucket's), then the values of the state rows its sequences start from (``read_indices`` where given; a row of
    an empty sequence, of -1 or of no sequence is never read)."""
    pool = call["recurrent_state"]
    rows = np.asarray(call.get("state_indices", np.arange(len(call["cu_seqlens"]) - 1)))
    found = bucket_violations(
        call["cu_seqlens"], np.shape(call["query"])[2], chunk, call.get("bucket"), pool.shape[0], rows,
        call.get("checkpoint_every"), call.get("checkpoint_indices"), call.get("read_indices"),
    )  # fmt: skip
    if found:
        return found
    starts = rows if call.get("read_indices") is None else np.asarray(call["read_indices"])
    read = [int(r) for r, n in zip(starts, np.diff(call["cu_seqlens"]), strict=True) if r >= 0 and n > 0]
    return pool_row_violations(pool[read], read)
