"""The float64 oracle run on a conformance case, the case's measured condition, and errors against both.

Public so that a kernel's own tests can judge results exactly as the conformance suite does.
"""

from __future__ import annotations

import numpy as np

from gdn_ref.constants import CHUNK_BY_ALGORITHM
from gdn_ref.recurrent import recurrent

from .metrics import UNIT_ROUNDOFF, Error, compare, relative_change
from .regimes import Case

# The longer chunk of the two algorithms: the last chunk of either lies within this many final tokens, so the state
# entering them is at least as large as any chunked implementation's last-chunk state scale (carried_state).
LONGEST_CHUNK = max(CHUNK_BY_ALGORITHM.values())


def oracle(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """The float64 token-by-token reference on exactly the case's (rounded) values."""
    o = case.oracle
    return recurrent(
        o["query"], o["key"], o["value"], o["g_log"], o["beta"], scale=case.scale, initial_state=o["initial_state"]
    )


# Operands perturbed to measure a case's condition: the ones an implementation rounds to the compute dtype.
PERTURBED = ("query", "key", "value", "initial_state")


def oracle_conditions(case: Case, ref_out: np.ndarray, ref_state: np.ndarray) -> tuple[float, float]:
    """The case's condition for (out, state): the oracle's rel-RMS response, in units of the compute dtype's unit
    roundoff u, to independent relative perturbations uniform in [−u, u] of every rounded operand (metrics)."""
    u = UNIT_ROUNDOFF[case.dtype]
    rng = np.random.default_rng(case.seed ^ 0x5EED)
    values = dict(case.oracle)
    for name in PERTURBED:
        if values.get(name) is not None:
            values[name] = values[name] * (1.0 + u * rng.uniform(-1.0, 1.0, values[name].shape))
    out_p, state_p = recurrent(
        values["query"], values["key"], values["value"], values["g_log"], values["beta"],
        scale=case.scale, initial_state=values["initial_state"],
    )  # fmt: skip
    return relative_change(out_p, ref_out) / u, relative_change(state_p, ref_state) / u


def carried_state(case: Case) -> np.ndarray | None:
    """The oracle's state entering the last LONGEST_CHUNK tokens (the initial state when S <= LONGEST_CHUNK); None without an
    initial state. Any chunked implementation multiplies this state by transitions built from compute-dtype
    operands in its last chunk, so its state error is about u times this scale (metrics module docstring)."""
    o = case.oracle
    if o["initial_state"] is None:
        return None
    head = case.geometry.S - LONGEST_CHUNK
    if head <= 0:
        return o["initial_state"]
    tokens = {name: o[name][:, :, :head] for name in ("query", "key", "value", "g_log", "beta")}
    return recurrent(**tokens, scale=case.scale, initial_state=o["initial_state"])[1]


def errors_vs_oracle(case: Case, out: np.ndarray, state: np.ndarray) -> list[Error]:
    """Both outputs' errors against the oracle under the case dtype's tolerance, adapted to the case's measured
    condition and, for the state, the scale of the state carried into the last chunk (metrics module docstring)."""
    ref_out, ref_state = oracle(case)
    cond_out, cond_state = oracle_conditions(case, ref_out, ref_state)
    return [
        compare("out", out, ref_out, case.dtype, condition=cond_out),
        compare("state", state, ref_state, case.dtype, condition=cond_state, scale_floor=carried_state(case)),
    ]


__all__ = ["LONGEST_CHUNK", "PERTURBED", "carried_state", "errors_vs_oracle", "oracle", "oracle_conditions"]
