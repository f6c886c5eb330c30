"""Host entry points of the conv1d kernels: validate everything, launch, and leave the pool as it was on failure."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from gdn_ref.bucketed import bucket_violations
from gdn_ref.constants import CHUNK_SCHUR
from gdn_ref.contract import ContractError, Violation
from gdn_ref.conv_rules import (
    BUCKET_QUANTUM,
    CONV_PREFILL,
    CONV_STEP,
    IO_DTYPES,
    conv_index_violations,
    conv_prefill_violations,
    conv_step_violations,
    conv_varlen_violations,
    finite_rows_violations,
)

from ..common import backend
from ..conv.prefill import gdn_conv_bucket
from ..conv.step import gdn_conv_step, step_sbuf_violations
from .conv_varlen import packed_outputs, padded_requests
from .decode import _rows
from .pool_span import numpy_span, span_violations


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
    query_start_loc: np.ndarray | None = None,
    max_query_len: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Run ``gdn_conv_step`` (the conv of N requests × T tokens on a conv-state pool) with every rule checked first.

    Dimensions:
        N: requests. T: new tokens each (with ``query_start_loc``: at most, max_query_len). C: channels (a multiple of
        16). W: width, 2..5. L >= W − 1. P: pool rows.

    Args:
        x (np.ndarray): [N, T, C] float32 or bfloat16, token-major; with ``query_start_loc`` the requests' tokens
            packed, [tokens, C].
        conv_pool (np.ndarray): [P, C, L] x's dtype, updated IN PLACE at the rows live requests name.
        weight (np.ndarray): [C, W]; bias (np.ndarray | None): [C].
        state_indices (np.ndarray): [N] or [N, T] int32 rows (``gdn_conv_step``'s docstring); −1 = padding.
        num_accepted_tokens (np.ndarray | None): [N] int32 in [1, T]: with [N, T] rows resume from row [n, a − 1];
            with [N] rows vLLM's in-row form (L >= W − 2 + T): the window read from entry a − 1 of the row.
        activation (str | None): "silu" or None.
        check_values (bool): also scan x, the taps and the rows read for NaN/±Inf (the index values are always
            checked: they address the pool).
        query_start_loc (np.ndarray | None): [N + 1] int32: vLLM's varlen speculative form
            (``gdn_ref.conv.causal_conv1d_update_varlen``): request n's tokens are x[query_start_loc[n] ..
            query_start_loc[n + 1] − 1] (from 0 to tokens, non-decreasing, at most max_query_len each; none: the
            request reads and writes nothing), with [N] ``state_indices`` and ``num_accepted_tokens`` (required) over
            rows of L >= W − 2 + max_query_len inputs, each request writing its row's first W − 2 + len entries.
        max_query_len (int | None): with ``query_start_loc``, T of the compiled program (``host.conv_varlen``).

    Returns:
        tuple: (out [N, T, C] in x's dtype ([tokens, C] with ``query_start_loc``; zeros for padding requests),
        ``conv_pool`` itself, updated in place).

    Notes:
        A rejected call raises ``ContractError`` (argument, value, rule, fix) before launching, nothing written. The
        rows the call writes are saved first and put back if the launch fails part-way.
    """
    if query_start_loc is not None:
        return _decode_varlen(x, conv_pool, weight, bias, query_start_loc, state_indices, num_accepted_tokens,
                              max_query_len, activation, check_values)  # fmt: skip
    found = conv_step_violations(x, conv_pool, weight, bias, state_indices, num_accepted_tokens, activation)
    found = found or step_sbuf_violations(x, conv_pool, weight, bias, state_indices)
    if not found:
        found = conv_index_violations(state_indices, num_accepted_tokens, conv_pool.shape[0], x.shape[1])
    if not found and not conv_pool.flags.writeable:
        found = [Violation("conv.pool_writable", "conv_pool", "a read-only array", "the conv-state pool is updated "
                           "IN PLACE, so it must be writable", "pass a writable array", CONV_STEP)]  # fmt: skip
    span, strided = _pool_span(conv_pool)
    if not found and strided:
        found = span_violations(conv_pool.shape[0], strided["state_row_stride"], "conv_pool", CONV_STEP)
    _, reads, writes = ([], [], []) if found else _rows(state_indices, num_accepted_tokens)
    if not found and check_values:
        found = _finite("x", x) + _finite("weight", weight) + _finite("bias", bias)
        found = found or finite_rows_violations(conv_pool, reads)
    if found:
        raise ContractError(found)
    saved = np.array(conv_pool[writes], copy=True)
    try:
        out, _ = backend.simulate(gdn_conv_step)(x, span, weight, bias, state_indices, num_accepted_tokens,
                                                 activation, **strided)  # fmt: skip
    except BaseException:
        conv_pool[writes] = saved  # a launch that failed part-way: the pool as it was
        raise
    return out, conv_pool


def _decode_varlen(x: np.ndarray, conv_pool: np.ndarray, weight: np.ndarray, bias: np.ndarray | None,
                   query_start_loc: np.ndarray, state_indices: np.ndarray, num_accepted_tokens: np.ndarray | None,
                   max_query_len: Any, activation: str | None, check_values: bool) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """``conv_decode_step`` with ``query_start_loc``: the varlen rules (the bounds' values read here), the in-row
    step's on a stand-in of the padded x, then the in-row step on the requests laid out as [N, max_query_len, C]
    (``host.conv_varlen``) and its outputs packed back."""
    found = conv_varlen_violations(x, conv_pool, weight, query_start_loc, state_indices, num_accepted_tokens,
                                   max_query_len, values=True)  # fmt: skip
    if not found:  # shape rules on a stand-in of the padded x (no memory)
        padded = np.broadcast_to(np.zeros((), x.dtype), (state_indices.shape[0], max_query_len, x.shape[1]))
        found = conv_step_violations(padded, conv_pool, weight, bias, state_indices, num_accepted_tokens, activation)
        found = found or step_sbuf_violations(padded, conv_pool, weight, bias, state_indices)
    if not found:
        found = conv_index_violations(state_indices, num_accepted_tokens, conv_pool.shape[0], max_query_len)
    if not found and check_values:  # x as the caller passed it, before the layout copies the rows' entries in
        found = _finite("x", x) + _finite("weight", weight) + _finite("bias", bias)
        found = found or finite_rows_violations(conv_pool, [int(r) for r in np.asarray(state_indices) if r >= 0])
    if found:
        raise ContractError(found)
    bounds = np.asarray(query_start_loc).astype(np.int64)
    padded, rows = padded_requests(x, conv_pool, bounds, np.asarray(state_indices).astype(np.int64), max_query_len,
                                   weight.shape[1], np)  # fmt: skip
    out, _ = conv_decode_step(np.ascontiguousarray(padded), conv_pool, weight, bias, rows.astype(np.int32),
                              np.asarray(num_accepted_tokens), activation=activation, check_values=False)  # fmt: skip
    return packed_outputs(out, bounds, x.shape[0], np), conv_pool


def conv_prefill_bucket(
    x: np.ndarray,
    conv_pool: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray | None,
    cu_seqlens: np.ndarray,
    state_indices: np.ndarray,
    *,
    bucket: tuple[int, int] | None = None,
    activation: str | None = "silu",
    checkpoint_every: int | None = None,
    checkpoint_indices: np.ndarray | None = None,
    read_indices: np.ndarray | None = None,
    check_values: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Run ``gdn_conv_bucket`` (packed sequences in a bucket, each from its conv-state pool row) with every rule
    checked first.

    Dimensions:
        tokens: packed tokens. n: sequences. C: channels (a multiple of 16). W: width, 2..5. L >= W − 1. P: pool
        rows. K: checkpoints per sequence.

    Args:
        x (np.ndarray): [tokens, C] float32 or bfloat16, the sequences back to back (vLLM's ``query_start_loc``
            layout, unpadded).
        conv_pool (np.ndarray): [P, C, L] x's dtype, updated IN PLACE at the named rows.
        weight, bias, activation: as ``conv_decode_step``.
        cu_seqlens (np.ndarray): [n + 1] from 0 to ``tokens``, non-decreasing (empty sequences allowed).
        state_indices (np.ndarray): [n]: the row each sequence starts from and ends in; −1: an empty window, nothing
            stored.
        bucket (tuple[int, int] | None): (T, N) of the compiled program: T a multiple of 128 holding the tokens, N
            >= n slots; None: the tokens rounded up to 128 and n.
        checkpoint_every (int | None): the recurrent checkpoints' spacing (a multiple of 128): the window after
            every ``checkpoint_every`` tokens of sequence i goes to ``checkpoint_indices[i, k]`` (−1: none; past its
            length: not stored) — the rows and positions the recurrent bucket stores its states at.
        read_indices (np.ndarray | None): [n]: the row sequence i starts from when it is not the row it ends in
            (a prefix-cache hit); −1: an empty window.
        check_values (bool): also scan x, the taps and the rows read for NaN/±Inf.

    Returns:
        tuple: (out [tokens, C] in x's dtype, ``conv_pool`` itself, updated in place).

    Notes:
        The layout's values follow ``gdn_ref.bucketed``'s rules (the recurrent bucket's, with the tokens unpadded):
        a rejected call raises ``ContractError`` before anything is written; rows a failed launch wrote are put back.
    """
    found = []
    if np.ndim(x) != 2 or str(np.asarray(x).dtype) not in IO_DTYPES:
        found = [Violation("conv.x", "x", f"shape {np.shape(x)} dtype {np.asarray(x).dtype}", "x must be [tokens, C] "
                           "float32 or bfloat16", "pass the packed q|k|v projections as [tokens, C]", CONV_PREFILL)]  # fmt: skip
        raise ContractError(found)
    tokens = x.shape[0]
    bounds = np.asarray(cu_seqlens).reshape(-1)
    seqs = max(1, bounds.size - 1)
    if bucket is None:
        bucket = (max(BUCKET_QUANTUM, -(-tokens // BUCKET_QUANTUM) * BUCKET_QUANTUM), seqs)
    pool_rows = conv_pool.shape[0] if np.ndim(conv_pool) == 3 else 0
    layout = bucket_violations(cu_seqlens, tokens, CHUNK_SCHUR, None, pool_rows, state_indices, checkpoint_every,
                               checkpoint_indices, read_indices)  # fmt: skip
    found = [replace(v, api=CONV_PREFILL) for v in layout]
    total, slots = bucket if isinstance(bucket, tuple) and len(bucket) == 2 else (0, 0)
    if not (isinstance(total, int) and total >= tokens and total % BUCKET_QUANTUM == 0 and isinstance(slots, int)
            and slots >= seqs):  # fmt: skip
        found.append(Violation("conv.bucket", "bucket", f"value {bucket!r}", f"a bucket (T, N) holds the tokens ({tokens}"
                               f") in T, a multiple of {BUCKET_QUANTUM}, and the sequences ({seqs}) in N",
                               "pass bucket=None or a bucket that holds the call", CONV_PREFILL))  # fmt: skip
    if found:
        raise ContractError(found)
    launch = _padded_layout(x, bounds, state_indices, checkpoint_every, checkpoint_indices, read_indices, bucket)
    found = conv_prefill_violations(launch["x"], conv_pool, weight, bias, launch["cu_seqlens"],
                                    launch["state_indices"], activation, launch["checkpoint_every"],
                                    launch["checkpoint_indices"], launch["read_indices"])  # fmt: skip
    if not found and not conv_pool.flags.writeable:
        found = [Violation("conv.pool_writable", "conv_pool", "a read-only array", "the conv-state pool is updated "
                           "IN PLACE, so it must be writable", "pass a writable array", CONV_PREFILL)]  # fmt: skip
    span, strided = _pool_span(conv_pool)
    if not found and strided:
        found = span_violations(conv_pool.shape[0], strided["state_row_stride"], "conv_pool", CONV_PREFILL)
    lengths = np.diff(bounds.astype(np.int64))
    rows = np.asarray(state_indices).reshape(-1).astype(np.int64)
    reads = rows if read_indices is None else np.asarray(read_indices).reshape(-1).astype(np.int64)
    if not found and check_values:
        found = _finite("x", x) + _finite("weight", weight) + _finite("bias", bias)
        found = found or [replace(v, api=CONV_PREFILL) for v in
                          finite_rows_violations(conv_pool, [int(r) for r in reads if r >= 0])]  # fmt: skip
    if found:
        raise ContractError(found)
    writes = [int(r) for r, n in zip(rows, lengths, strict=True) if r >= 0 and n > 0]
    if checkpoint_every:
        table = np.asarray(checkpoint_indices).astype(np.int64)
        writes += [int(table[i, k]) for i, n in enumerate(lengths) for k in range(table.shape[1])
                   if table[i, k] >= 0 and (k + 1) * checkpoint_every <= n]  # fmt: skip
    saved = np.array(conv_pool[writes], copy=True)
    try:
        out, _ = backend.simulate(gdn_conv_bucket)(launch["x"], span, weight, bias, launch["cu_seqlens"],
                                                   launch["state_indices"], activation, launch["checkpoint_every"],
                                                   launch["checkpoint_indices"], launch["read_indices"],
                                                   **strided)  # fmt: skip
    except BaseException:
        conv_pool[writes] = saved  # a launch that failed part-way: the pool as it was
        raise
    return np.asarray(out)[:tokens], conv_pool


def _pool_span(conv_pool: np.ndarray) -> tuple[np.ndarray, dict[str, int]]:
    """The conv kernels' pool argument and the keywords saying so: a row-strided pool is addressed in place as its
    span (``host.pool_span``), with its row stride and window length."""
    span, row_stride = numpy_span(conv_pool)
    if row_stride is None:
        return span, {}
    return span, {"state_row_stride": row_stride, "state_len": conv_pool.shape[2]}


def _padded_layout(x: np.ndarray, bounds: np.ndarray, state_indices: np.ndarray, every: int | None,
                   table: np.ndarray | None, read_indices: np.ndarray | None, bucket: tuple[int, int]) -> dict:  # fmt: skip
    """The launch's tensors in the bucket: x zero-padded to T tokens, slots past n empty (their bound repeated)
    with −1 rows."""
    total, slots = bucket
    seqs = bounds.size - 1
    padded = np.zeros((total, x.shape[1]), x.dtype)
    padded[: x.shape[0]] = x

    def rows(values: np.ndarray | None) -> np.ndarray | None:
        if values is None:
            return None
        out = np.full(slots, -1, np.int32)
        out[:seqs] = np.asarray(values).reshape(-1)
        return out

    cu = np.full(slots + 1, int(bounds[-1]), np.int32)
    cu[: seqs + 1] = bounds
    ckpt = None
    if every:
        ckpt = np.full((slots, np.shape(table)[1]), -1, np.int32)
        ckpt[:seqs] = table
    return {"x": padded, "cu_seqlens": cu, "state_indices": rows(state_indices), "checkpoint_every": int(every or 0),
            "checkpoint_indices": ckpt, "read_indices": rows(read_indices)}  # fmt: skip


def _finite(name: str, array: np.ndarray | None, api: str = CONV_STEP, rule_id: str = "conv.finite") -> list[Violation]:
    """The first non-finite element of ``array`` as a violation of ``api``'s rule ``rule_id`` (none when every
    element is finite or the array is None); the gated norm's entry point (``host.norm``) shares it."""
    if array is None:
        return []
    bad = np.argwhere(~np.isfinite(np.asarray(array, dtype=np.float64)))
    if not bad.size:
        return []
    at = [int(i) for i in bad[0]]
    return [Violation(rule_id, name, f"value {float(np.asarray(array)[tuple(at)])} at index {at}",
                      f"{name} must hold finite numbers", f"find where {name} overflowed", api)]  # fmt: skip


conv_prefill_bucket.gdn_spec_conv_prefill_capabilities = {  # read by gdn-spec's conv family (gdn_spec.conv.prefill)
    "name": "gdn-nki conv_prefill_bucket",
    "checkpoints": True,
    "read_rows": True,
    "rejections": True,
}
conv_decode_step.gdn_spec_conv_capabilities = {  # read by gdn-spec's conv family (gdn_spec.conv)
    "name": "gdn-nki conv_decode_step",
    "per_token_rows": True,
    "in_row": True,
    "varlen": True,
    "rejections": True,
}
