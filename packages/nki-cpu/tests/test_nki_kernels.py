"""Tutorial-style kernels end to end: through ``nki_cpu.simulate`` and through the ``import nki`` opt-in."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np

import nki_cpu
from nki_cpu import isa as nisa
from nki_cpu import language as nl

BF16 = ml_dtypes.bfloat16


@nki_cpu.jit
def tensor_add(a, b):
    """Tiled element-wise add (docs' getting-started tutorial, 128-row tiles)."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    rows, cols = a.shape
    for i in nl.affine_range(rows // nl.tile_size.pmax):
        lo, hi = i * 128, (i + 1) * 128
        a_tile = nl.ndarray((128, cols), dtype=a.dtype, buffer=nl.sbuf)
        b_tile = nl.ndarray((128, cols), dtype=b.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=a_tile, src=a[lo:hi, :])
        nisa.dma_copy(dst=b_tile, src=b[lo:hi, :])
        c_tile = nl.ndarray((128, cols), dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=c_tile, data1=a_tile, data2=b_tile, op=nl.add)
        nisa.dma_copy(dst=out[lo:hi, :], src=c_tile)
    return out


@nki_cpu.jit(mode="trace")
def matmul_tiled(lhs_t, rhs):
    """Tiled matmul (docs' matrix-multiplication tutorial): PSUM accumulation with accumulate=None."""
    k_size, m_size = lhs_t.shape
    n_size = rhs.shape[1]
    out = nl.ndarray((m_size, n_size), dtype=nl.bfloat16, buffer=nl.shared_hbm)
    for m in nl.affine_range(m_size // 128):
        for n in nl.affine_range(n_size // 512):
            res_psum = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(k_size // 128):
                lhs_tile = nl.ndarray((128, 128), dtype=lhs_t.dtype, buffer=nl.sbuf)
                rhs_tile = nl.ndarray((128, 512), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=lhs_tile, src=lhs_t[k * 128 : (k + 1) * 128, m * 128 : (m + 1) * 128])
                nisa.dma_copy(dst=rhs_tile, src=rhs[k * 128 : (k + 1) * 128, n * 512 : (n + 1) * 512])
                nisa.nc_matmul(res_psum, lhs_tile, rhs_tile)
            res_sb = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res_sb, src=res_psum)
            nisa.dma_copy(dst=out[m * 128 : (m + 1) * 128, n * 512 : (n + 1) * 512], src=res_sb)
    return out


@nki_cpu.jit
def transpose_both_ways(x):
    """PE transpose (identity matmul into PSUM) and DMA transpose of the same tile."""
    rows, cols = x.shape
    tile = nl.ndarray((rows, cols), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=x)
    pe_out = nl.ndarray((cols, rows), dtype=x.dtype, buffer=nl.psum)
    nisa.nc_transpose(dst=pe_out, data=tile, engine=nisa.tensor_engine)
    pe_sb = nl.ndarray((cols, rows), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=pe_sb, src=pe_out, engine=nisa.engine.scalar)
    dma_out = nl.ndarray((cols, rows), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_transpose(dst=dma_out, src=x)
    out_pe = nl.ndarray((cols, rows), dtype=x.dtype, buffer=nl.shared_hbm)
    out_dma = nl.ndarray((cols, rows), dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out_pe, src=pe_sb)
    nisa.dma_copy(dst=out_dma, src=dma_out)
    return out_pe, out_dma


@nki_cpu.jit
def chunk_prefix(g, state=None, scale: float = 1.0):
    """GDN-style idioms: batch ``.ap`` loads, triangular mask, matmul prefix sum, cumulative scan, in-place state."""
    batches, chunk, width = g.shape
    out = nl.ndarray((batches, chunk, width), dtype=nl.float32, buffer=nl.shared_hbm)
    upper = nl.ndarray((chunk, chunk), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(upper, 1.0)
    nisa.affine_select(
        dst=upper,
        pattern=[[1, chunk]],
        offset=0,
        channel_multiplier=-1,
        cmp_op=nl.greater_equal,
        on_true_tile=upper,
        on_false_value=0.0,
    )
    for b in nl.sequential_range(batches):
        g_tile = nl.ndarray((chunk, width), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=g_tile, src=g[b].ap(pattern=[[width, chunk], [1, width]], offset=0))
        prefix = nl.ndarray((chunk, width), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(prefix, upper, g_tile)
        scaled = nl.ndarray((chunk, width), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=scaled, op=nl.copy, data=prefix, scale=scale)
        rows = nl.ndarray((chunk, width), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_cumulative(dst=rows, src=scaled, op0=nl.multiply, imm0=1.0, op1=nl.add)
        nisa.dma_copy(dst=out[b], src=rows)
        if state is not None:
            current = nl.load(state[b, :, :], dtype=nl.float32)
            nisa.tensor_tensor(current, current, rows, nl.add)
            nl.store(state[b, :, :], current)
    return out, state


def test_tensor_add_tiles():
    a = np.random.default_rng(0).standard_normal((384, 96)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((384, 96)).astype(np.float32)
    np.testing.assert_array_equal(nki_cpu.simulate(tensor_add)(a, b), a + b)
    assert len(nki_cpu.last_trace().records) == 3 * 4


def test_matmul_tiled_accumulates_in_psum():
    rng = np.random.default_rng(2)
    lhs_t = rng.standard_normal((384, 256)).astype(BF16)
    rhs = rng.standard_normal((384, 1024)).astype(BF16)
    out = nki_cpu.simulate(matmul_tiled)(lhs_t, rhs)
    expected = lhs_t.astype(np.float32).T @ rhs.astype(np.float32)
    assert out.dtype == BF16
    np.testing.assert_allclose(out.astype(np.float32), expected, rtol=1e-2, atol=1e-1)
    exact = (lhs_t.astype(np.float64).T @ rhs.astype(np.float64)).astype(np.float32).astype(BF16)
    assert np.mean(out == exact) > 0.97  # fp32 accumulation, one bf16 rounding at eviction


def test_transposes_agree():
    x = np.random.default_rng(3).standard_normal((64, 128)).astype(BF16)
    pe, dma = nki_cpu.simulate(transpose_both_ways)(x)
    np.testing.assert_array_equal(pe, x.T)
    np.testing.assert_array_equal(dma, x.T)


def test_gdn_style_idioms_and_in_place_state():
    rng = np.random.default_rng(4)
    g = rng.standard_normal((3, 16, 8)).astype(np.float32)
    state = rng.standard_normal((3, 16, 8)).astype(np.float32)
    before = state.copy()
    out, returned = chunk_prefix(g, state=state, scale=0.5)  # jit kernel called directly runs in simulation
    expected = np.cumsum(np.cumsum(g, axis=1) * 0.5, axis=2)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(state, before + expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(returned, state)
    out_none, none_state = nki_cpu.simulate(chunk_prefix)(g, scale=0.5)
    assert none_state is None
    np.testing.assert_allclose(out_none, out, rtol=0, atol=0)


OPT_IN_SCRIPT = textwrap.dedent(
    """
    import ml_dtypes
    import numpy as np
    import nki_cpu

    nki_cpu.install_as_nki()
    import nki
    import nki.isa as nisa
    import nki.language as nl

    assert nki.language is nl and nki.isa is nisa and nisa.engine.scalar is nki_cpu.isa.engine.scalar


    @nki.jit
    def add_kernel(a, b):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        for i in nl.affine_range(a.shape[0] // 128):
            ta = nl.load(a[i * 128 : (i + 1) * 128, :])
            tb = nl.load(b[i * 128 : (i + 1) * 128, :])
            nisa.tensor_tensor(ta, ta, tb, nl.add)
            nl.store(out[i * 128 : (i + 1) * 128, :], ta)
        return out


    @nki.jit
    def mm_kernel(lhs_t, rhs):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        for k in nl.affine_range(lhs_t.shape[0] // 128):
            st = nl.ndarray((128, 128), dtype=lhs_t.dtype, buffer=nl.sbuf)
            mv = nl.ndarray((128, 512), dtype=rhs.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=st, src=lhs_t[k * 128 : (k + 1) * 128, :])
            nisa.dma_copy(dst=mv, src=rhs[k * 128 : (k + 1) * 128, :])
            nisa.nc_matmul(dst=acc, stationary=st, moving=mv, accumulate=(k > 0))
        res = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc)
        nisa.dma_copy(dst=out, src=res)
        return out


    a = np.arange(256 * 64, dtype=np.float32).reshape(256, 64)
    np.testing.assert_array_equal(nki.simulate(add_kernel)(a, a), 2 * a)
    rng = np.random.default_rng(0)
    lhs_t = rng.standard_normal((256, 128)).astype(ml_dtypes.bfloat16)
    rhs = rng.standard_normal((256, 512)).astype(ml_dtypes.bfloat16)
    got = nki.simulate(mm_kernel)(lhs_t, rhs)
    np.testing.assert_allclose(got, lhs_t.astype(np.float32).T @ rhs.astype(np.float32), rtol=1e-4, atol=1e-3)
    assert nki_cpu.install_as_nki() is nki  # idempotent
    print("OPT-IN OK")
    """
)


def test_import_nki_opt_in_in_a_subprocess(tmp_path: Path):
    script = tmp_path / "opt_in.py"
    script.write_text(OPT_IN_SCRIPT)
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": ""},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "OPT-IN OK" in result.stdout


def test_opt_in_refuses_when_a_real_nki_is_importable(tmp_path: Path):
    fake = tmp_path / "nki"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise SystemExit('the real nki must not be imported by the check')\n")
    code = "import nki_cpu\ntry:\n    nki_cpu.install_as_nki()\nexcept RuntimeError as e:\n    print('REFUSED', e)\n"
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "REFUSED" in result.stdout and "real 'nki' package is importable" in result.stdout


@nki_cpu.jit
def copy_into(src, dst):
    """Loads ``src`` and stores it into the caller's ``dst`` (an in/out argument)."""
    tile = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=src)
    nisa.dma_copy(dst=dst, src=tile)
    return dst


def test_read_only_argument_the_kernel_writes_is_refused_by_name():
    src = np.arange(32, dtype=np.float32).reshape(4, 8)
    src.setflags(write=False)  # read-only and only read: fine
    dst = np.zeros((4, 8), np.float32)
    copy_into(src, dst)
    np.testing.assert_array_equal(dst, src)
    frozen = np.zeros((4, 8), np.float32)
    frozen.setflags(write=False)
    try:
        copy_into(src, dst=frozen)
    except ValueError as exc:
        assert "`dst`" in str(exc) and "read-only" in str(exc)
    else:
        raise AssertionError("a write into a read-only argument must be refused, not made on a copy")


def test_launch_grid_must_be_a_positive_int():
    for bad in ("2", 2.7, True, 0, -1):
        try:
            tensor_add[bad]
        except ValueError as exc:
            assert "positive int" in str(exc) and repr(bad) in str(exc)
        else:
            raise AssertionError(f"grid {bad!r} must be refused")
    assert tensor_add[np.int64(2)].grid == 2 and tensor_add[(3,)].grid == 3
