"""The rules of a conv1d call on a conv-state pool (``gdn_ref.conv``'s semantics), as ``Violation``s naming the
argument, the value, the rule and the fix: what a host checks before it hands a call to a kernel, and what a kernel
checks at trace time (shapes and dtypes only: index values are device data).

The rules a user meets most: a kernel width outside what the kernels take, a window longer than the state holds
(L < W − 1), channel counts that disagree between x, weight, bias and the pool, and pool rows out of range or
named twice.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from .contract import INDEX_DTYPE, Violation, index_violations, is_integer

CONV_STEP = "conv_decode_step"
CONV_PREFILL = "conv_prefill_bucket"
BUCKET_QUANTUM = 128  # a bucket's tokens: the recurrent bucket's chunk, so one bucket serves both kernels
MAX_SEQUENCES = 128  # sequence slots of a bucket, as the recurrent bucket's
CONV_WIDTHS = range(2, 6)  # vLLM's prefill kernel takes widths 2..5 (its KERNEL_WIDTH branches); Qwen3-Next uses 4
CHANNEL_QUANTUM = 16  # gdn-nki's conv kernels put a request's channels on 16 partitions (conv/step.py)
IO_DTYPES = ("float32", "bfloat16")
ACTIVATIONS = (None, "silu")


def _dtype(t: Any) -> str:
    return str(getattr(t, "dtype", type(t).__name__))


def _shape(t: Any) -> tuple[int, ...] | None:
    shape = getattr(t, "shape", None)
    return None if shape is None else tuple(int(s) for s in shape)


def conv_step_violations(
    x: Any,
    conv_pool: Any,
    weight: Any,
    bias: Any,
    state_indices: Any,
    num_accepted_tokens: Any = None,
    activation: Any = "silu",
    *,
    api: str = CONV_STEP,
    in_row: bool = True,
) -> list[Violation]:
    """Every broken shape / dtype rule of a conv decode-step call (no values read).

    Args:
        x: [N, T, C] float32 or bfloat16. conv_pool: [P, C, L] x's dtype, L >= W − 1. weight: [C, W], W in 2..5,
        float32 or bfloat16. bias: [C] or None. state_indices: [N] or [N, T] int32. num_accepted_tokens: [N]
        int32 (with [N] rows: vLLM's in-row form, L >= W − 2 + T). activation: "silu" or None.
        api (str): the entry point named in the messages.
        in_row (bool): the entry point takes vLLM's in-row form ([N] rows with num_accepted_tokens); False (the
            fused block, whose recurrent pool has no such form): num_accepted_tokens only with [N, T] rows.

    Returns:
        list[Violation]: empty when the call is well formed.
    """
    found: list[Violation] = []

    def bad(rule: str, argument: str, value: str, text: str, fix: str) -> None:
        found.append(Violation(f"conv.{rule}", argument, value, text, fix, api))

    xs = _shape(x)
    if xs is None or len(xs) != 3 or min(xs) < 1 or _dtype(x) not in IO_DTYPES:
        bad("x", "x", f"shape {xs} dtype {_dtype(x)}", "x must be [N, T, C] float32 or bfloat16 (token-major)",
            "pass the q|k|v projections of N requests × T tokens as [N, T, C]")  # fmt: skip
        return found
    channels = xs[2]
    found += _parts(x, channels, conv_pool, weight, bias, activation, api)
    si = _shape(state_indices)
    if si not in ((xs[0],), (xs[0], xs[1])) or _dtype(state_indices) != INDEX_DTYPE:
        bad("state_indices", "state_indices", f"shape {si} dtype {_dtype(state_indices)}",
            f"state_indices must be [N] = [{xs[0]}] or [N, T] = [{xs[0]}, {xs[1]}] int32 pool rows (-1 = padding)",
            "pass one row per request (or per token) as int32")  # fmt: skip
    if num_accepted_tokens is not None:
        na = _shape(num_accepted_tokens)
        if not in_row and si != (xs[0], xs[1]):
            bad("num_accepted_tokens", "num_accepted_tokens", f"shape {na} with state_indices of shape {si}",
                "num_accepted_tokens goes with [N, T] state_indices here (the row to resume from)",
                "pass per-token rows [N, T] with it, or drop it")  # fmt: skip
        elif na != (xs[0],) or _dtype(num_accepted_tokens) != INDEX_DTYPE:
            bad("num_accepted_tokens", "num_accepted_tokens", f"shape {na} dtype {_dtype(num_accepted_tokens)}",
                f"num_accepted_tokens is [N] = [{xs[0]}] int32: with [N, T] state_indices the row to resume from, "
                "with [N] rows the offset in the row (vLLM's in-row form)", "pass one count per request as int32, "
                "or drop it")  # fmt: skip
        if in_row:
            found += _in_row_violations(xs, conv_pool, weight, si, api)
    return found


def _in_row_violations(xs: tuple[int, ...], conv_pool: Any, weight: Any, si: Any, api: str) -> list[Violation]:
    """vLLM's in-row form ([N] rows with ``num_accepted_tokens``): a row holds the windows at every offset
    a − 1 <= T − 1, so L >= W − 2 + T (vLLM allocates W − 1 + num_speculative_tokens, T = num_speculative_tokens
    + 1)."""
    ps, ws = _shape(conv_pool), _shape(weight)
    if si != (xs[0],) or ps is None or len(ps) != 3 or ws is None or len(ws) != 2:
        return []
    need = ws[1] - 2 + xs[1]
    if ps[2] >= need:
        return []
    return [Violation("conv.in_row_window", "conv_pool", f"L={ps[2]}", f"with [N] state_indices and "
                      f"num_accepted_tokens a row holds the window at every offset num_accepted_tokens - 1 <= T - 1: "
                      f"L >= W - 2 + T = {need}", f"allocate the pool as [P, C, {need}] (W - 1 + the speculative "
                      "tokens), or pass [N, T] state_indices", api)]  # fmt: skip


def _parts(x: Any, channels: int, conv_pool: Any, weight: Any, bias: Any, activation: Any, api: str) -> list[Violation]:
    """The rules of the conv's other operands against x's channels and dtype: the taps and their width, the bias,
    the pool and its window length, the activation."""
    found: list[Violation] = []

    def bad(rule: str, argument: str, value: str, text: str, fix: str) -> None:
        found.append(Violation(f"conv.{rule}", argument, value, text, fix, api))

    ws, ps = _shape(weight), _shape(conv_pool)
    if channels % CHANNEL_QUANTUM:
        bad("channels", "x", f"C={channels}", f"the channels must be a multiple of {CHANNEL_QUANTUM} (a request "
            f"spans {CHANNEL_QUANTUM} partitions)", f"pad the channels to a multiple of {CHANNEL_QUANTUM}")  # fmt: skip
    width = None
    if ws is None or len(ws) != 2 or _dtype(weight) not in IO_DTYPES:
        bad("weight", "weight", f"shape {ws} dtype {_dtype(weight)}", "weight must be [C, W] float32 or bfloat16 "
            "(the depthwise taps, HF's conv1d.weight.squeeze(1))", "pass conv1d.weight[:, 0, :]")  # fmt: skip
    else:
        width = ws[1]
        if ws[0] != channels:
            bad("weight_channels", "weight", f"C={ws[0]}", f"weight must have x's C={channels} channels",
                "pass the conv's weight for the same q|k|v channels as x")  # fmt: skip
        if width not in CONV_WIDTHS:
            bad("width", "weight", f"W={width}", f"the kernel width must be in {CONV_WIDTHS.start}..{CONV_WIDTHS.stop - 1}",
                "pass the layer's conv1d taps (Qwen3-Next: W = 4)")  # fmt: skip
    if bias is not None:
        bs = _shape(bias)
        if bs != (channels,) or _dtype(bias) not in IO_DTYPES:
            bad("bias", "bias", f"shape {bs} dtype {_dtype(bias)}", f"bias must be None or [C] = [{channels}] float32 "
                "or bfloat16", "pass conv1d.bias, or None")  # fmt: skip
    if ps is None or len(ps) != 3 or ps[0] < 1:
        bad("pool", "conv_pool", f"shape {ps}", "conv_pool must be [P, C, L] (a window of L inputs per row, "
            "channel-major: vLLM's and HF's [.., dim, state_len])", "allocate [rows, C, W - 1]")  # fmt: skip
    else:
        if ps[1] != channels:
            bad("pool_channels", "conv_pool", f"C={ps[1]}", f"the pool must have x's C={channels} channels",
                "use the conv-state pool of this layer")  # fmt: skip
        if width is not None and ps[2] < width - 1:
            bad("window", "conv_pool", f"L={ps[2]}", f"a window of the W - 1 = {width - 1} inputs the taps read is "
                f"longer than the state's L={ps[2]}", f"allocate the pool as [P, C, {width - 1}] or longer")  # fmt: skip
        if _dtype(conv_pool) != _dtype(x):
            bad("pool_dtype", "conv_pool", f"dtype {_dtype(conv_pool)}", f"windows hold inputs, so the pool is x's "
                f"dtype ({_dtype(x)}): exact", f"allocate the pool as {_dtype(x)}")  # fmt: skip
    if activation not in ACTIVATIONS:
        bad("activation", "activation", f"value {activation!r}", "activation must be 'silu' or None",
            "pass activation='silu' (Qwen3-Next) or None")  # fmt: skip
    return found


def conv_prefill_violations(
    x: Any,
    conv_pool: Any,
    weight: Any,
    bias: Any,
    cu_seqlens: Any,
    state_indices: Any,
    activation: Any = "silu",
    checkpoint_every: Any = 0,
    checkpoint_indices: Any = None,
    read_indices: Any = None,
    *,
    api: str = CONV_PREFILL,
) -> list[Violation]:
    """Every broken shape / dtype rule of a bucketed conv prefill launch (no values read; ``gdn_ref.bucketed`` and
    ``conv_layout_violations`` check the layout's values on the host).

    Args:
        x: [T, C] float32 or bfloat16, T a positive multiple of 128 (the bucket). cu_seqlens: [N + 1] int32.
        state_indices: [N] int32, 1 <= N <= 128. checkpoint_every: 0 (none) or a positive int >= L, with
        checkpoint_indices [N, K] int32. read_indices: None or [N] int32. The rest as ``conv_step_violations``.
    """
    found: list[Violation] = []

    def bad(rule: str, argument: str, value: str, text: str, fix: str) -> None:
        found.append(Violation(f"conv.{rule}", argument, value, text, fix, api))

    xs = _shape(x)
    if xs is None or len(xs) != 2 or xs[0] < 1 or xs[0] % BUCKET_QUANTUM or _dtype(x) not in IO_DTYPES:
        bad("x", "x", f"shape {xs} dtype {_dtype(x)}", f"x must be [T, C] float32 or bfloat16 with T a positive "
            f"multiple of {BUCKET_QUANTUM} (the bucket's tokens)", "pad the packed tokens to the bucket's T")  # fmt: skip
        return found
    channels = xs[1]
    found += _parts(x, channels, conv_pool, weight, bias, activation, api)
    ns = _shape(state_indices)
    if ns is None or len(ns) != 1 or not 1 <= ns[0] <= MAX_SEQUENCES or _dtype(state_indices) != INDEX_DTYPE:
        bad("state_indices", "state_indices", f"shape {ns} dtype {_dtype(state_indices)}", f"state_indices must be "
            f"[N] int32 with 1 <= N <= {MAX_SEQUENCES}", "one pool row (or -1) per sequence slot, as int32")  # fmt: skip
        return found
    seqs = ns[0]
    if _shape(cu_seqlens) != (seqs + 1,) or _dtype(cu_seqlens) != INDEX_DTYPE:
        bad("cu_seqlens", "cu_seqlens", f"shape {_shape(cu_seqlens)} dtype {_dtype(cu_seqlens)}",
            f"cu_seqlens must be [N + 1] = [{seqs + 1}] int32", "pass the slots' token bounds as int32")  # fmt: skip
    if read_indices is not None and (_shape(read_indices) != (seqs,) or _dtype(read_indices) != INDEX_DTYPE):
        bad("read_indices", "read_indices", f"shape {_shape(read_indices)}", f"read_indices must be [N] = [{seqs}] "
            "int32", "one pool row to start from (or -1) per sequence slot")  # fmt: skip
    state_len = (_shape(conv_pool) or (0, 0, 0))[-1]
    every_ok = isinstance(checkpoint_every, int) and not isinstance(checkpoint_every, bool) and checkpoint_every >= 0
    if not every_ok or (checkpoint_every and checkpoint_every < state_len):
        bad("checkpoint_every", "checkpoint_every", f"value {checkpoint_every!r}", f"checkpoint_every must be 0 or "
            f"an int >= the window's L={state_len}", "pass the recurrent checkpoints' spacing (a multiple of 128)")  # fmt: skip
    elif checkpoint_every:
        cs = _shape(checkpoint_indices)
        if cs is None or len(cs) != 2 or cs[0] != seqs or cs[1] < 1 or _dtype(checkpoint_indices) != INDEX_DTYPE:
            bad("checkpoint_indices", "checkpoint_indices", f"shape {cs}", f"checkpoint_indices must be [N, K] = "
                f"[{seqs}, K] int32", "one row per sequence slot, one pool row (or -1) per checkpoint")  # fmt: skip
    return found


def conv_varlen_violations(
    x: Any,
    conv_pool: Any,
    weight: Any,
    query_start_loc: Any,
    state_indices: Any,
    num_accepted_tokens: Any,
    max_query_len: Any,
    *,
    values: bool = False,
) -> list[Violation]:
    """The rules of vLLM's varlen speculative form (``gdn_ref.conv.causal_conv1d_update_varlen``) beyond the in-row
    step's: shapes, and with ``values`` the bounds' values (a host reads them; a device path trusts them).

    Args:
        x: [tokens, C]. conv_pool: [P, C, L]. weight: [C, W]. query_start_loc: [N + 1] int32 from 0 to ``tokens``,
        non-decreasing, no request longer than ``max_query_len``. state_indices: [N] int32.
        num_accepted_tokens: [N] int32 (required: the form is vLLM's speculative one). max_query_len (int): >= 1;
        the pool's rows hold at least W − 2 + max_query_len entries (vLLM allocates W − 1 + num_speculative_tokens
        with max_query_len = num_speculative_tokens + 1; a request writes only its row's first W − 2 + len).
        values (bool): also check ``query_start_loc``'s values (an array the caller can read).

    Returns:
        list[Violation]: empty when the call is well formed.
    """
    found: list[Violation] = []

    def bad(rule: str, argument: str, value: str, text: str, fix: str) -> None:
        found.append(Violation(f"conv.varlen_{rule}", argument, value, text, fix, CONV_STEP))

    xs, qs, si = _shape(x), _shape(query_start_loc), _shape(state_indices)
    if xs is None or len(xs) != 2:
        bad("x", "x", f"shape {xs}", "with query_start_loc x is the requests' tokens packed as [tokens, C]",
            "pass x as [total tokens, dim]")  # fmt: skip
    if si is None or len(si) != 1:
        bad("state_indices", "state_indices", f"shape {si}", "with query_start_loc state_indices is [N], one row "
            "per request", "pass one conv-state row per request (vLLM: spec_state_indices_tensor[:, 0])")  # fmt: skip
    if num_accepted_tokens is None:
        bad("accepted", "query_start_loc", "given without num_accepted_tokens", "gdn-nki takes query_start_loc "
            "in vLLM's speculative form only (with num_accepted_tokens, as vLLM's GDN layer calls it)",
            "pass num_accepted_tokens, or x as [N, C, T] without query_start_loc")  # fmt: skip
    if not is_integer(max_query_len) or max_query_len < 1:
        bad("max_query_len", "max_query_len", repr(max_query_len), "with query_start_loc max_query_len is the most "
            "tokens a request has (>= 1): the compiled program's tokens per request", "pass max_query_len (vLLM: "
            "spec_state_indices_tensor.size(-1))")  # fmt: skip
    if found:
        return found
    requests = si[0]
    if qs != (requests + 1,) or _dtype(query_start_loc) != INDEX_DTYPE:
        bad("bounds_shape", "query_start_loc", f"shape {qs} dtype {_dtype(query_start_loc)}",
            f"query_start_loc is [N + 1] = [{requests + 1}] int32: one bound per request and the end",
            "pass the bounds of the N requests state_indices names, as int32")  # fmt: skip
        return found
    ps, ws = _shape(conv_pool), _shape(weight)
    if ps is not None and len(ps) == 3 and ws is not None and len(ws) == 2 and ps[2] < ws[1] - 2 + max_query_len:
        need = ws[1] - 2 + max_query_len
        bad("window", "conv_pool", f"L={ps[2]}", f"with query_start_loc a row holds the window at every offset "
            f"num_accepted_tokens - 1 <= max_query_len - 1: L >= W - 2 + max_query_len = {need}",
            f"allocate the pool as [P, C, {need}] (W - 1 + the speculative tokens)")  # fmt: skip
    if values and not found:
        found += _bounds_violations(np.asarray(query_start_loc).astype(np.int64), xs[0], max_query_len)
    return found


def _bounds_violations(bounds: np.ndarray, tokens: int, max_query_len: int) -> list[Violation]:
    """``query_start_loc``'s values: from 0, non-decreasing, to ``tokens``, no request past ``max_query_len``."""
    lengths = np.diff(bounds)
    text, value = None, None
    if bounds[0] != 0:
        value, text = f"value {int(bounds[0])} at [0]", "query_start_loc starts at 0"
    elif (lengths < 0).any():
        at = int(np.flatnonzero(lengths < 0)[0])
        value, text = (
            f"values {int(bounds[at])}, {int(bounds[at + 1])} at [{at}, {at + 1}]",
            "query_start_loc never decreases (request n's tokens are query_start_loc[n] .. query_start_loc[n + 1] - 1)",
        )
    elif bounds[-1] != tokens:
        value, text = f"value {int(bounds[-1])} at [-1]", f"query_start_loc ends at x's {tokens} tokens"
    elif (lengths > max_query_len).any():
        at = int(np.flatnonzero(lengths > max_query_len)[0])
        value, text = (
            f"request {at} of {int(lengths[at])} tokens",
            f"no request has more than max_query_len = {max_query_len} tokens",
        )
    if text is None:
        return []
    return [Violation("conv.varlen_bounds", "query_start_loc", value, text, "pass the cumulative token counts of "
                      "the requests, 0 first and x's token count last", CONV_STEP)]  # fmt: skip


def conv_index_violations(state_indices: Any, num_accepted_tokens: Any, pool_rows: int, tokens: int) -> list[Violation]:
    """The index values of a conv decode step: the recurrent step's rules (``contract.index_violations``: rows in
    [-1, P), padding requests all −1, live rows distinct, num_accepted_tokens in [1, T]), named for this entry
    point."""
    return [replace(v, api=CONV_STEP) for v in index_violations(state_indices, num_accepted_tokens, pool_rows, tokens)]


def finite_rows_violations(pool: np.ndarray, rows: list[int]) -> list[Violation]:
    """The rows a call reads must hold finite numbers: a NaN in a window reaches W − 1 outputs and every window
    after it."""
    for row in rows:
        bad = np.argwhere(~np.isfinite(np.asarray(pool[row], dtype=np.float64)))
        if bad.size:
            at = [int(row), *(int(i) for i in bad[0])]
            return [Violation("conv.pool_finite", "conv_pool", f"value {float(pool[tuple(at)])} at {at}",
                              "the windows a call reads must hold finite numbers",
                              "reset that row (zeros: an empty window) before reusing it", CONV_STEP)]  # fmt: skip
    return []
