"""gdn_tkg and gdn_step against the fp64 decode oracle; the pool's in-place rows, padding and rejections."""

from __future__ import annotations

import numpy as np
import pytest

import gdn_nki
from decode_inputs import DTYPES, StepInputs, assert_within, step_inputs
from gdn_ref import decode_steps, gdn_tkg_reference
from gdn_ref.contract import ContractError


def _tkg_inputs(seed: int, dtype: str, B=2, Hv=4, K=32, V=16):
    rng = np.random.default_rng(seed)
    bh, f32, cd = B * Hv, np.float32, DTYPES[dtype]
    return dict(
        q=rng.standard_normal((bh, K)).astype(cd),
        k=rng.standard_normal((bh, K)).astype(cd),
        v=rng.standard_normal((bh, V)).astype(cd),
        b=rng.standard_normal(bh).astype(f32),
        a=(0.5 * rng.standard_normal(bh)).astype(f32),
        A_log=(0.5 * rng.standard_normal(Hv)).astype(f32),
        dt_bias=(0.3 * rng.standard_normal(Hv)).astype(f32),
        z=rng.standard_normal((bh, V)).astype(cd),
        norm_weight=(1.0 + 0.2 * rng.standard_normal(V)).astype(f32),
        state_in=(0.3 * rng.standard_normal((bh, K, V))).astype(f32),
    )


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tkg_matches_the_oracle(dtype: str) -> None:
    x = _tkg_inputs(1, dtype)
    state_in = x["state_in"].copy()
    out, state = gdn_nki.tkg_simulate(**x)
    ref_out, ref_state = gdn_tkg_reference(**x)
    assert out.dtype == x["q"].dtype and state.dtype == np.float32
    assert_within("out", out, ref_out, dtype)
    assert_within("state", state, ref_state, dtype)
    assert np.array_equal(x["state_in"], state_in)  # state_in is only read


@pytest.mark.parametrize("batch", [3, 1])
def test_tkg_on_a_launch_grid_of_two_splits_its_rows_and_changes_no_bit(batch: int) -> None:
    """``gdn_tkg[2]``: each program runs its share of the batch rows (rows p, p + 2, …; none for program 1 at B = 1)
    and writes only them: out and state bit-identical to one program, and the two programs together move the
    launch's bytes once (each request's state read and written by one program only)."""
    import nki_cpu
    from nki_cpu.cost import estimate

    x = _tkg_inputs(11, "bfloat16", B=batch, Hv=4, K=32, V=32)
    one = gdn_nki.tkg_simulate(**x)
    whole = estimate(nki_cpu.last_trace()).dma_bytes
    two = gdn_nki.tkg_simulate(**x, grid=2)
    shares = [estimate(trace).dma_bytes for trace in nki_cpu.last_traces()]
    assert np.array_equal(one[0], two[0]) and np.array_equal(one[1], two[1])
    ref_out, ref_state = gdn_tkg_reference(**x)
    assert_within("out", two[0], ref_out, "bfloat16")
    assert_within("state", two[1], ref_state, "bfloat16")
    state_row = 4 * 32 * 32 * 4  # one request's state, read or written
    assert len(shares) == 2 and sum(shares) < whole + state_row  # every request by one program
    assert shares[0] > 2 * state_row * (batch - batch // 2 - 0.5)  # program 0 ran rows 0, 2, …
    with pytest.raises(ContractError, match=r"gdn_nki.tkg_simulate rejected[\s\S]*\[launch.grid\]"):
        gdn_nki.tkg_simulate(**x, grid=3)


def test_tkg_rejects_before_launch() -> None:
    x = _tkg_inputs(2, "float32")
    x["v"] = x["v"].astype(np.float64)
    with pytest.raises(ContractError, match=r"gdn_nki.tkg_simulate rejected[\s\S]*`v` dtype float64"):
        gdn_nki.tkg_simulate(**x)


def _expected(x, fused: bool, reads, l2norm: bool, scale: float):
    g, beta = x.oracle_gates(fused)
    return decode_steps(x.query, x.key, x.value, g, beta, scale, x.pool[reads], l2norm=l2norm)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("fused", [False, True])
def test_step_final_state_form_updates_named_rows_only(dtype: str, fused: bool) -> None:
    x = step_inputs(3, dtype)
    indices = np.array([5, -1, 2], np.int32)
    before = x.pool.copy()
    ref_out, ref_states = _expected(x, fused, [5, 0, 2], True, 0.2)
    out, pool = gdn_nki.decode_step(x.query, x.key, x.value, x.pool, indices, **x.gates(fused), scale=0.2,
                                    use_qk_l2norm=True)  # fmt: skip
    assert pool is x.pool and out.dtype == x.query.dtype
    for n, row in ((0, 5), (2, 2)):
        assert_within("out", out[n], ref_out[n], dtype)
        assert_within("state", pool[row], ref_states[n, -1], dtype)
    assert not out[1].any()  # padding: zeros
    untouched = [r for r in range(8) if r not in (5, 2)]
    assert np.array_equal(pool[untouched], before[untouched])  # bit-identical


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_verification_in_chunk_form_matches_the_oracle_at_qwen3_next_heads(dtype: str, monkeypatch) -> None:
    """[N] rows with T = 4 at Qwen3-Next's heads (16 / 32, D 128) verify in chunk form (``tkg.chunk``: every
    product against the state before the 4 tokens, the state written once): outputs and final states within the
    tolerance table of the fp64 oracle, a padding request's outputs zero, rows not named bit-identical; and as
    close to the token-by-token step as its own errors allow."""
    import gdn_nki.tkg.pipeline as pipeline

    prepared = []
    chunked = pipeline.prepare_chunk
    monkeypatch.setattr(pipeline, "prepare_chunk", lambda *a: prepared.append(1) or chunked(*a))
    x = step_inputs(21, dtype, N=3, T=4, Hk=16, Hv=32, Dk=128, Dv=128, P=5)
    x.pool *= 0.3
    indices = np.array([3, -1, 0], np.int32)
    before = x.pool.copy()
    ref_out, ref_states = _expected(x, True, [3, 0, 0], True, 128**-0.5)
    out, pool = gdn_nki.decode_step(x.query, x.key, x.value, x.pool, indices, **x.gates(True), use_qk_l2norm=True)
    assert len(prepared) == 3  # every request, the padding one too, in chunk form
    for n, row in ((0, 3), (2, 0)):
        assert_within("out", out[n], ref_out[n], dtype)
        assert_within("state", pool[row], ref_states[n, -1], dtype)
    assert not out[1].any()
    assert np.array_equal(pool[[1, 2, 4]], before[[1, 2, 4]])
    monkeypatch.setattr(pipeline, "uses_chunk_form", lambda *a: False)
    token_pool = before.copy()
    token_out, _ = gdn_nki.decode_step(x.query, x.key, x.value, token_pool, indices, **x.gates(True),
                                       use_qk_l2norm=True)  # fmt: skip
    assert len(prepared) == 3  # the token-by-token step prepared no chunk
    bound = 1e-5 if dtype == "float32" else 2e-2  # fp32 rounding; bf16: one rounding of the output
    for got, want in ((pool[[0, 3]], token_pool[[0, 3]]), (out[[0, 2]], token_out[[0, 2]])):
        got, want = got.astype(np.float64), want.astype(np.float64)
        assert np.abs(got - want).max() <= bound * np.abs(want).max()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_step_keeps_every_token_state_and_resumes_from_the_accepted_one(dtype: str) -> None:
    x = step_inputs(4, dtype, T=3, P=12)
    indices = np.array([[4, 1, 9], [-1, -1, -1], [0, 6, 7]], np.int32)
    accepted = np.array([2, 0, 3], np.int32)
    before = x.pool.copy()
    ref_out, ref_states = _expected(x, False, [1, 0, 7], False, 0.3)
    out, pool = gdn_nki.decode_step(x.query, x.key, x.value, x.pool, indices, accepted, **x.gates(False),
                                    scale=0.3)  # fmt: skip
    for n in (0, 2):
        assert_within("out", out[n], ref_out[n], dtype)
        for t in range(3):
            assert_within("state", pool[indices[n, t]], ref_states[n, t], dtype)
    untouched = [r for r in range(12) if r not in indices[[0, 2]]]
    assert np.array_equal(pool[untouched], before[untouched])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_several_state_tiles_per_request_match_the_oracle(dtype: str) -> None:
    """Qwen3-Next's decode head dims (Dk = Dv = 128) with 12 value heads on 6 key heads: a request's state is three
    128-partition tiles of one block (``state_tiles``), each stepped with its own block operands, stored to its
    own part of the row; per-token rows, one request accepting its whole draft, one padding."""
    from gdn_nki.tkg.state_tiles import tile_layout

    x = step_inputs(15, dtype, N=3, T=2, Hk=6, Hv=12, Dk=128, Dv=128, P=7)
    layout = tile_layout(128, 128, 12)
    assert layout.tiles == layout.tiles_per_block == 3, "the sizes no longer reach several tiles of one block"
    indices = np.array([[4, 0], [-1, -1], [2, 6]], np.int32)
    accepted = np.array([1, 0, 2], np.int32)  # request 2 resumes from the state after its whole draft (row 6)
    before = x.pool.copy()
    ref_out, ref_states = _expected(x, True, [4, 0, 6], True, 0.25)
    out, pool = gdn_nki.decode_step(x.query, x.key, x.value, x.pool, indices, accepted, **x.gates(True), scale=0.25,
                                    use_qk_l2norm=True)  # fmt: skip
    for n in (0, 2):
        assert_within("out", out[n], ref_out[n], dtype)
        for t in range(2):
            assert_within("state", pool[indices[n, t]], ref_states[n, t], dtype)
    assert not out[1].any()
    untouched = [r for r in range(7) if r not in indices[[0, 2]]]
    assert np.array_equal(pool[untouched], before[untouched])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_qk_l2norm_keeps_its_eps_on_small_keys(dtype: str) -> None:
    """Raw q and k of norms 3e-4–3e-3, where the eps under the root (``gdn_ref.decode.L2NORM_EPS``, 1e-6) is 10 % to
    10× Σx²: normalized they have norms 0.3–0.95, not 1 (at unit norms the eps moves nothing a tolerance sees)."""
    x = step_inputs(16, dtype, N=2, T=2)
    rng = np.random.default_rng(16)
    for name in ("query", "key"):
        raw = getattr(x, name).astype(np.float64)
        norms = rng.uniform(3e-4, 3e-3, (*raw.shape[:3], 1))
        setattr(x, name, (raw / np.linalg.norm(raw, axis=-1, keepdims=True) * norms).astype(DTYPES[dtype]))
    ref_out, ref_states = _expected(x, False, [3, 5], True, 0.3)
    out, pool = gdn_nki.decode_step(x.query, x.key, x.value, x.pool, np.array([3, 5], np.int32), **x.gates(False),
                                    scale=0.3, use_qk_l2norm=True)  # fmt: skip
    for n, row in enumerate((3, 5)):
        assert_within("out", out[n], ref_out[n], dtype)
        assert_within("state", pool[row], ref_states[n, -1], dtype)


@pytest.mark.parametrize(
    ("indices", "rule"),
    [([5, 5, 2], "state_indices.distinct"), ([5, 8, 2], "state_indices.range"), ([5, -2, 2], "state_indices.range")],
)
def test_step_rejections_leave_the_pool_untouched(indices, rule) -> None:
    x = step_inputs(5, "float32")
    before = x.pool.copy()
    with pytest.raises(ContractError, match=rf"gdn_nki.decode_step rejected[\s\S]*\[{rule}\]"):
        gdn_nki.decode_step(x.query, x.key, x.value, x.pool, np.array(indices, np.int32), **x.gates(False))
    assert np.array_equal(x.pool, before)


def test_step_rejects_nan_in_a_read_row_but_not_elsewhere() -> None:
    x = step_inputs(6, "float32")
    x.pool[3, 0, 0, 0] = np.nan  # a free slot: never read
    gdn_nki.decode_step(x.query, x.key, x.value, x.pool, np.array([5, -1, 2], np.int32), **x.gates(False))
    x.pool[5, 1, 2, 3] = np.inf
    before = x.pool.copy()
    with pytest.raises(ContractError, match=r"recurrent_state.finite"):
        gdn_nki.decode_step(x.query, x.key, x.value, x.pool, np.array([5, -1, 2], np.int32), **x.gates(False))
    assert np.array_equal(x.pool, before, equal_nan=True)


def test_failed_launch_restores_the_rows_it_wrote(monkeypatch) -> None:
    x = step_inputs(7, "float32")
    before = x.pool.copy()
    real = gdn_nki.host.decode.backend.simulate

    def failing(kernel):
        def launch(*args, **kwargs):
            real(kernel)(*args, **kwargs)  # the kernel writes its rows ...
            raise RuntimeError("device fault after the stores")  # ... and then the launch fails

        return launch

    monkeypatch.setattr(gdn_nki.host.decode.backend, "simulate", failing)
    with pytest.raises(RuntimeError, match="device fault"):
        gdn_nki.decode_step(x.query, x.key, x.value, x.pool, np.array([5, -1, 2], np.int32), **x.gates(False))
    assert np.array_equal(x.pool, before)


@pytest.mark.nki_cpu_only
def test_rows_are_device_data_and_padding_transfers_nothing() -> None:
    """Different rows, padding included, same program (the rows are never trace-time values); a padding request's
    pool transfers are skipped by the DMA (row -1 is outside the pool), so no other row is read or written and
    every row but the live request's keeps its bits, NaN included."""
    import nki_cpu

    x = step_inputs(8, "float32", N=2, T=1)
    counts = []
    for rows in ([1, 6], [6, 0], [7, -1]):
        pool = x.pool.copy()
        pool[np.arange(len(pool)) != 7] = np.nan  # what padding might read instead of nothing
        out, _ = gdn_nki.decode_step(x.query, x.key, x.value, pool, np.array(rows, np.int32), **x.gates(False),
                                     check_values=False)  # fmt: skip
        trace = nki_cpu.last_trace()
        counts.append((trace.static_instructions, len(trace.records)))
    assert counts[0] == counts[1] == counts[2]
    assert np.isfinite(out[0]).all() and np.isfinite(pool[7]).all()
    assert not out[1].any()
    assert np.isnan(pool[np.arange(len(pool)) != 7]).all()


def test_a_launch_grid_splits_requests_and_changes_nothing() -> None:
    x = step_inputs(9, "float32", N=3, T=2)
    rows = np.array([[5, 1], [-1, -1], [2, 7]], np.int32)
    pools = [x.pool.copy(), x.pool.copy()]
    outs = [gdn_nki.decode_step(x.query, x.key, x.value, pool, rows, **x.gates(True), grid=grid)[0]
            for pool, grid in zip(pools, (None, 2), strict=True)]  # fmt: skip
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(pools[0], pools[1])
    assert not np.array_equal(pools[0], x.pool)
    with pytest.raises(ContractError, match=r"gdn_nki.decode_step rejected[\s\S]*\[launch.grid\]"):
        gdn_nki.decode_step(x.query, x.key, x.value, pools[0], rows, **x.gates(True), grid=3)


@pytest.mark.parametrize("per_token", [False, True])
def test_a_compiled_request_loop_matches_the_oracle_past_its_last_full_group(per_token: bool, monkeypatch) -> None:
    """N = 11 runs as a compiled loop of two 8-request iterations (``step.REQUESTS_PER_ITERATION`` set to 8 to keep
    the test small): the second iteration's slots past N read and write nothing, padding inside a group
    included."""
    import gdn_nki.tkg.step

    monkeypatch.setattr(gdn_nki.tkg.step, "REQUESTS_PER_ITERATION", 8)
    _check_request_loop(step_inputs(12, "float32", N=11, T=2, P=45), [3, 17, -1, 0, 8, 29, 5, 12, 1, -1, 20], per_token)


def test_a_launch_grid_of_two_runs_each_programs_compiled_request_loop() -> None:
    """At ``grid=2`` each program's share of the requests (every other one) runs as a compiled loop when it is more
    than one iteration's group: 2·(group + 1) + 1 requests give each program two iterations, the second partial,
    and a loop iteration's requests must be the program's own (its offset and stride), not the first program's."""
    import gdn_nki.tkg.step

    group = gdn_nki.tkg.step.REQUESTS_PER_ITERATION
    n = 2 * (group + 1) + 1
    rng = np.random.default_rng(14)
    reads = [int(r) for r in rng.permutation(n + 4)[:n]]
    for padding in rng.choice(n, 4, replace=False):
        reads[padding] = -1
    _check_request_loop(step_inputs(14, "float32", N=n, T=1, P=n + 4), reads, per_token=False, grid=2)


def _check_request_loop(x: StepInputs, reads: list[int], per_token: bool, grid: int | None = None) -> None:
    """Decode ``x`` (fused gating, in-kernel l2norm) with request n reading row ``reads[n]`` (-1: padding): with
    ``per_token`` (T = 2), token 0's state written over the row read and token 1's to a row of its own past the
    rows read; every live request's outputs and rows against the oracle, padding outputs zero, every other row
    bit-identical."""
    n_req, spare = len(reads), x.pool.shape[0] - len(reads)
    if per_token:
        indices = np.array([[r, spare + n] if r >= 0 else [-1, -1] for n, r in enumerate(reads)], np.int32)
        accepted = np.full(n_req, 1, np.int32)
    else:
        indices, accepted = np.array(reads, np.int32), None
    assert len(set(indices[indices >= 0].ravel())) == (indices >= 0).sum()
    before = x.pool.copy()
    ref_out, ref_states = _expected(x, True, [max(r, 0) for r in reads], True, 0.3)
    out, pool = gdn_nki.decode_step(x.query, x.key, x.value, x.pool, indices, accepted, **x.gates(True), scale=0.3,
                                    use_qk_l2norm=True, grid=grid)  # fmt: skip
    written = set()
    for n, row in enumerate(reads):
        if row < 0:
            assert not out[n].any()
            continue
        assert_within("out", out[n], ref_out[n], "float32")
        targets = indices[n] if per_token else [row, row]
        for t, target in enumerate(targets):
            assert_within("state", pool[target], ref_states[n, t if per_token else -1], "float32")
            written.add(int(target))
    untouched = [r for r in range(len(pool)) if r not in written]
    assert np.array_equal(pool[untouched], before[untouched])


@pytest.mark.nki_cpu_only
def test_the_program_does_not_grow_with_the_requests(monkeypatch) -> None:
    """Past one iteration of the compiled request loop (8 requests here, to keep the test small), N changes only the
    loop's trip count."""
    import gdn_nki.tkg.step
    import nki_cpu

    monkeypatch.setattr(gdn_nki.tkg.step, "REQUESTS_PER_ITERATION", 8)
    sizes = {}
    for n in (9, 16, 40):
        x = step_inputs(13, "float32", N=n, T=1, P=n)
        gdn_nki.decode_step(x.query, x.key, x.value, x.pool, np.arange(n, dtype=np.int32), **x.gates(False))
        trace = nki_cpu.last_trace()
        sizes[n] = (trace.static_instructions, len(trace.records))
    assert sizes[9][0] == sizes[16][0] == sizes[40][0]
    assert sizes[9][1] == sizes[16][1] < sizes[40][1]


def test_a_padding_requests_rows_are_one_past_their_tensors_end() -> None:
    """Issue 40: no page says how ``oob_mode.skip`` reads a negative run-time offset, so every row a request does
    not have is the row one past its tensor's end: the pool's P for a -1 index (and every spare slot), ``out``'s N
    for a padding request's output row and for a live request's zeros' row."""
    if gdn_nki.common.backend.USING_REAL_NKI:
        pytest.skip("calls the kernel's row computation through nki-cpu")
    import nki_cpu
    from gdn_nki.common.request_rows import request_rows
    from nki_cpu import isa as nisa
    from nki_cpu import language as nl

    pool_rows, requests, slots = 10, 3, 5

    @nki_cpu.jit
    def rows_of(indices):
        found = nl.ndarray((4, slots), dtype=nl.int32, buffer=nl.shared_hbm)
        for k, tile in enumerate(request_rows(indices, None, requests, 1, slots, pool_rows)):
            nisa.dma_copy(dst=found[k : k + 1, :], src=tile)
        return found

    found = nki_cpu.simulate(rows_of)(np.array([4, -1, 7], np.int32))
    np.testing.assert_array_equal(
        found,
        [[4, 10, 7, 10, 10],  # pool rows of the indices (slots 3, 4: spare)
         [4, 10, 7, 10, 10],  # the rows read
         [0, 3, 2, 3, 3],  # out rows: the request's own, N where padding
         [3, 1, 3, 3, 3]],  # zeros' rows: the padding request's own, N elsewhere
    )  # fmt: skip


def test_small_value_dims_with_several_tokens_fit_psum() -> None:
    """Dv = 16 puts 32 Dk rows on a partition (2 KiB runs), so a token's selection products are 32 PSUM tiles;
    held for 4 tokens of two requests in flight they overflowed PSUM's 16 KiB per partition (found by gdn-spec's
    wider decode draws). Each is now masked into SBUF as soon as it is made."""
    x = step_inputs(0, "float32", N=2, T=4, Hk=2, Hv=6, Dk=64, Dv=16, P=8)
    indices = np.arange(8, dtype=np.int32).reshape(2, 4)
    accepted = np.array([4, 2], np.int32)
    ref_out, ref_states = _expected(x, False, [3, 5], False, 0.25)
    out, pool = gdn_nki.decode_step(x.query, x.key, x.value, x.pool, indices, accepted, **x.gates(False),
                                    scale=0.25)  # fmt: skip
    for n in range(2):
        assert_within("out", out[n], ref_out[n], "float32")
        for t in range(4):
            assert_within("state", pool[indices[n, t]], ref_states[n, t], "float32")


def test_fewer_requests_than_programs_leaves_a_program_idle() -> None:
    """One request at launch grid 2: program 1 has none (it divided by its zero-sized group before; found by the
    decode family run at launch grid 2, ``gdn_nki.conformance:decode_step_on_two_programs``)."""
    x = step_inputs(1, "float32", N=1, T=1)
    one = gdn_nki.decode_step(x.query, x.key, x.value, x.pool.copy(), np.array([3], np.int32), **x.gates(False))
    two = gdn_nki.decode_step(x.query, x.key, x.value, x.pool.copy(), np.array([3], np.int32), **x.gates(False),
                              grid=2)  # fmt: skip
    assert np.array_equal(one[0], two[0]) and np.array_equal(one[1], two[1])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_verification_past_128_token_head_rows_matches_the_oracle(dtype: str) -> None:
    """Qwen3.5's 64 value heads verifying 3 drafts: a request's outputs are T·Hv = 192 (token, head) rows, more
    than the partitions, so the padding request's zeros are folded into fewer rows (the [T·Hv, Dv] tile of zeros
    failed the trace with a partition dimension of 192, whatever the rows named)."""
    x = step_inputs(16, dtype, N=3, T=3, Hk=4, Hv=64, Dk=32, Dv=32, P=7)
    indices = np.array([[4, 0, 3], [-1, -1, -1], [2, 6, 5]], np.int32)
    accepted = np.array([2, 0, 3], np.int32)
    before = x.pool.copy()
    ref_out, ref_states = _expected(x, True, [0, 0, 5], True, 0.25)
    out, pool = gdn_nki.decode_step(x.query, x.key, x.value, x.pool, indices, accepted, **x.gates(True), scale=0.25,
                                    use_qk_l2norm=True)  # fmt: skip
    for n in (0, 2):
        assert_within("out", out[n], ref_out[n], dtype)
        for t in range(3):
            assert_within("state", pool[indices[n, t]], ref_states[n, t], dtype)
    assert not out[1].any()
    untouched = [r for r in range(7) if r not in indices[[0, 2]]]
    assert np.array_equal(pool[untouched], before[untouched])
