"""Compiled loops (``nl.fori_loop``): one body in the program, traced once, every iteration executed.

The static count (what the program holds) counts a compiled loop's body once; the dynamic count (the trace) every
executed instruction. Unrolled loops (Python ``range`` and the deprecated ``affine_range``/``sequential_range``)
count every iteration in both. A body whose instructions or tiles depend on the iteration, or that reads a tile an
earlier iteration allocated, is rejected: the real tracer runs the body's Python once (NKI 0.7, SDK 2.33).
"""

from __future__ import annotations

import numpy as np
import pytest

import nki_cpu
from nki_cpu import checks
from nki_cpu import isa as nisa
from nki_cpu import language as nl
from nki_cpu.cost import estimate

ROWS, COLS, TILES = 128, 64, 5


def _tile(hbm, index):
    """HBM tile ``index`` of a [TILES, ROWS, COLS] tensor, addressed by the run-time iteration value."""
    return hbm.ap(pattern=[[COLS, ROWS], [1, COLS]], scalar_offset=index, indirect_dim=0)


def _loaded(x, index):
    """A fresh SBUF tile holding x's tile ``index``."""
    t = nl.ndarray((ROWS, COLS), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=_tile(x, index))
    return t


def _scale_tiles(x, out, index) -> None:
    """The loop body: out[tile index] = 2 · x[tile index]; the index only offsets the HBM accesses."""
    t = _loaded(x, index)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
    nisa.dma_copy(dst=_tile(out, index), src=t)


@nki_cpu.jit
def doubled_fori(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.fori_loop(0, x.shape[0], lambda i: _scale_tiles(x, out, i))
    return out


@nki_cpu.jit
def doubled_fori_ds(x):
    """The same body addressing HBM with nl.ds(i, 1) on the tile axis, the iteration value stepped by 1."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)

    def body(i):
        t = nl.ndarray((1, ROWS, COLS), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[nl.ds(i, 1)])
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
        nisa.dma_copy(dst=out[nl.ds(i, 1)], src=t)

    nl.fori_loop(0, x.shape[0], body)
    return out


@nki_cpu.jit
def doubled_sequential_range(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.sequential_range(x.shape[0]):
        _scale_tiles(x, out, i)
    return out


@nki_cpu.jit
def body_depends_on_iteration(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)

    calls = []

    def body(i):
        _scale_tiles(x, out, i)
        calls.append(i)
        if len(calls) == 3:  # Python state that changes per iteration: the tracer would run this body once
            _scale_tiles(x, out, i)

    nl.fori_loop(0, x.shape[0], body)
    return out


@nki_cpu.jit
def nested_then_straight(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.fori_loop(0, 2, lambda _: nl.fori_loop(0, x.shape[0], lambda i: _scale_tiles(x, out, i)))
    nl.fori_loop(0, 1, lambda i: _scale_tiles(x, out, i))
    _scale_tiles(x, out, 0)
    return out


def _input() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((TILES, ROWS, COLS)).astype(np.float32)


BODY = 3  # load, multiply, store


@pytest.mark.parametrize("kernel", [doubled_fori, doubled_fori_ds], ids=["ap_scalar_offset", "ds"])
def test_compiled_loop_runs_every_iteration_and_holds_its_body_once(kernel) -> None:
    x = _input()
    np.testing.assert_array_equal(nki_cpu.simulate(kernel)(x), 2 * x)
    trace = nki_cpu.last_trace()
    assert len(trace.records) == TILES * BODY
    assert trace.static_instructions == BODY
    report = estimate(trace)
    assert (report.instructions, report.static_instructions) == (TILES * BODY, BODY)
    assert f"{TILES * BODY} instructions executed, {BODY} in the program" in str(report)


def test_unrolled_loop_holds_every_iteration() -> None:
    """sequential_range is Python range since NKI 0.7 (SDK 2.33): unrolled, so static = dynamic."""
    x = _input()
    np.testing.assert_array_equal(nki_cpu.simulate(doubled_sequential_range)(x), 2 * x)
    trace = nki_cpu.last_trace()
    assert trace.static_instructions == len(trace.records) == TILES * BODY


def test_a_body_whose_instructions_depend_on_the_iteration_is_rejected() -> None:
    with pytest.raises(
        AssertionError, match=r"fori_loop body: iteration 2 issued 6 instructions, iteration 0 issued 3"
    ):
        nki_cpu.simulate(body_depends_on_iteration)(_input())


def test_nested_loops_and_an_early_break_count_each_body_once() -> None:
    x = _input()
    nki_cpu.simulate(nested_then_straight)(x)
    trace = nki_cpu.last_trace()
    assert len(trace.records) == (2 * TILES + 1 + 1) * BODY
    # the nested body once, the one-iteration loop's body, and the straight-line tail
    assert trace.static_instructions == 3 * BODY
    assert not trace.records[-1].repeat


@nki_cpu.jit
def keeps_a_dead_tile(x):
    """Tile ``first`` is dead after its store, but a Python reference keeps it until the kernel returns."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    first = nl.ndarray((ROWS, COLS), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=first, src=x[0])
    nisa.dma_copy(dst=out[0], src=first)
    second = nl.ndarray((ROWS, COLS), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=second, src=x[1])
    nisa.dma_copy(dst=out[1], src=second)
    return out


def test_liveness_high_water_counts_a_tile_from_its_first_to_its_last_use() -> None:
    nki_cpu.simulate(keeps_a_dead_tile)(_input())
    trace = nki_cpu.last_trace()
    tile_bytes = COLS * 4
    assert trace.sbuf_high_water == 2 * tile_bytes, "Python references keep both tiles"
    assert trace.liveness_high_water("sbuf") == tile_bytes, "their uses do not overlap"
    assert trace.liveness_high_water("psum") == 0


# --- what a body traced once can and cannot do ---------------------------------------------------------------------
@nki_cpu.jit
def running_sum(x):
    """out[i] = x[0] + … + x[i]: the running sum crosses iterations in a tile allocated before the loop."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    total = nl.ndarray((ROWS, COLS), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=total, value=0.0)

    def body(i):
        nisa.tensor_tensor(dst=total, data1=total, data2=_loaded(x, i), op=nl.add)
        nisa.dma_copy(dst=_tile(out, i), src=total)

    nl.fori_loop(0, x.shape[0], body)
    return out


@nki_cpu.jit
def running_sum_in_a_body_tile(x):
    """The same sum carried in a tile the previous iteration allocated: wrong on hardware (one allocation)."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    carried = []

    def body(i):
        t = _loaded(x, i)
        if carried:
            nisa.tensor_tensor(dst=t, data1=t, data2=carried.pop(), op=nl.add)
        carried.append(t)

    nl.fori_loop(0, x.shape[0], body)
    nisa.dma_copy(dst=out[0], src=carried[0])
    return out


@nki_cpu.jit
def reads_an_early_iteration_after_the_loop(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    made = []

    def body(i):
        made.append(_loaded(x, i))

    nl.fori_loop(0, x.shape[0], body)
    nisa.dma_copy(dst=out[1], src=made[-1])  # the last iteration's tile: what the program holds after the loop
    nisa.dma_copy(dst=out[0], src=made[0])
    return out


@nki_cpu.jit
def rotates_tiles_by_python_state(x):
    """Two pre-loop tiles used alternately by a Python counter: one traced body would use one of them."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    slots = [nl.ndarray((ROWS, COLS), dtype=nl.float32, buffer=nl.sbuf) for _ in range(2)]
    calls = []

    def body(i):
        t = slots[len(calls) % 2]
        calls.append(i)
        nisa.dma_copy(dst=t, src=_tile(x, i))
        nisa.dma_copy(dst=_tile(out, i), src=t)

    nl.fori_loop(0, x.shape[0], body)
    return out


def test_a_value_carried_in_a_tile_allocated_before_the_loop_crosses_iterations() -> None:
    x = _input()
    np.testing.assert_allclose(nki_cpu.simulate(running_sum)(x), np.cumsum(x, axis=0), rtol=1e-6)
    assert nki_cpu.last_trace().static_instructions == 1 + 3


def test_reading_a_tile_an_earlier_iteration_allocated_is_rejected() -> None:
    with pytest.raises(AssertionError, match=r"tensor_tensor: touches a tile allocated in iteration 0 .* iteration 1"):
        nki_cpu.simulate(running_sum_in_a_body_tile)(_input())


def test_after_the_loop_only_the_last_iterations_tiles_are_readable() -> None:
    with pytest.raises(
        AssertionError, match=r"allocated in iteration 0 of a compiled loop that ended after iteration 4"
    ):
        nki_cpu.simulate(reads_an_early_iteration_after_the_loop)(_input())


def test_a_body_choosing_tiles_by_python_state_is_rejected() -> None:
    with pytest.raises(
        AssertionError, match=r"fori_loop body: iteration 1 issued 2 instructions, .* differ at instruction 0"
    ):
        nki_cpu.simulate(rotates_tiles_by_python_state)(_input())


def test_the_iteration_value_is_a_run_time_scalar() -> None:
    """Arithmetic is traced (here: evaluated) and stays a scalar; Python cannot read it, index with it or branch on
    it; loop bounds must be 32-bit (nki.isa.NkiScalar, nki.language.fori_loop, SDK 2.33)."""
    seen = []

    def body(i):
        assert isinstance(i, nisa.NkiScalar)
        j = 3 * (i + 1) - 2
        seen.append(nl.ds(j, 4).as_slice())
        for use in (int, bool, lambda v: [0, 1][v]):
            with pytest.raises(TypeError, match="NkiScalar"):
                use(i)
        with pytest.raises(TypeError, match="cannot be used"):
            bool(i < 3)

    nl.fori_loop(0, 2, body)
    assert seen == [slice(1, 5), slice(4, 8)]
    assert (nisa.NkiScalar(2**31 - 1) + 1).value == -(2**31), "32-bit arithmetic wraps"
    with pytest.raises(checks.RuleViolationError, match="must be a 32-bit value"):
        nl.fori_loop(0, nisa.NkiScalar(4, "int64"), lambda i: None)
    with pytest.raises(TypeError, match="positive trace-time int"):
        nl.fori_loop(0, 4, lambda i: None, step=0)
    assert not hasattr(nl, "dynamic_range"), "removed in NKI 0.7.0 (SDK 2.33)"


def test_scalar_load_and_store_round_trip_at_the_tiles_width() -> None:
    tile = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.memset(dst=tile, value=7)
    scalar = nisa.scalar_load(tile) * 4 + 1
    out = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.scalar_store(out, scalar)
    assert int(out.read()[0, 0]) == 29
    with pytest.raises(checks.RuleViolationError, match=r"must be nl\.int32 or nl\.int64, got float32"):
        nisa.scalar_load(nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf))
    with pytest.raises(TypeError, match="must be an NkiScalar"):
        nisa.scalar_store(out, 29)
    with pytest.raises(TypeError, match="1x1 int32 tile"):
        nisa.scalar_store(nl.ndarray((1, 1), dtype=nl.int64, buffer=nl.sbuf), scalar)


def test_scalar_load_from_a_table_column_the_iteration_addresses_is_one_body() -> None:
    """A compiled loop reading entry i of an SBUF table (``scalar_load`` of ``table[:, nl.ds(i, 1)]``) and using it
    as a DMA row index issues one body: the load's operand is the table, not the resolved column."""

    def kernel(x, table):
        out = nl.ndarray((3, 8), x.dtype, buffer=nl.shared_hbm)
        entries = nl.ndarray((1, 3), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=entries, src=table)
        row = nl.ndarray((1, 8), x.dtype, buffer=nl.sbuf)

        def body(i):
            index = nisa.scalar_load(entries[:, nl.ds(i, 1)])
            nisa.dma_copy(dst=row, src=x[nl.ds(index, 1), :])
            nisa.dma_copy(dst=out[nl.ds(i, 1), :], src=row)

        nl.fori_loop(0, 3, body)
        return out

    x = np.arange(64, dtype=np.float32).reshape(8, 8)
    got = nki_cpu.simulate(kernel)(x, np.array([[5, 0, 7]], np.int32))
    np.testing.assert_array_equal(got, x[[5, 0, 7]])
    assert nki_cpu.last_trace().static_instructions == 4


# --- the body is one program: static offsets and immediates too, also at zero trips -----------------------------------
def _rows_kernel(body_of):
    """A kernel copying rows of x [4, 8] into out through a fori_loop whose body ``body_of(x, out, rows)`` makes."""

    def kernel(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        rows = nl.ndarray((1, 8), x.dtype, buffer=nl.sbuf)
        nl.fori_loop(0, 4, body_of(x, out, rows))
        return out

    return kernel


def test_a_body_advancing_python_state_is_rejected() -> None:
    def body_of(x, out, rows):
        row = iter(range(4))

        def body(i):
            r = next(row)  # Python state: the traced-once body would copy row 0 every time
            nisa.dma_copy(dst=rows, src=x[r : r + 1, :])
            nisa.dma_copy(dst=out[r : r + 1, :], src=rows)

        return body

    with pytest.raises(checks.NkiValidationError, match=r"fori_loop body: iteration 1 .* differ at instruction 0"):
        nki_cpu.simulate(_rows_kernel(body_of))(np.zeros((4, 8), np.float32))


def test_a_body_addressing_by_the_iteration_value_is_one_program() -> None:
    def body_of(x, out, rows):
        def body(i):
            nisa.dma_copy(dst=rows, src=x[nl.ds(i, 1), :])
            nisa.dma_copy(dst=out[nl.ds(i, 1), :], src=rows)

        return body

    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    np.testing.assert_array_equal(nki_cpu.simulate(_rows_kernel(body_of))(x), x)
    assert nki_cpu.last_trace().static_instructions == 2


def test_a_body_whose_immediates_change_is_rejected() -> None:
    scale = iter([1.0, 2.0, 3.0, 4.0])

    def kernel(x):
        t = nl.load(x)
        nl.fori_loop(0, 4, lambda i: nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=next(scale)))

    with pytest.raises(checks.NkiValidationError, match="fori_loop body: iteration 1"):
        nki_cpu.simulate(kernel)(np.ones((4, 8), np.float32))


def test_a_zero_trip_body_is_still_checked_and_changes_nothing() -> None:
    def kernel(x, n):
        t = nl.load(x)
        bound = nisa.register_alloc()
        nisa.register_load(bound, n)
        nl.fori_loop(
            0, bound, lambda i: nisa.tensor_tensor(dst=t, data1=t, data2=t, op=nl.add, engine=nisa.scalar_engine)
        )

    with pytest.raises(checks.RuleViolationError, match="tensor_tensor"):
        nki_cpu.simulate(kernel)(np.ones((4, 8), np.float32), np.zeros((1,), np.int32))

    def doubling(x, n):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x)
        bound = nisa.register_alloc()
        nisa.register_load(bound, n)
        nl.fori_loop(0, bound, lambda i: nisa.tensor_tensor(dst=t, data1=t, data2=t, op=nl.add))
        nl.store(out, t)
        return out

    x = np.ones((4, 8), np.float32)
    np.testing.assert_array_equal(nki_cpu.simulate(doubling)(x, np.zeros((1,), np.int32)), x)
    zero = nki_cpu.last_trace()
    np.testing.assert_array_equal(nki_cpu.simulate(doubling)(x, np.full((1,), 3, np.int32)), 8 * x)
    three = nki_cpu.last_trace()
    assert zero.static_instructions == three.static_instructions == len(zero.records) + 1
    assert zero.fingerprint() == three.fingerprint()


@pytest.mark.parametrize("bound", [2.7, True, "3"])
def test_a_loop_bound_that_is_not_an_int_is_rejected(bound) -> None:
    with pytest.raises(checks.RuleViolationError, match="fori_loop upper must be an int"):
        nl.fori_loop(0, bound, lambda i: None)


def test_a_relaxed_float_bound_warns() -> None:
    trips = []

    def kernel():
        nl.fori_loop(0, 2.7, lambda i: trips.append(1))

    with pytest.warns(RuntimeWarning, match="fori_loop upper.*relaxed"):
        nki_cpu.simulate(kernel, relax={"loop_bounds"})()
    assert len(trips) == 2


# --- while_loop: a compiled loop with the same checks ----------------------------------------------------------------
def _countdown(counter_values, body_extra=None):
    """A kernel counting a register down from n to 0 through a tile, one tensor_scalar per trip."""

    def kernel(x, n):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x)
        count = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=count, src=n)
        r = nisa.register_alloc()
        nisa.register_load(r, count)

        def body(cond):
            nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
            nisa.tensor_scalar(dst=count, data=count, op0=nl.subtract, operand0=1.0)
            if body_extra is not None:
                body_extra(t)
            following = nisa.register_alloc()
            nisa.register_load(following, count)
            return following

        nl.while_loop(r, body)
        nl.store(out, t)
        return out

    return kernel


def test_while_loop_is_a_compiled_loop() -> None:
    x = np.ones((4, 8), np.float32)
    got = nki_cpu.simulate(_countdown(None))(x, np.full((1, 1), 3, np.int32))
    np.testing.assert_array_equal(got, 8 * x)
    trace = nki_cpu.last_trace()
    repeats = sum(r.repeat for r in trace.records)
    assert repeats == 2 * 3 and trace.static_instructions == len(trace.records) - repeats
    np.testing.assert_array_equal(nki_cpu.simulate(_countdown(None))(x, np.zeros((1, 1), np.int32)), x)
    assert nki_cpu.last_trace().fingerprint() == trace.fingerprint()


def test_while_loop_body_must_be_the_same_each_iteration() -> None:
    calls = iter(range(10))

    def extra(t):
        if next(calls) == 1:
            nisa.memset(dst=t, value=0.0)

    with pytest.raises(checks.NkiValidationError, match="while_loop body: iteration 1"):
        nki_cpu.simulate(_countdown(None, extra))(np.ones((4, 8), np.float32), np.full((1, 1), 3, np.int32))


def test_while_loop_inside_no_reorder_is_rejected() -> None:
    def kernel():
        with nl.no_reorder():
            nl.while_loop(nisa.register_alloc(0), lambda r: r)

    with pytest.raises(checks.RuleViolationError, match=r"while_loop inside nl\.no_reorder"):
        nki_cpu.simulate(kernel)()


# --- Trace.fingerprint: one compiled program, however its run-time data differ ---------------------------------------
def _gather_rows(x, idx):
    out = nl.ndarray((2, 8), x.dtype, buffer=nl.shared_hbm)
    index = nl.ndarray((2, 1), nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=index, src=idx)
    rows = nl.ndarray((2, 8), x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=rows, src=x.ap(pattern=[[8, 2], [1, 8]], offset=0, vector_offset=index, indirect_dim=0))
    first = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=first, src=idx[0:1, :])
    start = nisa.scalar_load(first)
    nisa.dma_copy(dst=rows[0:1, :], src=x[nl.ds(start, 1), :])
    nisa.dma_copy(dst=out, src=rows)
    return out


def test_two_launches_with_different_index_data_have_one_fingerprint() -> None:
    x = np.arange(64, dtype=np.float32).reshape(8, 8)
    prints = []
    for idx in ([[1], [6]], [[5], [0]]):
        got = nki_cpu.simulate(_gather_rows)(x, np.array(idx, np.int32))
        np.testing.assert_array_equal(got, x[[idx[0][0], idx[1][0]]])
        prints.append(nki_cpu.last_trace().fingerprint())
    assert prints[0] == prints[1]


def test_a_kernel_specialising_on_a_value_has_another_fingerprint() -> None:
    def kernel(x, rows):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x)
        for _ in range(rows):  # unrolled on a Python value: another program
            nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
        nl.store(out, t)
        return out

    x = np.ones((4, 8), np.float32)
    prints = set()
    for rows in (1, 2):
        nki_cpu.simulate(kernel)(x, rows)
        prints.add(nki_cpu.last_trace().fingerprint())
    assert len(prints) == 2
    nki_cpu.simulate(kernel)(2 * x, 1)
    assert nki_cpu.last_trace().fingerprint() in prints  # different data, same program
