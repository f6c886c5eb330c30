"""Edge cases of the bucketed prefill's boundary handling (``gdn_cte_bucket``: per-chunk boundary tiles, entry
states read at a run-time offset, skipped loads, the last link's copies): layouts ``test_nki_bucket.py`` does not
reach. Every sequence must equal a prefill of it alone bit for bit (``gdn_nki.prefill`` from the row it reads, or
from zero) and lie within gdn-spec's bounds of the fp64 oracle; every checkpoint must equal the final state of a
prefill truncated there; every row the launch does not write must keep its bytes (NaN and Inf included)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

import gdn_nki
from gdn_ref.recurrent import recurrent
from gdn_spec.metrics import compare, describe
from gdn_spec.regimes import Case, Geometry
from nki_inputs import TENSOR_ARGS, case

C = gdn_nki.CHUNK_BY_ALGORITHM["schur"]
DK = 32


@dataclass
class Launch:
    """A bucketed launch's inputs, what it gave, and the pool before it."""

    cases: list[Case | None]  # None: an empty sequence
    cu: np.ndarray
    rows: list[int]  # state rows (-1: none)
    reads: list[int]  # rows each sequence starts from (-1: zero)
    pool_before: np.ndarray
    out: np.ndarray
    pool: np.ndarray
    group_size: int
    every: int | None = None
    checkpoints: list[list[int]] = field(default_factory=list)


def _launch(
    lengths: list[int],
    rows: list[int],
    bucket: tuple[int, int],
    *,
    dv: int = 16,
    value_heads: int = 2,
    dk: int = DK,
    dtype: str = "bfloat16",
    group_size: int = 8,
    read: list[int] | None = None,
    every: int | None = None,
    checkpoints: list[list[int]] | None = None,
    grid: int | None = None,
    pool_rows: int = 16,
    poison: float = np.nan,
    start_scale: float = 1.0,
    with_pool: bool = True,
    through_torch: bool = False,
    seed: int = 0,
) -> Launch:
    """One ``prefill_bucket`` launch of seeded sequences (0: an empty one) on a pool whose rows no sequence
    reads hold ``poison``; the rows read hold random states times ``start_scale``. ``through_torch``: the same
    launch through ``gdn_nki.torch.chunk_gated_delta_rule`` (seq-first CPU torch tensors, the pool in place)."""
    geometry = {"Hk": 1, "Hv": value_heads, "Dk": dk, "Dv": dv}
    cases = [case(dtype, Geometry(B=1, S=n, **geometry), seed + i) if n else None for i, n in enumerate(lengths)]
    reads = list(rows if read is None else read) if with_pool else [-1] * len(lengths)
    rng = np.random.default_rng(seed)
    pool = np.full((pool_rows, value_heads, dk, dv), poison, np.float32)
    for r in sorted({r for r, n in zip(reads, lengths, strict=True) if r >= 0 and n}):
        pool[r] = start_scale * rng.standard_normal((value_heads, dk, dv))
    packed = {name: np.concatenate([c.kernel[name] for c in cases if c], axis=2) for name in TENSOR_ARGS}
    cu = np.cumsum((0, *lengths)).astype(np.int32)
    extra = {} if read is None else {"read_indices": np.asarray(read, np.int32)}
    if every is not None:
        extra.update(checkpoint_every=every, checkpoint_indices=np.asarray(checkpoints, np.int32))
    if with_pool:
        extra["recurrent_state"] = pool.copy()
    if through_torch:
        out, final = _through_torch(packed, cu, bucket, rows, group_size, extra)
    else:
        out, final = gdn_nki.prefill_bucket(
            **packed, cu_seqlens=cu, bucket=bucket, scale=dk**-0.5, state_indices=np.asarray(rows, np.int32),
            group_size=group_size, grid=grid, check_values=False, **extra,
        )  # fmt: skip
    before = pool if with_pool else np.zeros_like(final)
    return Launch(cases, cu, list(rows), reads, before, out, final, group_size, every, checkpoints or [])


def _through_torch(
    packed: dict[str, np.ndarray],
    cu: np.ndarray,
    bucket: tuple[int, int],
    rows: list[int],
    group_size: int,
    extra: dict,
) -> tuple[np.ndarray, np.ndarray]:
    """``_launch``'s call through the torch drop-in; its output head-major, the pool as numpy."""
    torch = pytest.importorskip("torch")
    from gdn_nki.torch import chunk_gated_delta_rule
    from gdn_nki.torch_io import as_numpy, as_torch

    seq_first = [as_torch(np.ascontiguousarray(np.moveaxis(packed[name], 1, 2))) for name in TENSOR_ARGS]
    pool = torch.from_numpy(extra.pop("recurrent_state"))
    indices = {name: torch.from_numpy(x) for name, x in extra.items() if isinstance(x, np.ndarray)}
    out, final = chunk_gated_delta_rule(
        *seq_first, initial_state=pool, output_final_state=True, cu_seqlens=torch.from_numpy(cu.astype(np.int64)),
        state_indices=torch.tensor(rows, dtype=torch.int32), bucket=bucket, group_size=group_size,
        checkpoint_every=extra.get("checkpoint_every"), **indices,
    )  # fmt: skip
    assert final is pool
    return np.moveaxis(as_numpy(out), 1, 2), pool.numpy()


def _prefill(
    c: Case, start: np.ndarray | None, group_size: int, tokens: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The sequence alone (its first ``tokens``), from ``start`` (copied: ``prefill`` writes its state)."""
    cut = slice(None, tokens)
    return gdn_nki.prefill(
        **{name: c.kernel[name][:, :, cut] for name in TENSOR_ARGS}, scale=c.scale,
        recurrent_state=None if start is None else start.copy(), group_size=group_size,
    )  # fmt: skip


def _mismatches(run: Launch) -> list[str]:
    """What differs from each sequence's own prefill and the oracle, and rows changed that the launch does not
    write."""
    found, written = [], set()
    for i, c in enumerate(run.cases):
        if c is None:
            continue
        start = run.pool_before[run.reads[i] : run.reads[i] + 1] if run.reads[i] >= 0 else None
        out = run.out[:, :, run.cu[i] : run.cu[i + 1]]
        want_out, want_state = _prefill(c, start, run.group_size)
        if not np.array_equal(out, want_out):
            found.append(f"sequence {i}: output differs from its prefill")
        state = want_state
        if run.rows[i] >= 0:
            written.add(run.rows[i])
            state = run.pool[run.rows[i] : run.rows[i] + 1]
            if not np.array_equal(state, want_state):
                found.append(f"sequence {i}: state row {run.rows[i]} differs from its prefill")
        initial = None if start is None else start.astype(np.float64)
        ref = recurrent(**{k: c.oracle[k] for k in TENSOR_ARGS}, initial_state=initial, scale=c.scale)
        errors = [compare("out", out, ref[0], c.dtype), compare("state", state, ref[1], c.dtype)]
        if not all(e.ok for e in errors):
            found.append(f"sequence {i}: {describe(errors)}")
        for k, row in enumerate(run.checkpoints[i] if run.checkpoints else []):
            cut = (k + 1) * run.every
            if row < 0 or cut > c.geometry.S:
                continue
            written.add(row)
            truncated = want_state if cut == c.geometry.S else _prefill(c, start, run.group_size, cut)[1]
            if not np.array_equal(run.pool[row : row + 1], truncated):
                found.append(f"sequence {i}: checkpoint {k} (row {row}) differs from the prefill of {cut} tokens")
    others = [r for r in range(run.pool.shape[0]) if r not in written]
    changed = [r for r in others if run.pool[r].tobytes() != run.pool_before[r].tobytes()]
    if changed:
        found.append(f"rows the launch does not write changed: {changed}")
    return found


def _assert_exact(run: Launch, context: str = "") -> None:
    found = _mismatches(run)
    assert not found, f"{context}: " + "; ".join(found)


def test_a_last_checkpoint_at_a_sequence_end_is_its_final_state_when_it_starts_from_a_read_row() -> None:
    """With ``read_indices``, a sequence whose last checkpoint is its end (before the bucket's last chunk) must get
    its final state in the checkpoint row, not the row it started from (a prefix-cache hit that extends the cache:
    vLLM's align mode) — nor nothing, when it starts from zero (read row -1)."""
    run = _launch(
        [2 * C, C, C + 5], [0, 1, 2], (5 * C, 3), read=[6, -1, 7], every=C,
        checkpoints=[[3, 4], [5, -1], [-1, -1]],
    )  # fmt: skip
    _assert_exact(run, "read rows, last checkpoints at sequence ends")


def test_a_last_checkpoint_at_a_sequence_end_is_stored_without_a_pool() -> None:
    """``prefill_bucket`` without a pool starts every sequence from zero (read rows -1); a checkpoint at a
    sequence's end before the bucket's last chunk still holds its final state."""
    run = _launch([C, C], [0, -1], (3 * C, 2), every=C, checkpoints=[[1], [-1]], with_pool=False)
    _assert_exact(run, "no pool")
