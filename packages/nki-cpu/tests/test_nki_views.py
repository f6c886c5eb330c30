"""Views: indexing rules, nl.ds, .ap (additive offset), reshape/permute/broadcast/view, argument aliasing."""

from __future__ import annotations

import numpy as np
import pytest

import nki_cpu
from _helpers import empty, tile
from nki_cpu import isa as nisa
from nki_cpu import language as nl
from nki_cpu.tensor import wrap_array


def test_fresh_tiles_are_nan_or_four():
    assert np.isnan(empty((4, 8)).read()).all()
    assert (empty((4, 8), nl.int32).read() == 4).all()
    t = empty((4, 8), nl.bfloat16)
    assert t.dtype == nl.bfloat16 and np.isnan(t.read_f32()).all()


def test_on_chip_int_index_keeps_rank_two():
    data = np.arange(64 * 4 * 8, dtype=np.float32).reshape(64, 4, 8)
    t = tile(data)
    assert t[0, :, :].shape == (1, 4, 8)
    assert t[:, 0, 3].shape == (64, 1)
    np.testing.assert_array_equal(t[:, 0, 3].read().reshape(-1), data[:, 0, 3])
    two = tile(np.arange(12, dtype=np.float32).reshape(3, 4))
    assert two[:, 1].shape == (3, 1)
    assert two[0, 0].shape == (1, 1)
    assert two[...].shape == (3, 4)


def test_hbm_int_index_drops_dims_and_keeps_offset():
    data = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    t = wrap_array(data)
    v = t[1]
    assert v.shape == (3, 4) and v.offset == 12
    np.testing.assert_array_equal(v.read(), data[1])
    assert t[1, 2, 3].shape == (1,)


def test_ds_and_nested_slices_compose():
    data = np.arange(16 * 32, dtype=np.float32).reshape(16, 32)
    t = tile(data)
    v = t[:, nl.ds(8, 16)][2:6, nl.ds(start=4, size=4)]
    np.testing.assert_array_equal(v.read(), data[:, 8:24][2:6, 4:8])
    np.testing.assert_array_equal(t[1:9:2, ::3].read(), data[1:9:2, ::3])
    with pytest.raises(IndexError):
        t[:, nl.ds(30, 4)]


def test_ap_offset_is_added_to_view_offset():
    data = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)
    t = tile(data)
    pattern = [[64, 128], [1, 16]]
    np.testing.assert_array_equal(t.slice(1, 8, 24).ap(pattern).read(), t.ap(pattern, offset=8).read())
    chained = t.ap([[64, 128], [1, 32]], offset=3).ap(pattern, offset=5)
    np.testing.assert_array_equal(chained.read(), t.ap(pattern, offset=8).read())
    hbm = np.arange(4 * 6 * 8, dtype=np.float32).reshape(4, 6, 8)
    k = wrap_array(hbm)
    v = k[2].ap(pattern=[[8, 3], [16, 2], [1, 8]], offset=8)
    expected = hbm.reshape(-1)[
        2 * 48 + 8 + (np.arange(3)[:, None, None] * 8 + np.arange(2)[None, :, None] * 16 + np.arange(8)[None, None, :])
    ]
    np.testing.assert_array_equal(v.read(), expected)


def test_ap_tuple_pairs_zero_step_and_dtype_reinterpret():
    t = tile(np.arange(8, dtype=np.float32).reshape(8, 1))
    spread = t.ap(((1, 8), (0, 4)))
    assert spread.shape == (8, 4)
    np.testing.assert_array_equal(spread.read(), np.repeat(np.arange(8.0)[:, None], 4, axis=1))
    words = tile(np.zeros((2, 4), dtype=np.int32))
    halves = words.ap([[8, 2], [1, 8]], dtype=nl.bfloat16)
    assert halves.shape == (2, 8) and halves.dtype == nl.bfloat16
    with pytest.raises(AssertionError, match="partition step"):
        tile(np.zeros((16, 32), np.float32)).ap([[64, 8], [1, 32]])


def test_reshape_permute_broadcast_view():
    data = np.arange(4 * 6, dtype=np.float32).reshape(4, 6)
    t = tile(data)
    np.testing.assert_array_equal(t.reshape((4, 2, 3)).read(), data.reshape(4, 2, 3))
    three = t.reshape((4, 2, 3))
    np.testing.assert_array_equal(three.permute([0, 2, 1]).read(), data.reshape(4, 2, 3).transpose(0, 2, 1))
    with pytest.raises(AssertionError, match="incompatible"):
        three.permute([0, 2, 1]).reshape((4, 6))
    with pytest.raises(AssertionError, match="dim 0"):
        t.reshape((2, 12))
    col = t[:, 1:2]
    b = col.broadcast(1, 5)
    assert b.strides[1] == 0
    np.testing.assert_array_equal(b.read(), np.repeat(data[:, 1:2], 5, axis=1))
    as_bytes = t.view(nl.uint8)
    assert as_bytes.shape == (4, 24)
    np.testing.assert_array_equal(as_bytes.read().view(np.float32), data)
    hbm = wrap_array(np.arange(2 * 8 * 3, dtype=np.float32).reshape(2, 8, 3))
    assert hbm.reshape((2, 2, 4, 3)).shape == (2, 2, 4, 3)
    assert three.flatten_dims(1, 2).shape == (4, 6)
    with pytest.raises(AssertionError, match="dim 0"):
        t.flatten_dims(0, 1)
    assert three.select(1, 1).shape == (4, 3)
    assert t.expand_dim(1).shape == (4, 1, 6)


def test_writes_through_views_are_shared():
    t = empty((4, 8))
    nisa.memset(t, 0.0)
    nisa.memset(t[:, 2:4], 7.0)
    expected = np.zeros((4, 8), np.float32)
    expected[:, 2:4] = 7
    np.testing.assert_array_equal(t.read(), expected)


def test_kernel_arguments_alias_the_callers_arrays():
    state = np.zeros((4, 8), np.float32)
    x = np.arange(32, dtype=np.float32).reshape(4, 8)

    @nki_cpu.jit
    def kernel(x_hbm, state_hbm):
        sb = nl.load(x_hbm)
        nl.store(state_hbm, sb)
        return state_hbm

    out = nki_cpu.simulate(kernel)(x, state)
    np.testing.assert_array_equal(state, x)
    np.testing.assert_array_equal(out, x)
    assert out is not state  # returned as a fresh array


def test_returned_view_is_materialised_in_its_shape():
    @nki_cpu.jit
    def kernel(x):
        out = nl.ndarray((4, 6), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=x)
        return out.reshape((2, 2, 6)), out[1]

    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    a, b = nki_cpu.simulate(kernel)(x)
    assert a.shape == (2, 2, 6) and b.shape == (6,)
    np.testing.assert_array_equal(a, x.reshape(2, 2, 6))
    np.testing.assert_array_equal(b, x[1])


def test_vector_offset_gather_and_float64_rejection():
    table = np.arange(10 * 4, dtype=np.float32).reshape(10, 4)
    hbm = wrap_array(table)
    idx = tile(np.array([[7], [2], [5]], dtype=np.int32))
    rows = empty((3, 4))
    nisa.dma_copy(dst=rows, src=hbm.ap(pattern=[[4, 3], [1, 4]], offset=0, vector_offset=idx, indirect_dim=0))
    np.testing.assert_array_equal(rows.read(), table[[7, 2, 5]])
    with pytest.raises(TypeError, match="not an NKI dtype"):
        nki_cpu.simulate(lambda x: x)(np.zeros(3))
