"""The documented constraints nki-cpu enforces (README, "What is enforced"): for each rule, the forbidden form
raises the simulator-style error naming instruction, operand, value and limit, and the allowed form runs. A rule
relaxed with ``simulate(relax=...)`` warns instead of raising — never silently."""

from __future__ import annotations

import numpy as np
import pytest

import nki_cpu
from _helpers import empty, rng, tile
from nki_cpu import checks, state
from nki_cpu import isa as nisa
from nki_cpu import language as nl


@pytest.fixture(autouse=True)
def _fresh_state():
    state.reset_detached()  # the accumulation-group bookkeeping lives in the launch state
    yield
    state.reset_detached()


def _data(shape=(128, 64)) -> np.ndarray:
    return rng(1).standard_normal(shape).astype(np.float32)


# --- GpSimd tensor_scalar: rsqrt only ---------------------------------------------------------------------------
def test_gpsimd_tensor_scalar_other_than_rsqrt_is_rejected():
    with pytest.raises(AssertionError, match=r"tensor_scalar engine gpsimd op0=multiply op1=None is not allowed"):
        nisa.tensor_scalar(empty((128, 64)), tile(_data()), nl.multiply, 2.0, engine=nisa.gpsimd_engine)


def test_gpsimd_tensor_scalar_rsqrt_runs():
    data = np.abs(_data()) + 0.5
    dst = empty((128, 64))
    nisa.tensor_scalar(dst, tile(data), nl.rsqrt, 0.0, engine=nisa.engine.gpsimd)
    np.testing.assert_allclose(dst.read(), 1 / np.sqrt(data), rtol=1e-6)


# --- ScalarE tensor_scalar on trn2: (multiply, add), (multiply, -), (add, -) -----------------------------------
def test_scalar_engine_tensor_scalar_other_pairs_are_rejected_on_trn2():
    with pytest.raises(AssertionError, match=r"engine scalar op0=subtract op1=None is not supported"):
        nisa.tensor_scalar(empty((128, 64)), tile(_data()), nl.subtract, 1.0, engine=nisa.scalar_engine)


def test_scalar_engine_tensor_scalar_documented_pairs_run(monkeypatch):
    data = _data()
    dst = empty((128, 64))
    nisa.tensor_scalar(dst, tile(data), nl.multiply, 2.0, op1=nl.add, operand1=1.0, engine=nisa.scalar_engine)
    np.testing.assert_allclose(dst.read(), data * 2 + 1, rtol=1e-6)
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")  # v4 ScalarE runs tensor_scalar natively
    nisa.tensor_scalar(dst, tile(data), nl.subtract, 1.0, engine=nisa.scalar_engine)
    np.testing.assert_allclose(dst.read(), data - 1, rtol=1e-6)


# --- fp32 operand tiles: tensor_scalar operand0/1, activation scale ---------------------------------------------
def test_non_fp32_scalar_operand_tiles_are_rejected():
    column = tile(np.ones((128, 1), np.float32), nl.bfloat16)
    with pytest.raises(AssertionError, match="tensor_scalar operand0 dtype bfloat16 must be float32"):
        nisa.tensor_scalar(empty((128, 64)), tile(_data()), nl.multiply, column)
    with pytest.raises(AssertionError, match="activation scale dtype bfloat16 must be float32"):
        nisa.activation(empty((128, 64)), nl.copy, tile(_data()), scale=column)


def test_fp32_scalar_operand_tiles_and_numbers_run():
    data, col = _data(), rng(2).standard_normal((128, 1)).astype(np.float32)
    dst = empty((128, 64))
    nisa.tensor_scalar(dst, tile(data, nl.bfloat16), nl.multiply, tile(col), op1=nl.add, operand1=0.5)
    np.testing.assert_allclose(dst.read(), data.astype(nl.bfloat16).astype(np.float32) * col + 0.5, rtol=1e-6)
    nisa.activation(dst, nl.copy, tile(data), scale=tile(col))
    np.testing.assert_allclose(dst.read(), data * col, rtol=1e-6)


# --- activation reduce_op = add -----------------------------------------------------------------------------------
def test_activation_reduce_op_other_than_add_is_rejected():
    with pytest.raises(AssertionError, match="activation reduce_op maximum is not allowed"):
        nisa.activation(
            empty((128, 64)), nl.exp, tile(_data()), reduce_op=nl.maximum, reduce_res=empty((128, 1)),
            reduce_cmd=nisa.reduce_cmd.reset_reduce,
        )  # fmt: skip


def test_activation_reduce_add_runs():
    data, res = _data(), empty((128, 1))
    nisa.activation(
        empty((128, 64)), nl.copy, tile(data), reduce_op=nl.add, reduce_res=res, reduce_cmd=nisa.reduce_cmd.reset_reduce
    )
    np.testing.assert_allclose(res.read()[:, 0], data.sum(axis=1), rtol=1e-5)


# --- activation on GpSimd: NeuronCore-v4 and newer only ----------------------------------------------------------
def test_activation_on_gpsimd_is_rejected_on_trn2():
    with pytest.raises(AssertionError, match="activation engine gpsimd is not available on this target"):
        nisa.activation(empty((128, 64)), nl.exp, tile(_data()), engine=nisa.engine.gpsimd)


def test_activation_on_gpsimd_runs_on_trn3_and_on_scalar_everywhere(monkeypatch):
    data = _data()
    dst = empty((128, 64))
    nisa.activation(dst, nl.exp, tile(data), engine=nisa.engine.scalar)
    np.testing.assert_allclose(dst.read(), np.exp(data), rtol=1e-6)
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")
    nisa.activation(dst, nl.tanh, tile(data), engine=nisa.engine.gpsimd)
    np.testing.assert_allclose(dst.read(), np.tanh(data), rtol=1e-6)


# --- tensor_tensor on vector / gpsimd -----------------------------------------------------------------------------
def test_tensor_tensor_on_the_scalar_engine_is_rejected():
    with pytest.raises(AssertionError, match="tensor_tensor engine scalar is not allowed"):
        nisa.tensor_tensor(empty((128, 64)), tile(_data()), tile(_data()), nl.add, engine=nisa.scalar_engine)


def test_tensor_tensor_on_vector_and_gpsimd_runs():
    data = _data()
    for engine in (nisa.vector_engine, nisa.gpsimd_engine):
        dst = empty((128, 64))
        nisa.tensor_tensor(dst, tile(data), tile(data), nl.add, engine=engine)
        np.testing.assert_allclose(dst.read(), 2 * data)


# --- one PSUM bank per instruction write ----------------------------------------------------------------------------
def test_psum_write_spanning_two_banks_is_rejected():
    wide = empty((128, 1024), buffer=nl.psum)  # 4 KiB per partition: two banks
    with pytest.raises(AssertionError, match="tensor_copy dst bytes per partition 4096 exceeds maximum 2048"):
        nisa.tensor_copy(wide, tile(np.zeros((128, 1024), np.float32)))
    with pytest.raises(AssertionError, match=r"tensor_copy dst byte range \[1024, 3072\) per partition crosses"):
        nisa.tensor_copy(wide[:, 256:768], tile(np.zeros((128, 512), np.float32)))


def test_psum_write_inside_one_bank_runs(monkeypatch):
    wide = empty((128, 1024), buffer=nl.psum)
    nisa.tensor_copy(wide[:, 512:1024], tile(np.ones((128, 512), np.float32)))
    assert np.all(wide.read()[:, 512:] == 1.0)
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")  # v4 instructions may span banks
    nisa.tensor_copy(wide, tile(np.zeros((128, 1024), np.float32)))
    assert np.all(wide.read() == 0.0)


# --- at most 8 matmul accumulation groups outstanding ----------------------------------------------------------------
def _groups(count: int) -> list:
    """Start ``count`` accumulation groups (one matmul each), then add a second matmul to each, oldest first;
    returns the accumulators (read them after the launch)."""
    stationary, moving = tile(np.eye(16, dtype=np.float32)), tile(np.ones((16, 16), np.float32))
    accumulators = [empty((16, 16), buffer=nl.psum) for _ in range(count)]
    for acc in accumulators:
        nisa.nc_matmul(acc, stationary, moving)
    for acc in accumulators:
        nisa.nc_matmul(acc, stationary, moving, accumulate=True)
    return accumulators


def test_nine_outstanding_accumulation_groups_are_rejected():
    with pytest.raises(AssertionError, match="nc_matmul dst outstanding accumulation groups 9 exceeds maximum 8"):
        _groups(9)


def test_eight_outstanding_and_any_number_of_sequential_groups_run():
    assert all(np.all(acc.read() == 2.0) for acc in _groups(8))
    stationary, moving = tile(np.eye(16, dtype=np.float32)), tile(np.ones((16, 16), np.float32))
    for _ in range(20):  # each group closes (its last matmul) before the next opens
        acc = empty((16, 16), buffer=nl.psum)
        nisa.nc_matmul(acc, stationary, moving)
        nisa.nc_matmul(acc, stationary, moving, accumulate=True)
    for _ in range(20):  # single matmuls are not accumulation groups, however many are pending
        nisa.nc_matmul(empty((16, 16), buffer=nl.psum), stationary, moving)


def test_relaxed_accumulation_limit_warns_and_runs():
    kernel = nki_cpu.simulate(lambda: _groups(9), relax={"accumulation_groups"})
    with pytest.warns(RuntimeWarning, match="accumulation groups 9 exceeds maximum 8.*relaxed"):
        accumulators = kernel()
    assert all(np.all(acc == 2.0) for acc in accumulators)


# --- launch grid = LNC degree ---------------------------------------------------------------------------------------
@nki_cpu.jit
def _programs(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    nisa.tensor_scalar(t, t, nl.add, float(nl.num_programs()))
    nl.store(out, t)
    return out


def test_launch_grid_beyond_the_lnc_degree_is_rejected(monkeypatch):
    x = np.zeros((4, 8), np.float32)
    with pytest.raises(AssertionError, match=r"launch grid 3 is not an LNC degree of this target \(allowed: 1, 2\)"):
        _programs[3](x)
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    with pytest.raises(AssertionError, match=r"launch grid 2 is not an LNC degree of this target \(allowed: 1\)"):
        _programs[2](x)


def test_launch_grid_of_one_or_two_runs_and_a_relaxed_grid_warns():
    x = np.zeros((4, 8), np.float32)
    assert np.all(_programs[2](x) == 2.0)
    assert np.all(_programs[1](x) == 1.0)
    with pytest.warns(RuntimeWarning, match="launch grid 4 is not an LNC degree"):
        assert np.all(nki_cpu.simulate(_programs[4], relax={"lnc_grid"})(x) == 4.0)


# --- buffers are nl objects, not strings (NKI 0.3.0+) -----------------------------------------------------------------
def test_buffer_given_as_a_string_is_rejected():
    with pytest.raises(AssertionError, match=r"ndarray buffer 'sbuf' is a string; pass nl\.sbuf"):
        nl.ndarray((128, 4), nl.float32, buffer="sbuf")


def test_buffer_objects_run():
    assert nl.ndarray((128, 4), nl.float32, buffer=nl.psum).buffer == nl.psum
    assert nl.zeros((128, 4), nl.float32, buffer=nl.sbuf).buffer == nl.sbuf


# --- accumulate=True onto PSUM no matmul initialised: a warning, as the simulator gives -----------------------------
def test_accumulate_onto_uninitialised_psum_warns():
    acc = empty((16, 16), buffer=nl.psum)
    nisa.memset(acc, 0.0)
    with pytest.warns(RuntimeWarning, match="accumulate=True into PSUM not initialised by an earlier nc_matmul"):
        nisa.nc_matmul(acc, tile(np.eye(16, dtype=np.float32)), tile(np.ones((16, 16), np.float32)), accumulate=True)


def test_accumulate_after_a_matmul_does_not_warn(recwarn):
    acc = empty((16, 16), buffer=nl.psum)
    stationary, moving = tile(np.eye(16, dtype=np.float32)), tile(np.ones((16, 16), np.float32))
    nisa.nc_matmul(acc, stationary, moving, accumulate=False)
    nisa.nc_matmul(acc, stationary, moving, accumulate=True)
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
    assert np.all(acc.read() == 2.0)


# --- the switch itself ------------------------------------------------------------------------------------------------
def test_relax_names_only_known_rules():
    with pytest.raises(ValueError, match=r"unknown rules.*'no_such_rule'"):
        nki_cpu.simulate(_programs, relax={"no_such_rule"})
    assert "accumulation_groups" in checks.RULES


# --- nc_matmul tiling mode: both tile arguments, aligned, inside the PE array -------------------------------------
def _tiled(tile_position, tile_size, k=32, m=32, **kwargs):
    """A [k, m] x [k, 8] matmul with the given tiling arguments; returns its result."""
    stationary = rng(60).standard_normal((k, m)).astype(np.float32)
    moving = rng(61).standard_normal((k, 8)).astype(np.float32)
    dst = empty((m, 8), buffer=nl.psum)
    nisa.nc_matmul(dst, tile(stationary), tile(moving), tile_position=tile_position, tile_size=tile_size, **kwargs)
    return dst, stationary.T @ moving


@pytest.mark.parametrize(
    ("position", "size", "message"),
    [
        ((32, 0), (), r"tile_position \(32, 0\) and tile_size \(\) must both be set"),
        ((), (32, 32), r"tile_position \(\) and tile_size \(32, 32\) must both be set"),
        ((16, 0), (32, 32), "tile_position start row 16 must be a multiple of the row size 32"),
        ((0, 96), (32, 64), r"start column 96 must be a multiple of the column size 64 with start \+ size <= 128"),
        ((0, 0), (256, 128), "tile_size row size 256 must be in"),
    ],
)
def test_misplaced_pe_tiles_are_rejected(position, size, message):
    with pytest.raises(AssertionError, match=message):
        _tiled(position, size)


def test_stationary_larger_than_its_tile_is_rejected():
    with pytest.raises(AssertionError, match=r"stationary \[64, 32\] does not fit tile_size \(32, 128\)"):
        _tiled((0, 0), (32, 128), k=64)


def test_double_row_with_column_tiling_is_rejected():
    stationary = tile(np.ones((32, 2, 16), np.float32), nl.float8_e4m3)
    moving = tile(np.ones((32, 2, 8), np.float32), nl.float8_e4m3)
    with pytest.raises(AssertionError, match="double_row cannot be combined with column tiling"):
        nisa.nc_matmul(
            empty((16, 8), buffer=nl.psum),
            stationary,
            moving,
            perf_mode="double_row",
            tile_position=(0, 64),
            tile_size=(64, 64),
        )


@pytest.mark.parametrize(
    ("position", "size"), [((96, 96), (32, 32)), ((64, 0), (64, 128)), ((0, 0), (48, 48)), ((0, 64), (128, 64))]
)
def test_documented_pe_tiles_run_with_the_untiled_result(position, size):
    got, expected = _tiled(position, size)
    np.testing.assert_allclose(got.read(), expected, rtol=1e-5, atol=1e-5)


def test_relaxed_pe_tiling_warns_and_runs():
    def misplaced():
        _tiled((16, 0), (32, 32))

    with pytest.warns(RuntimeWarning, match="start row 16 must be a multiple.*relaxed"):
        nki_cpu.simulate(misplaced, relax={"pe_tiling"})()


# --- dma_transpose from a run-time-addressed source: not a documented form -------------------------------------
def _hbm(values: np.ndarray, dtype: object) -> object:
    t = nl.ndarray(values.shape, dtype, buffer=nl.hbm)
    t.write(values)
    return t


def _transpose_tokens(dtype: object, runtime: bool) -> tuple[object, object]:
    """Transpose tokens [32, 64) of a [128, 64] HBM tensor: from a run-time start (an ``NkiScalar``, as a compiled
    loop's iteration value is) through ``nl.ds``, or from the same start as a Python int. Returns (dst, src)."""
    src = _hbm(_data((128, 64)), dtype)
    start = nki_cpu.isa.NkiScalar(32) if runtime else 32
    dst = empty((64, 32), dtype)
    nisa.dma_transpose(dst=dst, src=src[nl.ds(start, 32), :])
    return dst, src


@pytest.mark.parametrize("dtype", [nl.bfloat16, nl.float32])
def test_transpose_from_a_run_time_start_is_rejected(dtype):
    with pytest.raises(AssertionError, match=r"dma_transpose src addressed at run time .* load it with dma_copy"):
        _transpose_tokens(dtype, runtime=True)


def test_transpose_from_a_run_time_scalar_offset_is_rejected():
    src = _hbm(_data((128, 64)), nl.bfloat16)
    view = src.ap(pattern=[[64, 32], [1, 64]], offset=0, scalar_offset=nki_cpu.isa.NkiScalar(1), indirect_dim=0)
    with pytest.raises(AssertionError, match=r"dma_transpose src addressed at run time"):
        nisa.dma_transpose(dst=empty((64, 32), nl.bfloat16), src=view)


@pytest.mark.parametrize("dtype", [nl.bfloat16, nl.float32])
def test_transpose_from_a_static_start_and_a_run_time_copy_run_bit_exact(dtype):
    got, src = _transpose_tokens(dtype, runtime=False)
    np.testing.assert_array_equal(got.read(), np.asarray(src.read())[32:64].T)
    src = _hbm(_data((128, 64)), dtype)
    dst = empty((32, 64), dtype)
    nisa.dma_copy(dst=dst, src=src[nl.ds(nki_cpu.isa.NkiScalar(32), 32), :])  # dynamic starts: documented for copies
    np.testing.assert_array_equal(dst.read(), np.asarray(src.read())[32:64])


def test_views_of_a_run_time_view_stay_run_time_addressed():
    src = _hbm(_data((128, 64)), nl.float32)
    window = src[nl.ds(nki_cpu.isa.NkiScalar(0), 32), :]
    assert window.is_runtime_addressed() and window[:, 0:32].is_runtime_addressed()
    assert not src[nl.ds(0, 64), :].is_runtime_addressed()
    with pytest.raises(AssertionError, match="addressed at run time"):
        nisa.dma_transpose(dst=empty((32, 32), nl.float32), src=window[:, 0:32])


def test_relaxed_indirect_transpose_warns_and_runs():
    def from_run_time_start():
        return _transpose_tokens(nl.bfloat16, runtime=True)

    with pytest.warns(RuntimeWarning, match="addressed at run time.*relaxed"):
        got, src = nki_cpu.simulate(from_run_time_start, relax={"indirect_transpose"})()
    np.testing.assert_array_equal(got, np.asarray(src)[32:64].T)


# --- .ap with a run-time (scalar) or vector offset: on a whole allocation only -------------------------------------
def _heads() -> tuple[np.ndarray, object]:
    """A [2, 3, 8, 4] HBM argument (batch, heads, tokens, dim) and its numpy values."""
    values = _data((2, 3, 8, 4))
    return values, _hbm(values, nl.float32)


def test_ap_scalar_offset_on_an_indexed_view_is_rejected():
    _, hbm = _heads()
    with pytest.raises(AssertionError, match=r"ap with a scalar or vector offset on a view .* call .ap on the tensor"):
        hbm[1, 2].ap(pattern=[[4, 2], [1, 4]], offset=0, scalar_offset=nki_cpu.isa.NkiScalar(3), indirect_dim=0)


def test_ap_vector_offset_on_a_view_is_rejected():
    _, hbm = _heads()
    idx = tile(np.array([[1], [0]], dtype=np.int32))
    with pytest.raises(AssertionError, match=r"ap with a scalar or vector offset on a view"):
        hbm[0].ap(pattern=[[4, 2], [1, 4]], offset=0, vector_offset=idx, indirect_dim=0)


def test_ap_scalar_offset_on_the_tensor_itself_addresses_the_rows_written_out():
    values, hbm = _heads()
    b, h, start = 1, 2, 3
    view = hbm.ap(
        pattern=[[4, 2], [1, 4]], offset=(b * 3 + h) * 8 * 4, scalar_offset=nki_cpu.isa.NkiScalar(start), indirect_dim=2
    )
    dst = empty((2, 4))
    nisa.dma_copy(dst=dst, src=view)
    np.testing.assert_array_equal(dst.read(), values[b, h, start : start + 2])


def test_ap_static_offset_on_a_view_still_counts_from_the_view():
    values, hbm = _heads()  # nki-library's gdn_cte loads k[batch].ap(..., offset=...) this way (§2.6)
    dst = empty((2, 4))
    nisa.dma_copy(dst=dst, src=hbm[1, 2].ap(pattern=[[4, 2], [1, 4]], offset=3 * 4))
    np.testing.assert_array_equal(dst.read(), values[1, 2, 3:5])


def test_relaxed_ap_scalar_offset_view_warns_and_counts_in_the_view():
    values, hbm = _heads()

    def on_a_view():
        dst = empty((2, 4))
        view = hbm[1, 2].ap(pattern=[[4, 2], [1, 4]], offset=0, scalar_offset=nki_cpu.isa.NkiScalar(3), indirect_dim=0)
        nisa.dma_copy(dst=dst, src=view)
        return dst

    with pytest.warns(RuntimeWarning, match="scalar or vector offset on a view.*relaxed"):
        got = nki_cpu.simulate(on_a_view, relax={"ap_scalar_offset_view"})()
    np.testing.assert_array_equal(got, values[1, 2, 3:5])
