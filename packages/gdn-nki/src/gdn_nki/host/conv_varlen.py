"""The layout of vLLM's varlen speculative conv step (``gdn_ref.conv.causal_conv1d_update_varlen``) for
``gdn_conv_step``'s in-row form: the packed tokens laid out as [N, max_query_len, C], one compiled program per
(N, max_query_len); ``conv_decode_step`` with ``query_start_loc`` runs it on the host, ``torch/conv_device.py`` on a
device.

The in-row kernel writes a request's row's first W − 2 + T entries, R[o + 1 .. o + W − 2] ++ its T tokens (rows of
L >= W − 2 + T, ``conv_varlen_violations``; entries past them left), where vLLM writes the first W − 2 + len_n
entries and leaves the others. So a request's slots past its len_n tokens are filled with the entries its row
already holds there (R[W − 2 + t] for slot t): the kernel writes them back unchanged, bit for bit, and their
outputs are dropped. A request of no
tokens is padding (vLLM's kernel returns before reading its row). The layout is computed with array operations only
(``xp``: numpy on the host, torch on a device, where nothing is read back: ``gdn_nki.torch.conv_device``).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def padded_requests(
    x: Any, pool: Any, bounds: Any, rows: Any, max_query_len: int, width: int, xp: Any
) -> tuple[Any, Any]:
    """The packed tokens as the in-row kernel's [N, T, C] x, and the rows it is to address.

    Dimensions:
        tokens: packed tokens. N: requests. T: max_query_len. C: channels. W: width. P: pool rows.

    Args:
        x: [tokens, C]. pool: [P, C, L >= W − 2 + T]. bounds: [N + 1] int64 request bounds (trusted: in range).
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
