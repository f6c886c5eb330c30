"""List scheduler: engine parallelism, program order per engine/queue, RAW/WAR/WAW on overlapping regions."""

from __future__ import annotations

import dataclasses

import pytest

from _records import FP32, NO_LATENCY, box, op
from nki_cpu.cost import TRN1, TRN2, Engine, InstructionRecord, Region, Trace, duration_ns, schedule
from nki_cpu.cost.scheduler import MAX_BOXES


def place(*records: InstructionRecord, figures=NO_LATENCY, dma_queues: str = "round_robin"):
    trace = Trace()
    for record in records:
        trace.append(record)
    return schedule(trace, figures, dma_queues=dma_queues)


def test_independent_instructions_on_different_engines_overlap():
    placed = place(op(Engine.VECTOR, [box(1)], [box(2)]), op(Engine.SCALAR, [box(3)], [box(4)]))
    assert placed.start_ns == [0.0, 0.0]


def test_same_engine_serializes_in_program_order():
    first, second = op(Engine.VECTOR, [box(1)], [box(2)]), op(Engine.VECTOR, [box(3)], [box(4)])
    placed = place(first, second)
    assert placed.start_ns[1] == pytest.approx(placed.end_ns[0])
    assert placed.end_ns[0] == pytest.approx(duration_ns(first, TRN2))


def test_raw_dependency_delays_consumer():
    producer = op(Engine.VECTOR, [box(1)], [box(2)])
    consumer = op(Engine.SCALAR, [box(2, 512, 1024)], [box(3)])
    placed = place(producer, consumer)
    assert placed.start_ns[1] == pytest.approx(placed.end_ns[0])
    assert placed.waited_on[1] == 0


def test_war_dependency_delays_writer():
    reader = op(Engine.SCALAR, [box(1)], [box(2)], n=4096)
    writer = op(Engine.VECTOR, [box(5)], [box(1, 0, 16)])
    placed = place(reader, writer)
    assert placed.start_ns[1] == pytest.approx(placed.end_ns[0])


def test_waw_dependency_delays_second_writer():
    first = op(Engine.SCALAR, [box(1)], [box(2)], n=4096)
    second = op(Engine.VECTOR, [box(5)], [box(2, 1000, 2000)])
    placed = place(first, second)
    assert placed.start_ns[1] == pytest.approx(placed.end_ns[0])


def test_non_overlapping_regions_do_not_depend():
    producer = op(Engine.VECTOR, [box(1)], [box(2, 0, 1024)])
    other_bytes = op(Engine.SCALAR, [box(2, 1024, 2048)], [box(3)])
    other_parts = op(Engine.GPSIMD, [box(2, 0, 1024, parts=(64, 128))], [box(4)])
    producer = dataclasses.replace(producer, writes=(box(2, 0, 1024, parts=(0, 64)),))
    other_storage = op(Engine.PE, [box(9, 0, 1024)], [box(10)])
    placed = place(producer, other_bytes, other_parts, other_storage)
    assert placed.start_ns == [0.0, 0.0, 0.0, 0.0]


def test_reads_do_not_depend_on_reads():
    placed = place(op(Engine.VECTOR, [box(1)], [box(2)]), op(Engine.SCALAR, [box(1)], [box(3)]))
    assert placed.start_ns[1] == 0.0


def test_dependency_latency_is_added_with_default_figures():
    # producer on VectorE: ready = end + 200 VectorE cycles (§4.2 PERF: 264 − MIN_II)
    placed = place(op(Engine.VECTOR, [box(1)], [box(2)]), op(Engine.SCALAR, [box(2)], [box(3)]), figures=TRN2)
    assert placed.start_ns[1] == pytest.approx(placed.end_ns[0] + 200 / 0.96)


def test_chain_through_three_engines():
    a = op(Engine.DMA, [Region(7, "hbm", (0, 1), (0, 1 << 20))], [box(1)])
    b = op(Engine.VECTOR, [box(1)], [box(2)])
    c = op(Engine.SCALAR, [box(2)], [box(3)])
    placed = place(a, b, c)
    assert placed.start_ns[1] == pytest.approx(placed.end_ns[0])
    assert placed.start_ns[2] == pytest.approx(placed.end_ns[1])
    assert placed.makespan_ns == pytest.approx(placed.end_ns[2])


def test_dma_queues_run_in_parallel_and_serialize_within_a_queue():
    hbm = [Region(7, "hbm", (0, 1), (0, 1 << 20))]
    narrow = {"partitions": 8}  # one DMA engine each: engines are not the bottleneck here
    q0a, q0b = op(Engine.DMA, hbm, [box(1)], queue=0, **narrow), op(Engine.DMA, hbm, [box(2)], queue=0, **narrow)
    q1 = op(Engine.DMA, hbm, [box(3)], queue=1, **narrow)
    placed = place(q0a, q0b, q1, figures=TRN2, dma_queues="recorded")
    assert placed.track == ["dma.q0", "dma.q0", "dma.q1"]
    # both queues wait the fixed latency, then move data; the second transfer on q0 follows the first
    assert placed.start_ns[0] == pytest.approx(1300)
    assert placed.start_ns[2] == pytest.approx(1300)
    assert placed.start_ns[1] == pytest.approx(placed.end_ns[0])


def test_dma_instructions_are_assigned_round_robin_over_the_queues():
    hbm = [Region(7, "hbm", (0, 1), (0, 1 << 20))]
    records = [op(Engine.DMA, hbm, [box(10 + i)], partitions=8) for i in range(TRN2.dma_queues + 1)]
    placed = place(*records, figures=TRN2)
    assert placed.track == [f"dma.q{i}" for i in range(TRN2.dma_queues)] + ["dma.q0"]
    one_queue = place(*records, figures=dataclasses.replace(TRN2, dma_queues=1))
    assert set(one_queue.track) == {"dma.q0"}


def test_store_waiting_on_compute_does_not_block_a_load_on_another_queue():
    hbm_in, hbm_out = Region(7, "hbm", (0, 1), (0, 1 << 20)), Region(8, "hbm", (0, 1), (0, 1 << 20))
    compute = op(Engine.VECTOR, [box(1)], [box(2)], n=1 << 16)  # ~68 µs: the store must wait for it
    store = op(Engine.DMA, [box(2)], [hbm_out])
    load = op(Engine.DMA, [hbm_in], [box(3)])  # independent of both
    placed = place(compute, store, load, figures=TRN2)
    assert placed.track[1] != placed.track[2]
    assert placed.start_ns[1] >= placed.end_ns[0]
    assert placed.end_ns[2] < placed.end_ns[0]  # the load finished while the store still waited
    # the old single in-order queue: the load is stuck behind the store (head-of-line blocking)
    blocked = place(compute, store, load, figures=dataclasses.replace(TRN2, dma_queues=1))
    assert blocked.start_ns[2] >= blocked.end_ns[1]


def test_two_full_width_transfers_share_the_dma_engines():
    hbm = [Region(7, "hbm", (0, 1), (0, 1 << 20))]
    first, second = op(Engine.DMA, hbm, [box(1)]), op(Engine.DMA, hbm, [box(2)])  # 128 partitions: 16 engines
    placed = place(first, second, figures=TRN2)
    assert placed.track == ["dma.q0", "dma.q1"]
    assert placed.start_ns[0] == pytest.approx(1300)
    assert placed.start_ns[1] == pytest.approx(placed.end_ns[0])  # latencies overlap, bandwidth does not
    # half-width transfers (64 partitions = 8 engines each) fit side by side
    half = place(*(op(Engine.DMA, hbm, [box(3 + i)], partitions=64) for i in range(2)), figures=TRN2)
    assert half.start_ns[0] == half.start_ns[1] == pytest.approx(1300)
    # three of them do not: the third waits for the first pair's engines
    three = place(*(op(Engine.DMA, hbm, [box(3 + i)], partitions=64) for i in range(3)), figures=TRN2)
    assert three.start_ns[2] == pytest.approx(three.end_ns[0])


def test_unknown_queue_policy_is_rejected():
    with pytest.raises(ValueError, match="dma_queues"):
        place(op(Engine.VECTOR), dma_queues="by_engine")


def test_dma_runs_in_parallel_with_compute():
    hbm = [Region(7, "hbm", (0, 1), (0, 1 << 20))]
    placed = place(op(Engine.DMA, hbm, [box(1)]), op(Engine.VECTOR, [box(5)], [box(6)]))
    assert placed.start_ns[1] == 0.0


def test_covering_write_replaces_older_writer():
    small = op(Engine.SCALAR, [box(1)], [box(2, 0, 64)], n=4096)
    cover = op(Engine.VECTOR, [box(5)], [box(2, 0, 4096)])
    reader = op(Engine.GPSIMD, [box(2, 0, 64)], [box(3)])
    placed = place(small, cover, reader)
    assert placed.start_ns[1] == pytest.approx(placed.end_ns[0])
    assert placed.start_ns[2] == pytest.approx(placed.end_ns[1])
    assert placed.waited_on[2] == 1


def test_many_disjoint_writers_never_lose_a_dependency():
    # more disjoint writes than MAX_BOXES force merging; a late read of the first region still waits for it
    slow_first = op(Engine.SCALAR, [box(1)], [box(2, 0, 16)], n=100_000)
    fillers = [op(Engine.VECTOR, [box(1)], [box(2, 16 * i, 16 * i + 16)], n=1) for i in range(1, 3 * MAX_BOXES)]
    reader = op(Engine.GPSIMD, [box(2, 0, 16)], [box(3)])
    placed = place(slow_first, *fillers, reader)
    assert placed.start_ns[-1] >= placed.end_ns[0]


def test_large_trace_schedules():
    records = [op(Engine.VECTOR if i % 2 else Engine.SCALAR, [box(i % 7)], [box(100 + i % 13)]) for i in range(5000)]
    placed = place(*records)
    assert len(placed.end_ns) == 5000
    assert all(end >= start for start, end in zip(placed.start_ns, placed.end_ns, strict=True))


def pe_matmul(writes, rows=None, cols=None, n: int = 32, stationary: int = 32) -> InstructionRecord:
    attrs = {"stationary_free": stationary, "moving_free": n, "fp32": False}
    if rows is not None:
        attrs.update(pe_rows=rows, pe_cols=cols)
    return InstructionRecord("nc_matmul", Engine.PE, 32, n, ("bfloat16", "bfloat16", FP32), 0, (), writes, attrs=attrs)


def test_matmuls_on_disjoint_pe_tiles_run_at_the_same_time():
    # the merge's diagonal 32x32 blocks: four tiles, disjoint in rows and columns
    tiles = [pe_matmul([box(j)], (32 * j, 32 * j + 32), (32 * j, 32 * j + 32)) for j in range(4)]
    s = schedule(Trace(tiles), NO_LATENCY)
    one = duration_ns(tiles[0], NO_LATENCY)
    assert s.start_ns == [0.0] * 4
    assert s.makespan_ns == pytest.approx(one)


def test_pe_tiles_sharing_cells_serialize_and_the_whole_array_waits_for_all():
    quadrant = pe_matmul([box(1)], (0, 64), (0, 64), n=64, stationary=64)
    # rows 32..63 overlap the first tile's cells; the third (another quadrant) is free but issued after the second
    overlapping = pe_matmul([box(2)], (32, 64), (32, 64))
    other = pe_matmul([box(3)], (64, 128), (64, 128), n=64, stationary=64)
    full = pe_matmul([box(4)], n=128, stationary=128)
    s = schedule(Trace([quadrant, overlapping, other, full]), NO_LATENCY)
    d = [duration_ns(r, NO_LATENCY) for r in (quadrant, overlapping, other, full)]
    assert s.start_ns[1] == pytest.approx(d[0])  # waits for the shared cells
    assert s.start_ns[2] == pytest.approx(s.start_ns[1])  # in-order issue: not before the second started
    assert s.start_ns[3] == pytest.approx(max(s.end_ns[:3]))  # the whole array: after every tile
    assert s.makespan_ns == pytest.approx(s.start_ns[3] + d[3])


def test_trn1_tiles_are_at_least_64_wide():

    trn1 = dataclasses.replace(TRN1, dependency_latency_cycles=dict.fromkeys(Engine, 0), dma_fixed_latency_ns=0.0)
    # 32-row tiles 0 and 1 fall in the same 64-row tile of NeuronCore-v2: they serialize
    tiles = [pe_matmul([box(j)], (32 * j, 32 * j + 32), (32 * j, 32 * j + 32)) for j in range(2)]
    s = schedule(Trace(tiles), trn1)
    assert s.start_ns[1] == pytest.approx(s.end_ns[0])


def test_queued_behind_names_the_instruction_holding_the_track():
    first, second = op(Engine.VECTOR, [box(1)], [box(2)]), op(Engine.VECTOR, [box(3)], [box(4)])
    consumer = op(Engine.SCALAR, [box(4)], [box(5)])
    placed = place(first, second, consumer)
    assert placed.queued_behind == [-1, 0, -1]  # the consumer waited on data, not on its (idle) engine
    assert placed.waited_on == [-1, -1, 1]


def test_queued_behind_on_the_pe_array_is_the_cell_holder_or_the_issue_order():
    quadrant = pe_matmul([box(1)], (0, 64), (0, 64), n=64, stationary=64)
    overlapping = pe_matmul([box(2)], (32, 64), (32, 64))
    other = pe_matmul([box(3)], (64, 128), (64, 128), n=64, stationary=64)
    s = schedule(Trace([quadrant, overlapping, other]), NO_LATENCY)
    assert s.queued_behind == [-1, 0, 1]  # shared cells held by 0; 2's cells were free but 1 issued first
