"""Named input regimes and shape families for GDN conformance, built with numpy from a seed.

Hypothesis only draws the *shape*, the *regime name* and the *seed*; the tensors themselves come from
``numpy.random.default_rng(seed)`` here. (Hypothesis ``arrays()`` shrinks towards near-constant data, which at
kernel size tests almost nothing.)

Every case is cast to the compute dtype first (bf16 through ml_dtypes) and the oracle then runs on exactly
those rounded values, widened to float64: the comparison measures the implementation, not the input rounding.

| regime | what it stresses | q / k | v | g (log-decay per token) | β | initial state |
|---|---|---|---|---|---|---|
| ``random`` | the plain path | N(0,1), L2-normalized | N(0,1) | −U(0.001, 0.5) | U(0.05, 0.95) | omitted or zeros |
| ``collinear_keys`` | ill-conditioned I+A (large ‖A‖, inverse growth) | k = normalize(u_head + 0.05·N) | N(0,1) | −U(0, 0.02) | U(0.5, 1) | omitted or zeros |
| ``zero_gate`` | gate exactly 1 (the FLA safe-exp accuracy bug) | normalized N | N(0,1) | exactly 0 | U(0.05, 0.95) | omitted or zeros |
| ``model_gates`` | Qwen3-Next gates: −exp(A_log)·softplus(a+dt_bias) | normalized N | N(0,1) | A~U(0,16), dt log-U[1e-3,1e-1], dt_bias=softplus⁻¹(dt), a~N(0,1) | sigmoid(N(0,1)) | omitted or zeros |
| ``extreme_gates`` | exp overflow of the upper triangle; decay underflow | normalized N | N(0,1) | logsigmoid(U(0,1))/0.01 ∈ [−69.3, −31.3] | U(0.05, 0.95) | omitted or zeros |
| ``beta_near_zero`` | almost no write | normalized N | N(0,1) | −U(0.001, 0.5) | U(1e-4, 1e-2) | omitted or zeros |
| ``beta_near_one`` | full replacement, largest ‖A‖ per key | normalized N | N(0,1) | −U(0.001, 0.5) | 1 − U(1e-4, 1e-2) | omitted or zeros |
| ``initial_state`` | incoming state is the starting point | normalized N | N(0,1) | −U(0.001, 0.5) | U(0.05, 0.95) | N(0,1) |
| ``small_delta`` | v ≈ S·k: the delta v − Sᵀk cancels | normalized N | S0ᵀk + 1e-3·N | −U(0, 0.01) | U(0.05, 0.95) | N(0,1) |
| ``large_state`` | state beyond fp16 range (staging overflow) | normalized N | N(0,1) | −U(0, 0.01) | U(0.05, 0.95) | 1e5·N(0,1) |
| ``huge_gates`` | decays after a huge gate mid-chunk (prefix-sum cancellation) | normalized N | N(0,1) | −U(0.001, 0.5), one huge gate (−1e4 … fp32's lowest) per 64 tokens at a mid-chunk offset, a stretch of −1e4 on every other token, a run of −88 | U(0.05, 0.95) | omitted or zeros |
| ``document_resets`` | −inf gates: packed documents, the state cut between them | normalized N | N(0,1) | −U(0.001, 0.5), −inf at 1–3 tokens per batch item (every head) | U(0.05, 0.95) | omitted or zeros |
| ``strong_gates`` | a clamp of g (e.g. at −5) | normalized N | N(0,1) | −U(0, 0.05), every 8th token U(−12, −6) | U(0.05, 0.95) | 100·N(0,1) |

Shape families (``HEAD_GEOMETRIES``, ``HEAD_DIMS``, ``GROUP_SIZES``) are Qwen3-Next/3.5 head layouts scaled down
(Hk = 2 key heads shared by Hv ∈ {2, 4, 6, 8} value heads) and FLA's head dims including the masked 100.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

NUMPY_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}

# Qwen3-Next uses 16 key heads for 32 value heads (GQA 2), Qwen3.5 16/48 and 16/64; scaled to Hk = 2 these
# keep every GQA ratio in {1, 2, 3, 4}. Hk == Hv is also the only geometry neumann accepts.
HEAD_GEOMETRIES = ((2, 2), (2, 4), (2, 6), (2, 8))
EQUAL_HEAD_GEOMETRIES = ((1, 1), (2, 2), (4, 4))
# 128 = MAX_HEAD_DIM (the partition width); 100 is not a power of two, so a kernel must mask a partial tile;
# 16 is the smallest matmul-friendly size and makes large draws cheap.
HEAD_DIMS = (16, 64, 100, 128)
# schur groups chunks; small group sizes put "several groups plus a partial group" within a few chunks.
GROUP_SIZES = (1, 2, 3, 8)

EXTREME_GATE_NORMALIZER = 0.01  # FLA's strongest gate setting: logsigmoid(U(0,1))/0.01 ∈ [−69.3, −31.3]
LARGE_STATE_MAGNITUDE = 1e5  # above fp16's max (65504): an fp16-staged state overflows to inf
# Gates a serving stack produces mid-chunk: large finite ones (−1e4 already swamps an fp32 prefix sum of normal
# gates; −3.4e38 is fp32's lowest) and −inf, the usual cut between packed documents (decay exactly 0).
HUGE_GATES = (-1e4, -1e7, -1e30, float(np.finfo(np.float32).min))
HUGE_GATE_SPACING = 64  # the shorter chunk (neumann's): one huge gate per chunk of either algorithm
EDGE_GATE = -88.0  # e^−88 ≈ 6e-39: at fp32's normal/subnormal edge, below any single-gate threshold ≤ 88
# Strong but ordinary gates (well inside what Qwen's −exp(A_log)·softplus(·) produces): a kernel that clamps g at
# −5 keeps e^5 ≈ 150× too much of the state across each, which the 100× incoming state makes visible in bf16.
STRONG_GATE_RANGE = (-12.0, -6.0)
STRONG_GATE_EVERY = 8
STRONG_GATE_STATE = 100.0
SMALL_DELTA_NOISE = 1e-3
COLLINEAR_NOISE = 0.05


@dataclass(frozen=True)
class Geometry:
    """One call's sizes: batch, key heads, value heads, tokens, key and value head dims."""

    B: int
    Hk: int
    Hv: int
    S: int
    Dk: int
    Dv: int

    @property
    def lanes(self) -> int:
        """Independent (batch, value head) recurrences in the call."""
        return self.B * self.Hv

    @property
    def work(self) -> int:
        """A size proxy for run time: lanes × tokens × state elements."""
        return self.lanes * self.S * self.Dk * self.Dv


@dataclass(frozen=True)
class Regime:
    """A named input distribution; ``make`` returns float64 q, k, v, g, beta and the initial state (or None)."""

    name: str
    doc: str
    needs_state: bool
    make: Callable[[np.random.Generator, Geometry], dict[str, np.ndarray | None]] = field(repr=False)


@dataclass
class Case:
    """One conformance input: the call for the implementation and the same values in float64 for the oracle.

    ``kernel`` holds query, key, value (compute dtype), g_log, beta (fp32) and recurrent_state (fp32 or None);
    ``oracle`` holds the same values widened to float64 (``initial_state`` None means zeros).
    """

    regime: str
    geometry: Geometry
    dtype: str
    seed: int
    scale: float
    kernel: dict[str, np.ndarray | None]
    oracle: dict[str, np.ndarray | None]


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """FLA's ``x / sqrt(Σx² + 1e-6)`` over the last axis (the contract requires normalized q and k)."""
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + 1e-6)


def softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + eˣ) without overflow."""
    return np.logaddexp(0.0, x)


def inverse_softplus(y: np.ndarray) -> np.ndarray:
    """x with softplus(x) = y, for y > 0."""
    return np.log(np.expm1(y))


def model_gates(rng: np.random.Generator, B: int, Hv: int, S: int) -> np.ndarray:
    """Qwen3-Next-style log-decays ``g = −exp(A_log)·softplus(a + dt_bias)``, float64 [B, Hv, S].

    Per value head: A ~ U(0, 16) (A_log = log A), dt log-uniform in [1e-3, 1e-1], dt_bias = softplus⁻¹(dt);
    per token: a ~ N(0, 1). This is vLLM's model-like gate recipe; ``g`` lies in (−16·softplus(a+dt_bias), 0].
    """
    A = rng.uniform(0.0, 16.0, size=(1, Hv, 1))
    dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), size=(1, Hv, 1)))
    dt_bias = inverse_softplus(dt)
    a = rng.standard_normal((B, Hv, S))
    return -A * softplus(a + dt_bias)


def _qk(rng: np.random.Generator, geo: Geometry) -> tuple[np.ndarray, np.ndarray]:
    shape = (geo.B, geo.Hk, geo.S, geo.Dk)
    return l2_normalize(rng.standard_normal(shape)), l2_normalize(rng.standard_normal(shape))


def _per_token(geo: Geometry) -> tuple[int, int, int]:
    return (geo.B, geo.Hv, geo.S)


def _plain(
    rng: np.random.Generator,
    geo: Geometry,
    *,
    g: np.ndarray | None = None,
    beta: np.ndarray | None = None,
    state: np.ndarray | None = None,
) -> dict[str, np.ndarray | None]:
    q, k = _qk(rng, geo)
    return {
        "query": q,
        "key": k,
        "value": rng.standard_normal((geo.B, geo.Hv, geo.S, geo.Dv)),
        "g_log": -rng.uniform(0.001, 0.5, _per_token(geo)) if g is None else g,
        "beta": rng.uniform(0.05, 0.95, _per_token(geo)) if beta is None else beta,
        "initial_state": state,
    }


def _state(rng: np.random.Generator, geo: Geometry, magnitude: float = 1.0) -> np.ndarray:
    return magnitude * rng.standard_normal((geo.B, geo.Hv, geo.Dk, geo.Dv))


def _random(rng: np.random.Generator, geo: Geometry) -> dict[str, np.ndarray | None]:
    return _plain(rng, geo)


def _collinear_keys(rng: np.random.Generator, geo: Geometry) -> dict[str, np.ndarray | None]:
    data = _plain(rng, geo, g=-rng.uniform(0.0, 0.02, _per_token(geo)), beta=rng.uniform(0.5, 1.0, _per_token(geo)))
    # One direction per key head plus a little noise: k_i·k_j ≈ 1 for every pair, so A ≈ β·Γ fills the
    # whole strictly-lower triangle and ‖A‖ grows like the chunk length.
    direction = l2_normalize(rng.standard_normal((geo.B, geo.Hk, 1, geo.Dk)))
    noise = COLLINEAR_NOISE * rng.standard_normal((geo.B, geo.Hk, geo.S, geo.Dk)) / np.sqrt(geo.Dk)
    data["key"] = l2_normalize(direction + noise)
    return data


def _zero_gate(rng: np.random.Generator, geo: Geometry) -> dict[str, np.ndarray | None]:
    return _plain(rng, geo, g=np.zeros(_per_token(geo)))


def _model_gates(rng: np.random.Generator, geo: Geometry) -> dict[str, np.ndarray | None]:
    g = model_gates(rng, geo.B, geo.Hv, geo.S)
    beta = 1.0 / (1.0 + np.exp(-rng.standard_normal(_per_token(geo))))
    return _plain(rng, geo, g=g, beta=beta)


def _extreme_gates(rng: np.random.Generator, geo: Geometry) -> dict[str, np.ndarray | None]:
    log_sigmoid = -softplus(-rng.uniform(0.0, 1.0, _per_token(geo)))
    return _plain(rng, geo, g=log_sigmoid / EXTREME_GATE_NORMALIZER)


def _beta_near_zero(rng: np.random.Generator, geo: Geometry) -> dict[str, np.ndarray | None]:
    return _plain(rng, geo, beta=rng.uniform(1e-4, 1e-2, _per_token(geo)))


def _beta_near_one(rng: np.random.Generator, geo: Geometry) -> dict[str, np.ndarray | None]:
    return _plain(rng, geo, beta=1.0 - rng.uniform(1e-4, 1e-2, _per_token(geo)))


def _initial_state(rng: np.random.Generator, geo: Geometry) -> dict[str, np.ndarray | None]:
    return _plain(rng, geo, state=_state(rng, geo))


def _small_delta(rng: np.random.Generator, geo: Geometry) -> dict[str, np.ndarray | None]:
    state = _state(rng, geo)
    data = _plain(rng, geo, g=-rng.uniform(0.0, 0.01, _per_token(geo)), state=state)
    # v_t = S0ᵀ k_t (+ small noise) with k read through the GQA head map, so v − Sᵀk starts near zero and
    # stays small while the weak decay keeps S close to S0: the delta is a difference of nearly equal terms.
    key_head = np.arange(geo.Hv) // (geo.Hv // geo.Hk)
    k = data["key"][:, key_head]
    data["value"] = np.einsum("bhsk,bhkv->bhsv", k, state) + SMALL_DELTA_NOISE * rng.standard_normal(
        (geo.B, geo.Hv, geo.S, geo.Dv)
    )
    return data


def _large_state(rng: np.random.Generator, geo: Geometry) -> dict[str, np.ndarray | None]:
    g = -rng.uniform(0.0, 0.01, _per_token(geo))
    return _plain(rng, geo, g=g, state=_state(rng, geo, LARGE_STATE_MAGNITUDE))


def _huge_gates(rng: np.random.Generator, geo: Geometry) -> dict[str, np.ndarray | None]:
    g = -rng.uniform(0.001, 0.5, _per_token(geo))
    B, Hv, S = _per_token(geo)
    run = rng.integers(0, max(1, S - 24))
    g[..., run : run + 24] = EDGE_GATE
    stretch = rng.integers(0, max(1, S - 32))
    g[..., stretch : stretch + 32 : 2] = HUGE_GATES[0]  # alternating huge / normal
    windows = np.arange(0, S, HUGE_GATE_SPACING)
    offsets = rng.integers(1, HUGE_GATE_SPACING, (B, Hv, windows.size))  # never a chunk's first token
    positions = np.minimum(windows + offsets, S - 1)
    np.put_along_axis(g, positions, rng.choice(HUGE_GATES, positions.shape), axis=-1)
    return _plain(rng, geo, g=g)


def _document_resets(rng: np.random.Generator, geo: Geometry) -> dict[str, np.ndarray | None]:
    g = -rng.uniform(0.001, 0.5, _per_token(geo))
    for b in range(geo.B):  # documents are packed per batch item: every head is cut at the same tokens
        cuts = rng.choice(np.arange(1, geo.S), size=min(geo.S - 1, rng.integers(1, 4)), replace=False)
        g[b, :, cuts] = -np.inf
    return _plain(rng, geo, g=g)


def _strong_gates(rng: np.random.Generator, geo: Geometry) -> dict[str, np.ndarray | None]:
    g = -rng.uniform(0.0, 0.05, _per_token(geo))
    first = rng.integers(0, STRONG_GATE_EVERY)
    g[..., first::STRONG_GATE_EVERY] = rng.uniform(*STRONG_GATE_RANGE, g[..., first::STRONG_GATE_EVERY].shape)
    return _plain(rng, geo, g=g, state=_state(rng, geo, STRONG_GATE_STATE))


REGIMES: dict[str, Regime] = {
    r.name: r
    for r in (
        Regime("random", "normalized Gaussian q/k, moderate gates and β", False, _random),
        Regime("collinear_keys", "near-collinear keys: ill-conditioned I+A", False, _collinear_keys),
        Regime("zero_gate", "g = 0 exactly (no decay)", False, _zero_gate),
        Regime("model_gates", "Qwen-style gates −exp(A_log)·softplus(a+dt_bias)", False, _model_gates),
        Regime("extreme_gates", "per-token g in [−69.3, −31.3]", False, _extreme_gates),
        Regime("beta_near_zero", "β in [1e-4, 1e-2]", False, _beta_near_zero),
        Regime("beta_near_one", "β in [1 − 1e-2, 1 − 1e-4]", False, _beta_near_one),
        Regime("initial_state", "N(0,1) incoming state", True, _initial_state),
        Regime("small_delta", "v ≈ S0ᵀk: the delta cancels", True, _small_delta),
        Regime("large_state", "incoming state of magnitude 1e5 (beyond fp16)", True, _large_state),
        Regime("huge_gates", "huge gates (−1e4 … fp32 lowest) mid-chunk, alternating, runs of −88", False, _huge_gates),
        Regime("document_resets", "g = −inf between packed documents", False, _document_resets),
        Regime("strong_gates", "every 8th g in [−12, −6] with a 100× incoming state", True, _strong_gates),
    )
}


def cast(x: np.ndarray, dtype: str) -> np.ndarray:
    """``x`` rounded (to nearest even) into the named dtype, as a fresh contiguous array."""
    return np.ascontiguousarray(np.asarray(x).astype(NUMPY_DTYPES[dtype]))


def make_case(
    regime: str,
    geometry: Geometry,
    dtype: str,
    seed: int,
    *,
    supply_state: bool = False,
    scale: float | None = None,
) -> Case:
    """Build one conformance case.

    Args:
        regime (str): a key of ``REGIMES``.
        geometry (Geometry): the call's sizes.
        dtype (str): compute dtype, "float32" or "bfloat16" (query, key, value).
        seed (int): seed of ``numpy.random.default_rng``; the same arguments give the same arrays.
        supply_state (bool): for regimes without an initial state, pass an all-zero fp32 ``recurrent_state``
            buffer instead of omitting it (regimes that need a state always supply one).
        scale (float | None): query scale; None means Dk ** -0.5.

    Returns:
        Case: the implementation's arguments and the oracle's float64 copies of the very same values.
    """
    data = REGIMES[regime].make(np.random.default_rng(seed), geometry)
    kernel: dict[str, np.ndarray | None] = {name: cast(data[name], dtype) for name in ("query", "key", "value")}
    kernel["g_log"] = cast(data["g_log"], "float32")
    kernel["beta"] = cast(data["beta"], "float32")
    state = data["initial_state"]
    if state is None and supply_state:
        state = np.zeros((geometry.B, geometry.Hv, geometry.Dk, geometry.Dv))
    kernel["recurrent_state"] = None if state is None else cast(state, "float32")
    oracle = {name: None if x is None else x.astype(np.float64) for name, x in kernel.items()}
    oracle["initial_state"] = oracle.pop("recurrent_state")
    return Case(
        regime=regime,
        geometry=geometry,
        dtype=dtype,
        seed=seed,
        scale=geometry.Dk**-0.5 if scale is None else scale,
        kernel=kernel,
        oracle=oracle,
    )
