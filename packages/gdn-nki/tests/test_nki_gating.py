"""gdn_gating (vLLM's ``fused_gdn_gating`` as an NKI kernel) through ``gdn_nki.host.gating.fused_gdn_gating``:
against gdn-ref's float64 gate formulas (``gdn_ref.activations``) under gdn-spec's tolerance table at the shapes
vLLM calls it with (prefill tokens × Qwen3-Next's 32 value heads, tensor-parallel shards, decode batches), every
tile shape the launch plan makes, the softplus' linear range and beta, and the rejections."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from gdn_nki.common import backend
from gdn_nki.gating.kernel import gdn_gating
from gdn_nki.gating.rules import MIN_THRESHOLD
from gdn_nki.host.gating import fused_gdn_gating
from gdn_ref.activations import log_decay64, sigmoid64
from gdn_ref.contract import ContractError
from gdn_spec.metrics import compare

BF16 = ml_dtypes.bfloat16
DTYPES = {"float32": np.float32, "bfloat16": BF16}


def _inputs(tokens: int, heads: int, dtype: type, param_dtype: type = np.float32, seed: int = 0):
    rng = np.random.default_rng(seed)
    a = (4.0 * rng.standard_normal((tokens, heads))).astype(dtype)
    b = (4.0 * rng.standard_normal((tokens, heads))).astype(dtype)
    a_log = rng.uniform(-4.0, 2.0, heads).astype(param_dtype)  # decay rates e^-4 .. e^2
    dt_bias = rng.uniform(-2.0, 2.0, heads).astype(param_dtype)
    return a_log, a, b, dt_bias


def _oracle(a_log, a, b, dt_bias, beta: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """float64 g and β from the fp32 sum a + dt_bias (as vLLM's kernel rounds it); beta scales the softplus."""
    x = a.astype(np.float32) + dt_bias.astype(np.float32)
    g = log_decay64(np.float64(beta) * x, a_log) / beta
    return g[None], sigmoid64(b)[None]


def _check(got: tuple[np.ndarray, np.ndarray], inputs, beta: float = 1.0) -> None:
    g, beta_out = got
    a, b = inputs[1], inputs[2]
    ref_g, ref_beta = _oracle(*inputs, beta=beta)
    assert g.shape == (1, *a.shape) and g.dtype == np.float32
    assert beta_out.shape == (1, *b.shape) and beta_out.dtype == b.dtype
    assert (g <= 0).all()
    for name, value, ref, dtype in (("g", g, ref_g, "float32"), ("beta", beta_out, ref_beta, str(np.dtype(b.dtype)))):
        error = compare("out", np.asarray(value, np.float64), ref, dtype)
        assert error.ok, f"{name}: {error}"


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize(
    ("tokens", "heads"),
    [
        (700, 32),  # a prefill over Qwen3-Next's 32 value heads: R = 1, five full tiles and a [60, 1] one
        (3003, 4),  # a TP-8 shard's 4 heads: R = 5, four full [128, 5] tiles, an [88, 5] tile and a [3, 1] one
        (8, 32),  # decode: N = 8 requests
        (1, 16),  # one token
    ],
)
def test_matches_the_oracle(dtype: str, tokens: int, heads: int) -> None:
    inputs = _inputs(tokens, heads, DTYPES[dtype])
    _check(fused_gdn_gating(*inputs), inputs)


def test_bf16_parameters() -> None:
    """A_log and dt_bias as a bf16 checkpoint holds them (widened exactly)."""
    inputs = _inputs(200, 8, BF16, param_dtype=BF16, seed=1)
    _check(fused_gdn_gating(*inputs), inputs)


def test_the_softplus_linear_range_and_its_small_side() -> None:
    """x far above the threshold gives g = −exp(A_log)·x as vLLM's switch does, x far below a tiny decay (softplus
    ≈ eˣ, never rounded to a positive g): the exact softplus across both ends."""
    a_log, _, b, dt_bias = _inputs(256, 4, np.float32, seed=2)
    a = np.linspace(-60.0, 60.0, 256 * 4, dtype=np.float32).reshape(256, 4)
    g, _ = fused_gdn_gating(a_log, a, b, dt_bias)
    x = a + dt_bias
    far = x > 2 * MIN_THRESHOLD
    np.testing.assert_allclose(g[0][far], (-np.exp(a_log.astype(np.float64)) * x)[far], rtol=2e-7)
    _check((g, fused_gdn_gating(a_log, a, b, dt_bias)[1]), (a_log, a, b, dt_bias))


@pytest.mark.parametrize("beta", [0.5, 2.0])
def test_softplus_beta(beta: float) -> None:
    inputs = _inputs(300, 8, np.float32, seed=3)
    _check(fused_gdn_gating(*inputs, beta=beta), inputs, beta=beta)


def test_rows_are_independent_of_the_launch() -> None:
    """A row's gates are the same bits whichever launch (tile shape) it falls in."""
    inputs = _inputs(1000, 8, BF16, seed=4)
    whole = fused_gdn_gating(*inputs)
    part = fused_gdn_gating(inputs[0], inputs[1][37:53], inputs[2][37:53], inputs[3])
    for got, want in zip(part, whole, strict=True):
        np.testing.assert_array_equal(got[0], want[0, 37:53])


@pytest.mark.parametrize(
    ("change", "argument"),
    [
        ({"a": np.zeros((4, 8, 2), np.float32)}, "a"),  # [T, H] only
        ({"a": np.zeros((4, 8), np.float16)}, "a"),
        ({"b": np.zeros((4, 7), np.float32)}, "b"),
        ({"A_log": np.zeros(7, np.float32)}, "A_log"),
        ({"dt_bias": np.zeros((1, 8), np.float32)}, "dt_bias"),
        ({"beta": 0.0}, "beta"),
        ({"beta": float("nan")}, "beta"),
        ({"threshold": 10.0}, "threshold"),
    ],
)
def test_rejections_name_the_argument(change: dict, argument: str) -> None:
    a_log, a, b, dt_bias = _inputs(4, 8, np.float32)
    call = {"A_log": a_log, "a": a, "b": b, "dt_bias": dt_bias, "beta": 1.0, "threshold": 20.0, **change}
    with pytest.raises(ContractError, match=f"`{argument}`"):
        fused_gdn_gating(**call)


@pytest.mark.parametrize("argument", ["A_log", "a", "b", "dt_bias"])
def test_non_finite_values_rejected(argument: str) -> None:
    inputs = dict(zip(("A_log", "a", "b", "dt_bias"), _inputs(4, 8, np.float32), strict=True))
    inputs[argument].reshape(-1)[3] = np.inf
    with pytest.raises(ContractError, match=f"`{argument}`"):
        fused_gdn_gating(**inputs)


def test_kernel_asserts_at_trace_time() -> None:
    """A direct launch stops its trace with the same rule text (the tracer's assert)."""
    with pytest.raises(AssertionError, match="threshold"):
        backend.simulate(gdn_gating)(*_inputs(4, 8, np.float32), 1.0, 5.0)
