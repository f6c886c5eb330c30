"""Cost report sums, estimate targets, Chrome-trace JSON and PNG export."""

from __future__ import annotations

import json

import pytest

from nki_cpu.cost import (
    TRN2,
    CostReport,
    Engine,
    InstructionRecord,
    Region,
    Trace,
    duration_ns,
    estimate,
    get_figures,
    write_chrome_trace,
    write_png_timeline,
)

BF16, FP32 = "bfloat16", "float32"


def sbuf(sid: int, lo: int = 0, hi: int = 1024) -> Region:
    return Region(sid, "sbuf", (0, 128), (lo, hi))


def small_kernel() -> Trace:
    """load → matmul → evict → activation → store, plus one independent GpSimd op."""
    hbm_in, hbm_out = Region(1, "hbm", (0, 1), (0, 1 << 17)), Region(2, "hbm", (0, 1), (0, 1 << 17))
    psum = Region(20, "psum", (0, 128), (0, 2048))
    records = [
        InstructionRecord("dma_copy", Engine.DMA, 128, 512, (BF16, BF16), 1 << 17, (hbm_in,), (sbuf(10),)),
        InstructionRecord(
            "nc_matmul",
            Engine.PE,
            128,
            512,
            (BF16, BF16, FP32),
            1 << 18,
            (sbuf(10), sbuf(11)),
            (psum,),
            attrs={"stationary_free": 128, "moving_free": 512},
        ),
        InstructionRecord("tensor_copy", Engine.VECTOR, 128, 512, (FP32, BF16), 1 << 17, (psum,), (sbuf(12),)),
        InstructionRecord("activation", Engine.SCALAR, 128, 512, (BF16, BF16), 1 << 17, (sbuf(12),), (sbuf(13),)),
        InstructionRecord("iota", Engine.GPSIMD, 128, 128, ("int32",), 1 << 16, (), (sbuf(14),)),
        InstructionRecord("dma_copy", Engine.DMA, 128, 512, (BF16, BF16), 1 << 17, (sbuf(13),), (hbm_out,), queue=1),
    ]
    trace = Trace(sbuf_high_water=4096, psum_high_water=2048)
    for record in records:
        trace.append(record)
    return trace


def test_report_sums_and_counts():
    trace = small_kernel()
    report = estimate(trace)
    assert isinstance(report, CostReport)
    assert report.target == "trn2"
    assert report.instructions == 6
    for engine in (Engine.PE, Engine.VECTOR, Engine.SCALAR, Engine.GPSIMD):
        expected = sum(duration_ns(r, TRN2) for r in trace.records if r.engine is engine)
        assert report.engine_busy_ns[engine.value] == pytest.approx(expected)
        assert report.engine_counts[engine.value] == 1
    assert report.engine_counts["dma"] == 2
    assert report.track_counts == {"pe": 1, "vector": 1, "scalar": 1, "gpsimd": 1, "dma.q0": 1, "dma.q1": 1}
    assert report.dma_bytes == 2 * (1 << 17)
    assert report.sbuf_high_water == 4096
    assert report.psum_high_water == 2048
    assert report.makespan_ns == pytest.approx(max(report.schedule.end_ns))
    assert report.opcode_counts == {"dma_copy": 2, "nc_matmul": 1, "tensor_copy": 1, "activation": 1, "iota": 1}


def test_busy_share_is_busy_over_makespan():
    report = estimate(small_kernel())
    for name, share in report.busy_share.items():
        assert share == pytest.approx(report.engine_busy_ns[name] / report.makespan_ns)
        assert 0 < share <= 1


def test_makespan_is_the_dependency_chain():
    # the five chained instructions run one after another; the iota overlaps them
    report = estimate(small_kernel())
    start, end = report.schedule.start_ns, report.schedule.end_ns
    for before, after in [(0, 1), (1, 2), (2, 3), (3, 5)]:
        assert start[after] >= end[before]
    assert start[4] == 0.0
    assert report.makespan_ns == pytest.approx(end[5])


def test_dma_engine_busy_is_the_union_of_queues():
    hbm = Region(1, "hbm", (0, 1), (0, 1 << 20))
    trace = Trace()
    for queue in (0, 1):  # 8-partition transfers: one DMA engine each, so the two run at the same time
        trace.append(
            InstructionRecord(
                "dma_copy", Engine.DMA, 8, 512, (BF16,), 1 << 13, (hbm,), (sbuf(10 + queue),), queue=queue
            )
        )
    report = estimate(trace)
    transfer = report.schedule.end_ns[0] - report.schedule.start_ns[0]
    assert report.engine_busy_ns["dma"] == pytest.approx(transfer)
    assert report.track_busy_ns["dma.q0"] + report.track_busy_ns["dma.q1"] == pytest.approx(2 * transfer)


def test_str_is_a_table():
    text = str(estimate(small_kernel()))
    assert "makespan" in text
    for name in ("pe", "vector", "scalar", "gpsimd", "dma", "dma.q0", "dma.q1", "SBUF", "PSUM"):
        assert name in text


def test_empty_trace():
    report = estimate(Trace())
    assert report.makespan_ns == 0.0
    assert report.instructions == 0
    assert "makespan" in str(report)


def test_trn3_differs_from_trn2_where_figures_differ():
    trace = small_kernel()
    trn2, trn3 = estimate(trace, target="trn2"), estimate(trace, target="trn3")
    assert trn3.target == "trn3"
    assert trn3.engine_busy_ns["pe"] == pytest.approx(trn2.engine_busy_ns["pe"])  # same 2.4 GHz PE
    assert trn3.engine_busy_ns["vector"] < trn2.engine_busy_ns["vector"]  # 1.2 vs 0.96 GHz
    assert trn3.engine_busy_ns["dma"] < trn2.engine_busy_ns["dma"]  # 33 vs 23 B/ns
    assert trn3.makespan_ns < trn2.makespan_ns


def test_unknown_target_is_rejected_with_the_known_ones():
    with pytest.raises(ValueError, match="trn2"):
        get_figures("trn9")
    assert get_figures("gen4").name == "trn3"


def test_chrome_trace_has_one_track_per_used_engine(tmp_path):
    report = estimate(small_kernel())
    path = write_chrome_trace(report, tmp_path / "sub" / "trace.json")
    document = json.loads(path.read_text())
    events = document["traceEvents"]
    threads = {e["args"]["name"]: e["tid"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert set(threads) == {"pe", "vector", "scalar", "gpsimd", "dma.q0", "dma.q1"}
    assert len(set(threads.values())) == len(threads)
    complete = [e for e in events if e["ph"] == "X"]
    assert [e["name"] for e in complete] == ["dma_copy", "nc_matmul", "tensor_copy", "activation", "iota", "dma_copy"]
    matmul = complete[1]
    assert matmul["tid"] == threads["pe"]
    assert matmul["dur"] == pytest.approx(512 / 2.4 / 1000)  # µs
    assert matmul["args"]["moving_free"] == 512


def test_png_timeline(tmp_path):
    pytest.importorskip("matplotlib")
    path = write_png_timeline(estimate(small_kernel()), tmp_path / "timeline.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
