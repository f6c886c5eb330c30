"""Constraint violations raise AssertionError with the simulator-style message."""

from __future__ import annotations

import numpy as np
import pytest

import nki_cpu
from _helpers import empty, tile
from nki_cpu import isa as nisa
from nki_cpu import language as nl
from nki_cpu.tensor import wrap_array


def test_partition_limit_message_matches_the_simulator():
    big = empty((256, 4))
    with pytest.raises(AssertionError, match="tensor_tensor data1 partition dimension 256 exceeds maximum 128"):
        nisa.tensor_tensor(empty((128, 4)), big, empty((128, 4)), nl.add)


def test_matmul_free_size_limits():
    with pytest.raises(AssertionError, match="nc_matmul stationary free size 256 exceeds maximum 128"):
        nisa.nc_matmul(empty((256, 8), buffer=nl.psum), empty((64, 256)), empty((64, 8)))
    with pytest.raises(AssertionError, match="nc_matmul moving free size 1024 exceeds maximum 512"):
        nisa.nc_matmul(empty((8, 1024), buffer=nl.psum), empty((64, 8)), empty((64, 1024)))


def test_matmul_contraction_mismatch_and_buffers():
    with pytest.raises(AssertionError, match="moving partition dimension 32 does not match stationary partition"):
        nisa.nc_matmul(empty((8, 8), buffer=nl.psum), empty((64, 8)), empty((32, 8)))
    with pytest.raises(AssertionError, match="nc_matmul dst must be in psum, got sbuf"):
        nisa.nc_matmul(empty((8, 8)), empty((64, 8)), empty((64, 8)))
    with pytest.raises(AssertionError, match="nc_matmul moving must be in sbuf, got psum"):
        nisa.nc_matmul(empty((8, 8), buffer=nl.psum), empty((64, 8)), empty((64, 8), buffer=nl.psum))
    with pytest.raises(AssertionError, match="cannot be mixed"):
        nisa.nc_matmul(empty((8, 8), buffer=nl.psum), empty((64, 8)), empty((64, 8), nl.bfloat16))


def test_psum_bank_limit():
    psum = empty((8, 1024), buffer=nl.psum)
    with pytest.raises(AssertionError, match="crosses a 2048-byte PSUM bank"):
        nisa.nc_matmul(psum[:, 256:768], empty((64, 8)), empty((64, 512)))
    nisa.nc_matmul(psum[:, 512:1024], tile(np.zeros((64, 8), np.float32)), tile(np.zeros((64, 512), np.float32)))


def test_buffer_rules():
    hbm = wrap_array(np.zeros((8, 8), np.float32))
    with pytest.raises(AssertionError, match="tensor_copy src must be in psum/sbuf, got hbm"):
        nisa.tensor_copy(empty((8, 8)), hbm)
    with pytest.raises(AssertionError, match="dma_copy src must be in hbm/sbuf, got psum"):
        nisa.dma_copy(hbm, empty((8, 8), buffer=nl.psum))
    with pytest.raises(AssertionError, match="not accessible from the gpsimd engine"):
        nisa.memset(empty((8, 8), buffer=nl.psum), 0.0, engine=nisa.gpsimd_engine)
    with pytest.raises(AssertionError, match="iota dst must be in sbuf, got psum"):
        nisa.iota(empty((8, 8), buffer=nl.psum), [[1, 8]])
    with pytest.raises(AssertionError, match="cannot both be in psum"):
        ps = empty((8, 8), buffer=nl.psum)
        nisa.tensor_tensor(empty((8, 8)), ps, ps, nl.add)


def test_transpose_rules():
    with pytest.raises(AssertionError, match="nc_transpose dst dtype bfloat16 must equal data dtype float32"):
        nisa.nc_transpose(empty((8, 8), nl.bfloat16, nl.psum), empty((8, 8)))
    with pytest.raises(AssertionError, match="nc_transpose data partition dimension 64 exceeds maximum 32"):
        nisa.nc_transpose(empty((64, 64)), empty((64, 64)), engine=nisa.vector_engine)
    with pytest.raises(AssertionError, match="dma_transpose dst shape"):
        nisa.dma_transpose(empty((8, 4)), empty((8, 4)))
    with pytest.raises(AssertionError, match=r"hwdge 2-D src.shape\[0\] must be 16"):
        nisa.dma_transpose(empty((4, 8), nl.bfloat16), empty((8, 4), nl.bfloat16), dge_mode=nisa.dge_mode.hwdge)


def test_element_count_mismatches():
    with pytest.raises(AssertionError, match="tensor_tensor data2 elements per partition 16 do not match dst"):
        nisa.tensor_tensor(empty((8, 8)), empty((8, 8)), empty((8, 16)), nl.add)
    with pytest.raises(AssertionError, match="dma_copy dst element count 64"):
        nisa.dma_copy(empty((8, 8)), wrap_array(np.zeros(65, np.float32)))
    with pytest.raises(AssertionError, match="partition dimension 4 does not match dst partition dimension 8"):
        nisa.tensor_scalar(empty((8, 8)), empty((8, 8)), nl.add, empty((4, 1)))


def test_memset_float_on_int_tile():
    with pytest.raises(AssertionError, match=r"memset value 0\.5 is a float"):
        nisa.memset(empty((4, 4), nl.int32), 0.5)


def test_capacity_limits_in_a_launch():
    @nki_cpu.jit
    def too_much_sbuf():
        tiles = [nl.ndarray((128, 16384), nl.float32, buffer=nl.sbuf) for _ in range(4)]
        return len(tiles)

    with pytest.raises(AssertionError, match="live sbuf usage 262144 bytes per partition exceeds maximum 212984"):
        nki_cpu.simulate(too_much_sbuf)()

    @nki_cpu.jit
    def too_much_psum():
        banks = [nl.ndarray((128, 512), nl.float32, buffer=nl.psum) for _ in range(9)]
        return len(banks)

    with pytest.raises(AssertionError, match="live psum usage 18432 bytes per partition exceeds maximum 16384"):
        nki_cpu.simulate(too_much_psum)()
    assert nki_cpu.simulate(too_much_psum, check_capacity=False)() == 9
    assert nki_cpu.last_trace().psum_high_water == 9 * 2048


def test_launch_names_the_argument_whose_dtype_nki_lacks():
    @nki_cpu.jit
    def _copy(x, y):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=x)
        return out

    x = np.zeros((4, 4), np.float32)
    with pytest.raises(TypeError, match=r"kernel argument `y`: .*float64.*cast it"):
        nki_cpu.simulate(_copy)(x, np.zeros((4, 4)))
    with pytest.raises(TypeError, match=r"kernel argument `y`"):
        nki_cpu.simulate(_copy)(x, y=np.zeros((4, 4)))
