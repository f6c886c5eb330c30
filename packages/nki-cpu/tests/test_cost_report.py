"""Cost report sums, estimate targets, Chrome-trace JSON and PNG export."""

from __future__ import annotations

import dataclasses
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
    return trace_of(records, sbuf_high_water=4096, psum_high_water=2048)


def trace_of(records: list[InstructionRecord], **high_water: int) -> Trace:
    """A trace holding ``records`` in order."""
    trace = Trace(**high_water)
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
    titled = write_png_timeline(estimate(small_kernel()), tmp_path / "titled.png", title="small kernel, S = 1")
    assert titled.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def pe_record(opcode: str, dtype: str, stationary: int, moving: int, *, sid: int, **attrs) -> InstructionRecord:
    """A PE instruction on 128 partitions writing its own PSUM region (so the records are independent)."""
    psum = Region(100 + sid, "psum", (0, 128), (0, 4 * moving))
    return InstructionRecord(
        opcode,
        Engine.PE,
        128,
        moving,
        (dtype, dtype, FP32),
        4 * 128 * moving,
        (sbuf(sid),),
        (psum,),
        attrs={"stationary_free": stationary, "moving_free": moving, **attrs},
    )


def mixed_pe_kernel() -> Trace:
    """Three bf16 128x128x128 matmuls, two fp32 moving-64 matmuls, a bf16 PE transpose, two matmuls that differ only
    by their tile_position, and a vector op (not PE)."""
    records = [
        *(pe_record("nc_matmul", BF16, 128, 128, sid=i) for i in range(3)),
        *(pe_record("nc_matmul", FP32, 128, 64, sid=10 + i, fp32=True) for i in range(2)),
        pe_record("nc_transpose", BF16, 128, 128, sid=20, is_transpose=True),
        pe_record("nc_matmul", BF16, 128, 128, sid=21, is_transpose=True),
        pe_record("nc_matmul", BF16, 64, 128, sid=30, tile_position=(0, 0), tile_size=(64, 64)),
        pe_record("nc_matmul", BF16, 64, 128, sid=31, tile_position=(64, 64), tile_size=(64, 64)),
        InstructionRecord("tensor_copy", Engine.VECTOR, 128, 512, (FP32, BF16), 1 << 17, (sbuf(40),), (sbuf(41),)),
    ]
    return trace_of(records)


def test_pe_breakdown_groups_pe_time_by_instruction_kind():
    trace = mixed_pe_kernel()
    report = estimate(trace)
    rows = report.pe_breakdown()
    by_label = {str(row.kind): row for row in rows}
    bf16_full = by_label["nc_matmul bf16 stationary 128x128 moving 128x128"]
    fp32_half = by_label["nc_matmul fp32 stationary 128x128 moving 128x64"]
    transpose = by_label["nc_transpose bf16 stationary 128x128 moving 128x128"]
    tiled = [row for row in rows if row.kind.tile_position is not None]
    assert (bf16_full.count, fp32_half.count, transpose.count) == (3, 2, 1)
    assert bf16_full.busy_ns == pytest.approx(3 * duration_ns(trace.records[0], TRN2))
    assert fp32_half.busy_ns == pytest.approx(2 * duration_ns(trace.records[3], TRN2))
    # the two tiled matmuls are separate kinds, each labelled with its tiling
    assert sorted(row.kind.tile_position for row in tiled) == [(0, 0), (64, 64)]
    assert "tile_position (64, 64) tile_size (64, 64)" in str(tiled[0].kind) + str(tiled[1].kind)
    assert by_label["nc_matmul bf16 transpose stationary 128x128 moving 128x128"].count == 1
    assert len(rows) == 6  # the vector op is no PE kind
    assert sum(row.busy_ns for row in rows) == pytest.approx(report.engine_busy_ns["pe"])
    assert sum(row.share for row in rows) == pytest.approx(1.0)
    assert [row.busy_ns for row in rows] == sorted((row.busy_ns for row in rows), reverse=True)


def test_pe_breakdown_without_pe_work_is_empty():
    assert estimate(Trace()).pe_breakdown() == []


def tiled(j: int) -> InstructionRecord:
    """A 32x32x32 bf16 matmul on the j-th diagonal 32x32 tile of the PE array."""
    attrs = {
        "stationary_free": 32,
        "moving_free": 32,
        "fp32": False,
        "pe_rows": (32 * j, 32 * j + 32),
        "pe_cols": (32 * j, 32 * j + 32),
    }
    write = Region(j, "psum", (0, 32), (0, 128))
    return InstructionRecord(
        "nc_matmul", Engine.PE, 32, 32, ("bfloat16",) * 2 + ("float32",), 0, (), (write,), attrs=attrs
    )


NO_LATENCY = dataclasses.replace(TRN2, dependency_latency_cycles=dict.fromkeys(Engine, 0))


def test_pe_busy_counts_concurrent_tiles_once():
    """Matmuls on disjoint PE tiles overlap in time: the PE is busy for one tile's duration, not the sum."""
    report = estimate(Trace([tiled(j) for j in range(4)]), figures=NO_LATENCY)
    assert report.engine_busy_ns["pe"] == pytest.approx(report.makespan_ns)
    assert report.makespan_ns == pytest.approx(32 / 2.4)


def test_concurrent_pe_time_is_split_evenly_among_the_instructions_running():
    from nki_cpu.cost.report import _split_among_concurrent

    # 0 runs alone for 2 ns, beside 1 for 2 ns, then 1 alone for 2 ns; 2 starts as 1 ends; 3 lies inside 1
    parts = _split_among_concurrent({0: (0.0, 4.0), 1: (2.0, 6.0), 2: (6.0, 7.0), 3: (4.0, 5.0)})
    assert parts == pytest.approx({0: 2.0 + 1.0, 1: 1.0 + 0.5 + 1.0, 2: 1.0, 3: 0.5})
    assert sum(parts.values()) == pytest.approx(7.0)  # the union


def test_pe_breakdown_counts_concurrent_tiles_once():
    # four tiled matmuls side by side, then a full-array one: the kinds' busy times add up to the PE busy time
    full = pe_record("nc_matmul", BF16, 128, 128, sid=50)
    report = estimate(trace_of([*(tiled(j) for j in range(4)), full]), figures=NO_LATENCY)
    tiles, whole = sorted(report.pe_breakdown(), key=lambda row: row.count, reverse=True)
    assert tiles.count == 4 and whole.count == 1
    assert tiles.duration_ns == pytest.approx(4 * tiles.busy_ns)  # each ran beside three others
    assert tiles.busy_ns == pytest.approx(32 / 2.4) and whole.busy_ns == pytest.approx(whole.duration_ns)
    assert tiles.busy_ns + whole.busy_ns == pytest.approx(report.engine_busy_ns["pe"])
