"""Compiled loops (``nl.fori_loop``, ``nl.dynamic_range``): one body in the program, every iteration executed.

The static count (what the program holds) counts a compiled loop's body once; the dynamic count (the trace) every
executed instruction. Unrolled loops (Python ``range`` and the deprecated ``affine_range``/``sequential_range``)
count every iteration in both. A body whose instructions depend on the iteration is rejected.
"""

from __future__ import annotations

import numpy as np
import pytest

import nki_cpu
from nki_cpu import isa as nisa
from nki_cpu import language as nl
from nki_cpu.cost import estimate

ROWS, COLS, TILES = 128, 64, 5


def _scale_tiles(x, out, index) -> None:
    """The loop body: out[tile index] = 2 · x[tile index]; the index only offsets the HBM accesses."""
    rows = x.ap(pattern=[[COLS, ROWS], [1, COLS]], scalar_offset=index, indirect_dim=0)
    t = nl.ndarray((ROWS, COLS), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=rows)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
    nisa.dma_copy(dst=out.ap(pattern=[[COLS, ROWS], [1, COLS]], scalar_offset=index, indirect_dim=0), src=t)


@nki_cpu.jit
def doubled_fori(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.fori_loop(0, x.shape[0], lambda i: _scale_tiles(x, out, i))
    return out


@nki_cpu.jit
def doubled_dynamic_range(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.dynamic_range(x.shape[0]):
        _scale_tiles(x, out, i)
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

    def body(i):
        _scale_tiles(x, out, i)
        if int(i) == 2:  # Python control flow on the index: not expressible as one compiled body
            _scale_tiles(x, out, i)

    nl.fori_loop(0, x.shape[0], body)
    return out


@nki_cpu.jit
def nested_then_straight(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for _ in nl.dynamic_range(2):
        for i in nl.dynamic_range(x.shape[0]):
            _scale_tiles(x, out, i)
    for i in nl.dynamic_range(x.shape[0]):
        _scale_tiles(x, out, i)
        break  # leaving a compiled loop early ends its repeats
    _scale_tiles(x, out, 0)
    return out


def _input() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((TILES, ROWS, COLS)).astype(np.float32)


BODY = 3  # load, multiply, store


@pytest.mark.parametrize("kernel", [doubled_fori, doubled_dynamic_range], ids=["fori_loop", "dynamic_range"])
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
    # the nested body once, the broken loop's one iteration, and the straight-line tail
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
