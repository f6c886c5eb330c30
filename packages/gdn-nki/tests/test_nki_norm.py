"""gdn_gated_rms_norm (FLA's gated RMSNorm as an NKI kernel) through ``gdn_nki.gated_rms_norm``: against gdn-ref's
float64 oracle under gdn-spec's tolerance table at prefill sizes (packed tokens × Qwen3-Next's 32 value heads) and
decode sizes, every tile shape the launch plan makes, each option, row independence, and the rejections."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import gdn_nki
from gdn_nki.common import backend
from gdn_nki.norm.kernel import MIN_TILES, RUN_BYTES, rows_per_partition, tile_plan
from gdn_nki.norm.rules import MAX_DIM
from gdn_ref.contract import ContractError
from gdn_ref.norm import gated_rms_norm_oracle
from gdn_spec.metrics import compare

BF16 = ml_dtypes.bfloat16
DTYPES = {"float32": np.float32, "bfloat16": BF16}


def _inputs(shape: tuple[int, ...], dtype: type, seed: int = 0, scale: float = 1.0):
    rng = np.random.default_rng(seed)
    x = (scale * rng.standard_normal(shape)).astype(dtype)
    z = (2.0 * rng.standard_normal(shape)).astype(dtype)
    weight = (1.0 + 0.5 * rng.standard_normal(shape[-1])).astype(np.float32)
    return x, z, weight


def _check(y: np.ndarray, x, z, weight, dtype: str, **options) -> None:
    ref = gated_rms_norm_oracle(*(None if a is None else np.asarray(a, np.float64) for a in (x, z, weight)),
                                **options)  # fmt: skip
    assert y.dtype == x.dtype and y.shape == x.shape
    error = compare("out", np.asarray(y, np.float64), ref, dtype)
    assert error.ok, error


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize(
    "shape",
    [
        (300, 32, 128),  # prefill: packed tokens × Qwen3-Next's value heads, full tiles and both remainders
        (1250, 4, 128),  # 5000 rows: R = 9, four full tiles, a [43, 9] tile and a [5, 1] tile
        (8, 32, 128),  # decode: N = 8 requests
        (1, 32, 128),  # decode: one request
        (64, 16, 64),  # another head dim
        (3, 2, MAX_DIM),  # the widest row the kernel takes: its tiles fit SBUF and PSUM in fp32
    ],
)
def test_matches_the_oracle(dtype: str, shape: tuple[int, ...]) -> None:
    x, z, weight = _inputs(shape, DTYPES[dtype])
    y = gdn_nki.gated_rms_norm(x, z, weight, eps=1e-6)
    _check(y, x, z, weight, dtype, eps=1e-6, activation="silu")


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize(
    ("with_gate", "with_weight", "activation", "eps"),
    [(True, True, "sigmoid", 1e-5), (False, True, "silu", 1e-6), (True, False, "swish", 1e-6),
     (False, False, "silu", 1e-2)],
)  # fmt: skip
def test_options(dtype: str, with_gate: bool, with_weight: bool, activation: str, eps: float) -> None:
    x, z, weight = _inputs((40, 8, 128), DTYPES[dtype], seed=1)
    z, weight = (z if with_gate else None), (weight if with_weight else None)
    y = gdn_nki.gated_rms_norm(x, z, weight, eps=eps, activation=activation)
    _check(y, x, z, weight, dtype, eps=eps, activation=activation)


def test_eps_dominates_tiny_rows() -> None:
    """Rows far below sqrt(eps) come out scaled by 1/sqrt(eps), not normalized to unit RMS (the eps is honoured)."""
    x, z, weight = _inputs((16, 8, 128), np.float32, seed=2, scale=1e-4)
    y = gdn_nki.gated_rms_norm(x, z, weight, eps=1e-2)
    _check(y, x, z, weight, "float32", eps=1e-2)
    assert np.sqrt(np.mean(np.square(y / (weight * z / (1 + np.exp(-z)))))) < 2e-3


def test_bf16_weight() -> None:
    x, z, weight = _inputs((24, 8, 128), BF16, seed=3)
    y = gdn_nki.gated_rms_norm(x, z, weight.astype(BF16))
    _check(y, x, z, weight.astype(BF16), "bfloat16")


def test_rows_are_independent_of_the_launch() -> None:
    """A row's bits do not depend on the rows launched with it or the tile shape it lands in: the rows of a
    5000-row launch (R = 9 tiles and both remainder tiles) equal the same rows launched alone and in a 40-row
    launch (R = 1)."""
    x, z, weight = _inputs((1250, 4, 128), BF16, seed=4)
    whole = gdn_nki.gated_rms_norm(x, z, weight)
    for rows in (slice(0, 1), slice(600, 610), slice(1240, 1250)):
        alone = gdn_nki.gated_rms_norm(x[rows], z[rows], weight)
        assert np.array_equal(whole[rows].view(np.uint16), alone.view(np.uint16))


@pytest.mark.parametrize("rows", [1, 127, 128, 129, 511, 512, 2048, 5000, 8191, 262144])
@pytest.mark.parametrize("itemsize", [2, 4])
def test_tile_plan_covers_every_row_once(rows: int, itemsize: int) -> None:
    per_part = rows_per_partition(rows, 128, itemsize)
    assert 1 <= per_part <= RUN_BYTES // (128 * itemsize)
    plan = tile_plan(rows, per_part)
    covered = []
    for start, parts, run in plan:
        assert 1 <= parts <= 128 and run in (1, per_part)
        covered += range(start, start + parts * run)
    assert covered == list(range(rows))
    if rows >= 128 * MIN_TILES:
        assert len(plan) >= MIN_TILES


@pytest.mark.parametrize(
    ("change", "argument"),
    [
        ({"x": np.zeros((4, 8, 128), np.float16)}, "x"),
        ({"x": np.zeros(128, np.float32)}, "x"),
        ({"z": np.zeros((4, 8, 64), np.float32)}, "g"),
        ({"z": np.zeros((4, 8, 128), BF16)}, "g"),
        ({"weight": np.ones(64, np.float32)}, "weight"),
        ({"weight": np.ones(128, np.float64)}, "weight"),
        ({"eps": 0.0}, "eps"),
        ({"eps": float("inf")}, "eps"),
        ({"activation": "gelu"}, "activation"),
        ({"x": np.zeros((2, MAX_DIM + 1), np.float32), "z": None, "weight": None}, "x"),
    ],
)
def test_rejections_name_the_argument(change: dict, argument: str) -> None:
    x, z, weight = _inputs((4, 8, 128), np.float32)
    call = {"x": x, "z": z, "weight": weight, "eps": 1e-6, "activation": "silu", **change}
    with pytest.raises(ContractError) as info:
        gdn_nki.gated_rms_norm(call.pop("x"), call.pop("z"), call.pop("weight"), **call)
    assert f"`{argument}`" in str(info.value)


@pytest.mark.parametrize("argument", ["x", "g", "weight"])
def test_non_finite_values_rejected(argument: str) -> None:
    x, z, weight = _inputs((4, 8, 128), np.float32)
    {"x": x, "g": z, "weight": weight}[argument].reshape(-1)[5] = np.nan
    with pytest.raises(ContractError, match=f"`{argument}`"):
        gdn_nki.gated_rms_norm(x, z, weight)


def test_kernel_asserts_at_trace_time() -> None:
    """A direct launch of the kernel stops its trace with the same rule text (the tracer's assert)."""
    x, z, weight = _inputs((4, 8, 128), np.float32)
    with pytest.raises(AssertionError, match="activation"):
        backend.simulate(gdn_nki.gdn_gated_rms_norm)(x, z, weight, 1e-6, "relu")
