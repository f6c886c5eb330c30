"""Each instruction against plain numpy: fp32 compute, one rounding into dst, PSUM accumulation, in-place use."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from _helpers import empty, rng, tile
from nki_cpu import isa as nisa
from nki_cpu import language as nl
from nki_cpu.tensor import wrap_array

BF16 = ml_dtypes.bfloat16


def bf16(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).astype(BF16)


def test_tensor_tensor_rounds_once_into_bf16():
    a = rng(1).standard_normal((128, 64)).astype(np.float32)
    b = rng(2).standard_normal((128, 64)).astype(np.float32)
    dst = empty((128, 64), nl.bfloat16)
    nisa.tensor_tensor(dst=dst, data1=tile(a), data2=tile(b), op=nl.subtract)
    np.testing.assert_array_equal(dst.read(), (a - b).astype(BF16))
    # bf16 inputs are upcast exactly; the fp32 product is rounded once
    ab, bb = bf16(a), bf16(b)
    dst2 = empty((128, 64), nl.bfloat16)
    nisa.tensor_tensor(dst2, tile(ab), tile(bb), nl.multiply)
    np.testing.assert_array_equal(dst2.read(), (ab.astype(np.float32) * bb.astype(np.float32)).astype(BF16))


def test_tensor_tensor_flattens_free_dims_and_works_in_place():
    a = rng(3).standard_normal((16, 4, 8)).astype(np.float32)
    b = rng(4).standard_normal((16, 32)).astype(np.float32)
    x = tile(a)
    nisa.tensor_tensor(x, x, tile(b), nl.maximum)
    np.testing.assert_array_equal(x.read(), np.maximum(a.reshape(16, 32), b).reshape(16, 4, 8))
    cmp = empty((16, 32))
    nisa.tensor_tensor(cmp, tile(b), tile(b * 0), nl.greater_equal)
    np.testing.assert_array_equal(cmp.read(), (b >= 0).astype(np.float32))


def test_tensor_scalar_forms():
    data = rng(5).standard_normal((8, 16)).astype(np.float32)
    col = rng(6).standard_normal((8, 1)).astype(np.float32)
    dst = empty((8, 16))
    nisa.tensor_scalar(dst, tile(data), nl.subtract, 2.0, True, nl.multiply, tile(col), False)
    np.testing.assert_allclose(dst.read(), (2.0 - data) * col, rtol=1e-6)
    nisa.tensor_scalar(
        dst=dst, data=tile(data), op0=nl.multiply, operand0=tile(col), op1=nl.subtract, operand1=1.0, reverse1=True
    )
    np.testing.assert_allclose(dst.read(), 1.0 - data * col, rtol=1e-6)
    pos = np.abs(data) + 0.5
    nisa.tensor_scalar(dst, tile(pos), nl.rsqrt, None, engine=nisa.engine.gpsimd)
    np.testing.assert_allclose(dst.read(), 1 / np.sqrt(pos), rtol=1e-6)
    one = tile(data[:1, :])
    nisa.tensor_scalar(one, one, nl.add, tile(data)[0:1, 3:4])
    np.testing.assert_allclose(one.read(), data[:1] + data[0, 3], rtol=1e-6)


def test_scalar_tensor_tensor_reverse_flags():
    data = rng(7).standard_normal((4, 8)).astype(np.float32)
    col = rng(8).standard_normal((4, 1)).astype(np.float32)
    other = rng(9).standard_normal((4, 8)).astype(np.float32)
    dst = empty((4, 8))
    nisa.scalar_tensor_tensor(
        dst=dst, data=tile(data), op0=nl.subtract, operand0=tile(col), reverse0=True, op1=nl.add, operand1=tile(other)
    )
    np.testing.assert_allclose(dst.read(), (col - data) + other, rtol=1e-6)
    nisa.scalar_tensor_tensor(
        dst=dst, data=tile(data), op0=nl.multiply, operand0=0.5, op1=nl.subtract, operand1=tile(other), reverse1=True
    )
    np.testing.assert_allclose(dst.read(), other - data * 0.5, rtol=1e-6)


def test_tensor_copy_casts_once_and_copies_bits():
    data = rng(10).standard_normal((32, 64)).astype(np.float32)
    psum = tile(data, buffer=nl.psum)
    out = empty((32, 64), nl.bfloat16)
    nisa.tensor_copy(dst=out, src=psum, engine=nisa.engine.scalar)
    np.testing.assert_array_equal(out.read(), data.astype(BF16))
    ints = tile(np.array([[1, -7, 2**30]], dtype=np.int32))
    same = empty((1, 3), nl.int32)
    nisa.tensor_copy(same, ints)
    np.testing.assert_array_equal(same.read(), [[1, -7, 2**30]])


def test_float_to_int_rounds_to_nearest_even_and_saturates():
    vals = tile(np.array([[0.5, 1.5, 2.5, -0.5, 1e10, -1e10]], dtype=np.float32))
    out = empty((1, 6), nl.int16)
    nisa.tensor_copy(out, vals)
    np.testing.assert_array_equal(out.read(), [[0, 2, 2, 0, 32767, -32768]])


def test_activation_scale_bias_and_reduce():
    data = rng(11).standard_normal((16, 32)).astype(np.float32)
    bias = rng(12).standard_normal((16, 1)).astype(np.float32)
    scale = rng(13).standard_normal((16, 1)).astype(np.float32)
    dst = empty((16, 32), nl.bfloat16)
    total = empty((16, 1))
    nisa.activation(
        dst,
        nl.exp,
        tile(data),
        bias=tile(bias),
        scale=tile(scale),
        reduce_op=nl.add,
        reduce_res=total,
        reduce_cmd=nisa.reduce_cmd.reset_reduce,
    )
    expected = np.exp(data * scale + bias).astype(np.float32)
    np.testing.assert_array_equal(dst.read(), expected.astype(BF16))
    np.testing.assert_allclose(total.read()[:, 0], expected.sum(axis=1), rtol=1e-5)
    copy = empty((16, 32))
    nisa.activation(dst=copy, op=nl.copy, data=tile(data, buffer=nl.psum), scale=-0.25)
    np.testing.assert_array_equal(copy.read(), data * np.float32(-0.25))
    # bias given as a column view of a PSUM tile
    ps = tile(np.tile(bias, (1, 4)), buffer=nl.psum)
    nisa.activation(copy, nl.copy, tile(data), bias=ps[:, 3:4])
    np.testing.assert_allclose(copy.read(), data + bias, rtol=1e-6)


def test_memset_iota_affine_select_masks():
    n = 8
    mask = empty((n, n))
    nisa.memset(mask, 1.0)
    nisa.affine_select(
        dst=mask,
        pattern=[[-1, n]],
        offset=0,
        channel_multiplier=1,
        cmp_op=nl.greater_equal,
        on_true_tile=mask,
        on_false_value=0.0,
    )
    np.testing.assert_array_equal(mask.read(), np.tril(np.ones((n, n))))
    ident = empty((n, n), nl.bfloat16)
    nisa.memset(dst=ident, value=1.0, engine=nisa.gpsimd_engine)
    nisa.affine_select(ident, [[1, n]], -1, ident, 0.0, cmp_op=nl.equal)
    np.testing.assert_array_equal(ident.read_f32(), np.eye(n))
    idx = empty((4, 6), nl.int32)
    nisa.iota(idx, [[1, 6]])
    np.testing.assert_array_equal(idx.read(), np.tile(np.arange(6), (4, 1)))
    lanes = empty((4, 1))
    nisa.iota(lanes, [[0, 1]], offset=3, channel_multiplier=2)
    np.testing.assert_array_equal(lanes.read()[:, 0], 3 + 2 * np.arange(4))


def test_nc_matmul_fp32_psum_accumulation():
    k, m, n = 128, 64, 96
    a = [bf16(rng(20 + i).standard_normal((k, m))) for i in range(3)]
    b = [bf16(rng(30 + i).standard_normal((k, n))) for i in range(3)]
    acc = empty((m, n), nl.float32, nl.psum)
    for i in range(3):
        nisa.nc_matmul(acc, tile(a[i]), tile(b[i]))  # accumulate=None: first write overwrites the NaN fill
    expected = np.zeros((m, n), np.float32)
    for i in range(3):
        expected += a[i].astype(np.float32).T @ b[i].astype(np.float32)
    np.testing.assert_allclose(acc.read(), expected, rtol=1e-5, atol=1e-4)
    nisa.nc_matmul(dst=acc, stationary=tile(a[0]), moving=tile(b[0]), accumulate=False)
    np.testing.assert_allclose(acc.read(), a[0].astype(np.float32).T @ b[0].astype(np.float32), rtol=1e-5, atol=1e-4)
    nisa.nc_matmul(acc, tile(a[1]), tile(b[1]), accumulate=True)
    np.testing.assert_allclose(
        acc.read(), expected - a[2].astype(np.float32).T @ b[2].astype(np.float32), rtol=1e-4, atol=1e-3
    )


def test_nc_matmul_broadcast_stationary_and_prefix_sum():
    c = 16
    col = rng(40).standard_normal((c, 1)).astype(np.float32)
    ident = np.eye(c, dtype=np.float32)
    out = empty((c, c), nl.float32, nl.psum)
    nisa.nc_matmul(out, tile(col).broadcast(1, c), tile(ident))
    np.testing.assert_array_equal(out.read(), np.tile(col[:, 0], (c, 1)))
    upper = np.triu(np.ones((c, c), np.float32))
    g = rng(41).standard_normal((c, 8)).astype(np.float32)
    cums = empty((c, 8), nl.float32, nl.psum)
    nisa.nc_matmul(cums, tile(upper), tile(g), tile_position=(0, 0), tile_size=(48, 48))
    np.testing.assert_allclose(cums.read(), np.cumsum(g, axis=0), rtol=1e-5, atol=1e-5)


def test_transposes_are_bit_exact():
    data = rng(50).standard_normal((64, 128)).astype(np.float32)
    out = empty((128, 64), nl.float32, nl.psum)
    nisa.nc_transpose(dst=out, data=tile(data), engine=nisa.tensor_engine)
    np.testing.assert_array_equal(out.read(), data.T)
    small = tile(bf16(data[:32, :32]), buffer=nl.psum)
    out_v = empty((32, 32), nl.bfloat16)
    nisa.nc_transpose(out_v, small, engine=nisa.vector_engine)
    np.testing.assert_array_equal(out_v.read(), bf16(data[:32, :32]).T)
    hbm = wrap_array(bf16(data))
    d = empty((128, 64), nl.bfloat16)
    nisa.dma_transpose(dst=d, src=hbm, dge_mode=nisa.dge_mode.none)
    np.testing.assert_array_equal(d.read(), bf16(data).T)
    col = tile(data[:, :1])
    row = empty((1, 64))
    nisa.dma_transpose(row, col)
    np.testing.assert_array_equal(row.read(), data[:, :1].T)


def test_dma_copy_counts_and_conversion():
    vec = wrap_array(np.arange(8, dtype=np.float32))
    col = empty((8, 1), nl.bfloat16)
    nisa.dma_copy(dst=col, src=vec)
    np.testing.assert_array_equal(col.read_f32()[:, 0], np.arange(8))
    hbm = np.arange(3 * 2 * 4, dtype=np.float32).reshape(3, 2, 4)
    sb = empty((3, 8))
    nisa.dma_copy(sb, wrap_array(hbm))
    np.testing.assert_array_equal(sb.read(), hbm.reshape(3, 8))
    vals = tile(np.array([[1.00390625, 3.0]], dtype=np.float32))
    out = np.zeros((1, 2), dtype=BF16)
    nisa.dma_copy(dst=wrap_array(out), src=vals)
    np.testing.assert_array_equal(out.astype(np.float32), [[1.0, 3.0]])  # RNE tie to even


def test_tensor_reduce_and_negate():
    data = rng(60).standard_normal((8, 4, 16)).astype(np.float32)
    dst = empty((8, 1))
    nisa.tensor_reduce(dst=dst, op=nl.maximum, data=tile(data), axis=(1, 2), negate=True, keepdims=True)
    np.testing.assert_array_equal(dst.read()[:, 0], -data.reshape(8, -1).max(axis=1))
    per_row = empty((8, 4))
    nisa.tensor_reduce(per_row, nl.add, tile(data), axis=[2])
    np.testing.assert_allclose(per_row.read(), data.sum(axis=2), rtol=1e-5)
    with pytest.raises(AssertionError, match="trailing"):
        nisa.tensor_reduce(per_row, nl.add, tile(data), axis=1)


def test_scans():
    data = rng(70).standard_normal((4, 32)).astype(np.float32)
    out = empty((4, 32))
    nisa.tensor_scalar_cumulative(dst=out, src=tile(data), op0=nl.multiply, imm0=1.0, op1=nl.add)
    np.testing.assert_allclose(out.read(), np.cumsum(data, axis=1), rtol=1e-5, atol=1e-5)
    nisa.tensor_scalar_cumulative(out, tile(data), nl.multiply, nl.maximum, 2.0)
    np.testing.assert_array_equal(out.read(), np.maximum.accumulate(2 * data, axis=1))
    decay = np.abs(data) * 0.5
    init = rng(71).standard_normal((4, 1)).astype(np.float32)
    scan = empty((4, 32))
    nisa.tensor_tensor_scan(
        dst=scan, data0=tile(decay), data1=tile(data), initial=tile(init), op0=nl.multiply, op1=nl.add
    )
    r = init[:, 0].copy()
    expected = np.empty_like(data)
    for i in range(32):
        r = decay[:, i] * r + data[:, i]
        expected[:, i] = r
    np.testing.assert_allclose(scan.read(), expected, rtol=1e-5, atol=1e-5)


def test_reciprocal_in_place_and_partition_reduce():
    data = np.abs(rng(80).standard_normal((8, 8)).astype(np.float32)) + 0.1
    t = tile(data)
    nisa.reciprocal(t, t)
    np.testing.assert_array_equal(t.read(), np.float32(1) / data)
    row = empty((1, 8))
    nisa.tensor_partition_reduce(row, nl.add, tile(data))
    np.testing.assert_allclose(row.read(), data.sum(axis=0, keepdims=True), rtol=1e-6)


def test_stream_shuffle_broadcasts_a_row():
    src = tile(np.arange(8, dtype=np.float32).reshape(1, 8))
    dst = empty((32, 8))
    nisa.nc_stream_shuffle(src=src[0:1, :], dst=dst[0:32, :], shuffle_mask=[0] * 32)
    np.testing.assert_array_equal(dst.read(), np.tile(np.arange(8.0), (32, 1)))


def test_nl_convenience_ops():
    a = rng(90).standard_normal((8, 16)).astype(np.float32)
    b = rng(91).standard_normal((8, 16)).astype(np.float32)
    ta, tb = tile(a), tile(b)
    np.testing.assert_allclose(nl.add(ta, tb).read(), a + b, rtol=1e-6)
    np.testing.assert_allclose(nl.multiply(ta, 2.0).read(), a * 2, rtol=1e-6)
    np.testing.assert_allclose(nl.subtract(1.0, ta).read(), 1 - a, rtol=1e-6)
    np.testing.assert_allclose(nl.exp(ta).read(), np.exp(a), rtol=1e-6)
    np.testing.assert_allclose(nl.sum(ta, axis=1).read()[:, 0], a.sum(axis=1), rtol=1e-5)
    np.testing.assert_allclose(nl.mean(ta, axis=[1]).read()[:, 0], a.mean(axis=1), rtol=1e-5, atol=1e-6)
    sm = nl.softmax(ta).read()
    np.testing.assert_allclose(sm, np.exp(a) / np.exp(a).sum(axis=1, keepdims=True), rtol=1e-5)
    mm = nl.matmul(ta, tb, transpose_x=True)
    assert mm.buffer == nl.psum
    np.testing.assert_allclose(mm.read(), a.T @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(nl.transpose(ta).read(), a.T)
    assert nl.copy(ta, dtype=nl.bfloat16).dtype == nl.bfloat16
    np.testing.assert_array_equal(nl.equal(ta, ta).read(), np.ones_like(a))
    np.testing.assert_array_equal(nl.where(nl.greater(ta, 0.0), ta, 0.0).read(), np.where(a > 0, a, 0))
    ident = nl.shared_identity_matrix(8, dtype=nl.float32)
    np.testing.assert_array_equal(ident.read(), np.eye(8))
    row = tile(a[:1])
    np.testing.assert_array_equal(nl.broadcast_to(row, (8, 16)).read(), np.tile(a[:1], (8, 1)))
