"""Host entry point of the fused decode block: validate everything, launch, and leave both pools as they were on
failure."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from gdn_ref.block_rules import BLOCK, block_violations
from gdn_ref.contract import ContractError, Violation, names_entry_point
from gdn_ref.conv_rules import finite_rows_violations

from ..block.step import gdn_block_step
from ..common import backend
from .conv import _finite as _conv_finite
from .decode import _rows

# The arguments scanned for NaN / ±Inf with check_values (the pools' rows read are scanned too).
_FINITE = ("hidden", "w_qkv", "w_z", "w_b", "w_a", "conv_weight", "conv_bias", "A_log", "dt_bias", "norm_weight")


@names_entry_point("gdn_nki.block_decode_step")
def block_decode_step(
    hidden: np.ndarray,
    w_qkv: np.ndarray,
    w_z: np.ndarray,
    w_b: np.ndarray,
    w_a: np.ndarray,
    conv_weight: np.ndarray,
    conv_bias: np.ndarray | None,
    A_log: np.ndarray,
    dt_bias: np.ndarray,
    norm_weight: np.ndarray,
    conv_pool: np.ndarray,
    state_pool: np.ndarray,
    state_indices: np.ndarray,
    num_accepted_tokens: np.ndarray | None = None,
    *,
    check_values: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Run ``gdn_block_step`` (a GatedDeltaNet layer's decode / verify step, in_proj to gated norm, on both pools)
    with every rule checked first.

    Dimensions:
        As ``gdn_block_step``: N requests × T tokens (N·T <= 1024), hidden size E (a multiple of 128), Hk / Hv
        heads, head dims Dk, Dv <= 128, C = 2·Hk·Dk + Hv·Dv channels, conv width W, window L, P pool rows.

    Args:
        hidden (np.ndarray): [N, T, E] float32 or bfloat16.
        w_qkv, w_z, w_b, w_a (np.ndarray): [E, C], [E, Hv·Dv], [E, Hv], [E, Hv] in hidden's dtype.
        conv_weight (np.ndarray): [C, W]; conv_bias (np.ndarray | None): [C].
        A_log, dt_bias (np.ndarray): [Hv] fp32. norm_weight (np.ndarray): [Dv] fp32.
        conv_pool (np.ndarray): [P, C, L] hidden's dtype, updated IN PLACE at the rows live requests name.
        state_pool (np.ndarray): [P, Hv, Dk, Dv] fp32, updated IN PLACE likewise.
        state_indices (np.ndarray): [N] or [N, T] int32 rows of both pools; −1 = padding.
        num_accepted_tokens (np.ndarray | None): [N] int32 with [N, T] rows: resume from row [n, a − 1].
        check_values (bool): also scan the inputs and the pool rows the call reads for NaN / ±Inf (the index values
            are always checked: they address the pools).

    Returns:
        tuple: (out [N, T, Hv·Dv] in hidden's dtype, ``conv_pool``, ``state_pool``, both updated in place).

    Notes:
        A rejected call raises ``ContractError`` (argument, value, rule, fix) before launching, nothing written. The
        rows the call writes in both pools are saved first and put back if the launch fails part-way.
    """
    args = (hidden, w_qkv, w_z, w_b, w_a, conv_weight, conv_bias, A_log, dt_bias, norm_weight, conv_pool, state_pool,
            state_indices, num_accepted_tokens)  # fmt: skip
    found = block_violations(*args)
    for name, pool in (("conv_pool", conv_pool), ("state_pool", state_pool)):
        if not found and not pool.flags.writeable:
            found = [Violation(f"block.{name}_writable", name, "a read-only array", f"{name} is updated IN PLACE, so "
                               "it must be writable", "pass a writable array", BLOCK)]  # fmt: skip
    _, reads, writes = ([], [], []) if found else _rows(state_indices, num_accepted_tokens)
    if not found and check_values:
        found = [replace(v, rule_id="block.finite", api=BLOCK) for name, x in zip(_FINITE, args, strict=False)
                 for v in _conv_finite(name, x)][:1]  # fmt: skip
        for name, pool in (("conv_pool", conv_pool), ("state_pool", state_pool)):
            found = found or [replace(v, argument=name, api=BLOCK) for v in finite_rows_violations(pool, reads)]
    if found:
        raise ContractError(found)
    saved = [np.array(pool[writes], copy=True) for pool in (conv_pool, state_pool)]
    try:
        out, _, _ = backend.simulate(gdn_block_step)(*args)
    except BaseException:
        for pool, rows in zip((conv_pool, state_pool), saved, strict=True):
            pool[writes] = rows  # a launch that failed part-way: both pools as they were
        raise
    return out, conv_pool, state_pool
