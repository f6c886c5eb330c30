"""Compiled loops in the cost model: one buffer per allocation of a body, a drain and a barrier at every iteration
boundary (and at the loop's entry and exit), and the barrier's cost fitted to the "NKI Dynamic Loops" page."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import nki_cpu
from nki_cpu import isa as nisa
from nki_cpu import language as nl
from nki_cpu.cost import TRN2, critical_path, dependency_bound_ns, estimate, makespan_floor, schedule
from nki_cpu.cost.critical import BARRIER
from nki_cpu.cost.figures import LOOP_BARRIER_NS
from nki_cpu.cost.loop_fit import PAGE_US, PLAUSIBLE_NS, fit

ROWS, COLS, TILES = 128, 64, 4
BARRIER_NS = 5000.0  # far above any instruction here, so a barrier shows in every figure


def _tile(hbm, index):
    return hbm.ap(pattern=[[COLS, ROWS], [1, COLS]], scalar_offset=index, indirect_dim=0)


def _body(x, out, index) -> None:
    """Load a tile into a tile the body allocates, double it, store it."""
    t = nl.ndarray((ROWS, COLS), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=_tile(x, index))
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
    nisa.dma_copy(dst=_tile(out, index), src=t)


@nki_cpu.jit
def doubled(x):
    """A compiled loop over the tiles, then one more instruction after it."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.fori_loop(0, TILES, lambda i: _body(x, out, i))
    _body(x, out, 0)
    return out


@nki_cpu.jit
def zero_trip_then_work(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    _body(x, out, 0)
    nl.fori_loop(0, 0, lambda i: _body(x, out, i))
    _body(x, out, 1)
    return out


def _input() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((TILES, ROWS, COLS)).astype(np.float32)


def _trace(kernel=doubled):
    nki_cpu.simulate(kernel)(_input())
    return nki_cpu.last_trace()


def _figures(barrier_ns: float):
    return dataclasses.replace(TRN2, loop_barrier_ns=barrier_ns)


BODY = 3  # load, multiply, store


# --- one buffer per allocation of a body ------------------------------------------------------------------------
def test_a_body_tile_is_one_buffer_whose_next_write_follows_the_last_read():
    trace = _trace()
    loads = [r for r in trace.records[: TILES * BODY] if r.opcode == "dma_copy" and r.writes[0].buffer == "sbuf"]
    stores = [r for r in trace.records[: TILES * BODY] if r.opcode == "dma_copy" and r.reads[0].buffer == "sbuf"]
    assert len({r.writes[0].storage_id for r in loads}) == 1, "every iteration's tile is the program's one buffer"
    for store, next_load in zip(stores, loads[1:], strict=False):
        assert next_load.writes[0].overlaps(store.reads[0]), "write-after-read across the iteration boundary"
    assert trace.records[-1].reads[0].storage_id != loads[0].writes[0].storage_id, "a tile after the loop is its own"
    # one buffer for the whole loop, plus the tile after it (never live together)
    assert trace.liveness_high_water("sbuf") == COLS * 4
    np.testing.assert_array_equal(nki_cpu.simulate(doubled)(_input()), 2 * _input())


def test_a_later_iterations_tile_still_starts_as_fresh_storage():
    """The interpreter keeps a fresh allocation per iteration (NaN until written), only the records name one
    buffer: a body reading its tile before writing it still reads NaN in every iteration."""

    @nki_cpu.jit
    def reads_before_writing(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)

        def body(i):
            t = nl.ndarray((ROWS, COLS), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=_tile(out, i), src=t)
            nisa.dma_copy(dst=t, src=_tile(x, i))

        nl.fori_loop(0, TILES, body)
        return out

    assert np.isnan(nki_cpu.simulate(reads_before_writing)(_input())).all()


# --- drain and barrier at every boundary ------------------------------------------------------------------------
@pytest.mark.parametrize("barrier_ns", [0.0, BARRIER_NS])
def test_no_instruction_starts_before_every_earlier_one_ended_and_the_barrier_passed(barrier_ns):
    trace = _trace()
    placed = schedule(trace, _figures(barrier_ns))
    boundaries = sorted(set(trace.boundaries))
    assert boundaries == [BODY * k for k in range(TILES + 1)], "each iteration's start and the loop's end"
    for b in boundaries:
        ended = max(placed.end_ns[:b], default=0.0)
        assert min(placed.start_ns[b:]) >= ended + barrier_ns - 1e-6


def test_a_loop_of_n_iterations_pays_n_plus_one_barriers():
    trace = _trace()
    without = estimate(trace, figures=_figures(0.0)).makespan_ns
    assert estimate(trace, figures=_figures(BARRIER_NS)).makespan_ns == pytest.approx(
        without + (TILES + 1) * BARRIER_NS
    )
    # the drain alone already serialises the iterations: each one's load waits for the previous one's store
    placed = schedule(trace, _figures(0.0))
    loads = [BODY * k for k in range(1, TILES)]
    assert all(placed.start_ns[i] >= placed.end_ns[i - 1] for i in loads)


def test_nested_loops_pay_each_loops_barriers_where_they_coincide():
    @nki_cpu.jit
    def nested(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.fori_loop(0, 2, lambda _: nl.fori_loop(0, TILES, lambda i: _body(x, out, i)))
        _body(x, out, 0)
        return out

    nki_cpu.simulate(nested)(_input())
    trace = nki_cpu.last_trace()
    without = estimate(trace, figures=_figures(0.0)).makespan_ns
    # the outer loop's 2 + 1 boundaries and each inner run's TILES + 1; the inner loop's entry is where the outer
    # iteration starts, and its exit where the outer one ends: both loops' barriers are paid there
    barriers = (2 + 1) + 2 * (TILES + 1)
    assert estimate(trace, figures=_figures(BARRIER_NS)).makespan_ns == pytest.approx(without + barriers * BARRIER_NS)


def test_a_loop_that_runs_zero_times_pays_one_barrier():
    trace = _trace(zero_trip_then_work)
    without = estimate(trace, figures=_figures(0.0)).makespan_ns
    assert estimate(trace, figures=_figures(BARRIER_NS)).makespan_ns == pytest.approx(without + BARRIER_NS)


def test_a_barrier_at_the_launchs_end_adds_nothing():
    @nki_cpu.jit
    def loop_last(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.fori_loop(0, TILES, lambda i: _body(x, out, i))
        return out

    nki_cpu.simulate(loop_last)(_input())
    trace = nki_cpu.last_trace()
    without = estimate(trace, figures=_figures(0.0)).makespan_ns
    assert estimate(trace, figures=_figures(BARRIER_NS)).makespan_ns == pytest.approx(without + TILES * BARRIER_NS)


def test_the_critical_path_names_the_barriers_and_still_sums_to_the_makespan():
    trace = _trace()
    placed = schedule(trace, _figures(BARRIER_NS))
    steps = critical_path(placed)
    # the loop opens the launch: its entry barrier has nothing to wait for, so the path starts after it
    assert placed.issue_ns[0] == BARRIER_NS and steps[0].index == 0
    assert sum(step.cause == BARRIER for step in steps) == TILES
    assert sum(step.charged_ns for step in steps) == pytest.approx(placed.makespan_ns)


def test_the_bounds_hold_the_barriers_and_stay_below_the_schedule():
    trace = _trace()
    figures = _figures(BARRIER_NS)
    bound = dependency_bound_ns(trace, figures)
    assert bound >= (TILES + 1) * BARRIER_NS
    floor = makespan_floor(trace, figures)
    assert bound <= floor.ns <= estimate(trace, figures=figures).makespan_ns + 1e-6
    for order in ("critical_path", "asap"):
        assert floor.ns <= estimate(trace, figures=figures, order=order).makespan_ns + 1e-6


# --- the barrier's cost, fitted to the page -----------------------------------------------------------------------
def test_the_barrier_figure_is_the_fit_to_the_dynamic_loops_page():
    result = fit()
    assert result.barrier_ns == pytest.approx(LOOP_BARRIER_NS, abs=10.0)
    assert TRN2.loop_barrier_ns == LOOP_BARRIER_NS
    assert PLAUSIBLE_NS[0] <= LOOP_BARRIER_NS <= PLAUSIBLE_NS[1]
    for form in ("fori_loop", "fori_loop, 4 tiles"):  # one value fits both loop forms
        assert result.us_per_tile[form] == pytest.approx(PAGE_US[form], rel=0.01)
        assert result.alone_ns[form] == pytest.approx(LOOP_BARRIER_NS, rel=0.02)
    # what stays unexplained (COST_MODEL.md, KU 25): the unrolled form is ~19 % slower in the model than on the page
    assert 1.1 < result.us_per_tile["range"] / PAGE_US["range"] < 1.3
