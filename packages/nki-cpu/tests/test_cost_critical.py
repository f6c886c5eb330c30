"""Critical path: the steps the makespan waited on, why, and charges that sum to the makespan."""

from __future__ import annotations

import pytest

from _records import NO_LATENCY, box, op
from nki_cpu.cost import TRN2, Engine, Trace, critical_path, estimate, path_summary, schedule
from nki_cpu.cost.critical import DATA, QUEUE, START


def test_path_follows_data_then_queue_and_charges_sum_to_the_makespan():
    load = op(Engine.VECTOR, [box(1)], [box(2)], n=4096)  # long producer
    busy = op(Engine.SCALAR, [box(9)], [box(10)], n=4096)  # holds the scalar engine
    use = op(Engine.SCALAR, [box(2)], [box(3)], n=64)  # waits on load's data
    after = op(Engine.SCALAR, [box(11)], [box(12)], n=64)  # waits behind use in the scalar queue
    placed = schedule(Trace([load, busy, use, after]), TRN2)
    steps = critical_path(placed)
    assert [(s.index, s.cause) for s in steps] == [(0, START), (2, DATA), (3, QUEUE)]
    assert sum(s.charged_ns for s in steps) == pytest.approx(placed.makespan_ns)
    assert steps[1].charged_ns > steps[2].charged_ns  # the data step carries the dependency latency too


def test_a_queue_bound_path_stays_on_its_engine():
    records = [op(Engine.VECTOR, [box(2 * i)], [box(2 * i + 1)]) for i in range(5)]
    steps = critical_path(schedule(Trace(records), NO_LATENCY))
    assert [s.cause for s in steps] == [START] + [QUEUE] * 4
    summary = path_summary(steps)
    assert list(summary) == [("vector", QUEUE), ("vector", START)]
    assert summary[("vector", QUEUE)][0] == 4


def test_report_exposes_bound_and_path():
    records = [op(Engine.VECTOR, [box(2 * i)], [box(2 * i + 1)]) for i in range(3)]
    report = estimate(Trace(records))
    assert report.dependency_bound_ns < report.makespan_ns  # independent ops, one queue
    assert sum(s.charged_ns for s in report.critical_path) == pytest.approx(report.makespan_ns)
    assert critical_path(schedule(Trace(), TRN2)) == []
