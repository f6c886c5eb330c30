"""Bucketed serving prefill (``gdn_cte_bucket`` / ``gdn_nki.prefill_bucket``): one program per bucket whatever the
layout, the pool read and written on device, prefix-cache checkpoints, batch invariance, and the layout checks."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

import gdn_nki
import nki_cpu
from gdn_nki.cte.bucket import gdn_cte_bucket
from gdn_ref.contract import ContractError
from gdn_spec.regimes import Case, Geometry
from nki_inputs import PACK, assert_matches_oracle, case, oracle

HK, HV, DK, DV = 1, 2, 32, 16
C = gdn_nki.CHUNK_BY_ALGORITHM["schur"]
BUCKET = (6 * C, 4)  # 6 chunks, 4 sequence slots
POOL_ROWS = 12
TENSORS = ("query", "key", "value", "g_log", "beta")


@dataclass
class Batch:
    """A batch of sequences (their cases), packed back to back, and the pool holding their initial states."""

    cases: list[Case | None]  # None: an empty sequence
    lengths: list[int]
    packed: dict[str, np.ndarray]
    cu: np.ndarray
    rows: np.ndarray
    pool: np.ndarray


def _sequence(length: int, seed: int, regime: str = "initial_state") -> Case:
    return case("bfloat16", Geometry(B=1, Hk=HK, Hv=HV, S=length, Dk=DK, Dv=DV), seed, regime)


def _batch(lengths: list[int], rows: list[int], seeds: list[int], pool_seed: int = 0) -> Batch:
    """Sequences of ``lengths`` (0: empty) from seeded cases, in a random pool; row -1: start from zero."""
    cases = [
        _sequence(n, s, "initial_state" if r >= 0 else "random") if n else None
        for n, s, r in zip(lengths, seeds, rows, strict=True)
    ]
    live = [c for c in cases if c is not None]
    packed = {name: np.concatenate([c.kernel[name] for c in live], axis=2) for name in TENSORS}
    pool = np.random.default_rng(pool_seed).standard_normal((POOL_ROWS, HV, DK, DV)).astype(np.float32)
    for c, r in zip(cases, rows, strict=True):
        if c is not None and r >= 0:
            pool[r] = c.kernel["recurrent_state"][0]
    cu = np.cumsum((0, *lengths)).astype(np.int32)
    return Batch(cases, list(lengths), packed, cu, np.asarray(rows, np.int32), pool)


def _run(batch: Batch, bucket: tuple[int, int] = BUCKET, **extra):
    pool = batch.pool.copy()
    out, final = gdn_nki.prefill_bucket(
        **batch.packed, cu_seqlens=batch.cu, bucket=bucket, scale=DK**-0.5, recurrent_state=pool,
        state_indices=batch.rows, **extra,
    )  # fmt: skip
    assert final is pool
    return out, pool


def _random_layout(rng: np.random.Generator, index: int) -> tuple[list[int], list[int]]:
    """Layout ``index`` of the bucket: a few fixed edge cases first, then random ones (empty slots, -1 rows)."""
    tokens, slots = BUCKET
    fixed = {0: [tokens], 1: [1] * slots, 2: [C, 0, 1], 3: [0, 2 * C + 5]}
    if index in fixed:
        lengths = fixed[index]
    else:
        n = int(rng.integers(1, slots + 1))
        chunks = rng.multinomial(int(rng.integers(n, tokens // C + 1)), [1 / n] * n)
        lengths = [0 if k == 0 else int(rng.integers((k - 1) * C + 1, k * C + 1)) for k in chunks]
    rows = [int(r) for r in rng.permutation(POOL_ROWS)[: len(lengths)]]
    if index == 1 or (index > 3 and rng.random() < 0.5):
        rows[int(rng.integers(len(rows)))] = -1
    return lengths, rows


def _check_against_oracle(batch: Batch, out: np.ndarray, pool: np.ndarray, context: str) -> None:
    """Each sequence's tokens and final state against the fp64 oracle; rows not named unchanged."""
    for i, c in enumerate(batch.cases):
        if c is None:
            continue
        state = pool[batch.rows[i] : batch.rows[i] + 1]
        if batch.rows[i] < 0:  # a zero-state case whose final state is not stored: only its output is judged
            state = oracle(c)[1].astype(np.float32)
        got = out[:, :, batch.cu[i] : batch.cu[i + 1]]
        assert_matches_oracle(c, got, state, f"{context} sequence {i}")
    named = {int(r) for r, n in zip(batch.rows, batch.lengths, strict=True) if r >= 0 and n > 0}
    others = [r for r in range(POOL_ROWS) if r not in named]
    assert pool[others].tobytes() == batch.pool[others].tobytes(), f"{context}: rows not named changed"


def test_every_layout_of_a_bucket_is_one_program_and_matches_the_oracle() -> None:
    rng = np.random.default_rng(32)
    fingerprints = set()
    for index in range(20):
        lengths, rows = _random_layout(rng, index)
        batch = _batch(lengths, rows, seeds=[100 * index + i for i in range(len(lengths))], pool_seed=index)
        out, pool = _run(batch)
        if not gdn_nki.common.backend.USING_REAL_NKI:
            fingerprints.add(nki_cpu.last_traces()[0].fingerprint())
        _check_against_oracle(batch, out, pool, f"layout {index} {lengths} rows {rows}")
    if not gdn_nki.common.backend.USING_REAL_NKI:
        assert len(fingerprints) == 1, f"{len(fingerprints)} programs for one bucket"


def test_the_program_depends_on_the_bucket() -> None:
    """The fingerprint is not blind: another bucket size is another program."""
    if gdn_nki.common.backend.USING_REAL_NKI:
        pytest.skip("fingerprints are nki-cpu's")
    batch = _batch([37, 130], [3, 5], seeds=[1, 2])
    found = set()
    for bucket in (BUCKET, (BUCKET[0] + C, BUCKET[1]), (BUCKET[0], BUCKET[1] + 1)):
        _run(batch, bucket)
        found.add(nki_cpu.last_traces()[0].fingerprint())
    assert len(found) == 3


@pytest.mark.usefixtures("loop_every_steady_run")  # 24 chunks at group 3: unrolled at the default
def test_a_compiled_loop_over_sequences_is_one_program() -> None:
    """With group 3, a bucket of 24 chunks runs each head's steady state as a compiled loop whose iterations cross
    sequence boundaries: one program for every layout, and each sequence equal to a separate prefill of it."""
    layouts = [
        ([11 * C + 3, 0, 5 * C, 4 * C - 1], [7, 2, 0, -1]),
        ([24 * C], [4]),
        ([1, 1, 21 * C - 1, 0], [1, -1, 9, 3]),
    ]
    fingerprints = set()
    for index, (lengths, rows) in enumerate(layouts):
        batch = _batch(lengths, rows, seeds=[7 * index + i for i in range(len(lengths))])
        out, pool = _run(batch, (24 * C, 4), group_size=3)
        if not gdn_nki.common.backend.USING_REAL_NKI:
            trace = nki_cpu.last_traces()[0]
            fingerprints.add(trace.fingerprint())
            assert any(entry == ("loop", "fori_loop") for entry in trace.program if isinstance(entry, tuple))
        for i, c in enumerate(batch.cases):
            if c is None:
                continue
            start = c.kernel["recurrent_state"].copy() if rows[i] >= 0 else None
            alone = gdn_nki.prefill(**{k: c.kernel[k] for k in TENSORS}, scale=DK**-0.5, recurrent_state=start,
                                    group_size=3)  # fmt: skip
            assert np.array_equal(out[:, :, batch.cu[i] : batch.cu[i + 1]], alone[0]), f"layout {index} seq {i}"
            if rows[i] >= 0:
                assert np.array_equal(pool[rows[i]], alone[1][0]), f"layout {index} seq {i}: state"
    assert len(fingerprints) <= 1


def test_a_sequence_is_bit_identical_whatever_shares_the_launch() -> None:
    """Batch invariance: one sequence's output and final state, placed in random layouts and buckets beside random
    others, never change by a bit."""
    rng = np.random.default_rng(5)
    target = _sequence(2 * C + 17, seed=999)
    results = []
    for trial in range(6):
        bucket = (BUCKET[0] + C * int(rng.integers(0, 2)), BUCKET[1] + int(rng.integers(0, 2)))
        others = [int(rng.integers(0, C + 1)) for _ in range(int(rng.integers(0, 3)))]
        position = int(rng.integers(0, len(others) + 1))
        lengths = [*others[:position], target.geometry.S, *others[position:]]
        rows = [int(r) for r in rng.permutation(POOL_ROWS)[: len(lengths)]]
        batch = _batch(lengths, rows, seeds=[50 * trial + i for i in range(len(lengths))], pool_seed=trial)
        batch.cases[position] = target
        batch.packed = {
            name: np.concatenate([c.kernel[name] for c in batch.cases if c is not None], axis=2) for name in TENSORS
        }
        batch.pool[rows[position]] = target.kernel["recurrent_state"][0]
        out, pool = _run(batch, bucket)
        results.append((out[:, :, batch.cu[position] : batch.cu[position + 1]].copy(), pool[rows[position]].copy()))
    for trial, (out, state) in enumerate(results[1:], start=1):
        assert np.array_equal(out, results[0][0]), f"trial {trial}: output changed with the batch"
        assert np.array_equal(state, results[0][1]), f"trial {trial}: final state changed with the batch"


def test_checkpoints_equal_truncated_prefills_and_resume_exactly() -> None:
    every = 2 * C
    batch = _batch([5 * C + 9, 3 * C, 40], [0, 1, 2], seeds=[11, 12, 13])
    checkpoints = np.array([[3, 4, -1], [5, 6, 7], [8, 9, 10]], np.int32)
    out, pool = _run(batch, (12 * C, 4), checkpoint_every=every, checkpoint_indices=checkpoints)
    plain_out, plain_pool = _run(batch, (12 * C, 4))
    assert np.array_equal(out, plain_out) and np.array_equal(pool[:3], plain_pool[:3])
    # sequence 0: checkpoints after 256 and 512 tokens (the third, -1, is not stored)
    seq = batch.cases[0]
    for k, row in enumerate((3, 4)):
        cut = (k + 1) * every
        truncated = _batch([cut], [0], seeds=[0])
        truncated.cases = [seq]
        truncated.packed = {name: seq.kernel[name][:, :, :cut] for name in TENSORS}
        truncated.pool[0] = seq.kernel["recurrent_state"][0]
        _, trunc_pool = _run(truncated, (12 * C, 4))
        assert np.array_equal(pool[row], trunc_pool[0]), f"checkpoint {k} differs from the truncated prefill"
    # sequence 1 (3 chunks): one checkpoint after 256 tokens; the 512 one is past its end: rows 6, 7 untouched
    assert np.array_equal(pool[6:8], batch.pool[6:8]) and np.array_equal(pool[8:11], batch.pool[8:11])
    # resuming sequence 0 from its 512-token checkpoint equals the uninterrupted prefill, bit for bit
    resume = _batch([5 * C + 9 - 2 * every], [4], seeds=[0])
    resume.packed = {name: seq.kernel[name][:, :, 2 * every :] for name in TENSORS}
    resume.pool[4] = pool[4]
    resumed_out, resumed_pool = _run(resume, (12 * C, 4))
    assert np.array_equal(resumed_out, out[:, :, 2 * every : batch.cu[1]])
    assert np.array_equal(resumed_pool[4], pool[0])


def test_a_checkpoint_at_a_sequence_end_is_its_final_state() -> None:
    """A sequence whose length is a checkpoint multiple: its last checkpoint is its final state, bit for bit, in
    both rows (the chain stores it once, a copy makes the second), with a state row or without one."""
    every = 2 * C
    batch = _batch([4 * C, 2 * C - 7, 2 * C, 3 * C], [0, 1, -1, 2], seeds=[21, 22, 23, 24])
    checkpoints = np.array([[3, 4], [5, 6], [7, 8], [9, 10]], np.int32)
    out, pool = _run(batch, (12 * C, 4), checkpoint_every=every, checkpoint_indices=checkpoints)
    plain_out, plain_pool = _run(batch, (12 * C, 4))
    assert np.array_equal(out, plain_out) and np.array_equal(pool[:3], plain_pool[:3])
    assert np.array_equal(pool[4], pool[0])  # the last checkpoint of a sequence with a state row
    zero_start = _batch([2 * C], [0], seeds=[0])  # the -1 sequence's final state, from a prefill that keeps it
    zero_start.cases = [batch.cases[2]]
    zero_start.packed = {name: batch.cases[2].kernel[name] for name in TENSORS}
    zero_start.pool[0] = 0.0
    _, zero_pool = _run(zero_start, (12 * C, 4))
    assert np.array_equal(pool[7], zero_pool[0])
    untouched = [5, 6, 8, 10, 11]  # checkpoints past their sequence's length (2C − 7 < 2C), rows no one names
    assert pool[untouched].tobytes() == batch.pool[untouched].tobytes()


def test_checkpoints_on_and_off_are_one_program() -> None:
    if gdn_nki.common.backend.USING_REAL_NKI:
        pytest.skip("fingerprints are nki-cpu's")
    batch = _batch([3 * C, 40], [0, 1], seeds=[1, 2])
    found = set()
    for table in (np.array([[3, 4], [5, 6]]), np.full((2, 2), -1)):
        _run(batch, checkpoint_every=C, checkpoint_indices=table.astype(np.int32))
        found.add(nki_cpu.last_traces()[0].fingerprint())
    assert len(found) == 1


@pytest.mark.parametrize(
    ("change", "rule"),
    [
        ({"cu_seqlens": np.array([0, 40, 30, 170])}, "bucket.cu_seqlens_order"),
        ({"state_indices": np.array([1, 0, 1])}, "bucket.rows_distinct"),  # seq 1 is empty: 0 may repeat
        ({"state_indices": np.array([1, 12, 2])}, "bucket.state_indices_range"),
        ({"bucket": (2 * C, 4)}, "bucket.holds_tokens"),
        ({"bucket": (6 * C, 2)}, "bucket.holds_sequences"),
        ({"bucket": (6 * C + 1, 4)}, "bucket.tokens"),
        ({"checkpoint_every": 100, "checkpoint_indices": np.full((3, 1), -1)}, "bucket.checkpoint_every"),
        ({"checkpoint_every": C, "checkpoint_indices": np.array([[4], [5], [1]])}, "bucket.rows_distinct"),
        ({"checkpoint_indices": np.array([[4], [5], [6]])}, "bucket.checkpoint_every"),
    ],
)
def test_a_rejected_layout_changes_nothing(change: dict, rule: str) -> None:
    batch = _batch([40, 0, 130], [1, 0, 2], seeds=[1, 2, 3])
    pool = batch.pool.copy()
    kwargs = {"cu_seqlens": batch.cu, "bucket": BUCKET, "state_indices": batch.rows, **change}
    with pytest.raises(ContractError) as err:
        gdn_nki.prefill_bucket(**batch.packed, scale=DK**-0.5, recurrent_state=pool, **kwargs)
    assert rule in {v.rule_id for v in err.value.violations}
    assert pool.tobytes() == batch.pool.tobytes()


def test_checkpoint_rows_without_a_spacing_are_refused_not_ignored() -> None:
    """``prefill_varlen(..., checkpoint_indices=)`` without ``checkpoint_every`` or a bucket used to take the
    trace-time form, which has no checkpoints, and dropped the rows silently."""
    batch = _batch([40, 130], [1, 2], seeds=[1, 2])
    pool = batch.pool.copy()
    with pytest.raises(ContractError, match="checkpoint_every") as err:
        gdn_nki.prefill_varlen(**batch.packed, cu_seqlens=batch.cu, scale=DK**-0.5, recurrent_state=pool,
                               state_indices=batch.rows, checkpoint_indices=np.array([[4], [5]], np.int32))  # fmt: skip
    assert {v.rule_id for v in err.value.violations} == {"bucket.checkpoint_every"}
    assert pool.tobytes() == batch.pool.tobytes()


def test_a_non_finite_start_row_is_rejected_and_a_row_no_sequence_reads_is_not() -> None:
    """The value checks of ``prefill_varlen``'s pool rows hold in the bucketed form: a NaN in a row a sequence
    starts from is refused naming ``recurrent_state`` and the row; one in a row of an empty sequence, a -1 slot's
    pool[-1] or a free row is never read and is no error."""
    batch = _batch([40, 0, 130], [1, 0, -1], seeds=[1, 2, 3])
    for row, refused in ((1, True), (0, False), (POOL_ROWS - 1, False), (5, False)):
        pool = batch.pool.copy()
        pool[row, 0, 0, 0] = np.nan
        before = pool.tobytes()
        call = {"cu_seqlens": batch.cu, "bucket": BUCKET, "state_indices": batch.rows, "recurrent_state": pool}
        if refused:
            with pytest.raises(ContractError, match=rf"recurrent_state.*pool row {row}") as err:
                gdn_nki.prefill_bucket(**batch.packed, scale=DK**-0.5, **call)
            assert {v.rule_id for v in err.value.violations} == {"recurrent_state.finite"}
            assert pool.tobytes() == before
        else:
            gdn_nki.prefill_bucket(**batch.packed, scale=DK**-0.5, **call)
            assert np.isnan(pool[row, 0, 0, 0])


def test_prefill_varlen_takes_a_bucket_and_the_configured_default() -> None:
    batch = _batch([37, 200], [2, 5], seeds=[3, 4])
    want_out, want_pool = _run(batch)
    pool = batch.pool.copy()
    out, _ = gdn_nki.prefill_varlen(**batch.packed, cu_seqlens=batch.cu, scale=DK**-0.5, recurrent_state=pool,
                                    state_indices=batch.rows, bucket=BUCKET)  # fmt: skip
    assert np.array_equal(out, want_out) and np.array_equal(pool, want_pool)
    gdn_nki.configure_buckets([(2 * C, 8), BUCKET, (64 * C, 16)])
    try:
        pool = batch.pool.copy()
        out, _ = gdn_nki.prefill_varlen(**batch.packed, cu_seqlens=batch.cu, scale=DK**-0.5, recurrent_state=pool,
                                        state_indices=batch.rows)  # fmt: skip
        assert np.array_equal(out, want_out) and np.array_equal(pool, want_pool)
        if not gdn_nki.common.backend.USING_REAL_NKI:
            assert nki_cpu.last_traces()[0].fingerprint() == _fingerprint_of(batch, BUCKET)
    finally:
        gdn_nki.configure_buckets([])


def _fingerprint_of(batch: Batch, bucket: tuple[int, int]) -> str:
    _run(batch, bucket)
    return nki_cpu.last_traces()[0].fingerprint()


def test_the_raw_kernel_refuses_a_pool_of_the_wrong_shape() -> None:
    batch = _batch([37], [0], seeds=[1])
    padded = {
        name: np.pad(x, [(0, 0), (0, 0), (0, C - 37)] + [(0, 0)] * (x.ndim - 3)) for name, x in batch.packed.items()
    }
    with pytest.raises(AssertionError, match="state_pool"):
        gdn_nki.common.backend.simulate(gdn_cte_bucket)(
            **padded, chunk_bounds=np.array([0, 1], np.int32), state_indices=np.array([0], np.int32),
            state_pool=np.zeros((2, HV, DK, DV + 1), np.float32), mask_pack=PACK,
        )  # fmt: skip


def test_the_torch_entry_point_takes_a_bucket_and_checkpoints() -> None:
    torch = pytest.importorskip("torch")
    from gdn_nki.host.torch_io import as_torch
    from gdn_nki.torch import chunk_gated_delta_rule

    batch = _batch([37, 0, 300], [2, 6, 5], seeds=[3, 4, 5])
    seq_first = {name: as_torch(np.ascontiguousarray(np.moveaxis(batch.packed[name], 1, 2))) for name in TENSORS}
    qkv = [seq_first[name] for name in ("query", "key", "value")]
    gates = [seq_first[name] for name in ("g_log", "beta")]
    cu = torch.from_numpy(batch.cu.astype(np.int64))
    trace_time_pool = torch.from_numpy(batch.pool.copy())
    live = torch.tensor([2, 5])
    want, _ = chunk_gated_delta_rule(*qkv, *gates, initial_state=trace_time_pool, output_final_state=True,
                                     cu_seqlens=cu[[0, 1, 3]], state_indices=live)  # fmt: skip
    pool = torch.from_numpy(batch.pool.copy())
    checkpoints = torch.tensor([[-1, -1], [-1, -1], [7, 8]], dtype=torch.int32)
    got, final = chunk_gated_delta_rule(*qkv, *gates, initial_state=pool, output_final_state=True, cu_seqlens=cu,
                                        state_indices=torch.from_numpy(batch.rows), bucket=BUCKET,
                                        checkpoint_every=C, checkpoint_indices=checkpoints)  # fmt: skip
    assert final is pool
    assert torch.equal(got, want), "the bucketed form equals the trace-time form bit for bit"
    assert torch.equal(pool[[2, 5]], trace_time_pool[[2, 5]])
    changed = [r for r in range(POOL_ROWS) if not torch.equal(pool[r], torch.from_numpy(batch.pool[r]))]
    assert changed == [2, 5, 7, 8], "the two live rows and sequence 2's checkpoints after 128 and 256 of 300 tokens"


def test_resuming_from_a_row_it_does_not_write_leaves_that_row_and_matches_the_uninterrupted_prefill() -> None:
    """``read_indices``: two sequences resume from one checkpoint row into rows of their own (a prefix-cache hit
    shared by two requests); each equals the uninterrupted prefill bit for bit and the checkpoint row is untouched.
    Layouts with read rows are one program."""
    batch = _batch([3 * C + 9], [0], seeds=[21])
    out, pool = _run(batch, checkpoint_every=C, checkpoint_indices=np.array([[5, -1, -1]], np.int32))
    seq, tail = batch.cases[0], 3 * C + 9 - C
    resume = _batch([tail, tail], [6, 7], seeds=[0, 0], pool_seed=4)
    resume.packed = {name: np.concatenate([seq.kernel[name][:, :, C:]] * 2, axis=2) for name in TENSORS}
    resume.pool[5] = pool[5]
    read = np.array([5, 5], np.int32)
    resumed_out, resumed_pool = _run(resume, read_indices=read)
    first = None if gdn_nki.common.backend.USING_REAL_NKI else nki_cpu.last_traces()[0].fingerprint()
    for i in range(2):
        assert np.array_equal(resumed_out[:, :, i * tail : (i + 1) * tail], out[:, :, C:]), f"sequence {i}: out"
        assert np.array_equal(resumed_pool[6 + i], pool[0]), f"sequence {i}: final state"
    unwritten = [r for r in range(POOL_ROWS) if r not in (6, 7)]
    assert resumed_pool[unwritten].tobytes() == resume.pool[unwritten].tobytes(), "a row not written changed"
    # Another layout of the bucket with read rows (one from zero, one from a row it does not write): same program.
    other = _batch([40, 0, C + 1], [2, 3, 9], seeds=[5, 6, 7])
    _run(other, read_indices=np.array([-1, 4, 11], np.int32))
    if first is not None:
        assert nki_cpu.last_traces()[0].fingerprint() == first


def test_a_read_row_the_launch_writes_is_rejected_and_nothing_changes() -> None:
    batch = _batch([C + 3, 20], [0, 1], seeds=[1, 2])
    cases = {
        "another sequence's state row": dict(read_indices=np.array([1, 1], np.int32)),
        "a checkpoint row": dict(
            read_indices=np.array([4, -1], np.int32),
            checkpoint_every=C,
            checkpoint_indices=np.array([[4], [-1]], np.int32),
        ),
    }
    for what, extra in cases.items():
        pool = batch.pool.copy()
        with pytest.raises(ContractError, match="read_rows_written") as error:
            gdn_nki.prefill_varlen(**batch.packed, cu_seqlens=batch.cu, bucket=BUCKET, scale=DK**-0.5,
                                   recurrent_state=pool, state_indices=batch.rows, **extra)  # fmt: skip
        assert "read_indices" in str(error.value), what
        assert pool.tobytes() == batch.pool.tobytes(), f"{what}: the pool changed"
    pool = batch.pool.copy()
    pool[9, 1, 2, 3] = np.nan  # a poisoned row a sequence would start from is refused before the launch
    with pytest.raises(ContractError, match=r"pool row 9.*recurrent_state\.finite"):
        gdn_nki.prefill_varlen(**batch.packed, cu_seqlens=batch.cu, bucket=BUCKET, scale=DK**-0.5,
                               recurrent_state=pool, state_indices=batch.rows, read_indices=np.array([9, -1]))  # fmt: skip


def test_the_torch_entry_point_traces_each_bucket_once() -> None:
    """Issue 32, item 5: over layouts of a bucket (one sequence filling it, N of one token, an empty slot and an
    empty sequence, -1 rows, checkpoints stored or not), the torch drop-in's launches have ONE trace key per bucket
    — what torch-neuronx compiles on: shapes, dtypes, non-tensor values — and nki-cpu finds one program per key."""
    torch = pytest.importorskip("torch")
    from gdn_nki.host.torch_io import as_torch
    from gdn_nki.torch import chunk_gated_delta_rule
    from gdn_nki.traces import recording_launches, trace_counts

    tokens, slots = BUCKET
    layouts = [  # (lengths, rows, checkpoint rows per sequence: K = 2 columns, -1 = none)
        ([tokens], [3], [[4, 5]]),
        ([1] * slots, [0, -1, 2, 6], [[-1, -1]] * slots),
        ([C + 5, 0, 45], [7, 1, -1], [[8, -1], [-1, -1], [-1, -1]]),
        ([2 * C, 3 * C - 1], [-1, 9], [[10, 11], [-1, 2]]),
    ]
    buckets = [BUCKET, (tokens + 2 * C, slots + 1)]
    with recording_launches() as launches:
        for bucket in buckets:
            for index, (lengths, rows, checkpoints) in enumerate(layouts):
                batch = _batch(lengths, rows, seeds=[20 * index + i for i in range(len(lengths))], pool_seed=index)
                seq_first = {name: as_torch(np.ascontiguousarray(np.moveaxis(batch.packed[name], 1, 2)))
                             for name in TENSORS}  # fmt: skip
                pool = torch.from_numpy(batch.pool.copy())
                chunk_gated_delta_rule(
                    *(seq_first[name] for name in TENSORS), initial_state=pool, output_final_state=True,
                    cu_seqlens=torch.from_numpy(batch.cu.astype(np.int64)), state_indices=torch.from_numpy(batch.rows),
                    bucket=bucket, checkpoint_every=C, checkpoint_indices=torch.tensor(checkpoints, dtype=torch.int32),
                )  # fmt: skip
    traces = trace_counts(launches)
    assert sorted(traces.values()) == [len(layouts)] * len(buckets), (
        f"{len(traces)} trace keys for {len(buckets)} buckets: {list(traces)}"
    )
    if not gdn_nki.common.backend.USING_REAL_NKI:  # launches in bucket order, len(layouts) each
        programs = [{launch.programs for launch in launches[at : at + len(layouts)]}
                    for at in range(0, len(launches), len(layouts))]  # fmt: skip
        assert [len(found) for found in programs] == [1] * len(buckets), programs
        assert len(set.union(*programs)) == len(buckets)


def test_two_state_blocks_start_each_sequence_from_its_row_or_zero_wherever_it_starts() -> None:
    """At Dv = 64 the state is two column blocks, each with its own boundary tiles; with group 3 the entries are
    read at run-time offsets inside a unit and copied at unit ends. A sequence without a row that starts where an
    earlier unit of the same tile set loaded another's initial state must start from zero, and NaN in rows no
    sequence names must reach nothing: each sequence equals a separate prefill of it, bit for bit."""
    dv = 64
    layouts = [
        ([2 * C + 5, C, 3 * C, C - 7, 2 * C], [4, -1, 6, -1, 2]),
        ([4 * C, 1, 0, 3 * C + 2], [-1, 9, 1, 3]),
    ]
    for index, (lengths, rows) in enumerate(layouts):
        cases = [
            case("bfloat16", Geometry(B=1, Hk=1, Hv=1, S=n, Dk=DK, Dv=dv), 40 * index + i,
                 "initial_state" if r >= 0 else "random") if n else None
            for i, (n, r) in enumerate(zip(lengths, rows, strict=True))
        ]  # fmt: skip
        pool = np.full((POOL_ROWS, 1, DK, dv), np.nan, np.float32)
        for c, r in zip(cases, rows, strict=True):
            if c is not None and r >= 0:
                pool[r] = c.kernel["recurrent_state"][0]
        packed = {name: np.concatenate([c.kernel[name] for c in cases if c], axis=2) for name in TENSORS}
        cu = np.cumsum((0, *lengths)).astype(np.int32)
        out, final = gdn_nki.prefill_bucket(
            **packed, cu_seqlens=cu, bucket=(12 * C, 5), scale=DK**-0.5, recurrent_state=pool,
            state_indices=np.asarray(rows, np.int32), group_size=3, check_values=False,
        )  # fmt: skip
        for i, c in enumerate(cases):
            if c is None:
                continue
            start = c.kernel["recurrent_state"].copy() if rows[i] >= 0 else None
            alone = gdn_nki.prefill(**{k: c.kernel[k] for k in TENSORS}, scale=DK**-0.5, recurrent_state=start,
                                    group_size=3)  # fmt: skip
            assert np.array_equal(out[:, :, cu[i] : cu[i + 1]], alone[0]), f"layout {index} sequence {i}: output"
            if rows[i] >= 0:
                assert np.array_equal(final[rows[i]], alone[1][0]), f"layout {index} sequence {i}: state"


def test_fp32_at_head_dim_128_and_group_16_runs_a_smaller_group_with_the_same_results() -> None:
    """The boundary tiles of two fp32 tile sets of 16 chunks at head dim 128 would not fit SBUF beside the rest:
    the bucket runs a smaller group (``lanes.bucket_group``) and its results are those of a group of 16."""
    lengths, rows = [C + 9, 2 * C], [1, -1]
    cases = [
        case("float32", Geometry(B=1, Hk=1, Hv=1, S=n, Dk=128, Dv=128), 70 + i, "initial_state" if r >= 0 else "random")
        for i, (n, r) in enumerate(zip(lengths, rows, strict=True))
    ]  # fmt: skip
    pool = np.zeros((POOL_ROWS, 1, 128, 128), np.float32)
    pool[1] = cases[0].kernel["recurrent_state"][0]
    packed = {name: np.concatenate([c.kernel[name] for c in cases], axis=2) for name in TENSORS}
    cu = np.cumsum((0, *lengths)).astype(np.int32)
    out, final = gdn_nki.prefill_bucket(**packed, cu_seqlens=cu, bucket=(16 * C, 2), recurrent_state=pool,
                                        state_indices=np.asarray(rows, np.int32), group_size=16)  # fmt: skip
    if not gdn_nki.common.backend.USING_REAL_NKI:
        assert nki_cpu.last_traces()[0].fingerprint()  # it ran: no SBUF overflow
    for i, c in enumerate(cases):
        start = c.kernel["recurrent_state"].copy() if rows[i] >= 0 else None
        alone = gdn_nki.prefill(**{k: c.kernel[k] for k in TENSORS}, recurrent_state=start, group_size=16)
        assert np.array_equal(out[:, :, cu[i] : cu[i + 1]], alone[0]), f"sequence {i}: output"
        if rows[i] >= 0:
            assert np.array_equal(final[rows[i]], alone[1][0]), f"sequence {i}: state"


def test_a_pool_of_2_to_the_24_rows_is_refused_before_anything_is_read() -> None:
    """The row tables are exact float32 sums only below 2**24: row P ("no row") would round onto a real row. A
    zero-stride view stands in for such a pool (nothing of it is read before the refusal)."""
    batch = _batch([37], [0], seeds=[1])
    row = np.zeros((1, HV, DK, DV), np.float32)
    huge = np.lib.stride_tricks.as_strided(row, shape=(1 << 24, HV, DK, DV), strides=(0, *row.strides[1:]),
                                           writeable=True)  # fmt: skip
    with pytest.raises(ContractError, match=r"16777216 rows violates \[bucket.pool_rows\]"):
        gdn_nki.prefill_bucket(**batch.packed, cu_seqlens=batch.cu, bucket=BUCKET, recurrent_state=huge,
                               state_indices=batch.rows)  # fmt: skip
    assert not row.any(), "a refused call wrote the pool"


@pytest.mark.usefixtures("loop_every_steady_run")  # 24 chunks at group 3: unrolled at the default
def test_a_compiled_loop_reads_its_tables_from_fixed_tiles_and_no_dma_copies_pool_to_pool() -> None:
    """Documented forms only (issue 40): every ``scalar_load`` reads a [1, 1] tile at a trace-time address (no page
    says a view at a run-time offset is "a 1x1 tensor"), and no DMA copies one pool row to another — a last
    checkpoint at its sequence's end is a second store from SBUF, not a copy of the pool row the end store wrote
    (no page orders two DMAs at run-time addresses)."""
    if gdn_nki.common.backend.USING_REAL_NKI:
        pytest.skip("reads nki-cpu's trace")
    batch = _batch([11 * C + 3, 0, 5 * C, 4 * C - 1], [7, 2, 0, -1], seeds=[1, 2, 3, 4])
    checkpoints = np.array([[8, -1], [-1, -1], [9, 10], [11, 3]], np.int32)  # sequence 3 ends at its second
    _run(batch, (24 * C, 4), group_size=3, checkpoint_every=2 * C, checkpoint_indices=checkpoints)
    trace = nki_cpu.last_traces()[0]
    assert any(entry == ("loop", "fori_loop") for entry in trace.program if isinstance(entry, tuple))
    loads = [r for r in trace.records if r.opcode == "scalar_load"]
    assert loads and all("runtime" not in op for r in loads for op in r.operands if isinstance(op, tuple))
    pool_to_pool = [
        r for r in trace.records
        if r.opcode == "dma_copy" and {x.storage_id for x in r.reads} & {x.storage_id for x in r.writes if x.buffer == "hbm"}
    ]  # fmt: skip
    assert not pool_to_pool
