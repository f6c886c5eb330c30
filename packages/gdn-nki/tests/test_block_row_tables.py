"""The decode kernels' row tables made ahead (the fused block's set-up before its in_proj): the conv and the
recurrence given tables made earlier give their own bits, and the block makes every table before its first
in_proj instruction."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import gdn_nki
from gdn_nki.common.backend import simulate
from gdn_nki.conv.step import conv_row_tables, gdn_conv_step
from gdn_nki.tkg.step import gdn_step, step_row_tables

NT_ROWS = pytest.param(True, True, id="NT-rows-accepted")
N_ROWS = pytest.param(False, False, id="N-rows")
IN_ROW = pytest.param(False, True, id="N-rows-in-row-offsets")


def _rows(rng: np.random.Generator, n_req: int, tokens: int, pool_rows: int, per_token: bool) -> np.ndarray:
    rows = rng.permutation(pool_rows)[: n_req * tokens].reshape(n_req, tokens).astype(np.int32)
    rows[[1, n_req - 1]] = -1  # padding, the last request among them
    return rows if per_token else np.ascontiguousarray(rows[:, 0])


def _conv_launch(ahead: bool):
    def launch(x, pool, weight, bias, rows, accepted):
        tables = conv_row_tables(x, pool, weight, rows, accepted) if ahead else None
        return gdn_conv_step(x, pool, weight, bias, rows, accepted, "silu", row_tables=tables)

    return launch


@pytest.mark.parametrize(("per_token", "with_accepted"), [NT_ROWS, N_ROWS, IN_ROW])
def test_conv_given_tables_made_ahead_gives_its_own_bits(per_token: bool, with_accepted: bool) -> None:
    """19 requests (three groups of 8, the last part padding past N), bf16, T = 3: the outputs and the pool as the
    conv making its own tables gives them."""
    n_req, tokens, channels, width, pool_rows = 19, 3, 64, 4, 64
    rng = np.random.default_rng(51)
    window = width - 2 + tokens if with_accepted and not per_token else width - 1
    x = rng.standard_normal((n_req, tokens, channels)).astype(ml_dtypes.bfloat16)
    pool = rng.standard_normal((pool_rows, channels, window)).astype(ml_dtypes.bfloat16)
    weight = (0.5 * rng.standard_normal((channels, width))).astype(np.float32)
    bias = (0.1 * rng.standard_normal(channels)).astype(np.float32)
    rows = _rows(rng, n_req, tokens, pool_rows, per_token)
    accepted = rng.integers(1, tokens + 1, n_req).astype(np.int32) if with_accepted else None
    results = []
    for ahead in (False, True):
        pools = pool.copy()
        out, _ = simulate(_conv_launch(ahead))(x, pools, weight, bias, rows, accepted)
        results.append((np.asarray(out).tobytes(), pools.tobytes()))
    assert results[0] == results[1]


def _step_launch(ahead: bool):
    def launch(q, k, v, pool, rows, accepted, g_log, beta):
        tables = step_row_tables(pool, rows, accepted, q.shape[0], q.shape[1]) if ahead else None
        return gdn_step(q, k, v, pool, rows, accepted, g_log=g_log, beta=beta, scale=0.25, row_tables=tables)

    return launch


@pytest.mark.parametrize(("per_token", "tokens"), [(True, 2), (False, 1)])
def test_recurrence_given_tables_made_ahead_gives_its_own_bits(per_token: bool, tokens: int) -> None:
    """18 requests (the compiled request loop: two groups of 16), −1 rows; [N, T] rows resuming from the accepted
    row, and [N] rows at T = 1."""
    n_req, hk, hv, dk, dv, pool_rows = 18, 1, 2, 16, 16, 48
    rng = np.random.default_rng(52)
    r = rng.standard_normal
    q, k = (r((n_req, tokens, hk, dk)).astype(np.float32) for _ in range(2))
    v = r((n_req, tokens, hv, dv)).astype(np.float32)
    g_log = -np.abs(r((n_req, tokens, hv))).astype(np.float32)
    beta = rng.uniform(0.1, 0.9, (n_req, tokens, hv)).astype(np.float32)
    pool = (0.2 * r((pool_rows, hv, dk, dv))).astype(np.float32)
    rows = _rows(rng, n_req, tokens, pool_rows, per_token)
    accepted = rng.integers(1, tokens + 1, n_req).astype(np.int32) if per_token else None
    results = []
    for ahead in (False, True):
        pools = pool.copy()
        out, _ = simulate(_step_launch(ahead))(q, k, v, pools, rows, accepted, g_log, beta)
        results.append((np.asarray(out).tobytes(), pools.tobytes()))
    assert results[0] == results[1]


def test_conv_refuses_tables_of_another_launch() -> None:
    rng = np.random.default_rng(53)
    x = rng.standard_normal((40, 1, 16)).astype(np.float32)
    pool = rng.standard_normal((48, 16, 3)).astype(np.float32)
    weight = rng.standard_normal((16, 4)).astype(np.float32)
    rows = np.arange(40, dtype=np.int32)

    def launch(x, pool, weight, rows):
        tables = conv_row_tables(x[:8], pool, weight, rows[:8])  # one group's, for a launch of five
        return gdn_conv_step(x, pool, weight, None, rows, None, "silu", row_tables=tables)

    with pytest.raises(AssertionError, match=r"row_tables made for \d+ groups"):
        simulate(launch)(x, pool, weight, rows)


@pytest.mark.parametrize("tokens", [1, 2])
def test_block_makes_every_row_table_before_its_in_proj(tokens: int) -> None:
    """Every instruction of the row tables (the index loads and the arithmetic on them) comes before the in_proj's
    first one in the block's program: none is left for the nested conv or recurrence to make behind the in_proj's
    stores."""
    import nki_cpu

    hk, hv, dk, dv, e, width, pool_rows, n_req = 1, 2, 16, 16, 128, 4, 24, 3
    channels = 2 * hk * dk + hv * dv
    rng = np.random.default_rng(54)
    r = rng.standard_normal
    weights = [(0.08 * r((e, c))).astype(np.float32) for c in (channels, hv * dv, hv, hv)]
    rows = _rows(rng, n_req, tokens, pool_rows, tokens > 1)
    accepted = np.array([2, 1, 1], np.int32) if tokens > 1 else None
    gdn_nki.block_decode_step(
        r((n_req, tokens, e)).astype(np.float32), *weights, (0.5 * r((channels, width))).astype(np.float32), None,
        (0.3 * r(hv)).astype(np.float32), np.zeros(hv, np.float32), np.ones(dv, np.float32),
        r((pool_rows, channels, width - 1)).astype(np.float32), np.zeros((pool_rows, hv, dk, dv), np.float32), rows,
        accepted,
    )  # fmt: skip
    sites = [[frame[2] for frame in record.site] for record in nki_cpu.last_trace().records]
    tables = [i for i, frames in enumerate(sites) if {"request_rows", "_first_rows", "_live_mask"} & set(frames)]
    in_proj = [i for i, frames in enumerate(sites) if "project_all" in frames]
    assert tables and in_proj
    assert max(tables) < min(in_proj), (max(tables), min(in_proj))
