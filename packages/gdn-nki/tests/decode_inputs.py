"""Seeded decode inputs (token-major, numpy) and the judge against the fp64 decode oracle (gdn_spec.metrics)."""

from __future__ import annotations

from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from gdn_spec.metrics import compare, describe

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}


@dataclass
class StepInputs:
    """One gdn_step call's tensors: q/k/v in the compute dtype, gates fp32 (both forms), a state pool."""

    query: np.ndarray
    key: np.ndarray
    value: np.ndarray
    g_log: np.ndarray
    beta: np.ndarray
    a: np.ndarray
    b: np.ndarray
    A_log: np.ndarray
    dt_bias: np.ndarray
    pool: np.ndarray
    extra: dict = field(default_factory=dict)

    def gates(self, fused: bool) -> dict[str, np.ndarray]:
        if fused:
            return dict(a=self.a, b=self.b, A_log=self.A_log, dt_bias=self.dt_bias)
        return dict(g_log=self.g_log, beta=self.beta)

    def oracle_gates(self, fused: bool) -> tuple[np.ndarray, np.ndarray]:
        from gdn_ref import fused_gates

        return fused_gates(self.a, self.b, self.A_log, self.dt_bias) if fused else (self.g_log, self.beta)


def step_inputs(seed: int, dtype: str, N=3, T=2, Hk=2, Hv=4, Dk=32, Dv=16, P=8) -> StepInputs:
    rng = np.random.default_rng(seed)
    f32, cd = np.float32, DTYPES[dtype]
    q = rng.standard_normal((N, T, Hk, Dk))
    k = rng.standard_normal((N, T, Hk, Dk))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    return StepInputs(
        query=q.astype(cd),
        key=k.astype(cd),
        value=rng.standard_normal((N, T, Hv, Dv)).astype(cd),
        g_log=(-rng.uniform(0.01, 1.0, (N, T, Hv))).astype(f32),
        beta=rng.uniform(0.05, 1.0, (N, T, Hv)).astype(f32),
        a=rng.standard_normal((N, T, Hv)).astype(f32),
        b=rng.standard_normal((N, T, Hv)).astype(f32),
        A_log=np.log(rng.uniform(0.5, 4.0, Hv)).astype(f32),
        dt_bias=rng.uniform(-1.0, 1.0, Hv).astype(f32),
        pool=rng.standard_normal((P, Hv, Dk, Dv)).astype(f32),
    )


def assert_within(output: str, got: np.ndarray, ref: np.ndarray, dtype: str) -> None:
    """Judge ``got`` against the fp64 ``ref`` with gdn-spec's tolerance table for ``output`` ("out"/"state")."""
    error = compare(output, got, ref, dtype)
    assert error.ok, describe([error])
