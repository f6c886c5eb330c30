"""Host entry points of the conv1d kernels: validate everything, launch, and leave the pool as it was on failure."""

from __future__ import annotations

import numpy as np

from gdn_ref.contract import ContractError, Violation
from gdn_ref.conv_rules import CONV_STEP, conv_index_violations, conv_step_violations, finite_rows_violations

from ..common import backend
from ..conv.step import gdn_conv_step
from .decode import _rows


def conv_decode_step(
    x: np.ndarray,
    conv_pool: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray | None,
    state_indices: np.ndarray,
    num_accepted_tokens: np.ndarray | None = None,
    *,
    activation: str | None = "silu",
    check_values: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Run ``gdn_conv_step`` (the conv of N requests × T tokens on a conv-state pool) with every rule checked first.

    Dimensions:
        N: requests. T: new tokens each. C: channels (a multiple of 16). W: width, 2..5. L >= W − 1. P: pool rows.

    Args:
        x (np.ndarray): [N, T, C] float32 or bfloat16, token-major.
        conv_pool (np.ndarray): [P, C, L] x's dtype, updated IN PLACE at the rows live requests name.
        weight (np.ndarray): [C, W]; bias (np.ndarray | None): [C].
        state_indices (np.ndarray): [N] or [N, T] int32 rows (``gdn_conv_step``'s docstring); −1 = padding.
        num_accepted_tokens (np.ndarray | None): [N] int32 with [N, T] rows: resume from row [n, a − 1].
        activation (str | None): "silu" or None.
        check_values (bool): also scan x, the taps and the rows read for NaN/±Inf (the index values are always
            checked: they address the pool).

    Returns:
        tuple: (out [N, T, C] in x's dtype, ``conv_pool`` itself, updated in place).

    Notes:
        A rejected call raises ``ContractError`` (argument, value, rule, fix) before launching, nothing written. The
        rows the call writes are saved first and put back if the launch fails part-way.
    """
    found = conv_step_violations(x, conv_pool, weight, bias, state_indices, num_accepted_tokens, activation)
    if not found:
        found = conv_index_violations(state_indices, num_accepted_tokens, conv_pool.shape[0], x.shape[1])
    if not found and not conv_pool.flags.writeable:
        found = [Violation("conv.pool_writable", "conv_pool", "a read-only array", "the conv-state pool is updated "
                           "IN PLACE, so it must be writable", "pass a writable array", CONV_STEP)]  # fmt: skip
    reads, writes = ([], []) if found else _rows(state_indices, num_accepted_tokens)
    if not found and check_values:
        found = _finite("x", x) + _finite("weight", weight) + _finite("bias", bias)
        found = found or finite_rows_violations(conv_pool, reads)
    if found:
        raise ContractError(found)
    saved = np.array(conv_pool[writes], copy=True)
    try:
        out, _ = backend.simulate(gdn_conv_step)(x, conv_pool, weight, bias, state_indices, num_accepted_tokens,
                                                 activation)  # fmt: skip
    except BaseException:
        conv_pool[writes] = saved  # a launch that failed part-way: the pool as it was
        raise
    return out, conv_pool


def _finite(name: str, array: np.ndarray | None) -> list[Violation]:
    if array is None:
        return []
    bad = np.argwhere(~np.isfinite(np.asarray(array, dtype=np.float64)))
    if not bad.size:
        return []
    at = [int(i) for i in bad[0]]
    return [Violation("conv.finite", name, f"value {float(np.asarray(array)[tuple(at)])} at {at}",
                      f"{name} must hold finite numbers", f"find where {name} overflowed", CONV_STEP)]  # fmt: skip


conv_decode_step.gdn_spec_conv_capabilities = {  # read by gdn-spec's conv family (gdn_spec.conv)
    "name": "gdn-nki conv_decode_step",
    "per_token_rows": True,
    "rejections": True,
}
