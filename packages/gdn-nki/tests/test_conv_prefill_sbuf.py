"""gdn_conv_bucket at the channel counts users run with every sequence slot of a bucket (review holes49 item 5):
the starts pass holds every group's windows at once, which at Qwen3.5's C = 12288 in fp32 and 128 slots overflows
a partition's SBUF; it then runs in channel chunks (``prefill.starts_chunks``). Against the fp64 oracle at that
shape, and bit for bit the same outputs and pool whether a small case runs in one chunk or several (a channel's
conv reads only its own channel; every window of a chunk is read before any of its channels is written)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import gdn_nki
from gdn_nki.conv import prefill
from gdn_ref.conv import causal_conv1d_prefill_pool
from gdn_spec.metrics import compare, describe

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}


def _layout(seqs: int, tokens: int, rng: np.random.Generator):
    """``seqs`` sequences (short ones among them: at most L tokens, their final window from the starts pass)
    filling ``tokens`` on a pool of 2·seqs rows: rows a permutation with two −1s; every other sequence starts from
    a row the launch does not write (a prefix-cache hit), one from an empty window."""
    lengths = np.ones(seqs, np.int64)
    lengths[: seqs // 4] = 2
    lengths[-1] += tokens - lengths.sum()
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    order = rng.permutation(2 * seqs).astype(np.int32)
    rows, reads = order[:seqs].copy(), order[:seqs].copy()
    reads[1::2] = order[seqs + 1 :: 2]
    rows[[3, seqs - 2]] = -1
    reads[[3, 6]] = -1
    return cu, rows, reads


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_qwen35_channels_with_128_slots_fit_and_match_the_oracle(dtype: str) -> None:
    C, W, L, T, N = 12288, 4, 3, 256, 128
    rng = np.random.default_rng(12)
    cd = DTYPES[dtype]
    cu, rows, reads = _layout(N, T, rng)
    x = rng.standard_normal((T, C)).astype(cd)
    pool = rng.standard_normal((2 * N, C, L)).astype(cd)
    weight, bias = (0.5 * rng.standard_normal((C, W))).astype(cd), (0.1 * rng.standard_normal(C)).astype(cd)
    before = pool.copy()
    out, _ = gdn_nki.conv_prefill_bucket(x, pool, weight, bias, cu, rows, bucket=(T, N), read_indices=reads)
    ref_out, ref_pool = causal_conv1d_prefill_pool(x, weight, bias, cu, before, rows, "silu", None, None, reads)
    error = compare("out", out, ref_out, dtype)
    assert error.ok, describe([error])
    np.testing.assert_array_equal(pool, ref_pool.astype(pool.dtype))
    assert prefill.starts_chunks(cd if dtype == "bfloat16" else prefill.FP32, C // 16, L, W, True, N) == (
        2 if dtype == "float32" else 1
    )


@pytest.mark.parametrize("chunks", [2, 4])
def test_chunked_starts_are_bit_identical_to_one_pass(chunks: int, monkeypatch: pytest.MonkeyPatch) -> None:
    C, W, L, T, N = 128, 4, 3, 128, 24
    rng = np.random.default_rng(13)
    cu, rows, reads = _layout(N, T, rng)
    x = rng.standard_normal((T, C)).astype(np.float32)
    pool = rng.standard_normal((2 * N, C, L)).astype(np.float32)
    weight, bias = rng.standard_normal((C, W)).astype(np.float32), rng.standard_normal(C).astype(np.float32)
    results = []
    for forced in (1, chunks):
        monkeypatch.setattr(prefill, "starts_chunks", lambda *_, n=forced: n)
        mine = pool.copy()
        out, _ = gdn_nki.conv_prefill_bucket(x, mine, weight, bias, cu, rows, bucket=(T, N), read_indices=reads)
        results.append((out, mine))
    assert np.array_equal(results[0][0], results[1][0]) and np.array_equal(results[0][1], results[1][1])
