"""V-major ("K-last") state pools: [P, Hv, Dv, Dk] read and written by the kernels themselves (``state_v_first``).

Every case runs the same call twice, on a K-major pool and on its transpose with ``state_v_first=True``: outputs and
pools must agree bit for bit (the kernels compute on the same [Dk, Dv] tiles; only how a state reaches them
differs, ``gdn_nki.common.state_layout``). Shapes are the serving ones: K = V (Qwen3-Next's 128 = 128, where a pool
in the wrong layout passes every shape rule) and K != V, several decode state tiles a request, a tile's transposes
over two PSUM banks, grid 2, −1 rows, [N, T] rows with ``num_accepted_tokens``, buckets with checkpoints and read
rows, bf16. A V-major flag with a state
of the other shape (K != V) is refused naming the argument, the rule and the fix, and writes nothing.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from bench_scripts import load_bench
from decode_inputs import step_inputs
from gdn_nki import decode_step, prefill_varlen
from gdn_nki.tkg.state_tiles import PSUM_BANK_FP32, tile_layout
from gdn_ref.contract import ContractError


def _transposed(pool: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.swapaxes(pool, -1, -2))


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# (Dk, Dv, Hk, Hv, T, rows, accepted, grid, fused, dtype)
# fmt: off
DECODE_CASES = {
    "K = V, -1 row": (32, 32, 2, 4, 1, [3, -1, 5], None, None, True, "float32"),
    "K != V, [N, T] rows, accepted, grid 2": (32, 64, 2, 4, 2, [[1, 2], [-1, -1], [6, 7]], [2, 1, 1], 2, True,
                                              "float32"),
    "K > V, precomputed gates, bf16": (32, 16, 2, 4, 1, [3, 0, 5], None, 2, False, "bfloat16"),
    "Qwen3-Next dims, two state tiles a request": (128, 128, 4, 8, 1, [2, 0, -1], None, None, True, "bfloat16"),
    "K > V, a store's transposes fill two PSUM banks": (128, 64, 2, 8, 1, [4, -1, 1], None, 2, True, "float32"),
}
# fmt: on


@pytest.mark.parametrize("name", list(DECODE_CASES))
def test_decode_on_a_v_major_pool_equals_the_k_major_pool_bit_for_bit(name: str) -> None:
    dk, dv, hk, hv, tokens, rows, accepted, grid, fused, dtype = DECODE_CASES[name]
    layout = tile_layout(dk, dv, hv)
    if name.startswith("Qwen3-Next"):
        assert layout.tiles == 2  # the case reaches a request's second state tile
    if "two PSUM banks" in name:
        assert layout.rows * layout.partitions > PSUM_BANK_FP32  # turned back to V-major in two banks
    s = step_inputs(7, dtype, N=3, T=tokens, Hk=hk, Hv=hv, Dk=dk, Dv=dv)
    rows = np.array(rows, np.int32)
    accepted = None if accepted is None else np.array(accepted, np.int32)
    k_major, v_major = s.pool.copy(), _transposed(s.pool)
    out_k, _ = decode_step(s.query, s.key, s.value, k_major, rows, accepted, **s.gates(fused), grid=grid)
    out_v, returned = decode_step(s.query, s.key, s.value, v_major, rows, accepted, **s.gates(fused), grid=grid,
                                  state_v_first=True)  # fmt: skip
    assert returned is v_major
    assert _same(out_k, out_v)
    assert _same(k_major, np.swapaxes(v_major, -1, -2).copy())
    assert not _same(k_major, s.pool)  # the call wrote rows: the comparison above is not of two untouched pools


def _prefill_inputs(dk: int, dv: int, tokens: int, seed: int = 1, hk: int = 2, hv: int = 4, rows: int = 8) -> tuple:
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, hk, tokens, dk)).astype(np.float32)
    k = rng.standard_normal((1, hk, tokens, dk))
    k = (k / np.linalg.norm(k, axis=-1, keepdims=True)).astype(np.float32)
    v = rng.standard_normal((1, hv, tokens, dv)).astype(np.float32)
    g = (-rng.uniform(0.01, 0.3, (1, hv, tokens))).astype(np.float32)
    beta = rng.uniform(0.05, 1.0, (1, hv, tokens)).astype(np.float32)
    pool = rng.standard_normal((rows, hv, dk, dv)).astype(np.float32)
    return q, k, v, g, beta, pool


# (Dk, Dv, cu_seqlens, keywords): the trace-time form, grid 2, a bucket with an empty sequence, a -1 row, a
# checkpoint, read rows and a sequence ending at the bucket's last chunk
PREFILL_CASES = {
    "K = V, trace-time form": (32, 32, [0, 130, 300], dict(state_indices=np.array([4, 1]))),
    "K != V, grid 2": (32, 64, [0, 130, 300], dict(state_indices=np.array([4, 1]), grid=2)),
    "K = V, bucket, checkpoints, read rows, -1 row": (
        32, 32, [0, 256, 256, 300, 340],
        dict(state_indices=np.array([4, 6, 1, -1]), bucket=(512, 4), checkpoint_every=128,
             checkpoint_indices=np.array([[0], [-1], [-1], [-1]]), read_indices=np.array([2, -1, 1, -1])),
    ),
    "K < V, bucket ending at its last chunk": (32, 64, [0, 200, 456], dict(state_indices=np.array([3, 5]),
                                                                           bucket=(512, 2))),
}  # fmt: skip


@pytest.mark.parametrize("name", list(PREFILL_CASES))
def test_prefill_on_a_v_major_pool_equals_the_k_major_pool_bit_for_bit(name: str) -> None:
    dk, dv, cu, keywords = PREFILL_CASES[name]
    q, k, v, g, beta, pool = _prefill_inputs(dk, dv, cu[-1])
    cu = np.array(cu)
    k_major, v_major = pool.copy(), _transposed(pool)
    out_k, _ = prefill_varlen(q, k, v, g, beta, cu, scale=dk**-0.5, recurrent_state=k_major, **keywords)
    out_v, returned = prefill_varlen(q, k, v, g, beta, cu, scale=dk**-0.5, recurrent_state=v_major,
                                     state_v_first=True, **keywords)  # fmt: skip
    assert returned is v_major
    assert _same(out_k, out_v)
    assert _same(k_major, np.swapaxes(v_major, -1, -2).copy())
    assert not _same(k_major, pool)


def test_a_new_final_state_comes_back_v_major() -> None:
    q, k, v, g, beta, _ = _prefill_inputs(32, 64, 300)
    cu = np.array([0, 130, 300])
    out_k, final_k = prefill_varlen(q, k, v, g, beta, cu, scale=32**-0.5)
    out_v, final_v = prefill_varlen(q, k, v, g, beta, cu, scale=32**-0.5, state_v_first=True)
    assert final_v.shape == (2, 4, 64, 32)
    assert _same(out_k, out_v) and _same(final_k, np.swapaxes(final_v, -1, -2).copy())


def _rejected(call: Any, argument: str, *words: str) -> None:
    with pytest.raises(ContractError) as error:
        call()
    text = str(error.value)
    assert f"`{argument}`" in text and "[state_layout.v_first]" in text, text
    for word in words:
        assert word in text, text


def test_a_v_major_flag_with_a_k_major_pool_of_other_dims_is_refused_and_writes_nothing() -> None:
    s = step_inputs(3, "float32", N=3, T=1, Dk=32, Dv=16)
    pool = s.pool.copy()  # K-major [P, Hv, 32, 16] with state_v_first=True
    rows = np.array([1, 2, -1], np.int32)
    _rejected(lambda: decode_step(s.query, s.key, s.value, pool, rows, **s.gates(True), state_v_first=True),
              "state_pool", "(V, K) = (16, 32)", "state_v_first=False")  # fmt: skip
    assert _same(pool, s.pool)
    q, k, v, g, beta, pool = _prefill_inputs(32, 16, 200)
    before = pool.copy()
    for keywords in ({}, {"bucket": (256, 2)}):
        _rejected(lambda kw=keywords: prefill_varlen(q, k, v, g, beta, np.array([0, 80, 200]), recurrent_state=pool,
                                                     state_indices=np.array([1, 2]), state_v_first=True, **kw),
                  "recurrent_state", "(V, K) = (16, 32)")  # fmt: skip
    assert _same(pool, before)


def test_the_layout_flag_is_a_bool() -> None:
    s = step_inputs(3, "float32", N=1, T=1, Dk=32, Dv=32)
    with pytest.raises(ContractError, match=r"`state_v_first`.*\[state_layout.flag\]"):
        decode_step(s.query, s.key, s.value, s.pool, np.array([0], np.int32), **s.gates(True), state_v_first="yes")


def test_the_v_major_state_moves_whole_not_element_by_element() -> None:
    """nki-cpu's cost model (``bench/bench_state_layout.py`` at its smoke sizes): the V-major decode step within 1.75×
    the K-major one (1.61× measured: tiles turned on the tensor engine) and a prefill lane, trace-time or bucketed,
    within 1.3× (1.14×, 1.16×). The store's transposes issued at once rather than one step late cost 1.83×, the DMA
    engines' SBUF transposes 3.13×, a state DMA'd element by element (4-byte runs) 98× and 31×."""
    bench = load_bench("bench_state_layout")
    assert bench.measure("decode", 1).ratio < 1.75
    for kernel in ("prefill", "bucket"):
        assert bench.measure(kernel, 128).ratio < 1.3
