"""The conv ops on a device (Neuron / XLA tensors): ``gdn_conv_step`` and ``gdn_conv_bucket`` launched on the
device tensors through ``device.launch``, as the recurrence ops' device path (``device.py``) launches theirs
(torch-neuronx, SDK 2.33, "How to work with NKI kernels from torch-neuronx": a kernel called on device tensors is
compiled once per shapes, dtypes and non-tensor values, then runs on the device).

Nothing here reads a device value on the host. The trace-time rules (``rules.conv_step`` / ``rules.conv_prefill``,
the fake implementations' own) read shapes and dtypes; the prefill bucket comes from shapes alone (the tokens
rounded up to ``BUCKET_QUANTUM``, one slot per sequence, or the caller's); the pool is handed to the kernel itself,
which reads and writes the named rows in place (the ops declare it in ``mutates_args``). The value rules (NaN /
Inf, the rows' range and duplicates, ``query_start_loc`` rising to the token count) would need a sync: this path
trusts them, as vLLM's conv kernels do.

Layout: both kernels read x token-major, which is what the drop-ins hand the ops ([N, T, C] for decode, [tokens, C]
for prefill; vLLM's channel-major x is the transpose of its projections' token-major output, so the drop-ins'
``contiguous()`` is a view there). Prefill pads x with zero tokens up to the bucket only when the token count is not
already a multiple of ``BUCKET_QUANTUM`` (one copy of x, the kernel's T being a compiled shape); the padding
tokens come after the last sequence, so no window reads them, and their outputs are dropped.
"""

from __future__ import annotations

from gdn_ref.conv_rules import BUCKET_QUANTUM

from ..conv.prefill import gdn_conv_bucket
from ..conv.step import gdn_conv_step
from ..host.conv_varlen import packed_outputs, padded_requests
from ..host.torch_io import import_torch
from . import device, rules

torch = import_torch()
Tensor = torch.Tensor


def causal_conv1d_update(x: Tensor, conv_state: Tensor, weight: Tensor, bias: Tensor | None, rows: Tensor,
                         activation: str | None, accepted: Tensor | None = None) -> Tensor:  # fmt: skip
    """``gdn_nki::causal_conv1d_update`` on a device: ``gdn_conv_step`` on the pool itself.

    Dimensions:
        N: requests. T: tokens each. C: channels. W: width. L: the window a pool row holds. P: pool rows.

    Args:
        x (Tensor): [N, T, C] token-major, float32 or bfloat16.
        conv_state (Tensor): [P, C, L] in x's dtype: written in place at ``rows`` by the kernel.
        weight (Tensor): [C, W]; bias (Tensor | None): [C].
        rows (Tensor): [N] int32 pool rows, or [N, T] (each token's window kept in its own row), −1: a padding
            request (trusted: range and duplicates not checked).
        activation (str | None): "silu" or None.
        accepted (Tensor | None): [N] the tokens accepted last step (trusted, not read on the host: the kernel
            reads them): with [N, T] rows request n resumes from row ``rows[n, accepted[n] − 1]``; with [N] rows
            (vLLM's in-row form, L >= W − 2 + T) from entry ``accepted[n] − 1`` of its row; None: from
            ``rows[n, 0]`` / ``rows[n]``.

    Returns:
        Tensor: out [N, T, C] in x's dtype.

    Notes:
        Raises the CPU's ``ContractError`` for a bad shape or dtype before any launch.
    """
    rules.conv_step(x, conv_state, weight, bias, rows, activation, accepted)
    counts = None if accepted is None else accepted.to(torch.int32)
    span, strided = conv_pool_span(conv_state)
    out, _ = device.launch(gdn_conv_step, x, span, weight, bias, rows.to(torch.int32), counts, activation,
                           **strided)  # fmt: skip
    return out


def causal_conv1d_update_varlen(x: Tensor, conv_state: Tensor, weight: Tensor, bias: Tensor | None,
                                query_start_loc: Tensor, rows: Tensor, accepted: Tensor, max_query_len: int,
                                activation: str | None) -> Tensor:  # fmt: skip
    """``gdn_nki::causal_conv1d_update_varlen`` on a device: the packed requests laid out as [N, T, C] on the
    device (``host.conv_varlen.padded_requests``: gathers indexed by ``query_start_loc``, never read on the host),
    ``gdn_conv_step``'s in-row form on the pool itself, the outputs gathered back to the packed layout.

    Dimensions:
        tokens: packed tokens. N: requests. T: max_query_len. C: channels. W: width. P: pool rows.

    Args:
        x (Tensor): [tokens, C] token-major, float32 or bfloat16.
        conv_state (Tensor): [P, C, L >= W − 2 + T] in x's dtype: written in place at ``rows`` by the kernel (the
            first W − 2 + len_n entries of request n's row; its next T − len_n written back as they were, the rest
            not touched).
        weight (Tensor): [C, W]; bias (Tensor | None): [C].
        query_start_loc (Tensor): [N + 1] int32 request bounds (trusted: 0 .. tokens, non-decreasing, at most T
            tokens a request).
        rows (Tensor): [N] int32 pool rows, −1: padding (trusted: range and duplicates not checked).
        accepted (Tensor): [N] int32 in [1, T] (trusted): the offset + 1 of each request's taps in its row.
        max_query_len (int): T; one compiled program per (N, T) (the gathers' shapes: (tokens, N, T)).
        activation (str | None): "silu" or None.

    Returns:
        Tensor: out [tokens, C] in x's dtype (zeros for padding requests' tokens).

    Notes:
        Raises the CPU's ``ContractError`` for a bad shape or dtype before any launch.
    """
    rules.conv_varlen_step(x, conv_state, weight, bias, query_start_loc, rows, accepted, max_query_len, activation)
    bounds = query_start_loc.long()
    padded, live = padded_requests(x, conv_state, bounds, rows.long(), max_query_len, weight.shape[1], torch)
    span, strided = conv_pool_span(conv_state)
    out, _ = device.launch(gdn_conv_step, padded.contiguous(), span, weight, bias, live.to(torch.int32),
                           accepted.to(torch.int32), activation, **strided)  # fmt: skip
    return packed_outputs(out, bounds, x.shape[0], torch)


def causal_conv1d_fn(x: Tensor, conv_states: Tensor, weight: Tensor, bias: Tensor | None, cu_seqlens: Tensor,
                     rows: Tensor, read_rows: Tensor, activation: str | None, checkpoint_every: int = 0,
                     checkpoint_indices: Tensor | None = None,
                     bucket: tuple[int, int] | list[int] | None = None) -> Tensor:  # fmt: skip
    """``gdn_nki::causal_conv1d_fn`` on a device: ``gdn_conv_bucket`` once, on the pool itself.

    Dimensions:
        tokens: packed tokens. n: sequences. C: channels. W: width. L: the window a pool row holds. P: pool rows.

    Args:
        x (Tensor): [tokens, C] token-major, the sequences back to back.
        conv_states (Tensor): [P, C, L] in x's dtype: written in place by the kernel.
        weight (Tensor): [C, W]; bias (Tensor | None): [C].
        cu_seqlens (Tensor): [n + 1] sequence bounds from 0 to ``tokens`` (trusted).
        rows (Tensor): [n] the row each sequence's final window goes to (−1: not stored).
        read_rows (Tensor): [n] the row each sequence starts from (−1: an empty window).
        activation (str | None): "silu" or None.
        checkpoint_every (int): 0 (none), or the window after every that many tokens of a sequence goes to
            ``checkpoint_indices[i, k]`` ([n, K] int32, −1: not stored; trusted).
        bucket (tuple[int, int] | None): the compiled program's (T, N); None: ``bucket_shape``'s from shapes.

    Returns:
        Tensor: out [tokens, C] in x's dtype.

    Notes:
        Raises the CPU's ``ContractError`` for a bad shape or dtype before any launch.
    """
    rules.conv_prefill(x, conv_states, weight, bias, cu_seqlens, rows, read_rows, activation, checkpoint_every,
                       checkpoint_indices, bucket)  # fmt: skip
    tokens = x.shape[0]
    total, slots = bucket_shape(tokens, rows.shape[0], bucket)
    padded = x if total == tokens else torch.nn.functional.pad(x, (0, 0, 0, total - tokens))
    bounds = cu_seqlens.to(torch.int32)
    bounds = torch.cat([bounds, bounds[-1:].expand(slots + 1 - bounds.shape[0])])  # empty slots repeat the end
    options = {"read_indices": device._slots(read_rows, slots)}
    if checkpoint_every:  # the checkpoint rows, padded to the bucket's slots like the other tables
        options.update(
            checkpoint_every=int(checkpoint_every), checkpoint_indices=device._slots(checkpoint_indices, slots)
        )
    span, strided = conv_pool_span(conv_states)
    out, _ = device.launch(gdn_conv_bucket, padded, span, weight, bias, bounds, device._slots(rows, slots),
                           activation, **options, **strided)  # fmt: skip
    return out if total == tokens else out[:tokens]


def conv_pool_span(pool: Tensor) -> tuple[Tensor, dict[str, int]]:
    """A conv pool as the conv kernels take it (``device.pool_span``) and the keywords saying so: a row-strided pool's
    span, row stride and window length L."""
    span, strided = device.pool_span(pool)
    return span, ({**strided, "state_len": int(pool.shape[2])} if strided else {})


def bucket_shape(tokens: int, seqs: int, bucket: tuple[int, int] | None) -> tuple[int, int]:
    """The caller's bucket (T, N), else the smallest holding the call: the tokens rounded up to
    ``BUCKET_QUANTUM`` (at least one quantum) and one slot per sequence; ``conv_prefill_bucket``'s default."""
    if bucket is not None:
        return int(bucket[0]), int(bucket[1])
    return max(BUCKET_QUANTUM, -(-tokens // BUCKET_QUANTUM) * BUCKET_QUANTUM), seqs
