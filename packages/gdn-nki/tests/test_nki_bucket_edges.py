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
import nki_cpu
from gdn_nki.cte import lanes
from gdn_ref.contract import ContractError
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
    from gdn_nki.host.torch_io import as_numpy, as_torch
    from gdn_nki.torch import chunk_gated_delta_rule

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


def test_a_last_checkpoint_at_a_sequence_end_is_stored_when_no_row_is_read() -> None:
    """Every sequence starts from zero (read rows -1: the launch a pool-less call made before row arguments without
    a pool were refused, issue 41); a checkpoint at a sequence's end before the bucket's last chunk still holds its
    final state."""
    run = _launch([C, C], [0, -1], (3 * C, 2), read=[-1, -1], every=C, checkpoints=[[1], [-1]])
    _assert_exact(run, "no row read")


@pytest.mark.parametrize(
    ("lengths", "bucket", "checkpoints"),
    [
        # every slot used, the last one ending at its last checkpoint before the bucket's last chunk: its copy comes
        # after the chain (``lane_done``), as every other slot's
        ([C, 40, C + 9, C], (6 * C, 4), [[4, -1], [-1, -1], [5, 6], [7, -1]]),
        # a sequence after another ending exactly at the bucket's last chunk at its last checkpoint, an empty slot
        # after it: its copy is the last link's second store, whatever its slot
        ([C + 5, 4 * C, 0], (6 * C, 3), [[4, 5, -1, -1], [6, -1, 8, 9], [-1] * 4]),
    ],
    ids=["the-last-slot", "the-last-chunk-before-an-empty-slot"],
)
def test_a_last_checkpoint_at_a_sequence_end_wherever_the_tables_put_it(
    lengths: list[int], bucket: tuple[int, int], checkpoints: list[list[int]]
) -> None:
    """A last checkpoint at its sequence's end is stored by one of two paths, chosen per slot on device: copied
    from the state row once the chain is done, or, at the bucket's last chunk, stored a second time by the last
    link; each must find its sequence in any slot (checkpoints every chunk, others inside and past the sequences)."""
    rows = list(range(len(lengths)))
    _assert_exact(_launch(lengths, rows, bucket, dv=64, every=C, checkpoints=checkpoints), f"lengths {lengths}")


@pytest.mark.parametrize(
    ("lengths", "rows", "slots", "extra"),
    [
        ([C], [0], 1, {"every": C, "checkpoints": [[1]], "dv": 64}),  # its one chunk is first, last and a checkpoint
        ([5], [-1], 1, {"every": C, "checkpoints": [[1]]}),  # a checkpoint past the sequence: not stored
        ([0, 7, 0], [0, 1, 2], 3, {}),  # empty slots around the one sequence
        ([C], [-1], 1, {"every": C, "checkpoints": [[3]], "dv": 64}),  # no state row: the checkpoint is the store
    ],
)
def test_a_bucket_of_one_chunk(lengths: list[int], rows: list[int], slots: int, extra: dict) -> None:
    """One chunk: the lane's first link is its last (no entry offset, no next chunk), with two column blocks or
    one, and the last checkpoint stored by the last link."""
    _assert_exact(_launch(lengths, rows, (C, slots), **extra), f"{lengths} rows {rows}")


def test_the_most_sequence_slots_a_bucket_has() -> None:
    """N = 128, one slot per partition of the tables: sequences in the first, a middle and the last slot, every
    other slot empty (some naming rows, which must stay untouched), Inf in every row no sequence reads."""
    slots = gdn_nki.cte.bucket.MAX_SEQUENCES
    lengths, rows = [0] * slots, [-1] * slots
    for slot, n, row in ((0, C - 3, 5), (63, 2 * C, -1), (slots - 1, C, 9)):
        lengths[slot], rows[slot] = n, row
    rows[1], rows[100] = 2, 3  # empty sequences with rows: not read, not written
    checkpoints = [[-1]] * slots
    checkpoints[slots - 1] = [11]  # the last slot's last checkpoint is its end, at the bucket's last chunk
    checkpoints[63] = [12]
    run = _launch(lengths, rows, (4 * C, slots), every=C, checkpoints=checkpoints, poison=np.inf, dv=64)
    _assert_exact(run, "N = 128")


@pytest.mark.parametrize(("group_size", "n_chunks"), [(1, 6), (2, 7), (3, 16), (3, 60), (8, 41), (16, 35)])
def test_sequences_starting_at_unit_boundaries_and_one_chunk_after(
    monkeypatch: pytest.MonkeyPatch, group_size: int, n_chunks: int
) -> None:
    """Sequences start exactly at unit boundaries (the previous unit's last link copies the entry into the next
    unit's entry tile) and one chunk after them (the entry read at its offset inside a unit), from a row, from zero
    and from a read row, with two column blocks; a group of 1 puts an empty sequence between them. With groups 3
    and 8 the bucket has five whole units, so those boundaries fall inside a compiled loop's iterations (chunk
    indices at run time, the entry copied into the loop's state ring: one group per iteration, as the default would
    unroll so short a run whole); at group 3 and 60 chunks the run is long enough for the default's body of several
    groups (``common.loop_plan``). Checkpoints every chunk, stored after each
    sequence's first and last chunk and on either side of the unit boundaries; the last sequence ends at the
    bucket's last chunk."""
    g = group_size
    if n_chunks < 60:
        monkeypatch.setattr(lanes, "STEADY_GROUPS", 1)
    chunks = [g, 1, g - 1, 1, n_chunks - 2 * g - 1]  # starts at chunks g, g + 1, 2g, 2g + 1
    lengths = [k * C - (7 if i % 2 else 0) if k else 0 for i, k in enumerate(chunks)]
    rows, read = [0, -1, 1, 2, 3], [0, -1, 1, 4, -1]
    first, next_row, checkpoints = 0, 5, []
    for n in chunks:
        near_unit_end = [(first + k + 1) % g in (0, 1) and first + k <= 3 * g for k in range(n)]
        stored = [k in (0, n - 1) or near_unit_end[k] for k in range(n)]
        checkpoints.append([next_row + k if stored[k] else -1 for k in range(n)] + [-1] * (max(chunks) - n))
        first, next_row = first + n, next_row + n
    run = _launch(lengths, rows, (n_chunks * C, 5), dv=64, value_heads=1, group_size=g, read=read, every=C,
                  checkpoints=checkpoints, pool_rows=next_row)  # fmt: skip
    if g in (3, 8) and not gdn_nki.common.backend.USING_REAL_NKI:
        assert ("loop", "fori_loop") in nki_cpu.last_traces()[0].program, "no compiled loop: the layout tests less"
    _assert_exact(run, f"group {g}, lengths {lengths}")


def test_checkpoints_every_chunk_with_read_rows_a_minus_one_row_and_a_launch_grid() -> None:
    """Three value heads over a grid of two programs (an uneven split), five checkpoint columns (more than the
    table's four comparison tiles, written in turn), checkpoints every chunk: a last checkpoint at a sequence's end
    before the bucket's last chunk (copied after the chain), one at the bucket's last chunk (the last link's second
    store), one of a sequence without a state row (its only store); three sequences start from one read row."""
    lengths = [5 * C, 0, C + 5, 2 * C, C]
    rows = [0, 1, -1, -1, 2]
    read = [12, 1, 12, -1, 12]
    checkpoints = [[3, -1, -1, 4, 5], [-1] * 5, [6, 7, -1, -1, -1], [8, 9, -1, -1, -1], [10, 11, -1, -1, -1]]
    run = _launch(lengths, rows, (10 * C, 5), value_heads=3, dv=64, read=read, every=C, checkpoints=checkpoints,
                  grid=2, pool_rows=14)  # fmt: skip
    _assert_exact(run, "grid 2")


def test_fp32_at_head_dim_128_group_16_with_boundaries_at_the_smaller_groups_units() -> None:
    """fp32 at head dim 128 runs the bucket in groups of 13 where 16 is asked (``lanes.bucket_group``): sequences
    starting at chunks 13, 14 and 26, 27 (its unit boundaries and one after) and checkpoints there equal prefills
    with group 16 bit for bit."""
    lengths = [13 * C, C - 9, 12 * C, C, 3 * C - 1]
    rows, read = [0, -1, 1, 2, 3], [0, -1, 11, 11, -1]
    checkpoints = [[4] + [-1] * 11 + [5], [-1] * 13, [6] + [-1] * 10 + [7, -1], [8] + [-1] * 12,
                   [9, -1, 10] + [-1] * 10]  # fmt: skip
    run = _launch(lengths, rows, (30 * C, 5), dk=128, dv=128, value_heads=1, dtype="float32", group_size=16,
                  read=read, every=C, checkpoints=checkpoints, pool_rows=12)  # fmt: skip
    _assert_exact(run, "fp32, head dim 128, group 16")


def test_the_torch_entry_point_gives_the_same_edges() -> None:
    """``gdn_nki.torch.chunk_gated_delta_rule(..., bucket=)`` on the layouts above: two column blocks, an empty
    slot between sequences, a -1 state row, a read row shared by two sequences, a last checkpoint at a sequence's
    end before the bucket's last chunk and one at its last chunk, NaN in every row no sequence reads."""
    lengths, rows, read = [2 * C, 0, C + 5, C], [0, 1, -1, 2], [5, 1, 5, -1]
    checkpoints = [[3, 4], [-1, -1], [6, -1], [7, -1]]
    run = _launch(lengths, rows, (6 * C, 5), dv=64, read=read, every=C, checkpoints=checkpoints, group_size=3,
                  pool_rows=8, through_torch=True)  # fmt: skip
    _assert_exact(run, "torch")


@pytest.mark.parametrize("grid", [4, True, "2"])
def test_prefill_bucket_checks_its_grid_as_prefill_varlen_does(grid: object) -> None:
    """``gdn_nki.prefill_bucket`` called directly: a grid that is not an LNC degree is a ``ContractError`` naming
    ``grid`` before anything is staged (it reached the launch, where nki-cpu refused it with errors of its own and
    a real SDK might run it), and the pool keeps its bytes."""
    lengths = [C + 5, 0]
    cases = [
        case("bfloat16", Geometry(B=1, Hk=1, Hv=2, S=n, Dk=DK, Dv=16), i) if n else None for i, n in enumerate(lengths)
    ]
    packed = {name: np.concatenate([c.kernel[name] for c in cases if c], axis=2) for name in TENSOR_ARGS}
    pool = np.random.default_rng(0).standard_normal((4, 2, DK, 16)).astype(np.float32)
    before = pool.tobytes()
    with pytest.raises(ContractError, match="grid") as error:
        gdn_nki.prefill_bucket(**packed, cu_seqlens=np.cumsum((0, *lengths)), bucket=(2 * C, 2), recurrent_state=pool,
                               state_indices=np.array([0, 1]), grid=grid)  # fmt: skip
    assert {v.rule_id for v in error.value.violations} == {"launch.grid"}
    assert pool.tobytes() == before
