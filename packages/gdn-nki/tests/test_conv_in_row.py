"""vLLM's in-row speculative form of ``gdn_conv_step`` ([N] rows with ``num_accepted_tokens``: a row of
L >= W − 2 + T inputs read from offset num_accepted_tokens − 1, ``gdn_ref.conv``) through
``gdn_nki.conv_decode_step`` against the fp64 oracle: outputs within gdn-spec's tolerance table, rows bit-exact,
padding, several channel tiles, a compiled loop, one program whatever the counts, and rejections leaving the pool."""

from __future__ import annotations

import numpy as np
import pytest

import gdn_nki
from gdn_nki.common.backend import last_program_fingerprints
from gdn_ref.contract import ContractError
from test_conv_step import _check, _inputs


def _in_row_call(seed: int, dtype: str, N: int, T: int, C: int = 32, W: int = 4, extra: int = 0, padding=(),
                 accepted=None):  # fmt: skip
    """A pool of rows of W − 2 + T (+ extra) inputs, N distinct rows (−1 at ``padding``), counts cycling 1..T."""
    P = 2 * N + 3
    rng, x, pool, weight, bias = _inputs(seed, dtype, N, T, C=C, W=W, L=W - 2 + T + extra, P=P)
    rows = rng.permutation(P)[:N].astype(np.int32)
    rows[list(padding)] = -1
    if accepted is None:
        accepted = (np.arange(N) % T + 1).astype(np.int32)
    return x, pool, weight, bias, rows, accepted


@pytest.mark.parametrize(
    ("N", "T", "C", "W", "extra", "dtype", "padding"),
    [
        (11, 4, 32, 4, 0, "bfloat16", (3, 10)),  # Qwen3-Next's W, T = 4 (3 speculative tokens), −1 rows
        (19, 2, 64, 4, 0, "float32", (0,)),  # three groups of 8, slots past N
        (6, 3, 48, 3, 2, "float32", ()),  # a row longer than vLLM allocates: its first W − 2 + T written, as vLLM
        (10, 4, 32, 4, 3, "bfloat16", (2,)),  # a longer row at T = 4: entries from W − 2 + T on left as they were
        (5, 1, 32, 4, 2, "bfloat16", (1,)),  # a longer row at T = 1: the last trip's drain in runs keeps the tail
        (5, 1, 32, 2, 0, "bfloat16", (4,)),  # T = 1: the in-row form is the plain step
        (9, 4, 8192, 4, 0, "bfloat16", (6,)),  # Qwen3-Next's channels: the taps over 2 PSUM banks
    ],
)
def test_in_row_matches_the_oracle(N: int, T: int, C: int, W: int, extra: int, dtype: str, padding) -> None:
    x, pool, weight, bias, rows, accepted = _in_row_call(N + T, dtype, N, T, C, W, extra, padding)
    _check(x, pool, weight, bias, rows, accepted, "silu", dtype)


def test_the_pools_last_row_at_the_largest_offset() -> None:
    """A request on the pool's last row resuming after all T tokens: the shifted run of its last partition must end
    inside the pool (a run past it would be skipped whole, ``oob_mode.skip``); the first row at offset 0 beside it."""
    x, pool, weight, bias, rows, _ = _in_row_call(31, "bfloat16", 3, 4)
    rows[:] = [pool.shape[0] - 1, 0, 5]
    _check(x, pool, weight, bias, rows, np.array([4, 1, 3], np.int32), "silu", "bfloat16")


@pytest.mark.parametrize("extra", [0, 2])
def test_in_row_in_a_compiled_loop_of_groups(monkeypatch, extra: int) -> None:
    """N = 75, T = 2 with one trip a compiled-loop iteration: the offsets are read from the loop's row window
    (``_RowWindow``) at run time, as the rows are (and, rows longer than W − 2 + T, the rows as read)."""
    import gdn_nki.conv.step

    monkeypatch.setattr(gdn_nki.conv.step, "TRIPS_PER_ITERATION", 1)
    x, pool, weight, bias, rows, accepted = _in_row_call(41, "bfloat16", 75, 2, C=64, extra=extra,
                                                         padding=(4, 17, 74))  # fmt: skip
    _check(x, pool, weight, bias, rows, accepted, None, "bfloat16")


def test_in_row_verify_then_resume_equals_decoding_the_accepted_tokens() -> None:
    """Serving: verify T = 4 tokens from offset 0 (a window of W − 1 inputs then T − 1 free entries), then the
    next step resumes from offset a − 1: its outputs and rows equal decoding the a accepted tokens one at a time
    on a plain pool (L = W − 1) and then the next step, bit for bit."""
    T, W, N = 4, 4, 5
    x, pool, weight, bias, rows, _ = _in_row_call(8, "float32", N, T, W=W)
    plain = np.zeros((pool.shape[0], pool.shape[1], W - 1), np.float32)
    plain[rows] = pool[rows, :, : W - 1]  # the window the in-row row holds at offset 0
    gdn_nki.conv_decode_step(x, pool, weight, bias, rows, np.ones(N, np.int32))
    accepted = np.array([1, 4, 2, 3, 1], np.int32)
    nxt = np.random.default_rng(9).standard_normal((N, T, 32)).astype(np.float32)
    out, _ = gdn_nki.conv_decode_step(nxt, pool, weight, bias, rows, accepted)
    for n in range(N):
        row = rows[n : n + 1]
        for t in range(accepted[n]):
            gdn_nki.conv_decode_step(x[n : n + 1, t : t + 1], plain, weight, bias, row)
        ref, _ = gdn_nki.conv_decode_step(nxt[n : n + 1], plain, weight, bias, row)
        np.testing.assert_array_equal(out[n], ref[0])
        np.testing.assert_array_equal(pool[rows[n], :, T - 1 :], plain[rows[n]])  # the row's last W − 1 inputs


def test_one_program_whatever_the_counts() -> None:
    """The counts are device data: every set of counts (and padding) runs one compiled program."""
    prints = set()
    for counts, padding in (([1] * 6, ()), ([3, 2, 1, 3, 2, 1], (2,)), ([3] * 6, (0, 5))):
        x, pool, weight, bias, rows, accepted = _in_row_call(5, "float32", 6, 3, padding=padding,
                                                             accepted=np.array(counts, np.int32))  # fmt: skip
        gdn_nki.conv_decode_step(x, pool, weight, bias, rows, accepted)
        prints.add(last_program_fingerprints())
    assert len(prints) == 1


@pytest.mark.parametrize(
    ("case", "rule", "argument"),
    [
        ("count_zero", "num_accepted_tokens.range", "num_accepted_tokens"),
        ("count_past_t", "num_accepted_tokens.range", "num_accepted_tokens"),
        ("short_row", "conv.in_row_window", "conv_pool"),
        ("count_shape", "conv.num_accepted_tokens", "num_accepted_tokens"),
    ],
)
def test_in_row_rejections_name_the_argument_and_leave_the_pool(case: str, rule: str, argument: str) -> None:
    x, pool, weight, bias, rows, accepted = _in_row_call(12, "float32", 4, 3)
    if case == "count_zero":
        accepted[1] = 0
    elif case == "count_past_t":
        accepted[2] = 4  # T = 3: the row has no window past offset T − 1
    elif case == "short_row":
        pool = np.ascontiguousarray(pool[:, :, :-1])  # L = 4 < W − 2 + T = 5
    else:
        accepted = np.ones((4, 1), np.int32)
    before = pool.copy()
    with pytest.raises(ContractError) as raised:
        gdn_nki.conv_decode_step(x, pool, weight, bias, rows, accepted)
    assert (rule, argument) in {(v.rule_id, v.argument) for v in raised.value.violations}, str(raised.value)
    np.testing.assert_array_equal(pool, before)
