"""Decode conformance inputs built with numpy from a seed, and their float64 expectation.

A case is one call of a decode kernel (``gdn_spec.decode``'s signature): N requests of T tokens, a state pool with
more rows than the requests name (the unnamed ones must come back bit-identical), indices in the per-request [N]
or per-token [N, T] form, optional padding requests (-1) and ``num_accepted_tokens``, and gating precomputed or
fused. Hypothesis draws only the sizes and the seed; the values come from ``numpy.random.default_rng(seed)``,
cast to the compute dtype first, and the oracle runs on exactly those rounded values (``gdn_ref.decode``).

| regime | what it stresses | g (log-decay per token) | β | pool rows |
|---|---|---|---|---|
| ``random`` | the plain step | −U(0.001, 0.5) | U(0.05, 0.95) | N(0,1) |
| ``zero_gate`` | decay exactly 1 | 0 | U(0.05, 0.95) | N(0,1) |
| ``extreme_gates`` | decay underflow (FLA's strongest gates) | logsigmoid(U(0,1))/0.01 ∈ [−69.3, −31.3] | U(0.05, 0.95) | N(0,1) |
| ``beta_near_zero`` | almost no write | −U(0.001, 0.5) | U(1e-4, 1e-2) | N(0,1) |
| ``beta_near_one`` | full replacement | −U(0.001, 0.5) | 1 − U(1e-4, 1e-2) | N(0,1) |
| ``large_state`` | a state far above the tokens' scale | −U(0, 0.01) | U(0.05, 0.95) | 1e5·N(0,1) |

Fused gating replaces the regime's gates by Qwen3-Next's (``MODEL_GATES``); q and k are L2-normalized by the
case unless the call asks the kernel to (``l2norm``: then they are raw, of norms 0.5–3, or of the norms ``qk_norms``
names — small ones make the eps under the root show). With ``num_accepted_tokens`` one live request accepts all T
tokens (the draft fully accepted, the commonest verdict: it resumes from the row its last token's state goes to).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gdn_ref.decode import decode_steps, fused_gates

from ..metrics import Error, compare
from ..regimes import EXTREME_GATE_NORMALIZER, LARGE_STATE_MAGNITUDE, NUMPY_DTYPES, l2_normalize

PADDING = -1
SPARE_ROWS = 2  # pool rows no request names: they must come back bit-identical (the last row among them)
RAW_QK_NORMS = (0.5, 3.0)  # the norms of raw q and k when the kernel normalizes them (``l2norm``)


@dataclass(frozen=True)
class DecodeGeometry:
    """One decode call's sizes: requests, tokens each, key and value heads, head dims."""

    N: int
    T: int
    Hk: int
    Hv: int
    Dk: int
    Dv: int

    def __str__(self) -> str:
        return f"N={self.N} T={self.T} Hk={self.Hk} Hv={self.Hv} Dk={self.Dk} Dv={self.Dv}"


@dataclass(frozen=True)
class Addressing:
    """How the call's requests address the pool.

    Attributes:
        per_token (bool): ``state_indices`` [N, T] (the state after every token kept), else [N].
        accepted (bool): pass ``num_accepted_tokens`` (per_token only), drawn in [1, T] per request, T for one
            live request.
        padding (int): how many requests are padding (-1), placed at random among the N.
        last_row_live (bool): a live request reads (and writes) the pool's last row — the row a kernel that
            indexes the pool with -1 as a Python index would clobber; otherwise the last row is unnamed.
    """

    per_token: bool = False
    accepted: bool = False
    padding: int = 0
    last_row_live: bool = False


@dataclass(frozen=True)
class Regime:
    doc: str
    g: Any  # (rng, shape) -> log-decay
    beta: Any  # (rng, shape) -> update strength
    state_scale: float = 1.0


def _uniform(low: float, high: float) -> Any:
    return lambda rng, shape: rng.uniform(low, high, shape)


def _extreme(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return -np.logaddexp(0.0, -rng.uniform(0.0, 1.0, shape)) / EXTREME_GATE_NORMALIZER


DECAY = _uniform(-0.5, -0.001)
BETA = _uniform(0.05, 0.95)
REGIMES = {
    "random": Regime("the plain step", DECAY, BETA),
    "zero_gate": Regime("decay exactly 1", lambda rng, shape: np.zeros(shape), BETA),
    "extreme_gates": Regime("decay underflow", _extreme, BETA),
    "beta_near_zero": Regime("almost no write", DECAY, _uniform(1e-4, 1e-2)),
    "beta_near_one": Regime("full replacement", DECAY, lambda rng, shape: 1.0 - rng.uniform(1e-4, 1e-2, shape)),
    "large_state": Regime("a large state", _uniform(-0.01, 0.0), BETA, LARGE_STATE_MAGNITUDE),
}


def model_gates(rng: np.random.Generator, shape: tuple[int, ...], hv: int) -> dict[str, np.ndarray]:
    """Qwen3-Next's raw gate inputs (MODEL_GATES): A ~ U(0, 16) as A_log, dt log-uniform in [1e-3, 1e-1] as
    dt_bias = softplus⁻¹(dt), a ~ N(0, 1), b ~ 2·N(0, 1); float32."""
    dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), hv))
    return {
        "a": rng.standard_normal(shape).astype(np.float32),
        "b": (2.0 * rng.standard_normal(shape)).astype(np.float32),
        "A_log": np.log(rng.uniform(1e-3, 16.0, hv)).astype(np.float32),
        "dt_bias": np.log(np.expm1(dt)).astype(np.float32),
    }


@dataclass
class DecodeCase:
    """One decode call and everything needed to judge it.

    ``call`` holds the kernel's keyword arguments (numpy, compute dtype for query/key/value, fp32 gates and pool,
    int32 indices); ``values`` the same tokens and gates widened to float64 (fused gates already applied).
    """

    regime: str
    geometry: DecodeGeometry
    dtype: str
    seed: int
    addressing: Addressing
    gating: str
    l2norm: bool
    call: dict[str, Any]
    values: dict[str, np.ndarray]
    pool_before: np.ndarray = field(repr=False)
    read_rows: np.ndarray = field(repr=False)  # [N], -1 for padding

    @property
    def live(self) -> np.ndarray:
        return np.flatnonzero(self.read_rows >= 0)

    def written_rows(self) -> np.ndarray:
        """Every pool row a live request writes, in request-major, token-minor order."""
        indices = np.asarray(self.call["state_indices"]).reshape(self.geometry.N, -1)
        return indices[self.live].reshape(-1)

    def describe(self) -> str:
        a = self.addressing
        form = "[N, T] indices" + (" + num_accepted_tokens" if a.accepted else "") if a.per_token else "[N] indices"
        extras = [f"{a.padding} padding" if a.padding else "", "last row live" if a.last_row_live else "",
                  "use_qk_l2norm" if self.l2norm else ""]  # fmt: skip
        return f"{self.regime} {self.geometry} {self.dtype} {self.gating} gating, {form}, " + ", ".join(
            filter(None, [*extras, f"seed={self.seed}"])
        )


def make_decode_case(
    regime: str,
    geometry: DecodeGeometry,
    dtype: str,
    seed: int,
    *,
    addressing: Addressing = Addressing(),
    gating: str = "precomputed",
    l2norm: bool = False,
    scale: float | None = None,
    qk_norms: tuple[float, float] = RAW_QK_NORMS,
) -> DecodeCase:
    """A decode call from a seed (module docstring); ``scale`` defaults to Dk**-0.5; ``qk_norms``: the range of the
    raw q and k norms (per token and head) when ``l2norm``."""
    if addressing.accepted and not addressing.per_token:
        raise ValueError("num_accepted_tokens needs per-token indices (Addressing(per_token=True, accepted=True))")
    if not 0 <= addressing.padding <= geometry.N - addressing.last_row_live:
        raise ValueError(f"padding={addressing.padding} of N={geometry.N} requests (last_row_live needs a live one)")
    rng = np.random.default_rng(seed)
    g_ = geometry
    spec = REGIMES[regime]
    token_shape = (g_.N, g_.T)
    q = rng.standard_normal((*token_shape, g_.Hk, g_.Dk))
    k = rng.standard_normal((*token_shape, g_.Hk, g_.Dk))
    if l2norm:  # raw keys of various norms: the kernel must normalize them itself
        q = q * rng.uniform(*qk_norms, (*token_shape, g_.Hk, 1)) / np.sqrt(g_.Dk)
        k = k * rng.uniform(*qk_norms, (*token_shape, g_.Hk, 1)) / np.sqrt(g_.Dk)
    else:
        q, k = l2_normalize(q), l2_normalize(k)
    v = rng.standard_normal((*token_shape, g_.Hv, g_.Dv))
    compute = NUMPY_DTYPES[dtype]
    call: dict[str, Any] = {name: x.astype(compute) for name, x in (("query", q), ("key", k), ("value", v))}
    gate_shape = (*token_shape, g_.Hv)
    if gating == "fused":
        raw = model_gates(rng, gate_shape, g_.Hv)
        call.update(raw)
        g_log, beta = fused_gates(raw["a"], raw["b"], raw["A_log"], raw["dt_bias"])
    else:
        call["g_log"] = spec.g(rng, gate_shape).astype(np.float32)
        call["beta"] = spec.beta(rng, gate_shape).astype(np.float32)
        g_log, beta = (call[name].astype(np.float64) for name in ("g_log", "beta"))

    width = g_.T if addressing.per_token else 1
    pool_rows = g_.N * width + SPARE_ROWS
    pool = (spec.state_scale * rng.standard_normal((pool_rows, g_.Hv, g_.Dk, g_.Dv))).astype(np.float32)
    named = rng.permutation(pool_rows - 1)[: g_.N * width].reshape(g_.N, width)  # the last row stays unnamed
    padded = rng.permutation(g_.N)[: addressing.padding]
    named[padded] = PADDING
    accepted = rng.integers(1, g_.T + 1, g_.N) if addressing.accepted else None
    live = np.flatnonzero(named[:, 0] >= 0)
    if accepted is not None and live.size:  # a draft accepted whole: it reads the row its last token's state overwrites
        accepted[rng.choice(live)] = g_.T
    read_column = np.zeros(g_.N, dtype=np.int64) if accepted is None else accepted - 1
    if addressing.last_row_live:
        first_live = live[0]
        named[first_live, read_column[first_live]] = pool_rows - 1
    call["state_pool"] = pool
    call["state_indices"] = named.astype(np.int32).reshape(g_.N, width) if addressing.per_token else (
        named[:, 0].astype(np.int32))  # fmt: skip
    if accepted is not None:
        call["num_accepted_tokens"] = accepted.astype(np.int32)
    call["scale"] = float(g_.Dk**-0.5 if scale is None else scale)
    call["use_qk_l2norm"] = l2norm
    values = {
        "query": call["query"].astype(np.float64),
        "key": call["key"].astype(np.float64),
        "value": call["value"].astype(np.float64),
        "g_log": np.asarray(g_log, dtype=np.float64),
        "beta": np.asarray(beta, dtype=np.float64),
    }
    read_rows = named[np.arange(g_.N), read_column].astype(np.int64)
    return DecodeCase(regime, geometry, dtype, seed, addressing, gating, l2norm, call, values, pool.copy(), read_rows)


def expected(case: DecodeCase) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The float64 oracle's result: the live requests' outputs [live, T, Hv, Dv], the whole pool after the call
    [P, Hv, Dk, Dv], and the states each live request started from [live, Hv, Dk, Dv]."""
    live = case.live
    start = case.pool_before[case.read_rows[live]].astype(np.float64)
    pool = case.pool_before.astype(np.float64)
    if live.size == 0:
        return np.empty((0, *case.call["value"].shape[1:])), pool, start
    v = case.values
    out, states = decode_steps(v["query"][live], v["key"][live], v["value"][live], v["g_log"][live],
                               v["beta"][live], case.call["scale"], start, l2norm=case.l2norm)  # fmt: skip
    if case.addressing.per_token:
        pool[case.written_rows()] = states.reshape(-1, *states.shape[2:])
    else:
        pool[case.written_rows()] = states[:, -1]
    return out, pool, start


def errors_vs_oracle(case: DecodeCase, out: np.ndarray, pool: np.ndarray) -> list[Error]:
    """The live requests' outputs and the written pool rows against the oracle, under the tolerance table; the
    state's relative errors are taken against the larger of the written states and the states the requests
    started from (a few tokens can erase most of a large state; ``metrics``, "the state's scale")."""
    ref_out, ref_pool, start = expected(case)
    live, written = case.live, case.written_rows()
    got_out = np.asarray(out)
    got_out = got_out[live] if got_out.shape[:1] == (case.geometry.N,) else got_out
    return [
        compare("out", got_out, ref_out, case.dtype),
        compare("state", np.asarray(pool)[written], ref_pool[written], case.dtype, scale_floor=start),
    ]


__all__ = [
    "PADDING",
    "RAW_QK_NORMS",
    "REGIMES",
    "SPARE_ROWS",
    "Addressing",
    "DecodeCase",
    "DecodeGeometry",
    "errors_vs_oracle",
    "expected",
    "make_decode_case",
    "model_gates",
]
