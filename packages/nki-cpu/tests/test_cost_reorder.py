"""The compiler's reordering, modelled (``estimate(order=...)``, ``cost.reorder``): a permutation that keeps every
memory dependency, never crosses a compiled loop's iteration boundary, keeps ``nl.no_reorder()`` blocks in order,
and shortens a program whose own order leaves an engine waiting."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import nki_cpu
from _records import box, op
from nki_cpu import isa as nisa
from nki_cpu import language as nl
from nki_cpu.cost import TRN2, Engine, Region, Trace, estimate
from nki_cpu.cost.record import NO_REORDER
from nki_cpu.cost.reorder import PROGRAM_INDEX, compiler_order, list_schedule, predecessors, regions
from nki_cpu.cost.scheduler import schedule

HEURISTICS = ("critical_path", "asap")


def _trace(*records) -> Trace:
    trace = Trace()
    for record in records:
        trace.append(record)
    return trace


def _badly_ordered() -> Trace:
    """A vector instruction, a scalar one waiting for it, then an independent scalar one: in program order the
    independent one waits behind the dependent one in the scalar engine's queue."""
    producer = op(Engine.VECTOR, [box(1)], [box(2)], n=4096)
    consumer = op(Engine.SCALAR, [box(2)], [box(5)], n=4096)
    independent = op(Engine.SCALAR, [box(3)], [box(4)], n=4096)
    return _trace(producer, consumer, independent)


def _origins(reordered: Trace) -> list[int]:
    """The program position of every record of a reordered trace, in the new order."""
    return [r.attrs[PROGRAM_INDEX] for r in reordered.records]


def _assert_keeps_dependencies(original: Trace, reordered: Trace) -> list[int]:
    """The reordered trace is a permutation of the original in which every conflicting pair keeps its order."""
    origin = _origins(reordered)
    assert sorted(origin) == list(range(len(original.records)))
    position = {o: p for p, o in enumerate(origin)}
    for later, (before, _) in enumerate(predecessors(original.records)):
        for earlier in before:
            assert position[earlier] < position[later]
    return origin


@pytest.mark.parametrize("heuristic", HEURISTICS)
def test_reordering_starts_the_independent_instruction_first(heuristic):
    trace = _badly_ordered()
    program = estimate(trace, figures=TRN2)
    compiled = estimate(trace, figures=TRN2, order=heuristic)
    assert compiled.order == heuristic and program.order == "program"
    assert compiled.makespan_ns < program.makespan_ns
    origin = _assert_keeps_dependencies(trace, compiled.trace)
    assert origin.index(2) < origin.index(1)  # the independent scalar instruction now issues first
    assert compiled.makespan_ns == pytest.approx(
        program.makespan_ns - (program.schedule.end_ns[2] - program.schedule.start_ns[2])
    )


def test_the_callers_trace_is_not_modified():
    trace = _badly_ordered()
    before = [(r.index, r.reads) for r in trace.records]
    estimate(trace, order="critical_path")
    assert [(r.index, r.reads) for r in trace.records] == before


def test_dependent_instructions_keep_their_order():
    # a RAW chain, a WAR and a WAW pair, all across engines
    records = [
        op(Engine.VECTOR, [box(1)], [box(2)], n=4096),
        op(Engine.SCALAR, [box(2)], [box(3)]),  # RAW on 2
        op(Engine.GPSIMD, [box(9)], [box(2, 0, 16)]),  # WAR on 2 (the scalar read) and WAW (the vector write)
        op(Engine.VECTOR, [box(7)], [box(8)], n=64),  # independent
        op(Engine.SCALAR, [box(3)], [box(1)]),  # RAW on 3, WAR on 1
    ]
    trace = _trace(*records)
    for heuristic in HEURISTICS:
        _assert_keeps_dependencies(trace, compiler_order(trace, TRN2, heuristic))


def test_random_traces_keep_every_dependency():
    engines = [Engine.VECTOR, Engine.SCALAR, Engine.GPSIMD, Engine.PE, Engine.DMA]
    rng = np.random.default_rng(7)
    for _ in range(20):
        records = []
        for _ in range(40):
            reads = [
                box(int(s), int(lo), int(lo) + 256)
                for s, lo in zip(rng.integers(1, 6, 2), rng.integers(0, 4, 2) * 256, strict=True)
            ]
            writes = [box(int(rng.integers(1, 6)), int(rng.integers(0, 4)) * 256, 1024)]
            records.append(op(engines[int(rng.integers(0, 5))], reads, writes, n=int(rng.integers(32, 2048))))
        trace = _trace(*records)
        for heuristic in HEURISTICS:
            reordered = compiler_order(trace, TRN2, heuristic)
            _assert_keeps_dependencies(trace, reordered)
            # the in-order scheduler runs the new order exactly as the list scheduler simulated it, unless the
            # kernel's own order was faster, which is then kept
            simulated = max(list_schedule(trace.records, TRN2, heuristic)[2])
            program = max(schedule(trace, TRN2).end_ns)
            assert max(schedule(reordered, TRN2).end_ns) == pytest.approx(min(simulated, program))


def test_no_reorder_block_keeps_its_order():
    free, ordered = _badly_ordered(), _badly_ordered()
    for record in ordered.records[1:]:
        record.attrs[NO_REORDER] = 1
    assert _origins(compiler_order(free, TRN2)).index(2) < _origins(compiler_order(free, TRN2)).index(1)
    assert _origins(compiler_order(ordered, TRN2)) == [0, 1, 2]
    assert estimate(ordered, order="critical_path").makespan_ns == pytest.approx(estimate(ordered).makespan_ns)


def test_regions_split_at_the_boundaries():
    assert regions(10, []) == [(0, 10)]
    assert regions(10, [0, 3, 3, 7, 10]) == [(0, 3), (3, 7), (7, 10)]


def test_instructions_never_cross_a_region_boundary():
    trace = _badly_ordered()
    trace.boundaries = [2]  # a loop iteration starts before the independent instruction
    assert _origins(compiler_order(trace, TRN2)) == [0, 1, 2]


def test_unknown_order_is_rejected_with_the_choices():
    with pytest.raises(ValueError, match=r"order must be one of .*'program'.*'critical_path'.*'asap'.*got 'fast'"):
        estimate(_badly_ordered(), order="fast")
    with pytest.raises(ValueError, match=r"order='asap' needs dma_queues='round_robin'"):
        estimate(_badly_ordered(), order="asap", dma_queues="recorded")
    with pytest.raises(ValueError, match="heuristic must be one of"):
        compiler_order(_badly_ordered(), TRN2, heuristic="program")


def test_the_reordered_schedule_matches_the_list_schedule_it_came_from():
    # the order is the list scheduler's start order, and the in-order scheduler replays it at the same times
    trace = _badly_ordered()
    order, start, end = list_schedule(trace.records, TRN2, "critical_path")
    replayed = schedule(compiler_order(trace, TRN2), TRN2)
    assert max(replayed.end_ns) == pytest.approx(max(end))
    assert [start[i] for i in order] == sorted(start)


# --- kernels: the interpreter marks loop iterations and no_reorder blocks ------------------------------------------


def _two_chains(x, out):
    """Loads, then two independent multiply chains; ``ordered`` wraps them in an nl.no_reorder() block."""
    a = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=x)
    b = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
    c = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=b, data=a, op0=nl.multiply, operand0=2.0)
    nisa.tensor_scalar(dst=c, data=a[:, :64], op0=nl.multiply, operand0=3.0)
    nisa.dma_copy(dst=out, src=b)


def test_no_reorder_marks_the_blocks_instructions():
    def kernel(x):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.hbm)
        with nl.no_reorder():
            with nl.no_reorder():  # nested: one block
                _two_chains(x, out)
        _two_chains(x, out)
        return out

    nki_cpu.simulate(kernel)(np.ones((128, 512), np.float32))
    records = nki_cpu.last_traces()[0].records
    marks = [r.attrs.get(NO_REORDER) for r in records]
    assert marks[: len(marks) // 2] == [1] * (len(marks) // 2)
    assert marks[len(marks) // 2 :] == [None] * (len(marks) // 2)


def test_a_compiled_loop_inside_no_reorder_is_rejected():
    def kernel(x):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.hbm)
        with nl.no_reorder():
            nl.fori_loop(0, 2, lambda _: _two_chains(x, out))
        return out

    with pytest.raises(AssertionError, match=r"fori_loop inside nl\.no_reorder"):
        nki_cpu.simulate(kernel)(np.ones((128, 512), np.float32))


def test_compiled_loop_iterations_are_region_boundaries():
    def kernel(x):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.hbm)
        _two_chains(x, out)
        nl.fori_loop(0, 3, lambda _: _two_chains(x, out))
        return out

    nki_cpu.simulate(kernel)(np.ones((128, 512), np.float32))
    trace = nki_cpu.last_traces()[0]
    body = 4  # instructions of _two_chains
    assert regions(len(trace.records), trace.boundaries) == [
        (0, body),
        *((body * k, body * (k + 1)) for k in (1, 2, 3)),
    ]
    reordered = estimate(trace, order="critical_path")
    assert reordered.instructions == len(trace.records) and reordered.static_instructions == trace.static_instructions


def _alias_kernel(x):
    """A loop whose body conflicts with itself only in its first iteration: y[0] is written, then y[i] read."""
    y = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    c = nl.ndarray((1, 128, 64), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=c, value=1.0)

    def body(i):
        nisa.dma_copy(dst=y[nl.ds(0, 1)], src=c)
        t = nl.ndarray((1, 128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=y[nl.ds(i, 1)])
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)

    nl.fori_loop(0, 4, body)
    return y


@pytest.mark.parametrize("heuristic", HEURISTICS)
def test_every_iteration_of_a_loop_gets_one_order_valid_for_all_of_them(heuristic):
    nki_cpu.simulate(_alias_kernel)(np.ones((4, 128, 64), np.float32))
    trace = nki_cpu.last_traces()[0]
    origin = _origins(compiler_order(trace, TRN2, heuristic))
    orders = {tuple(o - a for o in origin[a:b]) for a, b in regions(len(origin), trace.boundaries) if b - a == 3}
    assert orders == {(0, 1, 2)}, "iteration 0 needs the store before the load, so every iteration keeps it"


def test_zero_length_instructions_are_scheduled():
    no_floor = dataclasses.replace(TRN2, min_ii_cycles=0)
    trace = _trace(op(Engine.VECTOR, [box(1)], [box(2)], n=0), op(Engine.VECTOR, [box(3)], [box(4)], n=0))
    assert estimate(trace, figures=no_floor, order="critical_path").makespan_ns == 0.0


def test_the_reordered_program_keeps_its_own_allocations_within_the_buffer():
    # sixteen independent load -> matmul into a 4 KiB PSUM tile -> slow evacuation chains, written one after another:
    # unlimited, the list schedule would run every matmul ahead (60 KiB of PSUM live); it may overlap the chains,
    # but never with more than four PSUM tiles (16 KiB) live at once
    psum = 4096
    records, trace = [], Trace()
    for k in range(16):
        src, acc, dst = 10 * k + 1, 10 * k + 2, 10 * k + 3
        trace.allocations.update({src: ("sbuf", 512), acc: ("psum", psum), dst: ("sbuf", 512)})
        records += [
            op(Engine.DMA, [Region(1000 + k, "hbm", (0, 1), (0, 4096))], [box(src, 0, 512)], n=8, partitions=8),
            op(Engine.PE, [box(src, 0, 512)], [Region(acc, "psum", (0, 128), (0, psum))], n=512),
            op(Engine.VECTOR, [Region(acc, "psum", (0, 128), (0, psum))], [box(dst, 0, 512)], n=8192),
        ]
    for record in records:
        trace.append(record)
    assert trace.liveness_high_water("psum") == psum
    for heuristic in HEURISTICS:
        reordered = compiler_order(trace, TRN2, heuristic)
        _assert_keeps_dependencies(trace, reordered)
        assert reordered.liveness_high_water("psum") == TRN2.psum_bytes_per_partition  # full, never over
