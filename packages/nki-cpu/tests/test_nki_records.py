"""Trace records: one per instruction, with engine, regions, sizes and attrs the cost model reads."""

from __future__ import annotations

import numpy as np

import nki_cpu
from nki_cpu import isa as nisa
from nki_cpu import language as nl
from nki_cpu.cost.record import Engine


@nki_cpu.jit
def _kernel(x):
    out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
    a = nl.ndarray((128, 128), nl.bfloat16, buffer=nl.sbuf)
    b = nl.ndarray((128, 512), nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=x[:, 0:128])
    nisa.dma_copy(dst=b, src=x)
    acc = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)
    nisa.nc_matmul(acc, a, b)
    res = nl.ndarray((128, 512), nl.float32, buffer=nl.sbuf)
    nisa.activation(res, nl.exp, acc, scale=0.5)
    nisa.tensor_scalar(res[:, 256:512], res[:, 256:512], nl.multiply, 2.0)
    nisa.dma_copy(dst=out, src=res)
    return out


def test_records_one_per_instruction_with_engines_and_regions():
    x = np.ones((128, 512), dtype=np.float32).astype(nl.bfloat16)
    nki_cpu.simulate(_kernel)(x)
    trace = nki_cpu.last_trace()
    ops = [(r.opcode, r.engine) for r in trace.records]
    assert ops == [
        ("dma_copy", Engine.DMA),
        ("dma_copy", Engine.DMA),
        ("nc_matmul", Engine.PE),
        ("activation", Engine.SCALAR),
        ("tensor_scalar", Engine.VECTOR),
        ("dma_copy", Engine.DMA),
    ]
    assert [r.index for r in trace.records] == list(range(6))
    load_a, load_b, mm, act, ts, store = trace.records
    assert load_a.reads[0].buffer == "hbm" and load_a.writes[0].buffer == "sbuf"
    assert load_a.reads[0].byte_range == (0, (127 * 512 + 128) * 2)  # bounding box of the strided HBM view
    assert load_a.attrs["contiguous_bytes"] == 256 and load_a.attrs["descriptors"] == 128
    assert load_a.partitions == 128 and load_a.free_elems == 128 and load_a.nbytes == 128 * 128 * 2
    assert mm.reads[0] == load_a.writes[0] and mm.reads[1] == load_b.writes[0]
    assert mm.writes[0].buffer == "psum" and mm.writes[0].byte_range == (0, 2048)
    assert mm.attrs["stationary_free"] == 128 and mm.attrs["moving_free"] == 512 and not mm.attrs["fp32"]
    assert mm.dtypes == ("bfloat16", "bfloat16", "float32")
    assert act.reads[0] == mm.writes[0] and act.attrs["psum_input"]
    assert ts.writes[0].byte_range == (1024, 2048) and ts.writes[0].partitions == (0, 128)
    assert ts.writes[0].overlaps(act.writes[0])
    assert store.reads[0].storage_id == act.writes[0].storage_id
    assert trace.sbuf_high_water == 128 * 2 + 512 * 2 + 512 * 4
    assert trace.psum_high_water == 2048


def test_partition_slices_and_hbm_regions():
    t = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
    region = t[32:64, 8:16].region()
    assert region.partitions == (32, 64) and region.byte_range == (32, 64)
    ap_region = t.ap([[64, 16], [1, 16]], offset=16 * 64 + 16).region()
    assert ap_region.partitions == (16, 32) and ap_region.byte_range == (64, 128)


def test_grid_launch_gives_each_program_a_trace():
    @nki_cpu.jit
    def kernel(x):
        out = nl.ndarray((2, 4), nl.float32, buffer=nl.shared_hbm)
        pid = nl.program_id(0)
        t = nl.load(x[pid : pid + 1, :])
        nisa.tensor_scalar(t, t, nl.add, float(nl.num_programs(axes=0) * 10 + pid))
        nl.store(out[pid : pid + 1, :], t)
        return out

    x = np.zeros((2, 4), np.float32)
    out = nki_cpu.simulate(kernel[2])(x)
    np.testing.assert_array_equal(out, [[20] * 4, [21] * 4])  # both programs wrote their row of the output
    traces = nki_cpu.last_traces()
    assert len(traces) == 2 and all(len(t.records) == 3 for t in traces)


@nki_cpu.jit
def _fp32_matmuls(x, eye):
    a = nl.ndarray((128, 128), nl.float32, buffer=nl.sbuf)
    ident = nl.ndarray((128, 128), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=x)
    nisa.dma_copy(dst=ident, src=eye)
    plain = nl.ndarray((128, 128), nl.float32, buffer=nl.psum)
    nisa.nc_matmul(plain, a, ident)
    hinted = nl.ndarray((128, 128), nl.float32, buffer=nl.psum)
    nisa.nc_matmul(hinted, a, ident, is_moving_onezero=True)
    out = nl.ndarray((128, 128), nl.float32, buffer=nl.shared_hbm)
    plain_sb = nl.ndarray((128, 128), nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(plain_sb, plain)
    res = nl.ndarray((128, 128), nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(res, plain_sb, hinted, nl.subtract)
    nisa.dma_copy(dst=out, src=res)
    return out


def test_onezero_hint_is_recorded_and_halves_the_fp32_matmul_estimate():
    from nki_cpu.cost import TRN2, duration_ns

    x = np.random.default_rng(0).standard_normal((128, 128)).astype(np.float32)
    diff = nki_cpu.simulate(_fp32_matmuls)(x, np.eye(128, dtype=np.float32))
    assert np.all(diff == 0)  # a speed hint only
    plain, hinted = [r for r in nki_cpu.last_trace().records if r.opcode == "nc_matmul"]
    assert (plain.attrs["onezero"], hinted.attrs["onezero"]) == (False, True)
    assert duration_ns(hinted, TRN2) == duration_ns(plain, TRN2) / 2


@nki_cpu.jit
def _tiled_matmuls(x):
    a = nl.ndarray((64, 64), nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=x)
    plain = nl.ndarray((64, 64), nl.float32, buffer=nl.psum)
    nisa.nc_matmul(plain, a, a)
    tiled = nl.ndarray((64, 64), nl.float32, buffer=nl.psum)
    nisa.nc_matmul(tiled, a, a, tile_position=(64, 64), tile_size=(64, 64))
    res = nl.ndarray((64, 64), nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(res, tiled)
    out = nl.ndarray((64, 64), nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=res)
    return out


def test_matmul_tiling_is_recorded_only_when_set():
    x = np.ones((64, 64), dtype=np.float32).astype(nl.bfloat16)
    nki_cpu.simulate(_tiled_matmuls)(x)
    plain, tiled = [r for r in nki_cpu.last_trace().records if r.opcode == "nc_matmul"]
    assert "tile_position" not in plain.attrs and "tile_size" not in plain.attrs
    assert (tiled.attrs["tile_position"], tiled.attrs["tile_size"]) == ((64, 64), (64, 64))
