"""The intra-chunk inverses on their own: handed Ãᵀ (strictly upper, the rest of the tile garbage), both return
(I + Ãᵀ)⁻¹ — upper triangular with a unit diagonal, exactly — close to the fp64 inverse."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import nki_cpu
from gdn_nki.common import engines, tiles
from gdn_nki.common.backend import nisa, nki, nl
from gdn_nki.common.tiles import FP32
from gdn_nki.cte import neumann, schur
from gdn_nki.cte.chunks import Chunk
from gdn_nki.cte.constant_tiles import constants_from_pack, constants_on_device
from nki_cpu.cost import Engine
from nki_inputs import PACK

GROUP = 8


def _systems(chunk: int, count: int, seed: int) -> np.ndarray:
    """``count`` systems Ãᵀ = diag(β)(K Kᵀ ∘ Γᵀ) of normalized keys and model-like gates, as the kernel makes them;
    the diagonal and the lower triangle hold noise, which no inverse may read."""
    rng = np.random.default_rng(seed)
    systems = rng.standard_normal((count, chunk, chunk))
    upper = np.triu(np.ones((chunk, chunk), dtype=bool), k=1)
    for system in systems:
        key = rng.standard_normal((chunk, 128))
        key /= np.linalg.norm(key, axis=1, keepdims=True)
        gamma = np.cumsum(-rng.uniform(0.0, 0.1, chunk))
        beta = rng.uniform(0.0, 1.0, chunk)
        decay_t = np.exp(gamma[None, :] - gamma[:, None])  # [j, i] = e^{γ_i − γ_j}
        system[upper] = (beta[:, None] * (key @ key.T) * decay_t)[upper]
    return systems.astype(np.float32)


def _kernel(algorithm: str, dtype: Any) -> Any:
    chunk = 128 if algorithm == "schur" else 64

    @nki.jit
    def invert(systems: Any, mask_pack: Any) -> Any:
        out = nl.ndarray(systems.shape, dtype=dtype, buffer=nl.shared_hbm)
        with engines.balancing(engines.Balancer()):
            _invert_into(out, systems, mask_pack)
        return out

    def _invert_into(out: Any, systems: Any, mask_pack: Any) -> None:
        if algorithm == "schur":
            consts = constants_from_pack(mask_pack, chunk, dtype)
            constants, invert_group, system_dtype = schur.load_merge_planes(mask_pack, consts, dtype), schur, dtype
        else:
            consts = constants_on_device(chunk, dtype)
            constants, invert_group, system_dtype = neumann.build_block_planes(consts, dtype), neumann, FP32
        for _ in constants:
            pass
        chunks = []
        for i in range(systems.shape[0]):
            place = SimpleNamespace(inverse_t=tiles.sbuf((chunk, chunk), dtype))
            # as chunks.allocate_tile_sets: schur leaves a 64-block unwritten
            nisa.memset(dst=place.inverse_t, value=0.0)
            chunks.append(Chunk(token=0, a_t=nl.load(systems[i], dtype=system_dtype), place=place))
        for _ in invert_group.invert_group(chunks, consts, dtype):
            pass
        for i, chunk_tiles in enumerate(chunks):
            nl.store(out[i], chunk_tiles.inverse_t)

    return invert


# How far the inverse may be from the fp64 one, in units of the error of rounding the fp64 inverse once into the
# result's dtype: the result is itself one rounding of fp32 sums (schur's module notes), so what it adds beyond
# that is the operands' roundings along the way. Measured (seed 7, 8 systems): schur bf16 1.4×, fp32 2.5×; neumann
# bf16 1.0×, fp32 2.2×.
ROUNDINGS = 4.0


def _rel_rms(x: np.ndarray, ref: np.ndarray) -> float:
    return float(np.sqrt(np.mean((x - ref) ** 2) / np.mean(ref**2)))


@pytest.mark.nki_cpu_only
@pytest.mark.parametrize("algorithm", ["schur", "neumann"])
@pytest.mark.parametrize("dtype", [nl.bfloat16, nl.float32], ids=["bf16", "fp32"])
def test_the_inverse_of_the_transposed_system(algorithm: str, dtype: Any) -> None:
    chunk = 128 if algorithm == "schur" else 64
    systems = _systems(chunk, GROUP, seed=7)
    if algorithm == "schur" and dtype == nl.bfloat16:  # the kernel hands schur the system in the compute dtype
        systems = systems.astype(ml_dtypes.bfloat16).astype(np.float32)
    got = np.asarray(nki.simulate(_kernel(algorithm, dtype))(systems, PACK.copy())).astype(np.float64)
    result_dtype = ml_dtypes.bfloat16 if dtype == nl.bfloat16 else np.float32
    for system, inverse in zip(systems.astype(np.float64), got, strict=True):
        expected = np.linalg.inv(np.eye(chunk) + np.triu(system, k=1))
        assert np.array_equal(np.tril(inverse, k=-1), np.zeros_like(inverse))  # every lower entry an exact zero
        assert np.array_equal(np.diag(inverse), np.ones(chunk))
        rounded = expected.astype(result_dtype).astype(np.float64)
        assert _rel_rms(inverse, expected) <= ROUNDINGS * _rel_rms(rounded, expected), (algorithm, dtype)


@pytest.mark.nki_cpu_only
@pytest.mark.parametrize("algorithm", ["schur", "neumann"])
def test_no_full_tile_transpose_on_the_tensor_engine(algorithm: str) -> None:
    """schur's inverse transposes only its 32×32 blocks in fp32 (none in bf16), neumann only its operands, never
    its result: the system arrives in the orientation the inverse needs (``chunks`` module docstring)."""
    chunk = 128 if algorithm == "schur" else 64
    nki.simulate(_kernel(algorithm, nl.bfloat16))(_systems(chunk, GROUP, seed=8), PACK.copy())
    transposes = [r for r in nki_cpu.last_trace().records if r.engine is Engine.PE and r.opcode == "nc_transpose"]
    # neumann: one transpose of each chunk's P and of its X_d (the doubling and the substitution), none at the end
    assert len(transposes) == (0 if algorithm == "schur" else 2 * GROUP)
