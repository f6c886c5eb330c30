"""The conv oracle against direct formulations: a per-channel numpy convolution, torch's ``F.conv1d`` (HF's prefill
fallback) and HF's ``torch_causal_conv1d_update``; packed sequences, checkpoints, pools and rollback."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gdn_ref.conv import (
    causal_conv1d_decode_pool,
    causal_conv1d_prefill_pool,
    causal_conv1d_update_varlen,
    causal_conv1d_varlen,
    conv_from_window,
)


def _silu(y: np.ndarray) -> np.ndarray:
    return y / (1.0 + np.exp(-y))


def _direct(x: np.ndarray, window: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """y[t, c] = b[c] + Σ_j w[c, j] x̃[t + j] over the window's last W − 1 inputs then x, by np.convolve per channel
    (a flipped kernel: np.convolve is a true convolution)."""
    width = weight.shape[1]
    out = np.empty(x.shape)
    for c in range(x.shape[1]):
        series = np.concatenate([window[c, window.shape[1] - (width - 1) :], x[:, c]])
        out[:, c] = np.convolve(series, weight[c, ::-1], mode="valid") + bias[c]
    return out


@settings(max_examples=25, deadline=None)
@given(tokens=st.integers(1, 9), channels=st.integers(1, 6), width=st.integers(2, 5), extra=st.integers(0, 2),
       seed=st.integers(0, 2**31 - 1))  # fmt: skip
def test_conv_from_window_is_the_direct_convolution(
    tokens: int, channels: int, width: int, extra: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, channels))
    window = rng.standard_normal((channels, width - 1 + extra))
    weight, bias = rng.standard_normal((channels, width)), rng.standard_normal(channels)
    out, windows = conv_from_window(x, window, weight, bias, "silu")
    np.testing.assert_allclose(out, _silu(_direct(x, window, weight, bias)), rtol=1e-13, atol=1e-13)
    series = np.concatenate([window, x.T], axis=1)
    for t in range(tokens):  # the window after token t: the last L inputs up to it
        np.testing.assert_array_equal(windows[t], series[:, t + 1 : t + 1 + window.shape[1]])


def test_a_window_shorter_than_the_taps_is_refused() -> None:
    with pytest.raises(ValueError, match="shorter"):
        conv_from_window(np.zeros((2, 3)), np.zeros((3, 2)), np.zeros((3, 4)))


def test_matches_torch_conv1d_prefill_and_hf_update() -> None:
    torch = pytest.importorskip("torch")
    modeling = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    rng = np.random.default_rng(3)
    C, W, S, T = 6, 4, 11, 3
    x = rng.standard_normal((S + T, C))
    weight, bias = rng.standard_normal((C, W)), rng.standard_normal(C)
    # HF's prefill fallback (``causal_conv1d_fn``: F.conv1d with W - 1 zeros of left padding, then SiLU); its
    # cache keeps the last W inputs. Older transformers name the decode update ``torch_causal_conv1d_update``.
    update = getattr(modeling, "causal_conv1d_update", None) or modeling.torch_causal_conv1d_update
    xt = torch.from_numpy(x[:S].T[None].copy())
    conv = torch.nn.functional.conv1d(
        xt, torch.from_numpy(weight[:, None]), torch.from_numpy(bias), padding=W - 1, groups=C
    )
    ref = torch.nn.functional.silu(conv[..., :S])[0].T.numpy()
    out, windows = conv_from_window(x[:S], np.zeros((C, W)), weight, bias, "silu")
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)
    if hasattr(modeling, "causal_conv1d_fn"):
        hf_fn = modeling.causal_conv1d_fn(xt, torch.from_numpy(weight), torch.from_numpy(bias), activation="silu")
        np.testing.assert_allclose(out, hf_fn[0].T.numpy(), rtol=1e-12, atol=1e-12)
    # HF's decode update from that cache (L = W), T tokens at once; and from a cache of L = W - 1.
    for length in (W, W - 1):
        state = torch.from_numpy(windows[-1][:, W - length :][None].copy())
        hf = update(torch.from_numpy(x[S:].T[None].copy()), state, torch.from_numpy(weight),
                                                 torch.from_numpy(bias), activation="silu")  # fmt: skip
        mine, after = conv_from_window(x[S:], windows[-1][:, W - length :], weight, bias, "silu")
        np.testing.assert_allclose(mine, hf[0].T.numpy(), rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(after[-1], state[0].numpy())


@settings(max_examples=20, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 9), min_size=1, max_size=4), every=st.integers(1, 4), seed=st.integers(0, 2**31 - 1)
)
def test_packed_sequences_are_separate_runs_and_checkpoints_are_truncations(
    lengths: list[int], every: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    C, W, L = 3, 4, 3
    cu = np.concatenate([[0], np.cumsum(lengths)])
    x = rng.standard_normal((int(cu[-1]), C))
    windows = rng.standard_normal((len(lengths), C, L))
    weight, bias = rng.standard_normal((C, W)), rng.standard_normal(C)
    out, finals, checkpoints = causal_conv1d_varlen(x, weight, bias, cu, windows, "silu", every)
    for i, (a, b) in enumerate(itertools.pairwise(cu)):
        if a == b:
            np.testing.assert_array_equal(finals[i], windows[i])
            continue
        alone, after = conv_from_window(x[a:b], windows[i], weight, bias, "silu")
        np.testing.assert_array_equal(out[a:b], alone)
        np.testing.assert_array_equal(finals[i], after[-1])
        for k in range((b - a) // every):
            cut = (k + 1) * every
            _, truncated = conv_from_window(x[a : a + cut], windows[i], weight, bias, "silu")
            np.testing.assert_array_equal(checkpoints[(i, k)], truncated[-1])
    assert len(checkpoints) == sum(n // every for n in lengths)


def test_prefill_pool_rows_minus_one_checkpoints_and_read_rows() -> None:
    rng = np.random.default_rng(5)
    C, W, L, P = 2, 4, 3, 8
    lengths = [5, 0, 7, 2]
    cu = np.concatenate([[0], np.cumsum(lengths)])
    x = rng.standard_normal((int(cu[-1]), C))
    weight, bias = rng.standard_normal((C, W)), rng.standard_normal(C)
    pool = rng.standard_normal((P, C, L))
    rows, reads = np.array([1, 2, -1, 3]), np.array([6, -1, -1, 3])
    table = np.array([[4, -1], [5, -1], [0, 7], [-1, -1]])
    _out, after = causal_conv1d_prefill_pool(x, weight, bias, cu, pool, rows, "silu", 3, table, reads)
    _, ref_final, ref_ckpt = causal_conv1d_varlen(
        x, weight, bias, cu, np.stack([pool[6], np.zeros((C, L)), np.zeros((C, L)), pool[3]]), "silu", 3
    )
    np.testing.assert_array_equal(after[1], ref_final[0])  # read row 6, ends in row 1
    np.testing.assert_array_equal(after[3], ref_final[3])
    np.testing.assert_array_equal(after[4], ref_ckpt[(0, 0)])
    np.testing.assert_array_equal(after[0], ref_ckpt[(2, 0)])  # a -1 state row still stores its checkpoints
    np.testing.assert_array_equal(after[7], ref_ckpt[(2, 1)])
    for untouched in (2, 5, 6):  # an empty sequence's row, its checkpoint, a read-only row
        np.testing.assert_array_equal(after[untouched], pool[untouched])


@settings(max_examples=20, deadline=None)
@given(T=st.integers(1, 4), seed=st.integers(0, 2**31 - 1), data=st.data())
def test_verify_then_resume_equals_decoding_the_accepted_tokens(T: int, seed: int, data: st.DataObject) -> None:
    rng = np.random.default_rng(seed)
    N, C, W, L, P = 3, 4, 4, 3, 16
    weight, bias = rng.standard_normal((C, W)), rng.standard_normal(C)
    pool = rng.standard_normal((P, C, L))
    rows = rng.permutation(P)[: N * T].reshape(N, T)
    accepted = np.array([data.draw(st.integers(1, T)) for _ in range(N)])
    x = rng.standard_normal((N, T, C))
    start = rows[:, 0].copy()
    out, after = causal_conv1d_decode_pool(x, weight, bias, pool, rows, None)  # verify from row [n, 0]
    one = pool.copy()
    for t in range(T):  # token by token on [N] rows
        y, one = causal_conv1d_decode_pool(x[:, t : t + 1], weight, bias, one, start)
        np.testing.assert_allclose(out[:, t], y[:, 0], rtol=1e-13, atol=1e-13)
        if t + 1 in accepted:
            for n in np.flatnonzero(accepted == t + 1):
                np.testing.assert_array_equal(after[rows[n, t]], one[start[n]])
    # The next step resumes from the accepted token's row: as if only the accepted tokens had been decoded.
    nxt = rng.standard_normal((N, 1, C))
    resumed, _ = causal_conv1d_decode_pool(np.repeat(nxt, T, axis=1), weight, bias, after, rows, accepted)
    for n in range(N):
        window = after[rows[n, accepted[n] - 1]]
        ref, _ = conv_from_window(nxt[n], window, weight, bias, "silu")
        np.testing.assert_allclose(resumed[n, 0], ref[0], rtol=1e-13)


def test_decode_padding_reads_and_writes_nothing() -> None:
    rng = np.random.default_rng(9)
    C, W, P = 3, 4, 5
    pool = rng.standard_normal((P, C, W - 1))
    x = rng.standard_normal((3, 2, C))
    out, after = causal_conv1d_decode_pool(x, rng.standard_normal((C, W)), None, pool, np.array([2, -1, 0]), None, None)
    assert not out[1].any()
    for row in (1, 3, 4):
        np.testing.assert_array_equal(after[row], pool[row])
    assert not np.array_equal(after[2], pool[2]) and not np.array_equal(after[0], pool[0])


def _vllm_in_row_update(x, weight, bias, pool, rows, accepted):
    """vLLM's ``_causal_conv1d_update_kernel`` with ``num_accepted_tokens`` (IS_SPEC_DECODING), written as its
    loops run (vllm/model_executor/layers/mamba/ops/causal_conv1d.py at 03c6dad8): the W − 1 columns read from
    offset o = a − 1 and shifted one token at a time; the launch's state length W − 1 + (T − 1), whatever the row's
    L, and the row's entries below it rewritten entry by entry (new[i] = row[o + 1 + i] while i + T < state length,
    else token i − (state length − T)), the others left; no SiLU."""
    pool = pool.copy()
    tokens, width = x.shape[1], weight.shape[1]
    state_len = width - 1 + (tokens - 1)
    out = np.zeros(x.shape)
    for n, row in enumerate(rows):
        if row < 0:
            continue
        o = accepted[n] - 1
        source = pool[row].copy()
        cols = [source[:, o + j] for j in range(width - 1)]
        for t in range(tokens):
            acc = bias.copy()
            for j in range(width - 1):
                acc = acc + cols[j] * weight[:, j]
            acc = acc + x[n, t] * weight[:, width - 1]
            cols = [*cols[1:], x[n, t]]
            out[n, t] = acc
        for i in range(state_len):
            pool[row, :, i] = source[:, o + 1 + i] if i + tokens < state_len else x[n, i - (state_len - tokens)]
    return out, pool


@pytest.mark.parametrize("T,extra", [(1, 0), (2, 0), (4, 0), (4, 2), (1, 3), (2, 5)])
def test_in_row_form_is_vllms_update_kernel(T: int, extra: int) -> None:
    """[N] rows with num_accepted_tokens: vLLM's in-row form, entry for entry (a row of W − 2 + T entries, vLLM's
    allocation, and longer ones, whose entries from W − 2 + T on stay as they were), −1 rows untouched, every
    accepted count 1..T."""
    rng = np.random.default_rng(T + 10 * extra)
    N, C, W, P = 2 * T + 1, 5, 4, 3 * T + 4
    L = W - 2 + T + extra
    weight, bias = rng.standard_normal((C, W)), rng.standard_normal(C)
    pool, x = rng.standard_normal((P, C, L)), rng.standard_normal((N, T, C))
    rows = rng.permutation(P)[:N]
    rows[1] = -1
    accepted = np.arange(N) % T + 1
    out, after = causal_conv1d_decode_pool(x, weight, bias, pool, rows, accepted, None)
    ref_out, ref_after = _vllm_in_row_update(x, weight, bias, pool, rows, accepted)
    np.testing.assert_allclose(out, np.where((rows >= 0)[:, None, None], ref_out, 0.0), rtol=1e-13, atol=1e-13)
    np.testing.assert_array_equal(after, ref_after)
    np.testing.assert_array_equal(after[:, :, W - 2 + T :], pool[:, :, W - 2 + T :])  # a longer row's tail


@pytest.mark.parametrize("T", [1, 3, 4])
def test_in_row_windows_are_the_per_token_rows(T: int) -> None:
    """vLLM's in-row row and gdn-nki's [N, T] rows hold the same windows: from one window, both forms give the
    same outputs, and the in-row row's window at offset a − 1 is per-token row [n, a − 1]'s, for every a."""
    rng = np.random.default_rng(T)
    N, C, W = 3, 4, 4
    weight, bias = rng.standard_normal((C, W)), rng.standard_normal(C)
    window, x = rng.standard_normal((N, C, W - 1)), rng.standard_normal((N, T, C))
    in_row = np.concatenate([window, rng.standard_normal((N, C, T - 1))], axis=2)  # the window at offset 0
    out, after = causal_conv1d_decode_pool(x, weight, bias, in_row, np.arange(N), np.ones(N, int))
    rows = np.arange(N * T).reshape(N, T)
    per_token_pool = np.zeros((N * T, C, W - 1))
    per_token_pool[rows[:, 0]] = window  # each request resumes from row [n, 0]
    ref_out, ref_after = causal_conv1d_decode_pool(x, weight, bias, per_token_pool, rows, np.ones(N, int))
    np.testing.assert_array_equal(out, ref_out)
    for n in range(N):
        for a in range(1, T + 1):
            np.testing.assert_array_equal(after[n][:, a - 1 : a + W - 2], ref_after[rows[n, a - 1]])


def _vllm_varlen_update(x, weight, bias, pool, bounds, rows, accepted, max_query_len):
    """vLLM's ``_causal_conv1d_update_kernel`` with ``IS_VARLEN`` and ``IS_SPEC_DECODING``, transcribed element by
    element (vllm/model_executor/layers/mamba/ops/causal_conv1d.py at 03c6dad8): the launch's state length
    W − 1 + (max_query_len − 1), revised per request to state_len − (max_query_len − len), and the row's entries
    below it written from the row shifted by the offset + 1 then the request's tokens."""
    width = weight.shape[1]
    pool = pool.copy()
    out = np.zeros(x.shape)
    launch_state_len = width - 1 + (max_query_len - 1)
    for n, row in enumerate(rows):
        start, end = bounds[n], bounds[n + 1]
        if row < 0 or start == end:
            continue
        seqlen = end - start
        state_len = launch_state_len - (max_query_len - seqlen)
        o = accepted[n] - 1
        source = pool[row].copy()
        cols = [source[:, o + j] for j in range(width - 1)]
        for i in range(state_len):
            pool[row, :, i] = source[:, o + i + 1] if i + seqlen < state_len else x[start + i - (state_len - seqlen)]
        for t in range(seqlen):
            acc = bias.copy()
            for j in range(width - 1):
                acc = acc + cols[j] * weight[:, j]
            acc = acc + x[start + t] * weight[:, width - 1]
            cols = [*cols[1:], x[start + t]]
            out[start + t] = acc
    return out, pool


@pytest.mark.parametrize("T,extra", [(1, 0), (3, 0), (4, 0), (4, 2)])
def test_varlen_form_is_vllms_update_kernel(T: int, extra: int) -> None:
    """vLLM's varlen speculative form (``query_start_loc`` with ``num_accepted_tokens``), entry for entry: requests
    of 1 .. T tokens and none, a −1 row, every accepted count; a request writes only the first W − 2 + len of its
    row (the rest, and unnamed rows, as they were), a request of no tokens nothing."""
    rng = np.random.default_rng(T + 10 * extra)
    C, W = 5, 4
    lengths = np.array([1, T, 0, max(1, T - 1), T, 1, T])
    N, P, L = lengths.size, 12, W - 2 + T + extra
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    weight, bias = rng.standard_normal((C, W)), rng.standard_normal(C)
    pool, x = rng.standard_normal((P, C, L)), rng.standard_normal((bounds[-1], C))
    rows = rng.permutation(P)[:N]
    rows[4] = -1
    accepted = np.arange(N) % T + 1
    out, after = causal_conv1d_update_varlen(x, weight, bias, pool, bounds, rows, accepted, T, None)
    ref_out, ref_after = _vllm_varlen_update(x, weight, bias, pool, bounds, rows, accepted, T)
    padding = np.repeat(rows < 0, lengths)
    np.testing.assert_allclose(out, np.where(padding[:, None], 0.0, ref_out), rtol=1e-13, atol=1e-13)
    np.testing.assert_array_equal(after, ref_after)
    if T > 1:  # request 0, of fewer tokens than T, leaves its row's tail
        np.testing.assert_array_equal(after[rows[0], :, W - 1 :], pool[rows[0], :, W - 1 :])
    np.testing.assert_array_equal(after[rows[2]], pool[rows[2]])  # no tokens: nothing written


def test_varlen_of_full_requests_is_the_in_row_step() -> None:
    """Every request at max_query_len tokens and rows of W − 2 + T entries: the varlen form is the in-row step on
    x [N, T, C], bit for bit."""
    rng = np.random.default_rng(5)
    N, T, C, W, P = 4, 3, 6, 4, 7
    weight, bias = rng.standard_normal((C, W)), rng.standard_normal(C)
    pool, x = rng.standard_normal((P, C, W - 2 + T)), rng.standard_normal((N, T, C))
    rows, accepted = np.array([5, -1, 0, 2]), np.array([3, 1, 2, 1])
    out, after = causal_conv1d_update_varlen(x.reshape(N * T, C), weight, bias, pool, np.arange(N + 1) * T, rows,
                                             accepted, T, "silu")  # fmt: skip
    ref_out, ref_after = causal_conv1d_decode_pool(x, weight, bias, pool, rows, accepted, "silu")
    np.testing.assert_array_equal(out, ref_out.reshape(N * T, C))
    np.testing.assert_array_equal(after, ref_after)
