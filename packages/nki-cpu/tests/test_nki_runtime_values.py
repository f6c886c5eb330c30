"""Run-time values: device data is sealed from the kernel's Python, run-time views and gathers take only their
documented forms, out-of-bounds indices are named errors, and loads of run-time values are instructions.

One forbidden, one allowed and (where a rule is relaxable) one relaxed test per rule of README "Run-time values".
"""

from __future__ import annotations

import numpy as np
import pytest

import nki_cpu
from _helpers import empty, tile
from nki_cpu import checks
from nki_cpu import isa as nisa
from nki_cpu import language as nl
from nki_cpu.tensor import wrap_array


def _run(kernel, *args, relax=()):
    return nki_cpu.simulate(kernel, relax=set(relax))(*args)


def _index_tile(value: int, dtype=nl.int32, buffer=nl.sbuf):
    t = nl.ndarray((1, 1), dtype=dtype, buffer=buffer)
    nisa.memset(dst=t, value=value)
    return t


# --- device_data: a tile's elements never reach the kernel's Python ---------------------------------------------
ACCESSORS = {
    "read": lambda t: t.read(),
    "np": lambda t: t.np(),
    "read_f32": lambda t: t.read_f32(),
    "read_pf": lambda t: t.read_pf(),
    "peek_f32": lambda t: t.peek_f32(),
    "lanes": lambda t: t.lanes(),
    "storage.raw": lambda t: t.storage.raw,
}


@pytest.mark.parametrize("accessor", sorted(ACCESSORS))
def test_reading_a_tile_inside_a_kernel_is_rejected(accessor):
    def kernel(x):
        ACCESSORS[accessor](nl.load(x))

    with pytest.raises(checks.SealedValueError, match=r"inside a kernel reads a device value.*Fix: compute") as info:
        _run(kernel, np.ones((4, 4), np.float32))
    assert info.value.rule == "device_data"


def test_host_code_reads_tiles_outside_a_launch_and_results_after_it():
    def kernel(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(x))
        return out

    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    np.testing.assert_array_equal(_run(kernel, x), x)
    np.testing.assert_array_equal(tile(x).read(), x)  # no launch running: host code


def test_relaxed_device_data_warns_and_reads():
    seen = []

    def kernel(x):
        seen.append(nl.load(x).read())

    with pytest.warns(RuntimeWarning, match="tile.read\\(\\) inside a kernel.*relaxed"):
        _run(kernel, np.full((2, 2), 3.0, np.float32), relax={"device_data"})
    np.testing.assert_array_equal(seen[0], np.full((2, 2), 3.0))


# --- runtime_scalars: NkiScalar / VirtualRegister / run-time offsets are not Python values ----------------------
SCALAR_USES = {
    "int": int,
    "bool": bool,
    "index": lambda v: [0, 1, 2][v],
    "range": lambda v: range(v),
    "branch": lambda v: bool(v < 3),
    "value": lambda v: v.value,
}


@pytest.mark.parametrize(
    "kind, use",
    [(kind, use) for kind in ("scalar", "register") for use in sorted(SCALAR_USES)],
)
def test_python_uses_of_run_time_values_are_rejected(kind, use):

    def kernel(x):
        t = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        if kind == "scalar":
            value = nisa.scalar_load(t)
        else:
            value = nisa.register_alloc()
            nisa.register_load(value, t)
        SCALAR_USES[use](value)

    with pytest.raises(checks.SealedValueError) as info:
        _run(kernel, np.full((1, 1), 1, np.int32))
    assert info.value.rule == "runtime_scalars"


def test_the_offset_of_a_run_time_view_is_sealed_and_a_static_one_is_not():
    def kernel(x):
        t = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[0:1, 0:1])
        i = nisa.scalar_load(t)
        assert x[nl.ds(2, 2), :].offset == 2 * x.shape[1]  # static: program text
        return x[nl.ds(i, 2), :].offset

    with pytest.raises(checks.SealedValueError, match=r"the \.offset of a view addressed at run time"):
        _run(kernel, np.zeros((8, 4), np.int32))


@pytest.mark.parametrize(
    "peek",
    [lambda view, i: view.region(), lambda view, i: nl.ds(i, 2).as_slice()],
    ids=["region", "as_slice"],
)
def test_other_ways_to_the_resolved_address_are_sealed(peek):
    def kernel(x):
        t = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[0:1, 0:1])
        i = nisa.scalar_load(t)
        assert "offset=runtime" in repr(x[nl.ds(i, 2), :])
        peek(x[nl.ds(i, 2), :], i)

    with pytest.raises(checks.SealedValueError, match="run-time"):
        _run(kernel, np.zeros((8, 4), np.int32))


def test_run_time_values_address_and_bound_without_being_read():
    def kernel(x, idx):
        out = nl.ndarray((2, 4), x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=idx)
        i = nisa.scalar_load(t)
        rows = nl.ndarray((2, 4), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=rows, src=x[nl.ds(i * 2 - 1, 2), :])
        nisa.dma_copy(dst=out, src=rows)
        return out

    x = np.arange(32, dtype=np.float32).reshape(8, 4)
    np.testing.assert_array_equal(_run(kernel, x, np.full((1, 1), 3, np.int32)), x[5:7])
    assert nisa.NkiScalar(5).value == 5  # host code: no launch


def test_relaxed_runtime_scalars_warns_and_gives_the_value():
    seen = []

    def kernel(x):
        t = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        seen.append(int(nisa.scalar_load(t)))

    with pytest.warns(RuntimeWarning, match="int\\(\\) of an NkiScalar.*relaxed"):
        _run(kernel, np.full((1, 1), 7, np.int32), relax={"runtime_scalars"})
    assert seen == [7]


# --- register_alloc_value: None or a compile-time int ------------------------------------------------------------
def test_register_alloc_of_a_tensor_is_rejected_and_of_an_int_allowed():
    with pytest.raises(checks.RuleViolationError, match="register_alloc x must be None or a compile-time int"):
        nisa.register_alloc(_index_tile(3))
    register = nisa.register_alloc(4)
    out = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
    nisa.register_store(out, register)
    assert out.read()[0, 0] == 4
    nisa.register_store(out, nisa.register_alloc())
    assert out.read()[0, 0] == 0


def test_relaxed_register_alloc_value_loads_the_tile():
    def kernel():
        out = nl.ndarray((1, 1), nl.int32, buffer=nl.shared_hbm)
        nisa.register_store(out, nisa.register_alloc(_index_tile(9)))
        return out

    with pytest.warns(RuntimeWarning, match="register_alloc.*relaxed"):
        assert _run(kernel, relax={"register_alloc_value"})[0, 0] == 9


# --- scalar_load_source / register_load_source -------------------------------------------------------------------
@pytest.mark.parametrize(
    "shape, buffer", [((1,), nl.sbuf), ((1, 1), nl.psum), ((2, 1), nl.sbuf)], ids=["1-d", "psum", "2x1"]
)
def test_scalar_load_needs_a_1x1_sbuf_or_hbm_tile(shape, buffer):
    with pytest.raises(checks.RuleViolationError, match=r"scalar_load src must be a 1x1 .* in SBUF or HBM"):
        nisa.scalar_load(nl.ndarray(shape, nl.int32, buffer=buffer))
    assert nisa.scalar_load(_index_tile(5)).value == 5
    hbm = wrap_array(np.full((1, 1), 6, np.int64))
    assert nisa.scalar_load(hbm).dtype == "int64"


def test_relaxed_scalar_load_source_warns_and_loads():
    def kernel():
        t = nl.ndarray((1,), nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=t, value=2)
        out = nl.ndarray((1, 1), nl.int32, buffer=nl.shared_hbm)
        nisa.scalar_store(out, nisa.scalar_load(t))
        return out

    with pytest.warns(RuntimeWarning, match="scalar_load src must be a 1x1.*relaxed"):
        assert _run(kernel, relax={"scalar_load_source"})[0, 0] == 2


def test_register_load_needs_one_element_of_at_most_32_bits():
    register = nisa.register_alloc()
    for bad in (nl.ndarray((2,), nl.int32, buffer=nl.sbuf), nl.ndarray((1, 1), nl.int32, buffer=nl.psum)):
        with pytest.raises(checks.RuleViolationError, match="register_load src must be a one-element tensor"):
            nisa.register_load(register, bad)
    with pytest.raises(checks.RuleViolationError, match="32-bit or narrower"):
        nisa.register_load(register, wrap_array(np.ones((1,), np.int64)))
    for good in ((1,), (1, 1)):
        t = nl.ndarray(good, nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=t, value=3)
        nisa.register_load(register, t)
        assert register.value == 3


# --- loads are instructions with their dependencies ----------------------------------------------------------------
def test_scalar_and_register_loads_are_records_the_addressed_dma_reads():
    def kernel(x, idx):
        t = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=idx)
        i = nisa.scalar_load(t) + 1
        r = nisa.register_alloc()
        nisa.register_load(r, t)
        rows = nl.ndarray((1, 4), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=rows, src=x[nl.ds(i, 1), :])
        nisa.dma_copy(dst=rows, src=x[nl.ds(r, 1), :])

    _run(kernel, np.zeros((8, 4), np.float32), np.full((1, 1), 2, np.int32))
    records = nki_cpu.last_trace().records
    opcodes = [r.opcode for r in records]
    assert opcodes == ["dma_copy", "scalar_load", "register_load", "dma_copy", "dma_copy"]
    index_tile = records[0].writes[0]
    for load, use in ((records[1], records[3]), (records[2], records[4])):
        assert any(region.overlaps(index_tile) for region in load.reads)  # ordered after the index's DMA
        assert load.writes[0].buffer == "register" and load.writes[0] in use.reads  # the DMA waits for the load
    report = nki_cpu.cost.estimate(nki_cpu.last_trace())
    assert report.instructions == 5


# --- dynamic_index_count / dynamic_partition_start / indirect_dim_reslice / onchip_offset_int32 ---------------
def _scalar(value, dtype="int32"):
    return nisa.NkiScalar(value, dtype)


def test_two_run_time_indices_on_one_view_are_rejected():
    hbm = wrap_array(np.zeros((8, 8), np.float32))
    with pytest.raises(checks.RuleViolationError, match="at most one run-time index"):
        hbm[nl.ds(_scalar(1), 2), nl.ds(_scalar(2), 2)]
    with pytest.raises(checks.RuleViolationError, match="at most one run-time index"):
        hbm[nl.ds(_scalar(1), 4), :][:, nl.ds(_scalar(2), 2)]
    with pytest.raises(checks.RuleViolationError, match="at most one per view"):
        hbm.ap([[8, 2], [1, 8]], offset=0, scalar_offset=_scalar(1), vector_offset=_index_tile(1))
    assert hbm[nl.ds(_scalar(1), 2), nl.ds(2, 2)].is_indirect()  # one run-time index: allowed


def test_a_run_time_partition_start_on_sbuf_is_rejected_and_on_the_free_dim_allowed():
    sbuf = empty((8, 8))
    with pytest.raises(checks.RuleViolationError, match="partition dim of an SBUF/PSUM tensor"):
        sbuf[nl.ds(_scalar(1), 2), :]
    assert sbuf[:, nl.ds(_scalar(1), 2)].is_indirect()
    assert wrap_array(np.zeros((8, 8), np.float32))[nl.ds(_scalar(1), 2), :].is_indirect()


def test_re_slicing_the_indirect_dim_is_rejected_and_another_dim_allowed():
    window = wrap_array(np.zeros((8, 8), np.float32))[nl.ds(_scalar(1), 4), :]
    with pytest.raises(checks.RuleViolationError, match="dim 0 of a view addressed at run time must be taken whole"):
        window[0:2, :]
    assert window[:, 0:2].shape == (4, 2) and window[:, :].shape == (4, 8)


def test_an_int64_offset_on_sbuf_is_rejected_and_on_hbm_allowed():
    with pytest.raises(checks.RuleViolationError, match=r"must be nl\.int32, got int64"):
        empty((8, 8))[:, nl.ds(_scalar(1, "int64"), 2)]
    assert wrap_array(np.zeros((8, 8), np.float32))[nl.ds(_scalar(1, "int64"), 2), :].is_indirect()


RELAXED_VIEW_FORMS = {
    "dynamic_index_count": lambda: wrap_array(np.zeros((8, 8), np.float32))[nl.ds(_scalar(1), 2), nl.ds(_scalar(2), 2)],
    "indirect_dim_reslice": lambda: wrap_array(np.zeros((8, 8), np.float32))[nl.ds(_scalar(1), 4), :][0:2, :],
    "onchip_offset_int32": lambda: empty((8, 8))[:, nl.ds(_scalar(1, "int64"), 2)],
    "vector_offset_form": lambda: wrap_array(np.zeros((8, 4), np.float32)).ap(
        [[4, 2], [1, 4]], offset=0, vector_offset=wrap_array(np.ones((2, 1), np.int32))
    ),
    "register_load_source": lambda: nisa.register_load(nisa.register_alloc(), wrap_array(np.ones((2,), np.int32))),
}


def _warns_relaxed_and_raises_strict(form, rule: str) -> None:
    """``form`` run in a launch: a warning naming ``rule`` when it is relaxed, its RuleViolationError when not."""
    with pytest.warns(RuntimeWarning, match=rf"rule '{rule}' relaxed"):
        _run(form, relax={rule})
    with pytest.raises(checks.RuleViolationError) as info:
        _run(form)
    assert info.value.rule == rule


@pytest.mark.parametrize("rule", sorted(RELAXED_VIEW_FORMS))
def test_relaxed_run_time_forms_warn_and_proceed(rule):
    _warns_relaxed_and_raises_strict(RELAXED_VIEW_FORMS[rule], rule)


def test_relaxed_run_time_view_rules_warn():
    def kernel():
        empty((8, 8))[nl.ds(_scalar(1), 2), :]

    with pytest.warns(RuntimeWarning, match="partition dim.*relaxed"):
        _run(kernel, relax={"dynamic_partition_start"})


# --- vector_offset_form / dynamic_dge_mode ----------------------------------------------------------------------
def _table():
    values = np.arange(10 * 4, dtype=np.float32).reshape(10, 4)
    return values, wrap_array(values)


def _gather(hbm, idx, **kwargs):
    rows = empty((idx.shape[0], 4))
    view = hbm.ap(pattern=[[4, idx.shape[0]], [1, 4]], offset=0, vector_offset=idx, indirect_dim=0)
    nisa.dma_copy(dst=rows, src=view, **kwargs)
    return rows


@pytest.mark.parametrize(
    "idx",
    [
        lambda: tile(np.array([[1.0], [2.0]], np.float32)),
        lambda: wrap_array(np.array([[1], [2]], np.int32)),
    ],
    ids=["float", "hbm"],
)
def test_a_vector_offset_is_an_integer_sbuf_tile(idx):
    _, hbm = _table()
    with pytest.raises(checks.RuleViolationError, match="vector_offset must be an integer index tile in SBUF"):
        _gather(hbm, idx())


def test_a_vector_offset_addresses_hbm_not_sbuf():
    with pytest.raises(checks.RuleViolationError, match="vector_offset must address an HBM tensor"):
        tile(np.zeros((10, 4), np.float32)).ap(
            [[4, 2], [1, 4]], offset=0, vector_offset=tile(np.ones((2, 1), np.int32))
        )


def test_run_time_addresses_need_descriptors_generated_on_device():
    values, hbm = _table()
    idx = tile(np.array([[7], [2]], np.int32))
    with pytest.raises(checks.RuleViolationError, match="needs descriptors generated on device, got dge_mode=none"):
        _gather(hbm, idx, dge_mode=nisa.dge_mode.none)
    with pytest.raises(checks.RuleViolationError, match="needs software DGE, got dge_mode=hwdge"):
        _gather(hbm, idx, dge_mode=nisa.dge_mode.hwdge)
    with pytest.raises(checks.RuleViolationError, match="dge_mode=none"):
        nisa.dma_copy(dst=empty((2, 4)), src=hbm[nl.ds(_scalar(3), 2), :], dge_mode=nisa.dge_mode.none)
    np.testing.assert_array_equal(_gather(hbm, idx, dge_mode=nisa.dge_mode.swdge).read(), values[[7, 2]])
    rows = empty((2, 4))
    nisa.dma_copy(dst=rows, src=hbm[nl.ds(_scalar(3), 2), :], dge_mode=nisa.dge_mode.hwdge)
    np.testing.assert_array_equal(rows.read(), values[3:5])


def test_relaxed_dynamic_dge_mode_warns_and_copies():
    values = np.arange(40, dtype=np.float32).reshape(10, 4)

    def kernel(x):
        out = nl.ndarray((2, 4), x.dtype, buffer=nl.shared_hbm)
        rows = nl.ndarray((2, 4), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=rows, src=x[nl.ds(_scalar(3), 2), :], dge_mode=nisa.dge_mode.none)
        nisa.dma_copy(dst=out, src=rows)
        return out

    with pytest.warns(RuntimeWarning, match="dge_mode=none.*relaxed"):
        np.testing.assert_array_equal(_run(kernel, values, relax={"dynamic_dge_mode"}), values[3:5])


# --- dynamic_out_of_bounds / oob_mode.skip ------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [-1, 10], ids=["negative", "past-the-end"])
def test_a_gather_index_outside_the_tensor_is_a_named_error(bad):
    _, hbm = _table()
    with pytest.raises(checks.OutOfBoundsError, match="run-time index must address elements inside") as info:
        _gather(hbm, tile(np.array([[1], [bad]], np.int32)))
    assert info.value.rule == "dynamic_out_of_bounds" and isinstance(info.value, IndexError)


@pytest.mark.parametrize("start", [-1, 9])
def test_a_run_time_start_outside_the_tensor_is_a_named_error(start):
    _, hbm = _table()
    with pytest.raises(checks.OutOfBoundsError, match="run-time index must address elements inside"):
        nisa.dma_copy(dst=empty((2, 4)), src=hbm[nl.ds(_scalar(start), 2), :])


def test_oob_mode_skip_skips_the_rows_outside_and_copies_the_rest():
    values, hbm = _table()
    rows = tile(np.full((3, 4), -5.0, np.float32))
    view = hbm.ap(pattern=[[4, 3], [1, 4]], offset=0, vector_offset=tile(np.array([[1], [-1], [12]], np.int32)))
    nisa.dma_copy(dst=rows, src=view, oob_mode=nisa.oob_mode.skip)
    np.testing.assert_array_equal(rows.read(), np.stack([values[1], np.full(4, -5.0), np.full(4, -5.0)]))
    dst = tile(np.full((2, 4), -5.0, np.float32))
    nisa.dma_copy(dst=dst, src=hbm[nl.ds(_scalar(9), 2), :], oob_mode=nisa.oob_mode.skip)
    np.testing.assert_array_equal(dst.read(), np.full((2, 4), -5.0))


def test_a_store_skipped_outside_its_tensor_orders_nothing():
    """A skipped transfer touches no byte: two stores skipped past the end wait neither for each other nor for a
    store to row 0 (an in-bounds run-time address is resolved as before: two stores to row 2 are ordered)."""

    def kernel(pool, rows):
        src = nl.ndarray((1, 4), pool.dtype, buffer=nl.sbuf)
        nisa.memset(dst=src, value=1.0)
        index = nl.ndarray((1, 4), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=index, src=rows)
        for k in range(4):  # rows 0, 9 (outside), 9 (outside), 2, 2
            row = nisa.scalar_load(index[:, k : k + 1])
            dst = pool.ap(pattern=[[4, 1], [1, 4]], offset=0, scalar_offset=row, indirect_dim=0)
            nisa.dma_copy(dst=dst, src=src, oob_mode=nisa.oob_mode.skip)
        nisa.dma_copy(dst=dst, src=src, oob_mode=nisa.oob_mode.skip)

    values = np.zeros((8, 4), np.float32)
    _run(kernel, values, np.array([[0, 9, 9, 2]], np.int32))
    np.testing.assert_array_equal(values[[0, 2]], np.ones((2, 4)))
    stores = [r for r in nki_cpu.last_trace().records if r.opcode == "dma_copy"][1:]
    first, skipped, again, to_two, to_two_again = (store.writes[0] for store in stores)
    assert not skipped.overlaps(first) and not again.overlaps(skipped) and not again.overlaps(first)
    assert to_two_again.overlaps(to_two) and not to_two.overlaps(first)


def test_a_skipped_transfer_moves_no_bytes_and_a_partly_skipped_gather_its_rows_only():
    """The cost model charges what a DMA moves: nothing for a transfer skipped outside its tensor (its fixed
    latency only), the rows inside for a gather with rows outside."""
    from nki_cpu.cost.durations import dma_times
    from nki_cpu.cost.figures import TRN2

    def kernel(x, rows):
        index = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=index, src=rows)
        row = nisa.scalar_load(index)
        whole = nl.ndarray((2, 4), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=whole, src=x[nl.ds(row, 2), :], oob_mode=nisa.oob_mode.skip)
        gathered = nl.ndarray((4, 4), x.dtype, buffer=nl.sbuf)
        offsets = nl.ndarray((4, 1), nl.int32, buffer=nl.sbuf)
        nisa.iota(dst=offsets, pattern=[[0, 1]], offset=0, channel_multiplier=4)  # rows 0, 4, 8 and 12 (outside)
        nisa.dma_copy(dst=gathered, src=x.ap(pattern=[[4, 4], [1, 4]], offset=0, vector_offset=offsets,
                                             indirect_dim=0), oob_mode=nisa.oob_mode.skip)  # fmt: skip

    _run(kernel, np.arange(40, dtype=np.float32).reshape(10, 4), np.array([[9]], np.int32))
    skipped, gathered = [r for r in nki_cpu.last_trace().records if r.opcode == "dma_copy"][1:]
    assert skipped.nbytes == 0 and dma_times(skipped, TRN2)[1] == 0.0
    assert gathered.nbytes == 3 * 4 * 4


def test_an_on_chip_operand_at_a_run_time_offset_is_ordered_against_its_whole_rows():
    """The compiler cannot tell where a run-time offset points inside a tile, so a read at one waits for every
    earlier write to the tile's partitions, even where the offset it resolves to is elsewhere."""

    def kernel(rows):
        index = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=index, src=rows)
        offset = nisa.scalar_load(index)
        pair = nl.ndarray((4, 16), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=pair[:, 8:], value=2.0)
        nisa.memset(dst=pair[:, :8], value=1.0)
        got = nl.ndarray((4, 8), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=got, src=pair[:, nl.ds(offset, 8)])

    _run(kernel, np.array([[8]], np.int32))
    records = nki_cpu.last_trace().records
    first_half, read = next(r for r in records if r.opcode == "memset" and r.writes[0].byte_range[0] == 0), records[-1]
    assert read.reads[0].overlaps(first_half.writes[0])


def test_relaxed_dynamic_out_of_bounds_warns_and_skips():
    values = np.arange(40, dtype=np.float32).reshape(10, 4)

    def kernel(x):
        out = nl.ndarray((2, 4), x.dtype, buffer=nl.shared_hbm)
        rows = nl.ndarray((2, 4), x.dtype, buffer=nl.sbuf)
        nisa.memset(dst=rows, value=-5.0)
        index = nl.ndarray((2, 1), nl.int32, buffer=nl.sbuf)
        nisa.iota(dst=index, pattern=[[0, 1]], offset=0, channel_multiplier=12)  # rows 0 and 12 (outside)
        nisa.dma_copy(dst=rows, src=x.ap(pattern=[[4, 2], [1, 4]], offset=0, vector_offset=index, indirect_dim=0))
        nisa.dma_copy(dst=out, src=rows)
        return out

    with pytest.warns(RuntimeWarning, match="run-time index must address elements inside.*relaxed"):
        got = _run(kernel, values, relax={"dynamic_out_of_bounds"})
    np.testing.assert_array_equal(got, np.stack([values[0], np.full(4, -5.0)]))


def test_oob_mode_skip_skips_scatter_rows_outside():
    values = np.zeros((6, 4), np.float32)
    hbm = wrap_array(values)
    src = tile(np.arange(8, dtype=np.float32).reshape(2, 4))
    view = hbm.ap(pattern=[[4, 2], [1, 4]], offset=0, vector_offset=tile(np.array([[6], [2]], np.int32)))
    nisa.dma_copy(dst=view, src=src, oob_mode=nisa.oob_mode.skip)
    expected = np.zeros((6, 4), np.float32)
    expected[2] = [4, 5, 6, 7]
    np.testing.assert_array_equal(values, expected)


# --- unique_scatter_indices ------------------------------------------------------------------------------------------
def _scatter_compute(indices):
    hbm = wrap_array(np.zeros((6, 4), np.float32))
    dst = hbm.ap(
        pattern=[[4, len(indices)], [1, 4]], offset=0, vector_offset=tile(np.array(indices, np.int32)[:, None])
    )
    src = tile(np.ones((len(indices), 4), np.float32))
    nisa.dma_compute(dst=dst, srcs=[src, src], reduce_op=nl.add)
    return hbm


def test_dma_compute_scatter_indices_must_be_distinct():
    with pytest.raises(checks.RuleViolationError, match=r"scatter indices must be distinct.*1 repeated"):
        _scatter_compute([1, 3, 1])
    np.testing.assert_array_equal(_scatter_compute([1, 3]).read()[[1, 3]], np.full((2, 4), 2.0))


def test_relaxed_unique_scatter_indices_warns():
    def kernel():
        _scatter_compute([2, 2])

    with pytest.warns(RuntimeWarning, match="distinct.*relaxed"):
        _run(kernel, relax={"unique_scatter_indices"})


# --- issue 29 item 7: a vector-offset source is addressed at run time ------------------------------------------
def test_a_vector_offset_source_is_run_time_addressed_for_dma_transpose():
    hbm = wrap_array(np.zeros((32, 16), np.float32).astype(np.float32))
    view = hbm.ap(pattern=[[16, 16], [1, 16]], offset=0, vector_offset=tile(np.arange(16, dtype=np.int32)[:, None]))
    assert view.is_runtime_addressed()
    with pytest.raises(checks.RuleViolationError, match="dma_transpose src addressed at run time"):
        nisa.dma_transpose(dst=empty((16, 16)), src=view)


# --- issue 40: the remaining doc-forbidden run-time forms, and the documented forms beside them ----------------
def _window(sbuf_cols: int = 8):
    """An fp32 SBUF tile's columns 2..6 addressed at run time (a free-dim nl.ds with a run-time start)."""
    return empty((4, sbuf_cols))[:, nl.ds(_scalar(2), 4)]


def test_a_dtype_view_of_a_run_time_view_is_rejected_and_of_the_allocation_allowed():
    with pytest.raises(checks.RuleViolationError, match=r"view\(dtype\) of a view addressed at run time"):
        _window().view(nl.bfloat16)
    with pytest.raises(checks.RuleViolationError, match=r"ap\(dtype=\) of a view addressed at run time"):
        _window().ap([[8, 4], [1, 8]], dtype=nl.bfloat16)
    rows = tile(np.array([[1], [2]], np.int32))
    gather = wrap_array(np.zeros((8, 4), np.float32)).ap([[4, 2], [1, 4]], offset=0, vector_offset=rows)
    with pytest.raises(checks.RuleViolationError, match="addressed at run time"):
        gather.view(nl.int32)
    halves = empty((4, 8)).view(nl.bfloat16)  # the allocation: allowed, and then addressed at run time
    assert halves[:, nl.ds(_scalar(2), 4)].is_indirect()
    # the documented spelling: reinterpretation and run-time offset in one .ap on the allocation
    view = empty((4, 8)).ap([[16, 4], [1, 8]], dtype=nl.bfloat16, scalar_offset=_scalar(1), indirect_dim=1)
    assert view.is_indirect() and view.dtype == nl.bfloat16


def test_re_slicing_the_run_time_dim_through_a_relaxed_dtype_view_is_still_rejected():
    def kernel():
        halves = _window().view(nl.bfloat16)  # relaxed: warns, and keeps the run-time index's dimension
        with pytest.raises(checks.RuleViolationError, match="dim 1 of a view addressed at run time must be taken"):
            halves[:, 1:8:2]
        assert halves[0:2, :].shape == (2, 8)  # the other dimension may still be sliced

    with pytest.warns(RuntimeWarning, match="rule 'runtime_view_dtype' relaxed"):
        _run(kernel, relax={"runtime_view_dtype"})


def test_a_run_time_partition_start_through_ap_is_rejected_and_a_free_dim_offset_allowed():
    sbuf = empty((8, 8))
    with pytest.raises(checks.RuleViolationError, match="indirect_dim=0 on an SBUF/PSUM tensor"):
        sbuf.ap([[8, 2], [1, 8]], scalar_offset=_scalar(1), indirect_dim=0)
    with pytest.raises(checks.RuleViolationError, match="indirect_dim=0 on an SBUF/PSUM tensor"):
        sbuf.ap([[8, 2], [1, 8]], scalar_offset=_index_tile(1), indirect_dim=0)  # a (1, 1) tile is run time too
    assert sbuf.ap([[8, 8], [1, 2]], scalar_offset=_scalar(3), indirect_dim=1).is_indirect()
    # the documented form: scalar_offset a (1, 1) SBUF tensor, on HBM (a DMA's run-time side)
    values = np.arange(32, dtype=np.float32).reshape(8, 4)
    rows = empty((2, 4))
    nisa.dma_copy(dst=rows, src=wrap_array(values).ap([[4, 2], [1, 4]], scalar_offset=_index_tile(3), indirect_dim=0))
    np.testing.assert_array_equal(rows.read(), values[3:5])


def test_ds_with_a_1x1_uint32_start_addresses_at_run_time():
    """The v2.33 ``nl.ds`` page's own form: the start a (1, 1) uint32 tile."""
    values = np.arange(32, dtype=np.float32).reshape(8, 4)
    rows = empty((2, 4))
    nisa.dma_copy(dst=rows, src=wrap_array(values)[nl.ds(_index_tile(5, nl.uint32), 2), :])
    np.testing.assert_array_equal(rows.read(), values[5:7])
    assert empty((4, 8))[:, nl.ds(_index_tile(5, nl.uint32), 2)].is_indirect()


def _summed(dst, srcs, **kwargs):
    nisa.dma_compute(dst=dst, srcs=srcs, reduce_op=nl.add, **kwargs)


def test_dma_compute_at_a_run_time_address_is_rejected_and_at_a_static_one_allowed():
    values = np.arange(32, dtype=np.float32).reshape(8, 4)
    hbm = wrap_array(values.copy())
    ones = tile(np.ones((2, 4), np.float32))
    with pytest.raises(checks.RuleViolationError, match=r"srcs\[0\] must have a compile-time known address"):
        _summed(empty((2, 4)), [hbm[nl.ds(_scalar(3), 2), :], ones])
    with pytest.raises(checks.RuleViolationError, match="dst must have a compile-time known address"):
        _summed(hbm.ap([[4, 2], [1, 4]], scalar_offset=_scalar(3), indirect_dim=0), [ones, ones])
    dst = empty((2, 4))
    _summed(dst, [hbm[3:5, :], ones])  # static addresses: allowed
    np.testing.assert_array_equal(dst.read(), values[3:5] + 1)
    # the documented alternative: the run-time window copied into a fixed tile first
    window = empty((2, 4))
    nisa.dma_copy(dst=window, src=hbm[nl.ds(_scalar(3), 2), :])
    _summed(dst, [window, ones])
    np.testing.assert_array_equal(dst.read(), values[3:5] + 1)


def test_dma_compute_through_a_vector_offset_is_allowed():
    np.testing.assert_array_equal(_scatter_compute([1, 3]).read()[[1, 3]], np.full((2, 4), 2.0))


def test_dma_compute_with_unique_indices_false_is_rejected():
    ones = tile(np.ones((2, 4), np.float32))
    with pytest.raises(checks.RuleViolationError, match="unique_indices must be True, got False"):
        _summed(empty((2, 4)), [ones, ones], unique_indices=False)
    dst = empty((2, 4))
    _summed(dst, [ones, ones], unique_indices=True)
    np.testing.assert_array_equal(dst.read(), np.full((2, 4), 2.0))


ISSUE_40_FORMS = {
    "runtime_view_dtype": lambda: _window().view(nl.int32),
    "dynamic_partition_start": lambda: empty((8, 8)).ap([[8, 2], [1, 8]], scalar_offset=_scalar(1), indirect_dim=0),
    "dma_compute_static_address": lambda: _summed(
        empty((2, 4)), [wrap_array(np.zeros((8, 4), np.float32))[nl.ds(_scalar(3), 2), :], empty((2, 4))]
    ),
    "dma_compute_unique_indices": lambda: _summed(
        empty((2, 4)), [tile(np.ones((2, 4), np.float32))], unique_indices=False
    ),
}


@pytest.mark.parametrize("rule", sorted(ISSUE_40_FORMS))
def test_relaxed_issue_40_forms_warn_and_proceed(rule):
    _warns_relaxed_and_raises_strict(ISSUE_40_FORMS[rule], rule)
