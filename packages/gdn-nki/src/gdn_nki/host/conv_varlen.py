"""vLLM's varlen speculative conv step (``gdn_ref.conv.causal_conv1d_update_varlen``) on ``gdn_conv_step``'s in-row
form: the packed tokens laid out as [N, max_query_len, C], one compiled program per (N, max_query_len).

The in-row kernel writes a request's whole row, R[o + 1 .. o + W − 2] ++ its T tokens (the rows hold exactly
W − 2 + T entries here, ``conv_varlen_violations``), where vLLM writes the first W − 2 + len_n entries and leaves the
others. So a request's slots past its len_n tokens are filled with the entries its row already holds there (R[W − 2
+ t] for slot t): the kernel writes them back unchanged, bit for bit, and their outputs are dropped. A request of no
tokens is padding (vLLM's kernel returns before reading its row). The layout is computed with array operations only
(``xp``: numpy on the host, torch on a device, where nothing is read back: ``gdn_nki.torch.conv_device``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gdn_ref.contract import ContractError
from gdn_ref.conv_rules import (
    conv_index_violations,
    conv_step_violations,
    conv_varlen_violations,
    finite_rows_violations,
)

from ..conv.step import step_sbuf_violations
from .conv import _finite, conv_decode_step


def padded_requests(
    x: Any, pool: Any, bounds: Any, rows: Any, max_query_len: int, width: int, xp: Any
) -> tuple[Any, Any]:
    """The packed tokens as the in-row kernel's [N, T, C] x, and the rows it is to address.

    Dimensions:
        tokens: packed tokens. N: requests. T: max_query_len. C: channels. W: width. P: pool rows.

    Args:
        x: [tokens, C]. pool: [P, C, W − 2 + T]. bounds: [N + 1] int64 request bounds (trusted: in range).
        rows: [N] int64 pool rows, −1: padding. max_query_len (int): T. width (int): W.
        xp: the array namespace of the operands (numpy or torch).

    Returns:
        tuple: x [N, T, C] (request n's slot t: its token t, past its tokens R[W − 2 + t] of its row, zeros for a
        padding request) and the rows [N] (−1 also for a request of no tokens).
    """
    steps = _arange(max_query_len, bounds, xp)
    lengths = bounds[1:] - bounds[:-1]
    live = steps[None, :] < lengths[:, None]  # [N, T]
    source = (bounds[:-1, None] + steps[None, :]).clip(0, x.shape[0] - 1)
    kept = pool[rows.clip(0, None)][:, :, width - 2 : width - 2 + max_query_len].swapaxes(1, 2)  # [N, T, C]
    # A padding request's slots are zeros, not the entries of the row its −1 was clipped to (which nothing checked):
    # its products are discarded, but the kernel's 0/1 matmuls sum every partition, and 0 · NaN is NaN.
    kept = xp.where((rows >= 0)[:, None, None], kept, 0)
    return xp.where(live[:, :, None], x[source], kept), xp.where(lengths > 0, rows, -1)


def packed_outputs(out: Any, bounds: Any, tokens: int, xp: Any) -> Any:
    """The kernel's out [N, T, C] back in the packed layout [tokens, C]: token i of request n at bounds[n] + i."""
    at = _arange(tokens, bounds, xp)
    request = xp.searchsorted(bounds[1:], at, side="right").clip(0, out.shape[0] - 1)
    return out[request, (at - bounds[request]).clip(0, out.shape[1] - 1)]


def _arange(count: int, like: Any, xp: Any) -> Any:
    """0 .. count − 1 as int64, on ``like``'s device for torch."""
    if isinstance(like, np.ndarray):
        return np.arange(count, dtype=np.int64)
    return xp.arange(count, dtype=xp.int64, device=like.device)


def conv_decode_varlen(
    x: np.ndarray,
    conv_pool: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray | None,
    query_start_loc: np.ndarray,
    state_indices: np.ndarray,
    num_accepted_tokens: np.ndarray | None,
    *,
    max_query_len: int,
    activation: str | None = "silu",
    check_values: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Run vLLM's varlen speculative conv step (``gdn_conv_step``'s in-row form on the padded requests) with every
    rule checked first.

    Dimensions:
        tokens: packed tokens. N: requests. T: max_query_len. C: channels (a multiple of 16). W: width, 2..5.
        P: pool rows.

    Args:
        x (np.ndarray): [tokens, C] float32 or bfloat16, the requests' tokens back to back.
        conv_pool (np.ndarray): [P, C, W − 2 + T] x's dtype, updated IN PLACE at the rows live requests name: the
            first W − 2 + len_n entries of request n's row.
        weight (np.ndarray): [C, W]; bias (np.ndarray | None): [C].
        query_start_loc (np.ndarray): [N + 1] int32 request bounds, 0 .. tokens, non-decreasing, each request at
            most T tokens (a request of none reads and writes nothing).
        state_indices (np.ndarray): [N] int32 rows, −1 = padding (outputs zeros).
        num_accepted_tokens (np.ndarray | None): [N] int32 in [1, T]: request n's taps read its row from entry
            num_accepted_tokens[n] − 1 (required).
        max_query_len (int): T, the compiled program's tokens per request.
        activation (str | None): "silu" or None.
        check_values (bool): also scan x, the taps and the rows read for NaN/±Inf.

    Returns:
        tuple: (out [tokens, C] in x's dtype, ``conv_pool`` itself, updated in place).

    Notes:
        A rejected call raises ``ContractError`` before anything is written (``conv_decode_step`` puts back rows
        a launch that failed part-way wrote).
    """
    found = conv_varlen_violations(x, conv_pool, weight, query_start_loc, state_indices, num_accepted_tokens,
                                   max_query_len, values=True)  # fmt: skip
    if not found:  # the in-row step's shape rules on a stand-in of the padded x
        padded = np.broadcast_to(np.zeros((), x.dtype), (state_indices.shape[0], max_query_len, x.shape[1]))
        found = conv_step_violations(padded, conv_pool, weight, bias, state_indices, num_accepted_tokens, activation)
        found = found or step_sbuf_violations(padded, conv_pool, weight, bias, state_indices)
    if not found:
        found = conv_index_violations(state_indices, num_accepted_tokens, conv_pool.shape[0], max_query_len)
    bounds = np.asarray(query_start_loc).astype(np.int64)
    if not found and check_values:
        reads = [int(r) for r in np.asarray(state_indices) if r >= 0]
        found = _finite("x", x) + _finite("weight", weight) + _finite("bias", bias)
        found = found or finite_rows_violations(conv_pool, reads)
    if found:
        raise ContractError(found)
    padded, rows = padded_requests(x, conv_pool, bounds, np.asarray(state_indices).astype(np.int64), max_query_len,
                                   weight.shape[1], np)  # fmt: skip
    out, _ = conv_decode_step(np.ascontiguousarray(padded), conv_pool, weight, bias, rows.astype(np.int32),
                              np.asarray(num_accepted_tokens), activation=activation, check_values=False)  # fmt: skip
    return packed_outputs(out, bounds, x.shape[0], np), conv_pool
