"""vLLM's ``causal_conv1d_fn`` and ``causal_conv1d_update`` on gdn-nki's conv kernels, as ``torch.library`` custom
ops.

Each drop-in reads only shapes, dtypes and non-tensor options, rejects by name what it cannot honour, maps vLLM's
layouts onto the host entry point's (x token-major [N, T, C]; the conv-state pool [P, C, L] is already vLLM's
[num_cache_lines, dim, state_len]) and calls one op: ``gdn_nki::causal_conv1d_update``, whose CPU implementation is
``gdn_nki.host.conv.conv_decode_step``, and ``gdn_nki::causal_conv1d_fn``, whose CPU implementation is
``gdn_nki.host.conv.conv_prefill_bucket`` (every rule, the all-or-nothing pool commit); the fake implementations
give the output's shape; on a device the ops launch the conv kernels on the device tensors (``conv_device.py``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from gdn_ref.contract import ContractError, names_entry_point

from ..host.conv import conv_decode_step, conv_prefill_bucket
from ..host.torch_io import (
    SUPPORTED_DTYPES,
    as_numpy,
    as_torch,
    check_tensor,
    import_torch,
    in_torch_terms,
    reject_empty,
    reject_strided_pool,
    rejection,
)
from . import conv_device, rules
from .forward_only import attached, detached
from .graph_padding import first_rows
from .traced_rejection import rejects_at_trace_time

torch = import_torch()
Tensor = torch.Tensor

PAD_SLOT_ID = -1  # vLLM's padding row id (vllm.attention.backends.utils.PAD_SLOT_ID)

# The host entry points' argument names -> each drop-in's own, so that a rejection names what the caller passed.
_UPDATE_NAMES = {"conv_pool": "conv_state", "state_indices": "conv_state_indices"}
_FN_NAMES = {"conv_pool": "conv_states", "state_indices": "cache_indices", "cu_seqlens": "query_start_loc"}
_FLA_NAMES = {"conv_pool": "initial_state"}


def _x_index(caller_at: Callable[[list[int]], list[int]]) -> Callable[[str, list[int]], list[int]]:
    """``in_torch_terms``' index map for a drop-in that hands the host path x in another layout than the caller's
    (token-major): an element of x at the caller's index (``caller_at`` of the host path's), any other as it is."""
    return lambda name, at: caller_at(at) if name == "x" else at


@torch.library.custom_op("gdn_nki::causal_conv1d_update", mutates_args=("conv_state",))
def causal_conv1d_update_op(
    x: Tensor,
    conv_state: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    rows: Tensor,
    accepted: Tensor | None,
    activation: str | None,
) -> Tensor:
    """The conv of N requests × T tokens on the pool: out [N, T, C] (x token-major); ``conv_state`` updated at
    ``rows`` [N] or [N, T] (−1: padding, nothing read or written); with ``accepted`` [N] each request resumes from
    its row ``[n, accepted[n] − 1]`` ([N, T] rows) or from entry ``accepted[n] − 1`` of its row ([N] rows: vLLM's
    in-row form)."""
    if x.device.type != "cpu":  # the device path (conv_device.py); below, the CPU's host path
        return conv_device.causal_conv1d_update(x, conv_state, weight, bias, rows, activation, accepted)
    reject_strided_pool("conv_state", conv_state)  # the kernel updates the pool itself
    out, _ = conv_decode_step(
        np.ascontiguousarray(as_numpy(x)), as_numpy(conv_state), as_numpy(weight), None if bias is None else as_numpy(bias),
        np.ascontiguousarray(as_numpy(rows)).astype(np.int32),
        None if accepted is None else np.ascontiguousarray(as_numpy(accepted)).astype(np.int32), activation=activation,
    )  # fmt: skip
    return as_torch(np.ascontiguousarray(out)).clone()


@torch.library.custom_op("gdn_nki::causal_conv1d_update_varlen", mutates_args=("conv_state",))
def causal_conv1d_update_varlen_op(
    x: Tensor,
    conv_state: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    query_start_loc: Tensor,
    rows: Tensor,
    accepted: Tensor,
    max_query_len: int,
    activation: str | None,
) -> Tensor:
    """vLLM's varlen speculative step: out [tokens, C] (x token-major, request n's tokens ``query_start_loc[n] ..
    query_start_loc[n + 1] − 1``); ``conv_state`` updated in place at ``rows`` [N] (−1: padding), each request's
    taps reading its row from entry ``accepted[n] − 1`` (``gdn_ref.conv.causal_conv1d_update_varlen``)."""
    if x.device.type != "cpu":  # the device path (conv_device.py); below, the CPU's host path
        return conv_device.causal_conv1d_update_varlen(x, conv_state, weight, bias, query_start_loc, rows, accepted,
                                                       max_query_len, activation)  # fmt: skip
    reject_strided_pool("conv_state", conv_state)  # the kernel updates the pool itself
    out, _ = conv_decode_step(
        np.ascontiguousarray(as_numpy(x)), as_numpy(conv_state), as_numpy(weight), None if bias is None else as_numpy(bias),
        np.ascontiguousarray(as_numpy(rows)).astype(np.int32), np.ascontiguousarray(as_numpy(accepted)).astype(np.int32),
        activation=activation, query_start_loc=np.ascontiguousarray(as_numpy(query_start_loc)).astype(np.int32),
        max_query_len=max_query_len,
    )  # fmt: skip
    return as_torch(np.ascontiguousarray(out)).clone()


@causal_conv1d_update_varlen_op.register_fake
def _causal_conv1d_update_varlen_fake(x, conv_state, weight, bias, query_start_loc, rows, accepted, max_query_len,
                                      activation) -> Tensor:  # fmt: skip
    rules.conv_varlen_step(x, conv_state, weight, bias, query_start_loc, rows, accepted, max_query_len, activation)
    return torch.empty_like(x)


@causal_conv1d_update_op.register_fake
def _causal_conv1d_update_fake(x, conv_state, weight, bias, rows, accepted, activation) -> Tensor:
    rules.conv_step(x, conv_state, weight, bias, rows, activation, accepted)
    return torch.empty_like(x)


@rejects_at_trace_time(lambda rejected, argument: rejected(argument("x")))
@names_entry_point("gdn_nki.torch.causal_conv1d_update")
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
    *,
    null_block_id: int | None = None,
) -> Tensor:
    """vLLM's ``causal_conv1d_update``: the decode / verify conv of a batch on a conv-state pool.

    Dimensions:
        N: requests. T: tokens each. C (dim): channels. W: width. L (state_len) >= W − 1. P: pool rows.

    Args:
        x (Tensor): [N, C] (one token) or [N, C, T], float32 or bfloat16.
        conv_state (Tensor): [P, C, L] in x's dtype, updated IN PLACE at the rows named: contiguous, or rows at
            their own stride, each a dense [C, L] (vLLM's pages with ``VLLM_SSM_CONV_STATE_LAYOUT=DS``).
        weight (Tensor): [C, W]; bias (Tensor | None): [C].
        activation (bool | str | None): True, "silu" or "swish": SiLU; None or False: none.
        conv_state_indices (Tensor | None): [N] int32 pool rows; ``pad_slot_id``: a padding request (its row
            untouched; only that id pads, as in vLLM's kernels: with another id a −1 row is out of range, refused);
            None: row n for request n. Or [N, T] (gdn-nki's speculative form, the rows of vLLM's
            recurrent ``ssm_state_indices`` [N, T]): the window after token t goes to row [n, t].
        num_accepted_tokens (Tensor | None): [N] int32 in [1, T]. With [N, T] rows request n resumes from row
            [n, num_accepted_tokens[n] − 1] (the rows the recurrent state rolls back by). With [N] rows (or None
            rows), vLLM's own speculative form: ``conv_state`` rows of L >= W − 2 + T inputs (vLLM allocates
            W − 1 + num_speculative_tokens), the taps' window read from entry num_accepted_tokens[n] − 1 of the row
            and the row's first W − 2 + T entries rewritten as the window's last W − 2 then the T tokens, a longer
            row's later entries left as they were, as vLLM's kernel does (``gdn_ref.conv``).
        query_start_loc (Tensor | None): [N + 1] int32: vLLM's varlen form, as its GDN layer calls it in
            speculative decoding: x [tokens, dim] packed, request n's tokens ``query_start_loc[n] ..
            query_start_loc[n + 1] − 1`` (from 0 to tokens, non-decreasing, at most ``max_query_len`` each; a
            request of none reads and writes nothing), with ``conv_state_indices`` [N] and ``num_accepted_tokens``
            (the in-row form; without it query_start_loc is rejected by name; both may be longer, vLLM's graph
            padding: their first N + 1 / N entries are read, N from conv_state_indices) and ``conv_state`` rows of
            L >= W − 2 + max_query_len inputs: request n's row gets its first W − 2 + len_n entries written, as vLLM's
            kernel writes them (``gdn_ref.conv.causal_conv1d_update_varlen``).
        max_query_len (int): with ``query_start_loc``, the most tokens a request has (vLLM passes
            ``spec_state_indices_tensor.size(-1)``); the compiled program's tokens per request. Else unused.
        block_idx_last_scheduled_token, initial_state_idx: not supported yet — rejected by name (vLLM's
            prefix-caching form).
        validate_data: accepted (the host path validates every call).
        null_block_id (int | None): newer vLLM's name for the padding id, in ``pad_slot_id``'s place (its decode
            graphs pad rows with its null block, ``NULL_BLOCK_ID = 0``): the same as ``pad_slot_id`` (not both).

    Returns:
        Tensor: out, x's shape and dtype (with query_start_loc, zeros at a padding request's tokens).

    Notes:
        Bad input raises ``ContractError`` naming the argument; a rejected call leaves the pool as it was.
    """
    for name, value in (("block_idx_last_scheduled_token", block_idx_last_scheduled_token),
                        ("initial_state_idx", initial_state_idx)):  # fmt: skip
        if value is not None:
            raise rejection(name, "a tensor", f"gdn-nki's causal_conv1d_update does not support {name} yet",
                            f"pass {name}=None")  # fmt: skip
    if null_block_id is not None:
        if pad_slot_id not in (PAD_SLOT_ID, null_block_id):
            raise rejection("null_block_id", f"= {null_block_id!r} beside pad_slot_id = {pad_slot_id!r}",
                            "null_block_id is newer vLLM's name for pad_slot_id: one padding id",
                            "pass one of them")  # fmt: skip
        pad_slot_id = null_block_id
    act = _activation(activation)
    if query_start_loc is not None:
        return _update_varlen(x, conv_state, weight, bias, act, conv_state_indices, num_accepted_tokens,
                              query_start_loc, max_query_len, pad_slot_id)  # fmt: skip
    if not isinstance(x, Tensor) or x.dim() not in (2, 3):
        raise rejection("x", f"shape {tuple(getattr(x, 'shape', ()))}", "x must be [batch, dim] or "
                        "[batch, dim, seqlen]", "pass the new tokens channel-major, as vLLM does")  # fmt: skip
    check_tensor("x", x, SUPPORTED_DTYPES, any_device=True)
    reject_empty("x", x)  # here, not on the op's token-major x: the caller's shape
    tokens = x.unsqueeze(1) if x.dim() == 2 else x.transpose(1, 2)  # -> [N, T, C]
    # the op's [n, t, c] is the caller's [n, c] or [n, c, t]
    index = _x_index(lambda at: [at[0], at[2]] if x.dim() == 2 else [at[0], at[2], at[1]])
    if conv_state_indices is None:
        rows = torch.arange(x.shape[0], dtype=torch.int32, device=x.device)
    else:
        rows = _pad_rows(conv_state_indices.to(torch.int32), pad_slot_id)
    accepted = None if num_accepted_tokens is None else num_accepted_tokens.to(torch.int32)
    try:  # the pool's op has no autograd formula: its output goes on the inputs' graph after it (forward_only.py)
        out = causal_conv1d_update_op(detached(tokens).contiguous(), conv_state, detached(weight), detached(bias),
                                      rows, accepted, act)  # fmt: skip
    except ContractError as error:
        raise _in_pad_terms(in_torch_terms(error, _UPDATE_NAMES, index), "conv_state_indices", pad_slot_id) from None
    out = attached("gdn_nki.torch.causal_conv1d_update", out, (x, weight, bias))
    return out.squeeze(1) if x.dim() == 2 else out.transpose(1, 2)


def _update_varlen(x: Any, conv_state: Tensor, weight: Tensor, bias: Tensor | None, act: str | None,
                   conv_state_indices: Tensor | None, num_accepted_tokens: Tensor | None, query_start_loc: Tensor,
                   max_query_len: int, pad_slot_id: int) -> Tensor:  # fmt: skip
    """``causal_conv1d_update`` with ``query_start_loc`` (vLLM's varlen speculative form) on
    ``gdn_nki::causal_conv1d_update_varlen``; x [tokens, dim] is already token-major."""
    if num_accepted_tokens is None:
        raise rejection("query_start_loc", "a tensor without num_accepted_tokens", "gdn-nki takes query_start_loc "
                        "in vLLM's speculative form only: with num_accepted_tokens, as vLLM's GDN layer calls it",
                        "pass num_accepted_tokens [N], or x as [N, dim, seqlen] without query_start_loc")  # fmt: skip
    if not isinstance(x, Tensor) or x.dim() != 2:
        raise rejection("x", f"shape {tuple(getattr(x, 'shape', ()))}", "with query_start_loc x is the requests' "
                        "tokens packed as [tokens, dim]", "pass x as [total tokens, dim], as vLLM does")  # fmt: skip
    check_tensor("x", x, SUPPORTED_DTYPES, any_device=True)
    reject_empty("x", x)
    if conv_state_indices is None:
        raise rejection("conv_state_indices", "None", "with query_start_loc conv_state_indices names each "
                        "request's row (vLLM asserts it is given)", "pass conv_state_indices [N]")  # fmt: skip
    rows = _pad_rows(conv_state_indices.to(torch.int32), pad_slot_id)
    # vLLM's graph-padded tables: the first N (+ 1) entries, N from conv_state_indices, as its kernel reads them
    n = rows.shape[0]
    query_start_loc, num_accepted_tokens = first_rows(n + 1, query_start_loc), first_rows(n, num_accepted_tokens)
    try:  # the pool's op has no autograd formula: its output goes on the inputs' graph after it (forward_only.py)
        out = causal_conv1d_update_varlen_op(detached(x).contiguous(), conv_state, detached(weight), detached(bias),
                                             query_start_loc.to(torch.int32), rows,
                                             num_accepted_tokens.to(torch.int32), int(max_query_len), act)  # fmt: skip
    except ContractError as error:
        raise _in_pad_terms(in_torch_terms(error, _UPDATE_NAMES), "conv_state_indices", pad_slot_id) from None
    return attached("gdn_nki.torch.causal_conv1d_update", out, (x, weight, bias))


@torch.library.custom_op("gdn_nki::causal_conv1d_fn", mutates_args=("conv_states",))
def causal_conv1d_fn_op(
    x: Tensor,
    conv_states: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    cu_seqlens: Tensor,
    rows: Tensor,
    read_rows: Tensor,
    activation: str | None,
    checkpoint_every: int = 0,
    checkpoint_indices: Tensor | None = None,
    bucket: list[int] | None = None,
) -> Tensor:
    """The prefill of packed sequences: out [tokens, C] (x token-major); sequence i starts from pool row
    ``read_rows[i]`` (−1: an empty window) and writes its final window to ``rows[i]`` (−1: nothing stored), and
    with ``checkpoint_every`` the window after every that many of its tokens to ``checkpoint_indices[i, k]``;
    ``bucket`` [T, N]: the compiled program's shape (None: the call's own)."""
    if x.device.type != "cpu":  # the device path (conv_device.py); below, the CPU's host path
        return conv_device.causal_conv1d_fn(x, conv_states, weight, bias, cu_seqlens, rows, read_rows, activation,
                                            checkpoint_every, checkpoint_indices, bucket)  # fmt: skip
    reject_strided_pool("conv_states", conv_states)  # the kernel updates the pool itself
    out, _ = conv_prefill_bucket(
        np.ascontiguousarray(as_numpy(x)), as_numpy(conv_states), as_numpy(weight), None if bias is None else as_numpy(bias),
        as_numpy(cu_seqlens).astype(np.int32), as_numpy(rows).astype(np.int32), activation=activation,
        read_indices=as_numpy(read_rows).astype(np.int32), checkpoint_every=checkpoint_every or None,
        checkpoint_indices=None if checkpoint_indices is None else as_numpy(checkpoint_indices).astype(np.int32),
        bucket=tuple(bucket) if bucket else None,
    )  # fmt: skip
    return as_torch(np.ascontiguousarray(out)).clone()


@causal_conv1d_fn_op.register_fake
def _causal_conv1d_fn_fake(x, conv_states, weight, bias, cu_seqlens, rows, read_rows, activation,
                           checkpoint_every=0, checkpoint_indices=None, bucket=None) -> Tensor:  # fmt: skip
    rules.conv_prefill(x, conv_states, weight, bias, cu_seqlens, rows, read_rows, activation, checkpoint_every,
                       checkpoint_indices, bucket)  # fmt: skip
    return torch.empty_like(x)


@rejects_at_trace_time(lambda rejected, argument: rejected(argument("x")))
@names_entry_point("gdn_nki.torch.causal_conv1d_fn")
def causal_conv1d_fn(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    conv_states: Tensor,
    query_start_loc: Tensor,
    cache_indices: Tensor | None = None,
    has_initial_state: Tensor | None = None,
    activation: str | None = "silu",
    pad_slot_id: int = PAD_SLOT_ID,
    block_idx_first_scheduled_token: Tensor | None = None,
    block_idx_last_scheduled_token: Tensor | None = None,
    initial_state_idx: Tensor | None = None,
    num_computed_tokens: Tensor | None = None,
    block_size_to_align: int = 0,
    metadata: Any = None,
    validate_data: bool = False,
    *,
    read_indices: Tensor | None = None,
    checkpoint_every: int | None = None,
    checkpoint_indices: Tensor | None = None,
    bucket: tuple[int, int] | None = None,
) -> Tensor:
    """vLLM's ``causal_conv1d_fn``: the prefill conv of packed sequences, each from its conv-state pool row.

    Dimensions:
        tokens: packed tokens. n: sequences. C (dim): channels. W: width. L (state_len) >= W − 1. P: pool rows.

    Args:
        x (Tensor): [dim, tokens] (vLLM's channel-major packed layout), float32 or bfloat16.
        weight (Tensor): [C, W]; bias (Tensor | None): [C].
        conv_states (Tensor): [P, C, L] in x's dtype, updated IN PLACE: each sequence's final window to its row.
            Rows may lie at their own stride, each dense, as ``causal_conv1d_update``'s.
        query_start_loc (Tensor): [n + 1] int32 sequence bounds, from 0 to ``tokens``.
        cache_indices (Tensor | None): [n] pool rows (``pad_slot_id``: nothing read or stored; only that id pads,
            as in vLLM's kernels: with another id a −1 row is out of range, refused); None: row i.
        has_initial_state (Tensor | None): [n] bool: start from the row's window (else an empty one); None: all
            start empty.
        activation (str | None): "silu" / "swish" or None.
        block_idx_first_scheduled_token, block_idx_last_scheduled_token, initial_state_idx, num_computed_tokens,
            block_size_to_align: vLLM's prefix-caching block form — rejected by name (not supported yet).
        metadata, validate_data: accepted (the host path validates every call).
        read_indices (Tensor | None): gdn-nki's serving keywords, as ``gdn_nki.torch.chunk_gated_delta_rule``'s: [n]
            the row sequence i starts from when it is not its ``cache_indices`` row (a prefix-cache hit; −1 or
            ``pad_slot_id``: an empty window; overrides ``has_initial_state``).
        checkpoint_every (int | None), checkpoint_indices (Tensor | None): the window after every
            ``checkpoint_every`` tokens of sequence i (a multiple of 128) to row ``checkpoint_indices[i, k]`` (−1:
            none): the recurrent checkpoints' positions and rows, so one prefix-cache hit restores both states.
        bucket (tuple[int, int] | None): (T, N) of the compiled program (``gdn_nki.conv_prefill_bucket``).

    Returns:
        Tensor: out, x's shape and dtype.

    Notes:
        Bad input raises ``ContractError`` naming the argument; a rejected call leaves the pool as it was.
    """
    for name, value in (("block_idx_first_scheduled_token", block_idx_first_scheduled_token),
                        ("block_idx_last_scheduled_token", block_idx_last_scheduled_token),
                        ("initial_state_idx", initial_state_idx), ("num_computed_tokens", num_computed_tokens),
                        ("block_size_to_align", block_size_to_align or None)):  # fmt: skip
        if value is not None:
            raise rejection(name, repr(value) if not isinstance(value, Tensor) else "a tensor",
                            f"gdn-nki's causal_conv1d_fn does not support {name} yet", f"leave {name} unset")  # fmt: skip
    act = _activation(activation)
    if not isinstance(x, Tensor) or x.dim() != 2:
        raise rejection("x", f"shape {tuple(getattr(x, 'shape', ()))}", "x must be [dim, tokens] (the sequences "
                        "packed along tokens)", "pass x as vLLM's varlen layout, [dim, tokens]")  # fmt: skip
    check_tensor("x", x, SUPPORTED_DTYPES, any_device=True)
    reject_empty("x", x)  # here, not on the op's token-major x: the caller's shape
    seqs = query_start_loc.shape[0] - 1
    rows = (torch.arange(seqs, dtype=torch.int32, device=x.device) if cache_indices is None
            else _pad_rows(cache_indices.to(torch.int32), pad_slot_id))  # fmt: skip
    read_rows = (torch.full_like(rows, PAD_SLOT_ID) if has_initial_state is None
                 else torch.where(has_initial_state.to(torch.bool), rows, torch.full_like(rows, PAD_SLOT_ID)))  # fmt: skip
    if read_indices is not None:
        read_rows = _pad_rows(read_indices.to(torch.int32), pad_slot_id, minus_one_pads=True)
    table = None if checkpoint_indices is None else checkpoint_indices.to(torch.int32)
    try:  # the pool's op has no autograd formula: its output goes on the inputs' graph after it (forward_only.py)
        out = causal_conv1d_fn_op(detached(x).t().contiguous(), conv_states, detached(weight), detached(bias),
                                  query_start_loc.to(torch.int32), rows, read_rows, act, int(checkpoint_every or 0),
                                  table, list(bucket) if bucket is not None else None)  # fmt: skip
    except ContractError as error:
        # the op's [token, c]
        raise _in_pad_terms(in_torch_terms(error, _FN_NAMES, _x_index(lambda at: at[::-1])), "cache_indices",
                            pad_slot_id) from None  # fmt: skip
    return attached("gdn_nki.torch.causal_conv1d_fn", out, (x, weight, bias)).t()


@rejects_at_trace_time(
    lambda rejected, argument: (
        rejected(argument("x")),
        argument("initial_state") if argument("output_final_state") else None,
    )
)
@names_entry_point("gdn_nki.torch.causal_conv1d")
def causal_conv1d(
    x: Tensor,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    residual: Tensor | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    activation: str | None = None,
    backend: str | None = "triton",
    cu_seqlens: Tensor | None = None,
    **kwargs: Any,
) -> tuple[Tensor, Tensor | None]:
    """FLA's ``causal_conv1d`` (``fla.modules.convolution``): the causal depthwise conv of a batch or of packed
    sequences, forward only.

    Dimensions:
        B: batch (1 with ``cu_seqlens``). T: tokens. D: channels. W: width. N: sequences (B, or len(cu_seqlens) − 1).

    Args:
        x (Tensor): [B, T, D] float32 or bfloat16.
        weight (Tensor): [D, W] (None, FLA's identity taps, is rejected); bias (Tensor | None): [D].
        residual (Tensor | None): [B, T, D], added after the activation, to the fp32 sum (one rounding to x's
            dtype, as FLA's kernel).
        initial_state (Tensor | None): [N, D, W], FLA's cache layout (the last W inputs, oldest first; the taps read
            its last W − 1); read only, in its own dtype (fp32 caches of bf16 x are not rounded to bf16 before
            use). None: empty windows.
        output_final_state (bool): also return each sequence's final cache [N, D, W].
        activation (str | None): "silu" / "swish" or None.
        backend (str | None): FLA's implementation choice ("triton" / "cuda"); gdn-nki has one, so it is ignored.
        cu_seqlens (Tensor | None): [N + 1] sequence bounds over the T tokens (B = 1).
        **kwargs: FLA's precomputed index helpers (``cu_seqlens_cpu``, ``chunk_indices``) are accepted and unused;
            any other name is rejected.

    Returns:
        tuple[Tensor, Tensor | None]: y [B, T, D] in x's dtype, and the final caches [N, D, W] in x's dtype, as
        FLA's (or None).

    Notes:
        The conv runs as ``gdn_nki::causal_conv1d_fn`` on a pool of N rows holding the initial caches (the host
        path's window of L = W inputs); nothing the caller passed is written.
    """
    unknown = sorted(set(kwargs) - {"cu_seqlens_cpu", "chunk_indices"})
    if unknown:
        raise rejection(unknown[0], repr(kwargs[unknown[0]]), f"gdn-nki's causal_conv1d has no option {unknown[0]}",
                        f"drop {unknown[0]}")  # fmt: skip
    if weight is None:
        raise rejection("weight", "None", "gdn-nki's causal_conv1d needs the depthwise taps [D, W]",
                        "pass the conv's weight")  # fmt: skip
    act = _activation(activation)
    if not isinstance(x, Tensor) or x.dim() != 3:
        raise rejection("x", f"shape {tuple(getattr(x, 'shape', ()))}", "x must be [B, T, D]", "pass x as [B, T, D]")
    check_tensor("x", x, SUPPORTED_DTYPES, any_device=True)
    reject_empty("x", x)  # here, not on the op's [B·T, D] x: the caller's shape
    batch, tokens, dim = x.shape
    if cu_seqlens is None:
        bounds = torch.arange(0, (batch + 1) * tokens, max(tokens, 1), dtype=torch.int32, device=x.device)[: batch + 1]
    elif batch != 1:
        raise rejection("x", f"shape {tuple(x.shape)}", "with cu_seqlens the sequences are packed along T, so B is 1",
                        "pass x.reshape(1, -1, D)")  # fmt: skip
    else:
        bounds = cu_seqlens.to(torch.int32)
    seqs = bounds.shape[0] - 1
    width = weight.shape[-1]
    # FLA's kernel reads every input into fp32, adds the residual to the fp32 sum and rounds once to x's dtype; so
    # with a residual, or caches in another dtype than x's (fp32 caches of bf16 x), the op runs in fp32 (x, taps
    # and bias widened exactly) and the sum is rounded once here. Otherwise x's dtype, rounded once by the op.
    wide = residual is not None or (isinstance(initial_state, Tensor) and initial_state.dtype != x.dtype)
    dtype = torch.float32 if wide else x.dtype
    pool = (x.new_zeros((seqs, dim, width), dtype=dtype) if initial_state is None
            else detached(initial_state).to(dtype).clone(memory_format=torch.contiguous_format))  # fmt: skip
    rows = torch.arange(seqs, dtype=torch.int32, device=x.device)
    read_rows = rows if initial_state is not None else torch.full_like(rows, PAD_SLOT_ID)
    taps, shift = (None if t is None else (detached(t).float() if wide else detached(t)) for t in (weight, bias))
    try:  # the pool's op has no autograd formula: its results go on the inputs' graph after it (forward_only.py)
        out = causal_conv1d_fn_op(detached(x).to(dtype).reshape(batch * tokens, dim).contiguous(), pool, taps,
                                  shift, bounds, rows, read_rows, act).reshape(batch, tokens, dim)  # fmt: skip
    except ContractError as error:
        raise in_torch_terms(error, _FLA_NAMES, _x_index(lambda at: [*divmod(at[0], tokens), at[1]])) from None
    inputs = (x, weight, bias, initial_state)
    out = attached("gdn_nki.torch.causal_conv1d", out, inputs)
    if residual is not None:  # on the graph: a gradient reaches the residual stream
        out = out + residual.float()
    out = out.to(x.dtype)  # the fp32 sum rounded once (a no-op when the op ran in x's dtype)
    # FLA's final caches are in x's dtype (the cache entries a short sequence keeps rounded to it)
    return out, (attached("gdn_nki.torch.causal_conv1d", pool.to(x.dtype), inputs) if output_final_state else None)


def _pad_rows(rows: Tensor, pad_slot_id: int, minus_one_pads: bool = False) -> Tensor:
    """vLLM's padding id mapped to the host path's −1. As in vLLM's kernels (``if idx == pad_slot_id: return``)
    only ``pad_slot_id`` pads: with another id a −1 row is a cache line outside the pool, so it is mapped to
    ``_NOT_PADDING``, which the host path rejects as out of range (``_in_pad_terms`` restates it as −1), unless
    ``minus_one_pads`` (gdn-nki's own keywords, whose −1 is documented)."""
    if pad_slot_id == PAD_SLOT_ID:
        return rows
    if not minus_one_pads:
        rows = torch.where(rows == PAD_SLOT_ID, torch.full_like(rows, _NOT_PADDING), rows)
    return torch.where(rows == pad_slot_id, torch.full_like(rows, PAD_SLOT_ID), rows)


_NOT_PADDING = -(2**31)  # a caller's −1 row under another pad_slot_id: out of every pool's range
_MINUS_ONE = re.compile(r"(?<![\w-])-1\b")


def _in_pad_terms(error: ContractError, argument: str, pad_slot_id: int) -> ContractError:
    """``error`` with the host path's padding −1 in ``argument``'s violations restated as the caller's
    ``pad_slot_id``, and ``_NOT_PADDING`` as the caller's −1 (unchanged with vLLM's default id, −1)."""
    if pad_slot_id == PAD_SLOT_ID:
        return error
    pad = f"pad_slot_id={pad_slot_id}"

    def caller(text: str, label: str) -> str:
        return _MINUS_ONE.sub(label, text).replace(str(_NOT_PADDING), "-1")

    return ContractError([dataclasses.replace(v, value=caller(v.value, str(pad_slot_id)), rule=caller(v.rule, pad),
                                              fix=caller(v.fix, pad)) if v.argument == argument else v
                          for v in error.violations], error.entry_point)  # fmt: skip


def _activation(activation: Any) -> str | None:
    """vLLM's activation option: True / "silu" / "swish" is SiLU, None / False none; anything else is rejected."""
    if activation is None or activation is False:
        return None
    if activation is True or activation in ("silu", "swish"):
        return "silu"
    raise rejection("activation", repr(activation), "activation must be None, False, True, 'silu' or 'swish'",
                    "pass activation='silu' (Qwen3-Next) or None")  # fmt: skip
