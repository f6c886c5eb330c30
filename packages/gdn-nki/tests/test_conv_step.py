"""gdn_conv_step through ``gdn_nki.conv_decode_step`` against the fp64 conv oracle (``gdn_ref.conv``): outputs within
gdn-spec's tolerance table, windows bit-exact, rows not named untouched, padding, rollback, one program per (N, T),
and every rejection leaving the pool as it was."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gdn_nki
from gdn_nki.common.backend import last_program_fingerprints
from gdn_ref.contract import ContractError
from gdn_ref.conv import causal_conv1d_decode_pool
from gdn_spec.metrics import compare, describe

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}


def _inputs(seed: int, dtype: str, N: int, T: int, C: int = 32, W: int = 4, L: int = 3, P: int = 40):
    rng = np.random.default_rng(seed)
    cd = DTYPES[dtype]
    x = rng.standard_normal((N, T, C)).astype(cd)
    pool = rng.standard_normal((P, C, L)).astype(cd)
    weight = (0.5 * rng.standard_normal((C, W))).astype(np.float32)
    bias = (0.1 * rng.standard_normal(C)).astype(np.float32)
    return rng, x, pool, weight, bias


def _rows(rng: np.random.Generator, N: int, T: int, P: int, per_token: bool, padding: list[int]) -> np.ndarray:
    rows = rng.permutation(P)[: N * T].reshape(N, T).astype(np.int32)
    rows[padding] = -1
    return rows if per_token else np.ascontiguousarray(rows[:, 0])


def _check(x, pool, weight, bias, rows, accepted, activation, dtype) -> None:
    before = pool.copy()
    out, got = gdn_nki.conv_decode_step(x, pool, weight, bias, rows, accepted, activation=activation)
    ref_out, ref_pool = causal_conv1d_decode_pool(x, weight, bias, before, rows, accepted, activation)
    error = compare("out", out, ref_out, dtype)
    assert error.ok, describe([error])
    assert got is pool
    # Windows hold inputs: every row (named or not) is the oracle's bit for bit, rows not named as they were.
    np.testing.assert_array_equal(pool, ref_pool.astype(pool.dtype))
    live = np.asarray(rows).reshape(len(rows), -1)[:, 0] >= 0
    assert not np.asarray(out[~live], dtype=np.float64).any(), "a padding request's outputs are zeros"


@settings(max_examples=6, deadline=None)
@given(
    N=st.integers(1, 11),
    T=st.integers(1, 3),
    W=st.integers(2, 5),
    extra=st.integers(0, 1),
    per_token=st.booleans(),
    dtype=st.sampled_from(["float32", "bfloat16"]),
    seed=st.integers(0, 2**31 - 1),
    data=st.data(),
)
def test_conv_step_matches_the_oracle(N, T, W, extra, per_token, dtype, seed, data) -> None:
    rng, x, pool, weight, bias = _inputs(seed, dtype, N, T, W=W, L=W - 1 + extra)
    padding = data.draw(st.lists(st.integers(0, N - 1), max_size=2, unique=True))
    rows = _rows(rng, N, T, pool.shape[0], per_token, padding)
    accepted = None
    if per_token and data.draw(st.booleans()):
        accepted = np.array([data.draw(st.integers(1, T)) for _ in range(N)], np.int32)
    if data.draw(st.booleans()):  # the layer's own dtype: bf16 taps and bias (spread by bf16 0/1 matmuls, exact)
        weight, bias = weight.astype(ml_dtypes.bfloat16), bias.astype(ml_dtypes.bfloat16)
    _check(x, pool, weight, data.draw(st.sampled_from([bias, None])), rows, accepted,
           data.draw(st.sampled_from(["silu", None])), dtype)  # fmt: skip


@pytest.mark.parametrize(("N", "trips_per_iteration"), [(19, 16), (30, 16), (50, 16), (100, 1), (75, 1), (75, 2)])
def test_qwen3_next_width_and_a_compiled_loop_of_groups(N: int, trips_per_iteration: int, monkeypatch) -> None:
    """Trips of 2-4 groups of 8 (``_tile_sets``): N = 19, one trip of three groups, 5 slots past N; 30, one trip of
    four; 50, two trips of four (the last unrolled, as always), one slot group past N; with one trip a compiled-loop
    iteration (the body set small to keep the test small), 100 (seven trips of two) and 75 (five of two) run a
    compiled loop of 6 and 4 iterations before the last; 75 with two a loop of two iterations, then the last.
    Per-token rows, rollback, padding."""
    import gdn_nki.conv.step

    monkeypatch.setattr(gdn_nki.conv.step, "TRIPS_PER_ITERATION", trips_per_iteration)
    rng, x, pool, weight, bias = _inputs(3, "bfloat16", N, 2, C=64, P=2 * N + 4)
    rows = _rows(rng, N, 2, 2 * N + 4, True, [4, 17])
    accepted = rng.integers(1, 3, N).astype(np.int32)
    _check(x, pool, weight, bias, rows, accepted, "silu", "bfloat16")


@pytest.mark.parametrize(("T", "W", "dtype", "with_bias"), [(1, 4, "bfloat16", True), (3, 5, "float32", False),
                                                         (4, 4, "bfloat16", True), (4, 3, "float32", True),
                                                         (4, 4, "bfloat16", False)])  # fmt: skip
def test_sums_on_the_tensor_engine_and_products_on_the_vector_engine_are_the_reduces_bits(
    T: int, W: int, dtype: str, with_bias: bool, monkeypatch
) -> None:
    """The PE's PSUM sums (taps then the bias, 0/1 matmuls) and the vector engine's products (taps from PSUM, one
    instruction per bank: C = 4096 spans 2-3 banks) give every live output and every pool row of the GpSimd products
    and vector reduce bit for bit, at decode and verification widths; without a bias at T = 4 the products of one
    output are split between GpSimd and the vector engine at a channel (``PRODUCTS_ON_VECTOR_NO_BIAS``)."""
    import gdn_nki.conv.step

    rng, x, pool, weight, bias = _inputs(17 + T, dtype, 9, T, C=4096, W=W, L=W - 1)
    rows = _rows(rng, 9, T, pool.shape[0], False, [6])
    bias = bias if with_bias else None
    split, split_pool = gdn_nki.conv_decode_step(x, pool.copy(), weight, bias, rows)
    for table in ("OUTPUTS_ON_PE", "PRODUCTS_ON_VECTOR", "OUTPUTS_ON_PE_NO_BIAS", "PRODUCTS_ON_VECTOR_NO_BIAS"):
        monkeypatch.setattr(gdn_nki.conv.step, table, {T: 0})
    reduced, reduced_pool = gdn_nki.conv_decode_step(x, pool.copy(), weight, bias, rows)
    live = rows >= 0
    assert split[live].tobytes() == reduced[live].tobytes()
    assert split_pool.tobytes() == reduced_pool.tobytes()
    assert not np.asarray(split[~live], dtype=np.float64).any()


@pytest.mark.parametrize(("N", "on_vector", "runs", "in_row"), [
    (20, 1.4375, 1, False),  # F = 256: the cut (output 2, channel 144) inside the taps' second bank; three groups
    (20, 1.75, 1, True),  # cut at channel 64: the vector engine's part reads both banks; vLLM's in-row form
    (6, 1.625, 3, False),  # a lone group in runs of 86, 86, 84 channels: the first run holds the cut (96)
])  # fmt: skip
def test_one_outputs_products_split_between_gpsimd_and_the_vector_engine_are_gpsimds_bits(
    N: int, on_vector: float, runs: int, in_row: bool, monkeypatch
) -> None:
    """Without a bias at T = 4 (Qwen3-Next's conv) an output's products are split at a channel: GpSimd multiplies
    the first channels, the vector engine the rest from the taps' PSUM banks (``_multiply``). Every live output and
    every pool row is the all-GpSimd products' bit for bit (each product one fp32 rounding on either engine), and
    both are the oracle's."""
    import gdn_nki.conv.step

    T = 4
    rng, x, pool, weight, _ = _inputs(53 + N, "bfloat16", N, T, C=4096, L=T + 2 if in_row else 3, P=N + 4)
    weight = weight.astype(ml_dtypes.bfloat16)
    rows = _rows(rng, N, 1, pool.shape[0], False, [1])
    accepted = (np.arange(N, dtype=np.int32) % T + 1) if in_row else None
    monkeypatch.setattr(gdn_nki.conv.step, "PRODUCTS_ON_VECTOR_NO_BIAS", {T: on_vector})
    monkeypatch.setattr(gdn_nki.conv.step, "MULTI_TOKEN_RUNS", runs)
    _check(x, pool.copy(), weight, None, rows, accepted, "silu", "bfloat16")
    split, split_pool = gdn_nki.conv_decode_step(x, pool.copy(), weight, None, rows, accepted)
    monkeypatch.setattr(gdn_nki.conv.step, "PRODUCTS_ON_VECTOR_NO_BIAS", {T: 0})
    gpsimd, gpsimd_pool = gdn_nki.conv_decode_step(x, pool.copy(), weight, None, rows, accepted)
    live = rows >= 0
    assert split[live].tobytes() == gpsimd[live].tobytes()
    assert split_pool.tobytes() == gpsimd_pool.tobytes()


@pytest.mark.parametrize(("N", "C", "with_bias", "per_token", "activation"), [
    (8, 4096, True, False, "silu"),  # one group: the launch is its last trip; 8 runs of 32 channels
    (30, 208, True, True, "silu"),  # F = 13: runs of 2, the last of 1; four sets, one trip; [N, 1] rows
    (50, 64, False, False, None),  # two trips of four sets: the pipelined trip, then the runs; F = 4 (4 runs)
])  # fmt: skip
def test_the_last_trip_in_channel_runs_is_the_whole_groups_bits(
    N: int, C: int, with_bias: bool, per_token: bool, activation: str | None, monkeypatch
) -> None:
    """At T = 1 the last trip convolves each group in runs of channels (``_TileSet.convolve_and_store``: products
    on GpSimd, every third run summed by the vector engine, the others on the tensor engine): every live output and
    every pool row is the whole-group convolution's bit for bit, padding outputs are zeros, and both are the
    oracle's."""
    import gdn_nki.conv.step

    rng, x, pool, weight, bias = _inputs(41 + N, "bfloat16", N, 1, C=C, P=N + 6)
    weight, bias = weight.astype(ml_dtypes.bfloat16), (bias.astype(ml_dtypes.bfloat16) if with_bias else None)
    rows = _rows(rng, N, 1, pool.shape[0], per_token, [2, N - 1])
    _check(x, pool.copy(), weight, bias, rows, None, activation, "bfloat16")
    runs, runs_pool = gdn_nki.conv_decode_step(x, pool.copy(), weight, bias, rows, activation=activation)
    monkeypatch.setattr(gdn_nki.conv.step, "_drains_in_runs", lambda *_: False)
    whole, whole_pool = gdn_nki.conv_decode_step(x, pool.copy(), weight, bias, rows, activation=activation)
    live = np.asarray(rows).reshape(N, -1)[:, 0] >= 0
    assert runs[live].tobytes() == whole[live].tobytes()
    assert runs_pool.tobytes() == whole_pool.tobytes()
    assert not np.asarray(runs[~live], dtype=np.float64).any()


@pytest.mark.parametrize(("N", "T", "C", "W", "dtype", "per_token", "runs"), [
    (8, 4, 4096, 4, "bfloat16", False, 3),  # F = 256: runs cut the split output's PE share (176) and the taps' banks
    (5, 4, 4096, 3, "float32", True, 2),  # W = 3: 170-channel tap banks, the second run reads two; [N, T] rows
    (7, 2, 208, 4, "float32", False, 3),  # F = 13: runs of 5, 5 and 3
])  # fmt: skip
def test_a_lone_group_in_channel_runs_is_the_whole_groups_bits(
    N: int, T: int, C: int, W: int, dtype: str, per_token: bool, runs: int, monkeypatch
) -> None:
    """At T > 1 a launch of one group (N <= 8) convolves it in runs of channels (``_TileSet.convolve_in_runs``,
    each output's channels on the engines the whole group gives them): every live output and every pool row is the
    whole group's (``MULTI_TOKEN_RUNS = 1``, the pipelined path) bit for bit, padding outputs are zeros, and both
    are the oracle's."""
    import gdn_nki.conv.step

    rng, x, pool, weight, bias = _inputs(71 + N, dtype, N, T, C=C, W=W, L=W - 1)
    rows = _rows(rng, N, T, pool.shape[0], per_token, [1])
    monkeypatch.setattr(gdn_nki.conv.step, "MULTI_TOKEN_RUNS", runs)
    _check(x, pool.copy(), weight, bias, rows, None, "silu", dtype)
    in_runs, runs_pool = gdn_nki.conv_decode_step(x, pool.copy(), weight, bias, rows)
    monkeypatch.setattr(gdn_nki.conv.step, "MULTI_TOKEN_RUNS", 1)
    whole, whole_pool = gdn_nki.conv_decode_step(x, pool.copy(), weight, bias, rows)
    live = np.asarray(rows).reshape(N, -1)[:, 0] >= 0
    assert in_runs[live].tobytes() == whole[live].tobytes()
    assert runs_pool.tobytes() == whole_pool.tobytes()
    assert not np.asarray(in_runs[~live], dtype=np.float64).any()


@pytest.mark.parametrize(("C", "T"), [(16, 4), (48, 4), (32, 5)])
def test_verification_widths_on_few_channels_per_partition(C: int, T: int) -> None:
    """T = 4 sums 2.75 outputs on the tensor engine: with F = C / 16 channels a partition, 3/4 of F rounds to all of
    them at C = 16 (the third output wholly on the PE) and to part at C = 48; T = 5 the default split."""
    rng, x, pool, weight, bias = _inputs(23 + C, "float32", 6, T, C=C)
    _check(x, pool, weight, bias, _rows(rng, 6, T, pool.shape[0], False, [1]), None, "silu", "float32")


@pytest.mark.parametrize(("W", "T", "N"), [(5, 3, 64), (2, 3, 64), (5, 4, 24), (3, 5, 24)])
def test_psum_holds_the_taps_and_sums_at_qwen3_next_channels(W: int, T: int, N: int) -> None:
    """C = 8192: the taps in PSUM take 2-6 banks by width (``_engine_plan``) beside 3-4 tile sets' sums; the plan
    keeps them within 8 banks (W = 5 and W = 2 at T = 3 asked for 10)."""
    rng, x, pool, weight, bias = _inputs(29 + W, "bfloat16", N, T, C=8192, W=W, L=W - 1, P=N * T + 2)
    _check(x, pool, weight, bias, _rows(rng, N, T, pool.shape[0], False, [3]), None, "silu", "bfloat16")


def test_hf_cache_layout_keeps_w_inputs_and_the_taps_read_the_last_w_minus_1() -> None:
    """HF's cache keeps L = W inputs; the taps read its last W - 1 (not its first, as vLLM's non-speculative update
    reads a longer row), and the window shifts by T."""
    rng, x, pool, weight, bias = _inputs(13, "float32", 5, 2, W=4, L=4)
    _check(x, pool, weight, bias, _rows(rng, 5, 2, pool.shape[0], False, [2]), None, "silu", "float32")


def test_verify_then_resume_equals_decoding_the_accepted_tokens() -> None:
    """Rollback as the recurrent state's: verify T = 3 on [N, T] rows, resume from [n, a - 1]; the windows and
    outputs equal decoding the accepted tokens one at a time on [N] rows, bit for bit."""
    rng, x, pool, weight, bias = _inputs(5, "float32", 3, 3)
    rows = np.array([[0, 1, 2], [3, 4, 5], [6, 7, 8]], np.int32)
    accepted = np.array([1, 3, 2], np.int32)
    verify_pool = pool.copy()
    gdn_nki.conv_decode_step(x, verify_pool, weight, bias, rows)
    nxt = rng.standard_normal((3, 3, 32)).astype(np.float32)
    out, _ = gdn_nki.conv_decode_step(nxt, verify_pool, weight, bias, rows, accepted)
    for n in range(3):
        one = pool.copy()
        row = np.array([rows[n, 0]], np.int32)
        for t in range(accepted[n]):
            gdn_nki.conv_decode_step(x[n : n + 1, t : t + 1], one, weight, bias, row)
        ref, _ = gdn_nki.conv_decode_step(nxt[n : n + 1, :1], one, weight, bias, row)
        np.testing.assert_array_equal(out[n, 0], ref[0, 0])
        np.testing.assert_array_equal(verify_pool[rows[n, 0]], one[rows[n, 0]])


def test_one_program_whatever_the_rows() -> None:
    rng, x, pool, weight, bias = _inputs(7, "float32", 10, 2)
    prints = set()
    for padding, per_token_acc in (([], [1] * 10), ([0, 9], [2] * 10), (list(range(10)), [1] * 10)):
        rows = _rows(rng, 10, 2, pool.shape[0], True, padding)
        gdn_nki.conv_decode_step(x, pool, weight, bias, rows, np.array(per_token_acc, np.int32))
        prints.add(last_program_fingerprints())
    assert len(prints) == 1


REJECTIONS = {
    "width": lambda c: c.update(weight=np.zeros((32, 6), np.float32)),
    "window": lambda c: c.update(weight=np.zeros((32, 5), np.float32)),  # W - 1 = 4 > L = 3
    "weight_channels": lambda c: c.update(weight=np.zeros((16, 4), np.float32)),
    "pool_channels": lambda c: c.update(pool=np.zeros((40, 48, 3), np.float32)),
    "bias": lambda c: c.update(bias=np.zeros(16, np.float32)),
    "pool_dtype": lambda c: c.update(pool=np.zeros((40, 32, 3), ml_dtypes.bfloat16)),
    "channels": lambda c: c.update(
        x=np.zeros((2, 1, 24), np.float32),
        weight=np.zeros((24, 4), np.float32),
        pool=np.zeros((40, 24, 3), np.float32),
        bias=None,
    ),
    "range": lambda c: c.update(rows=np.array([3, 40], np.int32)),
    "distinct": lambda c: c.update(rows=np.array([5, 5], np.int32)),
    "accepted": lambda c: c.update(
        x=np.zeros((2, 2, 32), np.float32),
        rows=np.array([[1, 2], [3, 4]], np.int32),
        accepted=np.array([1, 3], np.int32),
    ),
    "activation": lambda c: c.update(activation="gelu"),
    "pool_finite": lambda c: c["pool"].__setitem__((3, 0, 1), np.nan),
}


@pytest.mark.parametrize("case", sorted(REJECTIONS))
def test_rejections_name_the_rule_and_leave_the_pool(case: str) -> None:
    _, x, pool, weight, bias = _inputs(11, "float32", 2, 1)
    call = dict(x=x[:, :1], pool=pool, weight=weight, bias=bias, rows=np.array([3, 7], np.int32), accepted=None,
                activation="silu")  # fmt: skip
    REJECTIONS[case](call)
    before = call["pool"].copy()
    with pytest.raises(ContractError) as raised:
        gdn_nki.conv_decode_step(call["x"], call["pool"], call["weight"], call["bias"], call["rows"], call["accepted"],
                                 activation=call["activation"])  # fmt: skip
    rule = {"range": "state_indices.range", "distinct": "state_indices.distinct",
            "accepted": "num_accepted_tokens.range"}.get(case, f"conv.{case}")  # fmt: skip
    assert rule in {v.rule_id for v in raised.value.violations}, str(raised.value)
    np.testing.assert_array_equal(call["pool"], before)


def _conv_into_parts(widths: tuple[int, ...]):
    """A launch of ``gdn_conv_step`` writing its output as parts of ``widths`` channels (the fused block's use)."""
    from gdn_nki.common.backend import nl
    from gdn_nki.conv.step import gdn_conv_step

    def launch(x, pool, weight, bias, rows):
        parts = tuple(nl.ndarray((*x.shape[:2], w), dtype=x.dtype, buffer=nl.shared_hbm) for w in widths)
        return gdn_conv_step(x, pool, weight, bias, rows, None, "silu", parts)

    return launch


@pytest.mark.parametrize("T", [1, 2])
def test_out_parts_are_the_outputs_channels_bit_for_bit(T: int) -> None:
    """Parts of whole partitions (C = 64: 4 channels a partition; 8 + 24 + 32) hold the one output's channels bit
    for bit, padding's zeros included, and the pool gets the same rows; [N] rows, T = 1 (the last trip in channel
    runs) and 2."""
    from gdn_nki.common.backend import simulate

    rng, x, pool, weight, bias = _inputs(23, "bfloat16", 11, T, C=64)
    rows = _rows(rng, 11, T, 40, False, [2, 9])
    out, whole_pool = gdn_nki.conv_decode_step(x, pool.copy(), weight, bias, rows)
    parted_pool = pool.copy()
    parts, _ = simulate(_conv_into_parts((8, 24, 32)))(x, parted_pool, weight, bias, rows)
    assert np.concatenate([np.asarray(p) for p in parts], axis=2).tobytes() == out.tobytes()
    assert parted_pool.tobytes() == whole_pool.tobytes()


def test_out_parts_not_whole_partitions_stop_the_trace() -> None:
    from gdn_nki.common.backend import simulate

    _, x, pool, weight, bias = _inputs(24, "float32", 2, 1, C=64)
    with pytest.raises(AssertionError, match="out_parts"):
        simulate(_conv_into_parts((6, 58)))(x, pool, weight, bias, np.array([0, 1], np.int32))
