"""vLLM's ``causal_conv1d_update`` on gdn-nki's conv decode kernel, as a ``torch.library`` custom op.

The drop-in reads only shapes, dtypes and non-tensor options, rejects by name what it cannot honour, maps vLLM's
layouts onto the host entry point's (x token-major [N, T, C]; the conv-state pool [P, C, L] is already vLLM's
[num_cache_lines, dim, state_len]) and calls one op, ``gdn_nki::causal_conv1d_update``, whose CPU implementation is
``gdn_nki.host.conv.conv_decode_step`` (every rule, the all-or-nothing pool commit) and whose fake implementation
gives the output's shape.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..host.conv import conv_decode_step
from ..host.torch_io import as_numpy, as_torch, import_torch, rejection

torch = import_torch()
Tensor = torch.Tensor

PAD_SLOT_ID = -1  # vLLM's padding row id (vllm.attention.backends.utils.PAD_SLOT_ID)


@torch.library.custom_op("gdn_nki::causal_conv1d_update", mutates_args=("conv_state",))
def causal_conv1d_update_op(
    x: Tensor, conv_state: Tensor, weight: Tensor, bias: Tensor | None, rows: Tensor, activation: str | None
) -> Tensor:
    """The conv of N requests × T tokens on the pool: out [N, T, C] (x token-major); ``conv_state`` updated at
    ``rows`` [N] (−1: padding, nothing read or written)."""
    pool = as_numpy(conv_state)
    staged = pool if pool.flags.c_contiguous else np.ascontiguousarray(pool)
    out, _ = conv_decode_step(
        np.ascontiguousarray(as_numpy(x)), staged, as_numpy(weight), None if bias is None else as_numpy(bias),
        np.ascontiguousarray(as_numpy(rows)).astype(np.int32), activation=activation,
    )  # fmt: skip
    if staged is not pool:
        pool[...] = staged  # published only once the call succeeded
    return as_torch(np.ascontiguousarray(out)).clone()


@causal_conv1d_update_op.register_fake
def _causal_conv1d_update_fake(x, conv_state, weight, bias, rows, activation) -> Tensor:
    return torch.empty_like(x)


def causal_conv1d_update(
    x: Tensor,
    conv_state: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    activation: bool | str | None = None,
    conv_state_indices: Tensor | None = None,
    num_accepted_tokens: Tensor | None = None,
    query_start_loc: Tensor | None = None,
    max_query_len: int = -1,
    pad_slot_id: int = PAD_SLOT_ID,
    block_idx_last_scheduled_token: Tensor | None = None,
    initial_state_idx: Tensor | None = None,
    validate_data: bool = False,
) -> Tensor:
    """vLLM's ``causal_conv1d_update``: the decode / verify conv of a batch on a conv-state pool.

    Dimensions:
        N: requests. T: tokens each. C (dim): channels. W: width. L (state_len) >= W − 1. P: pool rows.

    Args:
        x (Tensor): [N, C] (one token) or [N, C, T], float32 or bfloat16.
        conv_state (Tensor): [P, C, L] in x's dtype, updated IN PLACE at the rows named.
        weight (Tensor): [C, W]; bias (Tensor | None): [C].
        activation (bool | str | None): True, "silu" or "swish": SiLU; None or False: none.
        conv_state_indices (Tensor | None): [N] int32 pool rows; ``pad_slot_id``: a padding request (its row
            untouched); None: row n for request n.
        num_accepted_tokens, query_start_loc, block_idx_last_scheduled_token, initial_state_idx: not supported
            yet — rejected by name (vLLM's speculative and varlen forms).
        max_query_len, validate_data: accepted (the host path validates every call).

    Returns:
        Tensor: out, x's shape and dtype.

    Notes:
        Bad input raises ``ContractError`` naming the argument; a rejected call leaves the pool as it was.
    """
    for name, value in (("num_accepted_tokens", num_accepted_tokens), ("query_start_loc", query_start_loc),
                        ("block_idx_last_scheduled_token", block_idx_last_scheduled_token),
                        ("initial_state_idx", initial_state_idx)):  # fmt: skip
        if value is not None:
            raise rejection(name, "a tensor", f"gdn-nki's causal_conv1d_update does not support {name} yet",
                            f"pass {name}=None")  # fmt: skip
    act = _activation(activation)
    if not isinstance(x, Tensor) or x.dim() not in (2, 3):
        raise rejection("x", f"shape {tuple(getattr(x, 'shape', ()))}", "x must be [batch, dim] or "
                        "[batch, dim, seqlen]", "pass the new tokens channel-major, as vLLM does")  # fmt: skip
    tokens = x.unsqueeze(1) if x.dim() == 2 else x.transpose(1, 2)  # -> [N, T, C]
    if conv_state_indices is None:
        rows = torch.arange(x.shape[0], dtype=torch.int32, device=x.device)
    else:
        rows = conv_state_indices.to(torch.int32)
        if pad_slot_id != PAD_SLOT_ID:
            rows = torch.where(rows == pad_slot_id, torch.full_like(rows, PAD_SLOT_ID), rows)
    out = causal_conv1d_update_op(tokens.contiguous(), conv_state, weight, bias, rows, act)
    return out.squeeze(1) if x.dim() == 2 else out.transpose(1, 2)


def _activation(activation: Any) -> str | None:
    """vLLM's activation option: True / "silu" / "swish" is SiLU, None / False none; anything else is rejected."""
    if activation is None or activation is False:
        return None
    if activation is True or activation in ("silu", "swish"):
        return "silu"
    raise rejection("activation", repr(activation), "activation must be None, False, True, 'silu' or 'swish'",
                    "pass activation='silu' (Qwen3-Next) or None")  # fmt: skip
