"""gdn_conv_bucket through ``gdn_nki.conv_prefill_bucket`` against the fp64 conv oracle (``gdn_ref.conv``): packed
sequences on pool rows (−1 = an empty window), read rows, checkpoint windows at the recurrent checkpoints'
positions and rows, rows not named untouched, one program per bucket, batch invariance, and rejections."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gdn_nki
from gdn_nki.common.backend import last_program_fingerprints
from gdn_ref.contract import ContractError
from gdn_ref.conv import causal_conv1d_prefill_pool
from gdn_spec.metrics import compare, describe

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}
C, P, T_BUCKET = 32, 48, 256


def _case(seed: int, lengths: list[int], dtype: str = "float32", W: int = 4, L: int = 3):
    rng = np.random.default_rng(seed)
    cd = DTYPES[dtype]
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    x = rng.standard_normal((int(cu[-1]), C)).astype(cd)
    pool = rng.standard_normal((P, C, L)).astype(cd)
    weight = (0.5 * rng.standard_normal((C, W))).astype(np.float32)
    bias = (0.1 * rng.standard_normal(C)).astype(np.float32)
    return rng, cu, x, pool, weight, bias


def _run_and_check(cu, x, pool, weight, bias, rows, dtype, **layout) -> np.ndarray:
    before = pool.copy()
    out, got = gdn_nki.conv_prefill_bucket(x, pool, weight, bias, cu, rows, bucket=(T_BUCKET, 8), **layout)
    every = layout.get("checkpoint_every")
    ref_out, ref_pool = causal_conv1d_prefill_pool(x, weight, bias, cu, before, rows, "silu", every,
                                                   layout.get("checkpoint_indices"), layout.get("read_indices"))  # fmt: skip
    error = compare("out", out, ref_out, dtype)
    assert error.ok, describe([error])
    assert got is pool
    np.testing.assert_array_equal(pool, ref_pool.astype(pool.dtype))  # windows hold inputs: every row exact
    return out


@settings(max_examples=8, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 150), min_size=1, max_size=8).filter(lambda n: sum(n) <= T_BUCKET),
    W=st.integers(2, 5),
    extra=st.integers(0, 1),
    dtype=st.sampled_from(["float32", "bfloat16"]),
    seed=st.integers(0, 2**31 - 1),
    data=st.data(),
)
def test_prefill_matches_the_oracle(lengths, W, extra, dtype, seed, data) -> None:
    rng, cu, x, pool, weight, bias = _case(seed, lengths, dtype, W, W - 1 + extra)
    n = len(lengths)
    rows = rng.permutation(P)[:n].astype(np.int32)
    rows[data.draw(st.lists(st.integers(0, n - 1), max_size=2, unique=True))] = -1
    layout = {}
    if data.draw(st.booleans()):  # read rows: a prefix-cache hit resumes from a row it does not write
        spare = [r for r in range(P) if r not in rows]
        layout["read_indices"] = np.where(rng.random(n) < 0.5, rng.choice(spare, n), -1).astype(np.int32)
    if data.draw(st.booleans()):
        spare = [r for r in range(P) if r not in rows and r not in layout.get("read_indices", ())]
        table = np.array(spare[: 2 * n], np.int32).reshape(n, 2)
        layout.update(checkpoint_every=128, checkpoint_indices=table)
    if data.draw(st.booleans()):  # bf16 taps and bias, as the layer keeps them
        weight, bias = weight.astype(ml_dtypes.bfloat16), bias.astype(ml_dtypes.bfloat16)
    _run_and_check(cu, x, pool, weight, bias, rows, dtype, **layout)


def test_checkpoints_are_the_windows_of_the_truncated_prefill() -> None:
    """checkpoint_every = 128 (the recurrent bucket's chunk): a 300-token sequence stores after 128 and 256 tokens;
    each stored window equals the final window of the prefill cut there, and resuming from it equals the
    uninterrupted prefill."""
    _, cu, x, pool, weight, bias = _case(1, [300, 20])
    table = np.array([[10, 11, 12], [13, -1, -1]], np.int32)
    start = pool.copy()
    out, _ = gdn_nki.conv_prefill_bucket(x, pool, weight, bias, cu, np.array([0, 1], np.int32), bucket=(384, 2),
                                         checkpoint_every=128, checkpoint_indices=table)  # fmt: skip
    for k, cut in ((0, 128), (1, 256)):
        cut_pool = start.copy()
        gdn_nki.conv_prefill_bucket(x[:cut], cut_pool, weight, bias, np.array([0, cut], np.int32),
                                    np.array([0], np.int32))  # fmt: skip
        np.testing.assert_array_equal(pool[table[0, k]], cut_pool[0])
        rest, _ = gdn_nki.conv_prefill_bucket(x[cut:300], cut_pool, weight, bias, np.array([0, 300 - cut], np.int32),
                                              np.array([0], np.int32))  # fmt: skip
        np.testing.assert_array_equal(rest, out[cut:300])
        np.testing.assert_array_equal(cut_pool[0], pool[0])
    for row in (12, 13):  # past each sequence's length: untouched
        np.testing.assert_array_equal(pool[row], start[row])


def test_one_program_per_bucket_and_batch_invariance() -> None:
    """Layouts of one bucket — one sequence filling it, one-token sequences, empty slots, −1 rows — run one
    program, and a sequence's outputs and final window keep every bit wherever it sits."""
    rng, _, x_all, pool0, weight, bias = _case(2, [256])
    probe = x_all[:37]
    prints, results = set(), []
    for before in ([], [1, 1, 1], [0, 90, 5], [128, 3, 0, 0, 2]):
        lengths = [*before, 37]
        lengths += [0] * (8 - len(lengths))
        cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        x = rng.standard_normal((int(cu[-1]), C)).astype(np.float32)
        at = len(before)
        x[cu[at] : cu[at + 1]] = probe
        rows = np.arange(8, dtype=np.int32) + 8
        rows[at] = 3
        pool = pool0.copy()
        out, _ = gdn_nki.conv_prefill_bucket(x, pool, weight, bias, cu, rows, bucket=(T_BUCKET, 8))
        prints.add(last_program_fingerprints())
        results.append((out[cu[at] : cu[at + 1]].tobytes(), pool[3].tobytes()))
    assert len(prints) == 1
    assert len(set(results)) == 1


REJECTIONS = {
    "conv.width": dict(weight=np.zeros((C, 6), np.float32)),
    "conv.window": dict(weight=np.zeros((C, 5), np.float32)),
    "conv.pool_channels": dict(pool=np.zeros((P, 48, 3), np.float32)),
    "conv.weight_channels": dict(weight=np.zeros((16, 4), np.float32)),
    "bucket.state_indices_range": dict(rows=np.array([0, P], np.int32)),
    "bucket.rows_distinct": dict(rows=np.array([4, 4], np.int32)),
    "bucket.cu_seqlens_end": dict(cu=np.array([0, 5, 9], np.int32)),
    "conv.bucket": dict(bucket=(128, 1)),
    "bucket.read_rows_written": dict(read_indices=np.array([-1, 0], np.int32)),
}


@pytest.mark.parametrize("rule", sorted(REJECTIONS))
def test_rejections_name_the_rule_and_leave_the_pool(rule: str) -> None:
    _, cu, x, pool, weight, bias = _case(3, [5, 7])
    call = dict(x=x, pool=pool, weight=weight, bias=bias, cu=cu, rows=np.array([0, 1], np.int32), bucket=None,
                read_indices=None)  # fmt: skip
    call.update(REJECTIONS[rule])
    before = call["pool"].copy()
    with pytest.raises(ContractError) as raised:
        gdn_nki.conv_prefill_bucket(call["x"], call["pool"], call["weight"], call["bias"], call["cu"], call["rows"],
                                    bucket=call["bucket"], read_indices=call["read_indices"])  # fmt: skip
    assert rule in {v.rule_id for v in raised.value.violations}, str(raised.value)
    np.testing.assert_array_equal(call["pool"], before)


def test_prefill_then_decode_equals_a_longer_prefill() -> None:
    """The conv state a prefill leaves is what the decode step continues from: prefill S then 3 decode tokens
    equals prefill S + 3 (outputs and window, bit for bit in fp32)."""
    _, cu, x, pool, weight, bias = _case(4, [45])
    nxt = np.random.default_rng(5).standard_normal((3, C)).astype(np.float32)
    long_pool = pool.copy()
    whole = np.concatenate([x, nxt])
    ref, _ = gdn_nki.conv_prefill_bucket(whole, long_pool, weight, bias, np.array([0, 48], np.int32),
                                         np.array([0], np.int32))  # fmt: skip
    gdn_nki.conv_prefill_bucket(x, pool, weight, bias, cu, np.array([0], np.int32))
    for t in range(3):
        y, _ = gdn_nki.conv_decode_step(nxt[None, t : t + 1], pool, weight, bias, np.array([0], np.int32))
        np.testing.assert_array_equal(y[0, 0], ref[45 + t])
    np.testing.assert_array_equal(pool[0], long_pool[0])


def test_many_sequences_share_one_tile_set() -> None:
    """20 sequences (three groups of 8, one tile set convolving them in turn after every window is loaded), some
    empty, some of one token, some reading a row another writes after it."""
    rng, cu, x, pool, weight, bias = _case(6, [int(n) for n in np.random.default_rng(6).integers(0, 12, 20)])
    rows = rng.permutation(P)[:20].astype(np.int32)
    rows[[3, 11]] = -1
    before = pool.copy()
    out, _ = gdn_nki.conv_prefill_bucket(x, pool, weight, bias, cu, rows, bucket=(T_BUCKET, 24))
    ref_out, ref_pool = causal_conv1d_prefill_pool(x, weight, bias, cu, before, rows, "silu")
    error = compare("out", out, ref_out, "float32")
    assert error.ok, describe([error])
    np.testing.assert_array_equal(pool, ref_pool.astype(pool.dtype))


def test_qwen35_channels_in_fp32_fit_sbuf() -> None:
    """Qwen3.5's conv channels (2·16·128 + 64·128 = 12288) in fp32: the bulk pass's runs of 8 tokens held 230 KB a
    partition, past SBUF, and failed the trace; its runs are now halved to fit (Qwen3-Next's 8192 keep 8). A long
    sequence from its row, an empty window, and one shorter than the window."""
    from gdn_nki.common.tiles import FP32
    from gdn_nki.conv.prefill import RUN, bulk_run

    channels, rows = 12288, np.array([4, -1, 1], np.int32)
    assert bulk_run(FP32, 8192 // 16, 3, 4, True) == RUN and bulk_run(FP32, channels // 16, 3, 4, True) < RUN
    rng = np.random.default_rng(7)
    cu = np.array([0, 150, 220, 222], np.int32)
    x = rng.standard_normal((222, channels)).astype(np.float32)
    pool = rng.standard_normal((6, channels, 3)).astype(np.float32)
    weight = (0.5 * rng.standard_normal((channels, 4))).astype(np.float32)
    bias = (0.1 * rng.standard_normal(channels)).astype(np.float32)
    before = pool.copy()
    out, _ = gdn_nki.conv_prefill_bucket(x, pool, weight, bias, cu, rows, bucket=(256, 4))
    ref_out, ref_pool = causal_conv1d_prefill_pool(x, weight, bias, cu, before, rows, "silu")
    error = compare("out", out, ref_out, "float32")
    assert error.ok, describe([error])
    np.testing.assert_array_equal(pool, ref_pool.astype(pool.dtype))
