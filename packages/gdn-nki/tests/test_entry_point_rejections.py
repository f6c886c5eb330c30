"""Calls at the edges of the host entry points (issue 41): each is refused with a ``ContractError`` naming the
argument, its value, the rule and the fix — never a raw IndexError, a bare AssertionError or a silent wrong result
— and every buffer keeps its bytes."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import gdn_nki
from decode_inputs import step_inputs
from gdn_nki.traces import recording_launches
from gdn_spec.regimes import Geometry
from nki_inputs import case
from rejection_checks import DK, DV, TENSORS, C, assert_refused, no_buckets, packed_tensors, random_pool

pytestmark = pytest.mark.usefixtures(no_buckets.__name__)  # every test starts and ends with no bucket configured

# --- decode_step: the indices' own rules are reported before any row is read from them (issue 41, item 1) ---

STEP_ROWS = np.array([[0, 1], [2, 3], [4, 5]], np.int32)  # N = 3 requests, T = 2


@pytest.mark.parametrize(
    ("change", "rule_id", "argument", "value"),
    [
        (dict(num_accepted_tokens=np.array([1, 2], np.int32)), "num_accepted_tokens.shape", "num_accepted_tokens",
         "shape (2,)"),
        (dict(num_accepted_tokens=np.array(1, np.int32)), "num_accepted_tokens.rank", "num_accepted_tokens",
         "shape ()"),
        (dict(num_accepted_tokens=np.ones((3, 1), np.int32)), "num_accepted_tokens.rank", "num_accepted_tokens",
         "shape (3, 1)"),
        (dict(state_indices=None), "state_indices.required", "state_indices", "None"),
        (dict(state_indices=np.array(0, np.int32)), "state_indices.rank", "state_indices", "shape ()"),
    ],
    ids=["accepted_short", "accepted_0d", "accepted_N_by_1", "indices_none", "indices_0d"],
)  # fmt: skip
def test_decode_step_refuses_malformed_indices_before_reading_rows(change, rule_id, argument, value) -> None:
    x = step_inputs(41, "float32", N=3, T=2, P=8)
    call = {"state_indices": STEP_ROWS, "num_accepted_tokens": np.array([1, 2, 2], np.int32), **change}
    assert_refused(
        lambda: gdn_nki.decode_step(x.query, x.key, x.value, x.pool, **call, **x.gates(False)),
        rule_id, argument, value, [x.pool, STEP_ROWS],
    )  # fmt: skip


def test_decode_step_refuses_zero_requests() -> None:
    x = step_inputs(42, "float32", N=3, T=2, P=8)
    empty = {name: a[:0] for name, a in (("query", x.query), ("key", x.key), ("value", x.value))}
    gates = {name: a[:0] for name, a in x.gates(False).items()}
    assert_refused(
        lambda: gdn_nki.decode_step(**empty, state_pool=x.pool, state_indices=STEP_ROWS[:0], **gates),
        "query.rank", "query", "shape (0, 2, 2, 32)", [x.pool],
    )  # fmt: skip


# --- numpy integers are ints wherever an int is documented (item 4) ---


def test_configure_buckets_takes_numpy_integers() -> None:
    gdn_nki.configure_buckets([(np.int64(4 * C), np.int32(2))])
    assert gdn_nki.configured_buckets() == ((4 * C, 2),)
    assert all(type(x) is int for x in gdn_nki.configured_buckets()[0])


def test_numpy_integers_run_the_program_python_ints_run() -> None:
    """bucket, checkpoint_every, group_size and grid as numpy integers: the same launch as with ints — same trace
    key (what torch-neuronx compiles on), same bits."""
    tensors, cu = packed_tensors(190, 51), np.array([0, 140, 190], np.int32)
    rows, checkpoints = np.array([3, 1], np.int32), np.array([[4], [-1]], np.int32)
    results = []
    for ints in ((3 * C, 2, C, 2, 1), (np.int64(3 * C), np.int64(2), np.int64(C), np.int64(2), np.int64(1))):
        pool = random_pool(6, 52)
        with recording_launches() as launches:
            out, _ = gdn_nki.prefill_bucket(
                **tensors, cu_seqlens=cu, bucket=ints[:2], scale=DK**-0.5, recurrent_state=pool, state_indices=rows,
                checkpoint_every=ints[2], checkpoint_indices=checkpoints, group_size=ints[3], grid=ints[4],
            )  # fmt: skip
        results.append((out, pool, launches[0].key))
    (out_a, pool_a, key_a), (out_b, pool_b, key_b) = results
    assert key_a == key_b
    assert out_a.tobytes() == out_b.tobytes() and pool_a.tobytes() == pool_b.tobytes()


@pytest.mark.parametrize(
    ("change", "rule_id", "argument", "value"),
    [
        (dict(bucket=(True, 2)), "bucket.form", "bucket", "value (True, 2)"),
        (dict(checkpoint_every=True, checkpoint_indices=np.array([[4], [-1]], np.int32)), "bucket.checkpoint_every",
         "checkpoint_every", "value True"),
        (dict(group_size=np.True_), "group_size.range", "group_size", "value np.True_"),
    ],
    ids=["bucket", "checkpoint_every", "group_size"],
)  # fmt: skip
def test_a_bool_is_not_an_int(change, rule_id, argument, value) -> None:
    tensors, pool = packed_tensors(190, 53), random_pool(6, 54)
    call = {"bucket": (3 * C, 2), "state_indices": np.array([3, 1], np.int32), **change}
    assert_refused(
        lambda: gdn_nki.prefill_bucket(**tensors, cu_seqlens=np.array([0, 140, 190], np.int32), scale=DK**-0.5,
                                       recurrent_state=pool, **call),
        rule_id, argument, value, [pool, *tensors.values()],
    )  # fmt: skip


def test_decode_step_takes_a_numpy_grid_and_refuses_a_float_one() -> None:
    x = step_inputs(55, "float32", N=2, T=1, P=4)
    rows = np.array([1, 2], np.int32)
    out, _ = gdn_nki.decode_step(x.query, x.key, x.value, x.pool.copy(), rows, **x.gates(False), grid=np.int64(1))
    assert np.isfinite(out).all()
    assert_refused(
        lambda: gdn_nki.decode_step(x.query, x.key, x.value, x.pool, rows, **x.gates(False), grid=1.0),
        "launch.grid", "grid", "1.0", [x.pool],
    )  # fmt: skip


def test_the_raw_kernels_take_numpy_integers() -> None:
    """The kernels' trace-time rules take numpy integers (gdn-ref's ``is_integer``), so the kernels do too: a group
    size or checkpoint spacing of numpy's runs as the int would (no access-pattern type error mid-trace)."""
    from gdn_nki.common import backend

    tensors = packed_tensors(C, 56)
    want, _ = gdn_nki.simulate(**tensors, scale=DK**-0.5, mask_pack=gdn_nki.build_mask_pack(), group_size=1)
    got, _ = backend.simulate(gdn_nki.gdn_cte)(**tensors, scale=DK**-0.5, mask_pack=gdn_nki.build_mask_pack(),
                                                group_size=np.int64(1))  # fmt: skip
    assert got.tobytes() == want.tobytes()
    pool = random_pool(4, 57)
    backend.simulate(gdn_nki.gdn_cte_bucket)(
        **tensors, chunk_bounds=np.array([0, 1], np.int32), state_indices=np.array([2], np.int32), state_pool=pool,
        scale=DK**-0.5, mask_pack=gdn_nki.build_mask_pack(), checkpoint_every=np.int64(C),
        checkpoint_indices=np.array([[3]], np.int32),
    )  # fmt: skip
    assert pool[3].tobytes() == pool[2].tobytes()  # the checkpoint at the sequence's end is its final state


# --- buckets no launch can run are refused where they are named (item 2) ---

TOO_BIG = [((6 * C, 129), "bucket.max_sequences", "N=129"), ((512 * C, 4), "bucket.max_chunks", "T=65536 (512 chunks)")]


@pytest.mark.parametrize(("bucket", "rule_id", "value"), TOO_BIG, ids=["slots", "chunks"])
def test_configure_buckets_refuses_a_bucket_no_launch_can_run(bucket, rule_id, value) -> None:
    gdn_nki.configure_buckets([(4 * C, 2)])
    assert_refused(lambda: gdn_nki.configure_buckets([(2 * C, 2), bucket]), rule_id, "buckets", value, [])
    assert gdn_nki.configured_buckets() == ((4 * C, 2),), "a refused configuration changes nothing"


def test_configure_buckets_refuses_a_token_count_off_the_chunk() -> None:
    assert_refused(lambda: gdn_nki.configure_buckets([(1000, 2)]), "bucket.tokens", "buckets", "T=1000", [])


@pytest.mark.parametrize(("bucket", "rule_id", "value"), TOO_BIG, ids=["slots", "chunks"])
def test_prefill_bucket_refuses_a_bucket_no_launch_can_run(bucket, rule_id, value) -> None:
    tensors, pool = packed_tensors(190, 58), random_pool(6, 59)
    assert_refused(
        lambda: gdn_nki.prefill_varlen(**tensors, cu_seqlens=np.array([0, 140, 190], np.int32), bucket=bucket,
                                       recurrent_state=pool, state_indices=np.array([3, 1], np.int32)),
        rule_id, "bucket", value, [pool, *tensors.values()],
    )  # fmt: skip


def test_a_batch_too_large_for_one_program_names_cu_seqlens() -> None:
    """Without a bucket the batch runs in one of its own size: past the program's slots it is refused naming
    cu_seqlens (the batch), not a bucket the caller never passed."""
    tensors, pool = packed_tensors(129, 60), random_pool(130, 61)
    assert_refused(
        lambda: gdn_nki.prefill_bucket(**tensors, cu_seqlens=np.arange(130, dtype=np.int32), recurrent_state=pool,
                                       state_indices=np.arange(129, dtype=np.int32)),
        "bucket.max_sequences", "cu_seqlens", "129 sequences", [pool],
    )  # fmt: skip


def test_the_bucketed_form_refuses_neumann_by_its_name() -> None:
    c = case("float32", Geometry(B=1, Hk=2, Hv=2, S=100, Dk=DK, Dv=DV), 62)
    tensors = {name: c.kernel[name] for name in TENSORS}
    assert_refused(
        lambda: gdn_nki.prefill_bucket(**tensors, cu_seqlens=np.array([0, 60, 100]), bucket=(4 * 64, 2),
                                       algorithm="neumann"),
        "bucket.algorithm", "algorithm", "'neumann'", list(tensors.values()),
    )  # fmt: skip


# --- rows without a pool are refused by the bucketed form as by the trace-time form (item 3) ---


@pytest.mark.parametrize(
    ("rows", "argument", "value"),
    [
        (dict(state_indices=np.array([1, 0], np.int32)), "state_indices", "2 pool row(s)"),
        (dict(state_indices=np.array([-1, 0], np.int32)), "state_indices", "2 pool row(s)"),
        (dict(checkpoint_every=C, checkpoint_indices=np.array([[1], [-1]], np.int32)), "checkpoint_indices",
         "2 pool row(s)"),
        (dict(read_indices=np.array([-1, 1], np.int32)), "read_indices", "2 pool row(s)"),
    ],
    ids=["swapped", "minus_one", "checkpoints", "read_rows"],
)  # fmt: skip
def test_the_bucketed_form_refuses_rows_without_a_pool(rows, argument, value) -> None:
    """Without a pool the returned state is row i = sequence i. Rows naming a pool that does not exist put the
    states in the rows' order ([1, 0]: swapped) or drop a -1 row's, so they are refused, as the trace-time form
    refuses them (rule ``state_indices.pool``)."""
    tensors, cu = packed_tensors(190, 65), np.array([0, 140, 190], np.int32)
    for bucket in (None, (3 * C, 2)):
        assert_refused(
            lambda bucket=bucket: gdn_nki.prefill_varlen(**tensors, cu_seqlens=cu, bucket=bucket, **rows),
            f"{argument}.pool", argument, value, list(tensors.values()),
        )  # fmt: skip


# --- a bucket's T counts sequences padded to their chunk multiples: said in the error, sized by a helper (item 7) ---

THREE_PROMPTS = np.array([0, 300, 600, 1024], np.int32)  # 1024 tokens in all; 384 + 384 + 512 = 1280 padded


def test_padded_tokens_sizes_a_batch_as_a_bucket_holds_it() -> None:
    assert "padded_tokens" in gdn_nki.__all__
    assert gdn_nki.padded_tokens(lengths=[300, 300, 424]) == gdn_nki.padded_tokens(cu_seqlens=THREE_PROMPTS) == 1280
    assert gdn_nki.padded_tokens(lengths=np.array([128, 0, 1])) == 256  # an empty sequence takes nothing
    assert gdn_nki.padded_tokens(lengths=[300], algorithm="neumann") == 320
    assert gdn_nki.padded_tokens(lengths=[]) == 0


@pytest.mark.parametrize(
    ("batch", "rule_id", "argument", "value"),
    [
        ({}, "batch.form", "cu_seqlens", "neither"),
        ({"lengths": [1], "cu_seqlens": [0, 1]}, "batch.form", "cu_seqlens", "both"),
        ({"lengths": [300, -1]}, "batch.lengths", "lengths", "[300, -1]"),
        ({"lengths": [1.5]}, "batch.lengths", "lengths", "float64"),
        ({"cu_seqlens": [0, 300, 200]}, "bucket.cu_seqlens_order", "cu_seqlens", "entries 300, 200"),
        ({"lengths": [3], "algorithm": "fast"}, "algorithm.known", "algorithm", "'fast'"),
    ],
    ids=["neither", "both", "negative", "float", "decreasing", "algorithm"],
)
def test_padded_tokens_refuses_a_malformed_batch(batch, rule_id, argument, value) -> None:
    assert_refused(lambda: gdn_nki.padded_tokens(**batch), rule_id, argument, value, [])


def test_a_batch_past_the_bucket_is_refused_with_its_padded_total() -> None:
    tensors, pool = packed_tensors(1024, 67), random_pool(4, 68)
    call = dict(cu_seqlens=THREE_PROMPTS, recurrent_state=pool, state_indices=np.array([0, 1, 2], np.int32))
    error = assert_refused(lambda: gdn_nki.prefill_varlen(**tensors, **call, bucket=(1024, 4)),
                           "bucket.holds_tokens", "bucket", "T=1024 for 3 sequences of 1024 tokens in all",
                           [pool, *tensors.values()])  # fmt: skip
    assert "padded to its own chunk multiple (128): these take 1280 tokens (300 -> 384, 300 -> 384, 424 -> 512)" in (
        str(error)
    )
    gdn_nki.configure_buckets([(1024, 4)])
    error = assert_refused(lambda: gdn_nki.prefill_varlen(**tensors, **call), "bucket.none_holds", "bucket",
                           "3 sequences of 1024 tokens in all, 1280 padded", [pool, *tensors.values()])  # fmt: skip
    assert "gdn_nki.padded_tokens" in str(error)


# --- every offending sequence of a packed launch in the one error (item 8) ---


def _poisoned(total: int, seed: int) -> dict[str, np.ndarray]:
    """Packed tensors of three sequences [0, 140) [140, 150) [150, total) with bad values in the first and the last:
    a NaN in key (sequence 0, token 7) and a g_log > 0 and an Inf in value (sequence 2, tokens 160 and 170)."""
    tensors = packed_tensors(total, seed)
    tensors["key"][0, 0, 7, 3] = np.nan
    tensors["g_log"][0, 1, 160] = 0.5
    tensors["value"][0, 1, 170, 2] = np.inf
    return tensors


EXPECTED_BAD = [
    (0, "key.finite", "key", "value nan at index [0, 0, 7, 3] (sequence 0)"),
    (2, "g_log.domain", "g_log", "value 0.5 at index [0, 1, 160] (sequence 2)"),
    (2, "value.finite", "value", "value inf at index [0, 1, 170, 2] (sequence 2)"),
]


@pytest.mark.parametrize("bucket", [None, (4 * C, 4)], ids=["trace_time", "bucketed"])
def test_every_bad_sequence_is_named_in_the_one_error(bucket) -> None:
    tensors, pool = _poisoned(190, 69), random_pool(6, 70)
    pool[5, 1, 2, 3] = np.nan  # sequence 1's start row
    call = dict(cu_seqlens=np.array([0, 140, 150, 190], np.int32), recurrent_state=pool, bucket=bucket,
                state_indices=np.array([3, 5, 1], np.int32))  # fmt: skip
    error = assert_refused(lambda: gdn_nki.prefill_varlen(**tensors, **call), "recurrent_state.finite",
                           "recurrent_state", "pool row 5 (sequence 1), index [5, 1, 2, 3]",
                           [pool, *tensors.values()])  # fmt: skip
    assert error.sequences == [0, 1, 2]
    got = [(v.sequence, v.rule_id, v.argument, v.value) for v in error.violations if v.argument != "recurrent_state"]
    assert got == EXPECTED_BAD
    for _, rule_id, argument, value in EXPECTED_BAD:
        assert f"`{argument}` {value} violates [{rule_id}]" in str(error)


def test_a_server_drops_the_named_sequences_and_launches_the_rest() -> None:
    """The bucketed form with an empty slot and a -1 row: the sequence numbers are the caller's, and the batch
    without them runs as the clean sequence alone does."""
    tensors, pool = _poisoned(190, 71), random_pool(6, 72)
    cu, rows = np.array([0, 140, 140, 150, 190], np.int32), np.array([3, 4, -1, 1], np.int32)
    with pytest.raises(gdn_nki.ContractError) as info:
        gdn_nki.prefill_varlen(**tensors, cu_seqlens=cu, bucket=(4 * C, 4), recurrent_state=pool, state_indices=rows)
    assert info.value.sequences == [0, 3]
    keep = [2]  # 1 is empty; 0 and 3 dropped
    clean = {name: x[:, :, 140:150] for name, x in tensors.items()}
    out, _ = gdn_nki.prefill_varlen(**clean, cu_seqlens=np.array([0, 10], np.int32), bucket=(4 * C, 4),
                                    recurrent_state=pool, state_indices=rows[keep])  # fmt: skip
    assert np.isfinite(out).all()


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the NaN it lets through
def test_check_values_false_skips_the_scan() -> None:
    tensors, pool = _poisoned(190, 73), random_pool(6, 74)
    gdn_nki.prefill_varlen(**tensors, cu_seqlens=np.array([0, 140, 150, 190], np.int32), bucket=(4 * C, 4),
                           recurrent_state=pool, state_indices=np.array([3, 5, 1], np.int32), check_values=False)  # fmt: skip
    assert np.isnan(pool[3]).any() and np.isfinite(pool[5]).all()  # the poisoned sequences' states, and the clean one's


@pytest.mark.parametrize("fused", [False, True], ids=["precomputed_gates", "fused_gates"])
def test_decode_step_names_every_bad_request(fused: bool) -> None:
    x = step_inputs(77, "float32", N=4, T=2, P=8)
    x.query[0, 1, 1, 5] = np.nan  # request 0
    x.pool[2, 0, 1, 1] = np.inf  # request 1's row
    x.g_log[3, 0, 2], x.a[3, 0, 2] = 0.5, np.nan  # request 3 (g > 0, or a fused gate of NaN)
    rows = np.array([[0, 1], [2, 3], [-1, -1], [6, 7]], np.int32)
    bad = [(3, "a.finite"), (3, "g.domain")] if fused else [(3, "g_log.domain")]
    error = assert_refused(
        lambda: gdn_nki.decode_step(x.query, x.key, x.value, x.pool, rows, **x.gates(fused)),
        "query.finite", "query", "value nan at index [0, 1, 1, 5] (sequence 0)", [x.pool],
    )  # fmt: skip
    assert error.sequences == [0, 1, 3]
    assert [(v.sequence, v.rule_id) for v in error.violations] == [(0, "query.finite"), (1, "recurrent_state.finite"),
                                                                   *bad]  # fmt: skip
    assert "pool row 2 (sequence 1)" in str(error)


# --- a rejection names the function the caller called (item 6) ---


def _bad_beta(total: int = 190, seed: int = 78) -> dict[str, np.ndarray]:
    tensors = packed_tensors(total, seed)
    tensors["beta"] = tensors["beta"].astype(ml_dtypes.bfloat16)  # beta.dtype: a rule of gdn_cte's contract
    return tensors


ENTRY_POINT_CALLS = {  # test id -> (the function the caller called, the call)
    "prefill_varlen": ("gdn_nki.prefill_varlen", lambda: gdn_nki.prefill_varlen(
        **_bad_beta(), cu_seqlens=np.array([0, 140, 190]))),
    "prefill_varlen_bucketed": ("gdn_nki.prefill_varlen", lambda: gdn_nki.prefill_varlen(
        **_bad_beta(), cu_seqlens=np.array([0, 140, 190]), bucket=(3 * C, 2))),  # through prefill_bucket
    "prefill_bucket": ("gdn_nki.prefill_bucket", lambda: gdn_nki.prefill_bucket(
        **_bad_beta(), cu_seqlens=np.array([0, 140, 190]))),
    "simulate": ("gdn_nki.simulate", lambda: gdn_nki.simulate(**_bad_beta(C), mask_pack=gdn_nki.build_mask_pack())),
    "prefill": ("gdn_nki.prefill", lambda: gdn_nki.prefill(**_bad_beta(100))),  # through simulate
    "configure_buckets": ("gdn_nki.configure_buckets", lambda: gdn_nki.configure_buckets([(C, 0)])),
    "padded_tokens": ("gdn_nki.padded_tokens", lambda: gdn_nki.padded_tokens(lengths=[-1])),
    "decode_step": ("gdn_nki.decode_step", lambda: gdn_nki.decode_step(**_bad_step())),
}  # fmt: skip


def _bad_step() -> dict:
    x = step_inputs(79, "float32", N=2, T=1, P=4)
    return dict(query=x.query, key=x.key, value=x.value, state_pool=x.pool, state_indices=np.array([1, 1], np.int32),
                **x.gates(False))  # fmt: skip


@pytest.mark.parametrize("case", list(ENTRY_POINT_CALLS))
def test_a_rejection_names_the_function_the_caller_called(case: str) -> None:
    entry_point, call = ENTRY_POINT_CALLS[case]
    with pytest.raises(gdn_nki.ContractError) as info:
        call()
    message = str(info.value)
    assert message.startswith(f"{entry_point} rejected the call"), message
    assert info.value.entry_point == entry_point
    assert "gdn_cte" not in message and "gdn_step" not in message, message


def test_a_packed_kernel_names_itself() -> None:
    """A direct launch of a packed kernel with a bad argument stops naming that kernel, not gdn_cte, whose rules
    it checks."""
    from gdn_nki.common import backend

    tensors = _bad_beta(C)
    with pytest.raises(AssertionError, match=r"^gdn_cte_bucket rejected the call[\s\S]*`beta`"):
        backend.simulate(gdn_nki.gdn_cte_bucket)(**tensors, chunk_bounds=np.array([0, 1], np.int32),
                                                 state_indices=np.array([0], np.int32), state_pool=random_pool(1, 80),
                                                 mask_pack=gdn_nki.build_mask_pack())  # fmt: skip
