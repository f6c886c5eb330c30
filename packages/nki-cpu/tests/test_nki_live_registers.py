"""Rule ``live_registers``: at most 64 scalar registers live at once per engine sequencer ("nki.isa.register_alloc":
"64x 32-bit registers per engine sequencer in NeuronCore v2-v4"). A kernel at the limit runs; one past it fails
naming the sequencer, the count, the limit and the page; a value used right after its load holds one register; a
compute engine reading registers holds them on its own sequencer; a compiled loop's body counts once."""

from __future__ import annotations

import numpy as np
import pytest

import nki_cpu
from nki_cpu import checks
from nki_cpu import isa as nisa
from nki_cpu import language as nl
from nki_cpu.registers_live import REGISTERS_PER_SEQUENCER, live_register_peaks

ROWS = 100


def _held(count: int, at_once: bool):
    """A kernel loading ``count`` row indices (scalar_load) and copying each indexed row of ``src`` to ``out``:
    every load first and then every copy (``at_once``: all ``count`` values live together), or each copy right
    after its load."""

    def kernel(src, rows):
        out = nl.ndarray((count, 8), nl.float32, buffer=nl.shared_hbm)
        table = nl.ndarray((1, count), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=table, src=rows)
        staged = nl.ndarray((1, 8), nl.float32, buffer=nl.sbuf)
        loaded = []
        for i in range(count):
            loaded.append(nisa.scalar_load(table[:, i : i + 1]))
            if not at_once:
                _copy_row(src, out, staged, i, loaded.pop())
        for i, row in enumerate(loaded):
            _copy_row(src, out, staged, i, row)
        return out

    return kernel


def _copy_row(src, out, staged, i, row):
    nisa.dma_copy(dst=staged, src=src.ap(pattern=[[8, 1], [1, 8]], offset=0, scalar_offset=row, indirect_dim=0))
    nisa.dma_copy(dst=out[i : i + 1, :], src=staged)


def _operands(count: int) -> tuple[np.ndarray, np.ndarray]:
    src = np.arange(ROWS * 8, dtype=np.float32).reshape(ROWS, 8)
    rows = (np.arange(count, dtype=np.int32) * 7 % ROWS).reshape(1, count)
    return src, rows


def test_the_limit_is_the_pages_64() -> None:
    assert REGISTERS_PER_SEQUENCER == 64


@pytest.mark.parametrize(("count", "at_once", "peak"), [(64, True, 64), (90, False, 1)],
                         ids=["64 held together: at the limit", "90 each used right after its load"])  # fmt: skip
def test_a_kernel_within_the_limit_runs(count: int, at_once: bool, peak: int) -> None:
    src, rows = _operands(count)
    out = nki_cpu.simulate(_held(count, at_once=at_once))(src, rows)
    np.testing.assert_array_equal(out, src[rows[0]])
    assert live_register_peaks(nki_cpu.last_trace())["gpsimd"].count == peak


def test_a_kernel_holding_65_registers_fails_naming_the_sequencer_count_limit_and_page() -> None:
    src, rows = _operands(65)
    with pytest.raises(checks.RuleViolationError) as raised:
        nki_cpu.simulate(_held(65, at_once=True))(src, rows)
    message = str(raised.value)
    assert raised.value.rule == "live_registers"
    for part in ("65 scalar registers live at once on the gpsimd engine sequencer", "the limit is 64",
                 "nki.isa.register_alloc", "64x 32-bit registers per engine sequencer"):  # fmt: skip
        assert part in message, message


def test_relaxed_it_warns_and_runs() -> None:
    src, rows = _operands(65)
    with pytest.warns(RuntimeWarning, match="65 scalar registers.*relaxed"):
        out = nki_cpu.simulate(_held(65, at_once=True), relax={"live_registers"})(src, rows)
    np.testing.assert_array_equal(out, src[rows[0]])


def test_a_compute_engine_reading_registers_holds_them_on_its_sequencer() -> None:
    """65 values loaded, then each the run-time column of a vector-engine copy: GpSimd (the loader) holds all 65
    until their use and fails; read in the order they were loaded, the vector engine holds one at a time."""

    def kernel(src, cols):
        out = nl.ndarray((1, 65), nl.float32, buffer=nl.shared_hbm)
        data = nl.ndarray((1, ROWS), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=data, src=src)
        table = nl.ndarray((1, 65), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=table, src=cols)
        picked = nl.ndarray((1, 65), nl.float32, buffer=nl.sbuf)
        loaded = [nisa.scalar_load(table[:, i : i + 1]) for i in range(65)]
        for i, col in enumerate(loaded):
            nisa.tensor_copy(dst=picked[:, i : i + 1], src=data[:, nl.ds(col, 1)], engine=nisa.vector_engine)
        nisa.dma_copy(dst=out, src=picked)
        return out

    src = np.arange(ROWS, dtype=np.float32).reshape(1, ROWS)
    cols = (np.arange(65, dtype=np.int32) * 3 % ROWS).reshape(1, 65)
    with pytest.raises(checks.RuleViolationError, match="65 scalar registers live at once on the gpsimd"):
        nki_cpu.simulate(kernel)(src, cols)
    with pytest.warns(RuntimeWarning, match="65 scalar registers"):
        out = nki_cpu.simulate(kernel, relax={"live_registers"})(src, cols)
    np.testing.assert_array_equal(out, src[:, cols[0]])
    peaks = live_register_peaks(nki_cpu.last_trace())
    assert (peaks["gpsimd"].count, peaks["vector"].count) == (65, 1)


def test_a_compiled_loops_body_counts_once() -> None:
    """A body holding 40 values, run 3 times: 40 registers, not 120 (each iteration's die within it)."""

    def kernel(src, rows):
        out = nl.ndarray((3 * 40, 8), nl.float32, buffer=nl.shared_hbm)
        table = nl.ndarray((1, 3 * 40), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=table, src=rows)
        staged = nl.ndarray((1, 8), nl.float32, buffer=nl.sbuf)

        def body(k):
            window = nl.ndarray((1, 40), nl.int32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=window, src=table[:, nl.ds(k * 40, 40)], engine=nisa.gpsimd_engine)
            loaded = [nisa.scalar_load(window[:, i : i + 1]) for i in range(40)]
            for i, row in enumerate(loaded):
                _copy_row(src, out.ap(pattern=[[8, 40], [1, 8]], offset=0, scalar_offset=k * 40, indirect_dim=0),
                          staged, i, row)  # fmt: skip

        nl.fori_loop(0, 3, body)
        return out

    src, rows = _operands(120)
    out = nki_cpu.simulate(kernel)(src, rows)
    np.testing.assert_array_equal(out, src[rows[0]])
    assert live_register_peaks(nki_cpu.last_trace())["gpsimd"].count == 40
