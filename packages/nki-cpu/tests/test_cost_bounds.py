"""Lower bounds on the makespan (``cost.bounds``): the dependency bound, each engine's one-machine bound, and the
floor no issue order can beat."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from _records import NO_LATENCY, box, op
from nki_cpu.cost import TRN2, Engine, Trace, dependency_bound_ns, duration_ns, engine_bounds_ns, estimate
from nki_cpu.cost.bounds import DEPENDENCIES, jackson_bound, makespan_floor
from nki_cpu.cost.reorder import predecessors
from nki_cpu.cost.scheduler import schedule

ENGINES = [Engine.VECTOR, Engine.SCALAR, Engine.GPSIMD, Engine.PE, Engine.DMA]


def _random_trace(rng: np.random.Generator, count: int, storages: int = 6) -> Trace:
    records = []
    for _ in range(count):
        reads = [
            box(int(s), int(lo), int(lo) + 256)
            for s, lo in zip(rng.integers(1, storages, 2), rng.integers(0, 4, 2) * 256, strict=True)
        ]
        writes = [box(int(rng.integers(1, storages)), int(rng.integers(0, 4)) * 256, 1024)]
        records.append(op(ENGINES[int(rng.integers(0, 5))], reads, writes, n=int(rng.integers(32, 2048))))
    return Trace(records)


def _orders(trace: Trace):
    """Every order of the trace's records that keeps each RAW / WAR / WAW pair (brute force)."""
    before = [set(pred) for pred, _ in predecessors(trace.records)]
    for order in itertools.permutations(range(len(trace.records))):
        placed: set[int] = set()
        ok = True
        for i in order:
            if not before[i] <= placed:
                ok = False
                break
            placed.add(i)
        if ok:
            yield [trace.records[i] for i in order]


def test_dependency_bound_ignores_engine_queues_and_memory_reuse():
    # two independent ops on one engine, then a WAR on the first one's input: only the RAW chain counts
    a = op(Engine.VECTOR, [box(1)], [box(2)], n=4096)
    b = op(Engine.VECTOR, [box(3)], [box(4)], n=4096)
    overwrite = op(Engine.SCALAR, [box(5)], [box(1)], n=64)
    trace = Trace([a, b, overwrite])
    one = duration_ns(a, NO_LATENCY)
    assert schedule(trace, NO_LATENCY).makespan_ns == pytest.approx(2 * one)
    assert dependency_bound_ns(trace, NO_LATENCY) == pytest.approx(one)


def test_dependency_bound_is_the_longest_raw_chain_with_latencies():
    producer = op(Engine.VECTOR, [box(1)], [box(2)])
    consumer = op(Engine.SCALAR, [box(2)], [box(3)])
    side = op(Engine.GPSIMD, [box(7)], [box(8)], n=16)
    trace = Trace([producer, consumer, side])
    latency = TRN2.cycles_to_ns(TRN2.dependency_latency_cycles[Engine.VECTOR], Engine.VECTOR)
    chain = duration_ns(producer, TRN2) + latency + duration_ns(consumer, TRN2)
    assert dependency_bound_ns(trace, TRN2) == pytest.approx(chain)
    assert schedule(trace, TRN2).makespan_ns >= dependency_bound_ns(trace, TRN2)


def test_jackson_bound_of_hand_worked_jobs():
    assert jackson_bound([]) == 0.0
    assert jackson_bound([(5.0, 2.0, 1.0)]) == 8.0  # released at 5, runs 2, then its tail
    # both released at 0: the long tail first (0-3, its tail to 10), then the other (3-7, tail to 8)
    assert jackson_bound([(0.0, 4.0, 1.0), (0.0, 3.0, 7.0)]) == 10.0
    # a job released at 1 with a long tail preempts the running one: 1-2 it runs (tail to 12), the first finishes
    # at 5 (tail to 5)
    assert jackson_bound([(0.0, 4.0, 0.0), (1.0, 1.0, 10.0)]) == 12.0
    # idle time until a late release is not counted as work
    assert jackson_bound([(0.0, 1.0, 0.0), (10.0, 1.0, 0.0)]) == 11.0


def test_an_engine_bound_adds_its_work_to_the_shortest_head_and_tail():
    # a vector op feeds three scalar ops, the last of which feeds a vector op: the scalar work cannot start
    # before the first vector op ends, and whichever scalar op feeds the last vector op still has that op after it
    first = op(Engine.VECTOR, [box(1)], [box(2)], n=1024)
    middle = [op(Engine.SCALAR, [box(2)], [box(10 + k)], n=1024) for k in range(3)]
    last = op(Engine.VECTOR, [box(12)], [box(20)], n=1024)
    trace = Trace([first, *middle, last])
    bounds = engine_bounds_ns(trace, NO_LATENCY)
    vector, scalar = duration_ns(first, NO_LATENCY), duration_ns(middle[0], NO_LATENCY)
    # best case: the feeding scalar op first (done at v + s, the vector op after it), the other two after it
    assert bounds["scalar"] == pytest.approx(max(2 * vector + scalar, vector + 3 * scalar))
    assert dependency_bound_ns(trace, NO_LATENCY) == pytest.approx(2 * vector + scalar)
    assert schedule(trace, NO_LATENCY).makespan_ns >= bounds["scalar"]


def test_side_by_side_pe_tiles_count_by_their_share_of_the_array():
    def quarter(j: int):
        record = op(Engine.PE, [box(1)], [box(2 + j)], n=128)
        return dataclasses.replace(record, attrs={**record.attrs, "pe_rows": (32 * j, 32 * j + 32), "pe_cols": (0, 32)})

    tiles = Trace([quarter(j) for j in range(4)])
    whole = Trace([op(Engine.PE, [box(1)], [box(2 + j)], n=128) for j in range(4)])
    one = duration_ns(tiles.records[0], NO_LATENCY)
    cells = (128 // TRN2.pe_tile_quantum) ** 2
    assert engine_bounds_ns(tiles, NO_LATENCY)["pe"] == pytest.approx(4 * one / cells)
    assert engine_bounds_ns(whole, NO_LATENCY)["pe"] == pytest.approx(4 * one)
    assert schedule(tiles, NO_LATENCY).makespan_ns >= engine_bounds_ns(tiles, NO_LATENCY)["pe"]


def test_the_floor_names_the_bound_that_sets_it():
    chain = [op(Engine.VECTOR, [box(k)], [box(k + 1)], n=64) for k in range(1, 5)]
    floor = makespan_floor(Trace(chain), TRN2)
    assert floor.binding == DEPENDENCIES  # a chain with latencies: longer than the engine's work alone
    assert floor.ns == pytest.approx(dependency_bound_ns(Trace(chain), TRN2))
    wide = Trace([op(Engine.SCALAR, [box(1)], [box(10 + k)], n=4096) for k in range(6)])
    floor = makespan_floor(wide, TRN2)
    assert floor.binding == "scalar"
    assert floor.ns == pytest.approx(6 * duration_ns(wide.records[0], TRN2))
    assert set(floor.parts) == {DEPENDENCIES, "scalar"}


@pytest.mark.parametrize("figures", [TRN2, NO_LATENCY], ids=["trn2", "no_latency"])
def test_no_order_of_a_small_trace_beats_the_floor(figures):
    # brute force: every dependency-respecting order of random 6-instruction traces, each scheduled in order
    rng = np.random.default_rng(11)
    for _ in range(25):
        trace = _random_trace(rng, 6)
        floor = makespan_floor(trace, figures).ns
        best = min(
            schedule(Trace([dataclasses.replace(r) for r in order]), figures).makespan_ns for order in _orders(trace)
        )
        assert best >= floor - 1e-6


def test_the_floor_holds_for_the_program_and_both_compiler_orders():
    rng = np.random.default_rng(3)
    for _ in range(20):
        trace = _random_trace(rng, 60)
        floor = makespan_floor(trace, TRN2).ns
        for order in ("program", "critical_path", "asap"):
            assert estimate(trace, order=order).makespan_ns >= floor - 1e-6
