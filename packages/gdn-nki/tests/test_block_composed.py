"""gdn-ref's fp64 decode-block oracle against the separate gdn-nki kernels composed in float32 (host in_proj,
``conv_decode_step``, ``decode_step`` with fused gating and L2 norm, host gated RMSNorm): the oracle the fused block
will be held to is the arithmetic the separate kernels already do, within gdn-spec's float32 bounds."""

from __future__ import annotations

import numpy as np
import pytest

from gdn_nki import conv_decode_step, decode_step
from gdn_ref.block import gdn_block_decode_pool
from gdn_ref.decode import gated_rms_norm
from gdn_spec.metrics import TOLERANCES

HK, HV, DK, DV, E, W, L, P = 2, 4, 8, 8, 32, 4, 3, 9
C = 2 * HK * DK + HV * DV


def _within(got: np.ndarray, ref: np.ndarray, output: str) -> None:
    tol = TOLERANCES["float32"][output]
    scale = max(np.sqrt(np.mean(ref**2)), 1e-6)
    assert np.sqrt(np.mean((got - ref) ** 2)) / scale <= tol.rel_rms
    assert np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-6) <= tol.max_rel


def _separate_kernels(hidden, p, conv_pool, state_pool, rows, accepted):
    """The layer as the separate kernels run it today: in_proj on the host, then conv, recurrence, norm."""
    n, t_len, _ = hidden.shape
    mixed = (hidden @ p["w_qkv"]).astype(np.float32)
    conv_out, _ = conv_decode_step(mixed, conv_pool, p["conv_weight"], p["conv_bias"], rows, accepted)
    q = conv_out[..., : HK * DK].reshape(n, t_len, HK, DK)
    k = conv_out[..., HK * DK : 2 * HK * DK].reshape(n, t_len, HK, DK)
    v = conv_out[..., 2 * HK * DK :].reshape(n, t_len, HV, DV)
    a, b = ((hidden @ p[w]).astype(np.float32) for w in ("w_a", "w_b"))
    o, _ = decode_step(q, k, v, state_pool, rows, accepted, a=a, b=b, A_log=p["A_log"], dt_bias=p["dt_bias"],
                       use_qk_l2norm=True)  # fmt: skip
    z = (hidden @ p["w_z"]).reshape(n, t_len, HV, DV)
    out = gated_rms_norm(o, z, p["norm_weight"]).reshape(n, t_len, HV * DV)
    live = np.asarray(rows).reshape(n, -1)[:, 0] >= 0
    out[~live] = 0.0
    return out


@pytest.mark.parametrize(("rows", "accepted", "t_len"), [
    (np.array([3, -1, 0], np.int32), None, 1),
    (np.array([[0, 1], [-1, -1], [4, 5]], np.int32), np.array([2, 1, 1], np.int32), 2),
])  # fmt: skip
def test_oracle_matches_the_separate_kernels_composed(rows, accepted, t_len):
    rng = np.random.default_rng(5)
    r = rng.standard_normal
    p = {
        "w_qkv": (r((E, C)) * 0.2).astype(np.float32),
        "w_z": (r((E, HV * DV)) * 0.2).astype(np.float32),
        "w_b": (r((E, HV)) * 0.2).astype(np.float32),
        "w_a": (r((E, HV)) * 0.2).astype(np.float32),
        "conv_weight": (r((C, W)) * 0.5).astype(np.float32),
        "conv_bias": (r(C) * 0.1).astype(np.float32),
        "A_log": (r(HV) * 0.3).astype(np.float32),
        "dt_bias": (r(HV) * 0.3).astype(np.float32),
        "norm_weight": (1.0 + 0.1 * r(DV)).astype(np.float32),
    }
    hidden = r((3, t_len, E)).astype(np.float32)
    conv_pool = r((P, C, L)).astype(np.float32)
    state_pool = (r((P, HV, DK, DV)) * 0.2).astype(np.float32)
    ref_out, ref_conv, ref_state = gdn_block_decode_pool(
        hidden, **p, conv_pool=conv_pool, state_pool=state_pool, state_indices=rows, num_key_heads=HK,
        num_accepted_tokens=accepted,
    )  # fmt: skip
    untouched_conv, untouched_state = conv_pool.copy(), state_pool.copy()
    out = _separate_kernels(hidden, p, conv_pool, state_pool, rows, accepted)
    _within(out, ref_out, "out")
    _within(conv_pool.astype(np.float64), ref_conv, "state")
    _within(state_pool.astype(np.float64), ref_state, "state")
    written = {int(x) for x in np.asarray(rows).reshape(-1) if x >= 0}
    kept = [i for i in range(P) if i not in written]
    assert np.array_equal(conv_pool[kept], untouched_conv[kept])
    assert np.array_equal(state_pool[kept], untouched_state[kept])
