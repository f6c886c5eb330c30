"""Where the kernel issued each instruction (``InstructionRecord.site``) and the cost report's time per source line
(``site_breakdown``)."""

from __future__ import annotations

import inspect
import json
import os

import numpy as np
import pytest

import nki_cpu
from _records import box, op
from _site_helpers import doubled
from nki_cpu import isa as nisa
from nki_cpu import language as nl
from nki_cpu.cost import Engine, Trace, estimate, site_breakdown, write_chrome_trace
from nki_cpu.cost.record import site_label

HERE = os.path.basename(__file__)


def _kernel(x):
    a = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=x)  # LOAD
    b = doubled(a)  # HELPER 1
    c = doubled(b)  # HELPER 2
    eye = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=eye, value=1.0)  # MEMSET
    acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=eye, moving=c)  # MATMUL
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.hbm)
    d = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=d, src=acc)  # EVACUATE
    nisa.dma_copy(dst=out, src=d)  # STORE
    return out


def _line(tag: str) -> int:
    lines, first = inspect.getsourcelines(_kernel)
    return first + next(i for i, text in enumerate(lines) if text.rstrip().endswith(f"# {tag}"))


@pytest.fixture(scope="module")
def report():
    nki_cpu.simulate(_kernel)(np.ones((128, 512), np.float32))
    return estimate(nki_cpu.last_traces()[0])


def test_each_record_names_the_kernel_line_that_issued_it(report):
    records = report.trace.records
    assert [site_label(r) for r in records] == [
        f"{HERE}:{_line('LOAD')} _kernel",
        "_site_helpers.py:12 doubled",
        "_site_helpers.py:12 doubled",
        f"{HERE}:{_line('MEMSET')} _kernel",
        f"{HERE}:{_line('MATMUL')} _kernel",
        f"{HERE}:{_line('EVACUATE')} _kernel",
        f"{HERE}:{_line('STORE')} _kernel",
    ]
    # innermost first; nki-cpu's own frames are left out
    assert all("nki_cpu" + os.sep not in filename for r in records for filename, _, _ in r.site)
    assert records[1].site[1][1] == _line("HELPER 1") and records[2].site[1][1] == _line("HELPER 2")


def test_skipping_a_helper_module_charges_its_callers_lines(report):
    entries = report.site_breakdown(skip_files={"_site_helpers.py"})
    for tag in ("HELPER 1", "HELPER 2"):
        (entry,) = [e for e in entries if e.site == f"{HERE}:{_line(tag)} _kernel"]
        assert entry.count == 1
    assert not any(e.site.startswith("_site_helpers.py") for e in entries)
    # without the skip, the helper's one line holds both
    (helper,) = [e for e in report.site_breakdown() if e.site.startswith("_site_helpers.py")]
    assert helper.count == 2


def test_each_engines_entries_add_up_to_its_time(report):
    entries = site_breakdown(report)
    assert [e.engine for e in entries] == sorted(
        (e.engine for e in entries), key=["pe", "vector", "scalar", "gpsimd", "dma"].index
    )
    pe = [e for e in entries if e.engine == "pe"]
    assert sum(e.busy_ns for e in pe) == pytest.approx(report.engine_busy_ns["pe"])
    for engine in {e.engine for e in entries}:
        assert sum(e.share for e in entries if e.engine == engine) == pytest.approx(1.0)
    placed = report.schedule
    dma = sum(placed.end_ns[r.index] - placed.start_ns[r.index] for r in report.trace.records if r.engine is Engine.DMA)
    assert sum(e.busy_ns for e in entries if e.engine == "dma") == pytest.approx(dma)
    assert sum(e.count for e in entries) == len(report.trace.records)


def test_hand_made_records_have_no_site():
    report = estimate(Trace([op(Engine.VECTOR, [box(1)], [box(2)])]))
    (entry,) = report.site_breakdown()
    assert (entry.engine, entry.site, entry.count) == ("vector", "?", 1)


def test_the_chrome_trace_names_each_events_site(report, tmp_path):
    path = write_chrome_trace(report, tmp_path / "trace.json")
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"]
    assert events[0]["args"]["site"] == f"{HERE}:{_line('LOAD')} _kernel"
