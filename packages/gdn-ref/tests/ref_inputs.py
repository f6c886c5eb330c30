"""Seeded GDN inputs and the two error metrics the gdn-ref tests use."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

HF_VECTORS = Path(__file__).parent / "data" / "hf_qwen3_next_gdn_vectors.npz"
HF_CASES = ("gqa_h0", "mha_noh0", "ratio3_weakgate")


@dataclass
class Inputs:
    """One gdn call's tensors in the project layout (float64 unless cast)."""

    query: np.ndarray
    key: np.ndarray
    value: np.ndarray
    g_log: np.ndarray
    beta: np.ndarray
    initial_state: np.ndarray | None
    scale: float

    def args(self) -> tuple:
        return self.query, self.key, self.value, self.g_log, self.beta, self.scale, self.initial_state

    def astype(self, dtype) -> Inputs:
        """q/k/v in dtype (the compute dtype); gates and state in float32, as the API requires."""
        f32 = np.float32
        state = None if self.initial_state is None else self.initial_state.astype(f32)
        return Inputs(
            self.query.astype(dtype),
            self.key.astype(dtype),
            self.value.astype(dtype),
            self.g_log.astype(f32),
            self.beta.astype(f32),
            state,
            self.scale,
        )


def l2_normalize(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + 1e-6)


def make_inputs(
    seed: int,
    *,
    B: int = 1,
    Hk: int = 2,
    Hv: int = 4,
    S: int = 200,
    Dk: int = 32,
    Dv: int = 16,
    gate: str = "moderate",
    beta_range: tuple[float, float] = (0.05, 0.95),
    keys: str = "normal",
    with_state: bool = True,
) -> Inputs:
    """Seeded inputs. gate: "moderate" (g ∈ [−0.3, 0]), "zero" (g = 0), "strong" (g ∈ [−2, −0.5]),
    "extreme" (g ∈ [−70, −30]: exp of the upper triangle would overflow).

    keys: "normal" (Gaussian, normalized) or "collinear" (one shared direction plus 1% noise: ill-conditioned
    I + A).
    """
    rng = np.random.default_rng(seed)
    query = l2_normalize(rng.standard_normal((B, Hk, S, Dk)))
    if keys == "collinear":
        shared = rng.standard_normal((B, Hk, 1, Dk))
        key = l2_normalize(shared + 0.01 * rng.standard_normal((B, Hk, S, Dk)))
    else:
        key = l2_normalize(rng.standard_normal((B, Hk, S, Dk)))
    value = rng.standard_normal((B, Hv, S, Dv))
    if gate == "zero":
        g_log = np.zeros((B, Hv, S))
    elif gate == "strong":
        g_log = -rng.uniform(0.5, 2.0, (B, Hv, S))
    elif gate == "extreme":
        g_log = -rng.uniform(30.0, 70.0, (B, Hv, S))
    else:
        g_log = -rng.uniform(0.0, 0.3, (B, Hv, S))
    beta = rng.uniform(*beta_range, (B, Hv, S))
    state = rng.standard_normal((B, Hv, Dk, Dv)) if with_state else None
    return Inputs(query, key, value, g_log, beta, state, Dk**-0.5)


def hf_case(name: str) -> dict[str, np.ndarray]:
    """One case of the HF transformers test vectors, keyed by array name."""
    with np.load(HF_VECTORS) as data:
        return {key.split("__", 1)[1]: data[key] for key in data.files if key.startswith(f"{name}__")}


def rel_rms(actual: np.ndarray, reference: np.ndarray) -> float:
    """RMS of the error over RMS of the reference (FLA's ratio metric)."""
    actual, reference = np.asarray(actual, np.float64), np.asarray(reference, np.float64)
    return float(np.sqrt(np.mean((actual - reference) ** 2)) / (np.sqrt(np.mean(reference**2)) + 1e-300))


def max_abs(actual: np.ndarray, reference: np.ndarray) -> float:
    return float(np.max(np.abs(np.asarray(actual, np.float64) - np.asarray(reference, np.float64))))


def assert_close(actual: np.ndarray, reference: np.ndarray, rel: float, abs_: float, what: str = "") -> None:
    """Both metrics bounded, and everything finite; the message carries the numbers."""
    assert np.all(np.isfinite(actual)), f"{what}: non-finite values"
    r, a = rel_rms(actual, reference), max_abs(actual, reference)
    assert r <= rel and a <= abs_, f"{what}: rel-RMS {r:.3e} (bound {rel:.1e}), max-abs {a:.3e} (bound {abs_:.1e})"
