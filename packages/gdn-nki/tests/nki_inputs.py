"""Shared helpers of the gdn-nki tests: seeded cases, running the kernel, judging it against the fp64 oracle.

Inputs come from ``gdn_spec.regimes.make_case`` (numpy, seeded, cast to the compute dtype first, the oracle run
on the very same rounded values); errors and bounds come from ``gdn_spec.metrics`` — no tolerance is made up here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import gdn_nki
from gdn_ref.recurrent import recurrent
from gdn_spec.metrics import Error, compare, describe
from gdn_spec.oracle import errors_vs_oracle
from gdn_spec.regimes import Case, Geometry, make_case

PACK = gdn_nki.build_mask_pack()
TENSOR_ARGS = ("query", "key", "value", "g_log", "beta")


def case(
    dtype: str,
    geometry: Geometry,
    seed: int,
    regime: str = "random",
    *,
    supply_state: bool = False,
) -> Case:
    """A seeded case; ``supply_state`` passes an all-zero state buffer for regimes that have none."""
    return make_case(regime, geometry, dtype, seed, supply_state=supply_state)


def kernel_kwargs(c: Case, algorithm: str, **overrides: Any) -> dict[str, Any]:
    """Keyword arguments of ``gdn_nki.simulate`` for a case (fresh copies of every array, so a call may mutate
    them without touching the case). The mask pack is included for schur."""
    kwargs: dict[str, Any] = {name: None if x is None else x.copy() for name, x in c.kernel.items()}
    kwargs.update(scale=c.scale, algorithm=algorithm, mask_pack=PACK.copy() if algorithm == "schur" else None)
    kwargs.update(overrides)
    return kwargs


def run(c: Case, algorithm: str, **overrides: Any) -> tuple[np.ndarray, np.ndarray]:
    """``gdn_nki.simulate`` on a case (``grid`` and any gdn_cte argument may be overridden)."""
    return gdn_nki.simulate(**kernel_kwargs(c, algorithm, **overrides))


def oracle(c: Case) -> tuple[np.ndarray, np.ndarray]:
    """The fp64 token-by-token reference on the case's (rounded) inputs."""
    return recurrent(**{k: c.oracle[k] for k in (*TENSOR_ARGS, "initial_state")}, scale=c.scale)


def errors(out: np.ndarray, state: np.ndarray, ref_out: np.ndarray, ref_state: np.ndarray, dtype: str) -> list[Error]:
    """Relative-RMS and max-abs errors of both outputs under the dtype's tolerance from ``gdn_spec.metrics``."""
    return [compare("out", out, ref_out, dtype), compare("state", state, ref_state, dtype)]


def assert_matches_oracle(c: Case, out: np.ndarray, state: np.ndarray, context: str = "") -> None:
    """Fail with both outputs' numbers unless the kernel's results are within the conformance suite's bounds
    (the tolerance table adapted to the case's measured condition, as ``gdn-spec check`` judges)."""
    found = errors_vs_oracle(c, out, state)
    assert all(e.ok for e in found), f"{context} {c.regime} {c.geometry} {c.dtype} seed={c.seed}: {describe(found)}"


def assert_agree(
    got: tuple[np.ndarray, np.ndarray], want: tuple[np.ndarray, np.ndarray], dtype: str, what: str
) -> None:
    """Two runs' (out, state) agree within the dtype's tolerance table (``want`` plays the reference)."""
    found = errors(got[0], got[1], want[0], want[1], dtype)
    assert all(e.ok for e in found), f"{what}: {describe(found)}"


def seq_first(c: Case) -> dict[str, Any]:
    """A head-major case as FLA's seq-first CPU torch tensors (q/k [B, T, Hk, K], v [B, T, Hv, V], g/beta
    [B, T, Hv]); needs torch."""
    from gdn_nki.host.torch_io import as_torch

    kernel = c.kernel
    order = {"q": "query", "k": "key", "v": "value", "g": "g_log", "beta": "beta"}
    return {name: as_torch(np.swapaxes(kernel[arg], 1, 2).copy()) for name, arg in order.items()}
