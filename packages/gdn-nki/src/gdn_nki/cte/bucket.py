"""Bucketed serving prefill: ONE compiled program per bucket (T tokens, at most N sequences), the ``gdn_cte_bucket``
kernel.

A serving stack compiles a fixed set of shape buckets when it loads and never compiles again. Here the batch's
layout is data: the per-sequence chunk boundaries, the pool rows and the checkpoint rows arrive as device tensors,
and the kernel's program depends only on the shapes (T, N, heads, head dims, dtype, algorithm, group size,
checkpoint spacing). Every value head is one lane over all T / chunk chunks, exactly as ``gdn_cte`` with B = 1,
S = T: the intra-chunk work depends only on a chunk's own tokens, and the sequences show only at chunk boundaries
of the chain, as arithmetic and run-time-addressed DMAs (``boundaries``). The state pool is read and written on
device: no host gather or scatter.

The host packs each sequence padded exactly to its own chunk multiple (g = 0, β = 0 tokens: ``plan.packed_plan``)
and pads the packed row to T with more such tokens; they belong to no sequence and their outputs are not read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gdn_ref.constants import CHUNK_BY_ALGORITHM, DEFAULT_ALGORITHM, DEFAULT_GROUP_SIZE
from gdn_ref.contract import Arguments, is_integer
from gdn_ref.packed import tensor_violations

from ..common.backend import nki, nl
from ..common.kernel_assert import assert_valid_call, kernel_assert
from ..common.pool_rows import PoolRows
from ..common.state_layout import kmajor_view
from ..common.tiles import FP32
from . import boundaries
from .kernel import emit
from .plan import Span

MAX_SEQUENCES = 128  # sequences of a bucket: one per partition in the boundary tables
# Chunks of a bucket: its boundary tables have a column per chunk plus one (``boundaries.build``), at most MAX_TABLE
MAX_CHUNKS = boundaries.MAX_TABLE - 1
# Pool rows a bucket addresses: its row tables are fp32 sums of integers, exact below 2**24 (row P, one past the
# pool, included: it names "no row")
MAX_POOL_ROWS = 1 << 24


@nki.jit
def gdn_cte_bucket(
    query: Any,
    key: Any,
    value: Any,
    g_log: Any,
    beta: Any,
    chunk_bounds: Any,
    state_indices: Any,
    state_pool: Any,
    scale: float = 1.0,
    algorithm: str = DEFAULT_ALGORITHM,
    mask_pack: Any = None,
    group_size: int = DEFAULT_GROUP_SIZE,
    checkpoint_every: int = 0,
    checkpoint_indices: Any = None,
    read_indices: Any = None,
    state_v_first: bool = False,
    state_row_stride: int | None = None,
) -> tuple[Any, Any]:
    """Chunked gated delta-rule prefill of up to N packed sequences in a bucket of T tokens, the layout on device.

    Dimensions:
        T: tokens of the bucket, a chunk multiple (128 "schur", 64 "neumann"); at most 511 chunks; the sequences
        take it padded, each to its chunk multiple (``chunk_bounds`` counts chunks). N: sequence
        slots, <= 128. P: pool rows. K: checkpoints per sequence slot. Hk, Hv, Dk, Dv: as ``gdn_cte``.

    Args:
        query, key (nl.NkiTensor): [1, Hk, T, Dk] @ HBM: the sequences back to back, each padded with zero tokens
            to its chunk multiple, then zero tokens to T.
        value (nl.NkiTensor): [1, Hv, T, Dv] @ HBM, packed the same way.
        g_log, beta (nl.NkiTensor): [1, Hv, T] fp32 @ HBM; padding tokens carry g = 0 and β = 0.
        chunk_bounds (nl.NkiTensor): [N + 1] int32 @ HBM, run-time: sequence i is chunks ``chunk_bounds[i] ..
            chunk_bounds[i + 1] − 1``; from 0, non-decreasing, at most T / chunk. An empty slot repeats a bound.
        state_indices (nl.NkiTensor): [N] int32 @ HBM, run-time: the pool row sequence i starts from and its final
            state is written to; −1: start from zero, store nothing. Distinct among sequences with chunks.
        state_pool (nl.NkiTensor): [P, Hv, Dk, Dv] fp32 @ HBM, MUTABLE IN/OUT; rows not named are not touched.
        scale, algorithm, mask_pack, group_size: as ``gdn_cte`` (trace-time).
        checkpoint_every (int): trace-time, tokens between checkpoints, a chunk multiple; 0: none.
        checkpoint_indices (nl.NkiTensor): [N, K] int32 @ HBM, run-time: pool row of the state after
            ``(k + 1) · checkpoint_every`` tokens of sequence i (its padded tokens); −1, or a checkpoint past the
            sequence's chunks: not stored. Distinct from each other and from ``state_indices``'s live rows.
        read_indices (nl.NkiTensor): [N] int32 @ HBM, run-time, optional: the pool row sequence i starts from
            when it differs from the row it ends in (``state_indices``), e.g. a prefix-cache row it resumes from and
            must not overwrite; −1: start from zero. None: each sequence starts from its ``state_indices`` row.
            Rows may repeat; none is a row this launch writes for another sequence or a checkpoint.
        state_v_first (bool): trace-time; the pool is V-major, [P, Hv, Dv, Dk] (SGLang's pool, FLA's
            ``state_v_first``): its rows are gathered, checkpointed and stored in that layout by the boundary DMAs
            (``common.state_layout.head_columns``); the rules see the K-major view.
        state_row_stride (int): trace-time; the pool's rows lie this many elements apart, each row dense (vLLM's
            hybrid cache, ``common.pool_rows``): ``state_pool`` is then the pool's span, 1-D fp32 of
            (P − 1)·state_row_stride + Hv·Dk·Dv elements.

    Returns:
        tuple: ``out`` [1, Hv, T, Dv] in the compute dtype (padding tokens' rows are not meaningful) and
        ``state_pool``.

    Notes:
        The kernel trusts the run-time tensors, as FlashInfer's and vLLM's kernels do: the host entry points
        (``gdn_nki.prefill_bucket``) check them first. The program reads none of them while it is built, so every
        layout of a bucket is the same program (nki-cpu's ``Trace.fingerprint()`` shows it). Every trace-time rule
        is checked before anything is allocated or written (an ``AssertionError`` naming rule, argument and fix).
    """
    layout = BucketLayout(chunk_bounds, state_indices, state_pool, checkpoint_every, checkpoint_indices, read_indices,
                          bool(state_v_first), state_row_stride)  # fmt: skip
    call, pool = checked_call(query, key, value, g_log, beta, scale, algorithm, mask_pack, group_size, layout)
    return emit_bucket(call, layout, pool), state_pool


@dataclass(frozen=True)
class BucketLayout:
    """A bucketed launch's run-time layout tensors and pool, as ``gdn_cte_bucket`` takes them (its Args)."""

    chunk_bounds: Any
    state_indices: Any
    state_pool: Any
    checkpoint_every: int
    checkpoint_indices: Any
    read_indices: Any
    v_first: bool
    row_stride: int | None = None


def checked_call(
    query: Any,
    key: Any,
    value: Any,
    g_log: Any,
    beta: Any,
    scale: float,
    algorithm: str,
    mask_pack: Any,
    group_size: int,
    layout: BucketLayout,
) -> tuple[Arguments, PoolRows]:
    """A bucketed launch's arguments with every trace-time rule checked (the kernel's contract on the packed row,
    the layout tensors' shapes and dtypes, the pool); nothing allocated. The pool is the call's state, K-major, and
    its rows (``common.pool_rows``: a row-strided pool's span viewed as rows) are returned beside the call."""
    hv, dk, dv = value.shape[1], query.shape[3], value.shape[3]
    pool = PoolRows.of(layout.state_pool, layout.row_stride, (hv, dv, dk) if layout.v_first else (hv, dk, dv))
    call = Arguments(query, key, value, g_log, beta, scale, algorithm, mask_pack, group_size,
                     kmajor_view(pool.view, layout.v_first))  # fmt: skip
    assert_valid_call(tensor_violations(call, host=False), "gdn_cte_bucket")
    _check_layout_tensors(call, layout.chunk_bounds, layout.state_indices, layout.checkpoint_every,
                          layout.checkpoint_indices, layout.read_indices)  # fmt: skip
    return call, pool


def emit_bucket(call: Arguments, layout: BucketLayout, pool: PoolRows, norm: Any = None) -> Any:
    """Allocate ``out`` [1, Hv, T, Dv] and issue a checked bucketed launch on the pool's rows (``checked_call``'s):
    the boundary tables, then the one lane per value head over all T / chunk chunks (``norm``: the gated RMSNorm
    its output stage applies, as ``cte.kernel.emit``'s). Returns ``out``."""
    query, value = call.query, call.value
    value_heads, tokens, dv = value.shape[1], query.shape[2], value.shape[3]
    chunk = CHUNK_BY_ALGORITHM[call.algorithm]
    n_chunks = tokens // chunk
    out = nl.ndarray((1, value_heads, tokens, dv), dtype=query.dtype, buffer=nl.shared_hbm)
    every = int(layout.checkpoint_every) // chunk  # int(): numpy's integers are ints too (is_integer)
    tables = boundaries.build(
        layout.chunk_bounds, layout.state_indices, pool, n_chunks, every, layout.checkpoint_indices,
        read_indices=layout.read_indices, v_first=layout.v_first,
    )  # fmt: skip
    emit(call, out, call.recurrent_state, [Span(0, 0, n_chunks, 0)], tables, norm=norm)
    return out


def _check_layout_tensors(
    call: Arguments,
    chunk_bounds: Any,
    state_indices: Any,
    checkpoint_every: int,
    checkpoint_indices: Any,
    read_indices: Any = None,
) -> None:
    """The trace-time rules of the layout tensors and the pool (their shapes and dtypes; their values are data)."""
    pool, value = call.recurrent_state, call.value
    want_pool = (value.shape[1], call.query.shape[3], value.shape[3])
    kernel_assert(
        pool is not None and len(pool.shape) == 4 and tuple(pool.shape[1:]) == want_pool and pool.dtype == FP32,
        f"gdn_cte_bucket: `state_pool` must be [P, Hv, Dk, Dv] = [P, {', '.join(map(str, want_pool))}] float32. "
        "Fix: pass the pool the server keeps its recurrent states in",
    )
    kernel_assert(
        pool.shape[0] < MAX_POOL_ROWS,
        f"gdn_cte_bucket: `state_pool` has {pool.shape[0]} rows; its row tables are exact float32 sums, so at most "
        f"{MAX_POOL_ROWS - 1}. Fix: keep the pool below 2**24 rows, or split it",
    )
    seqs = tuple(state_indices.shape)
    kernel_assert(
        len(seqs) == 1 and 1 <= seqs[0] <= MAX_SEQUENCES and state_indices.dtype == nl.int32,
        f"gdn_cte_bucket: `state_indices` {seqs} {state_indices.dtype} must be [N] int32 with 1 <= N <= "
        f"{MAX_SEQUENCES}. Fix: one pool row (or -1) per sequence slot, as int32",
    )
    kernel_assert(
        read_indices is None or (tuple(read_indices.shape) == seqs and read_indices.dtype == nl.int32),
        f"gdn_cte_bucket: `read_indices` {tuple(getattr(read_indices, 'shape', ()))} must be [N] = {list(seqs)} "
        "int32, as `state_indices`. Fix: one pool row to start from (or -1) per sequence slot, as int32",
    )
    kernel_assert(
        tuple(chunk_bounds.shape) == (seqs[0] + 1,) and chunk_bounds.dtype == nl.int32,
        f"gdn_cte_bucket: `chunk_bounds` {tuple(chunk_bounds.shape)} {chunk_bounds.dtype} must be [N + 1] = "
        f"[{seqs[0] + 1}] int32. Fix: the padded chunk boundaries of the N sequence slots, as int32",
    )
    n_chunks = call.query.shape[2] // CHUNK_BY_ALGORITHM[call.algorithm]
    kernel_assert(
        n_chunks <= MAX_CHUNKS,
        f"gdn_cte_bucket: a bucket of {n_chunks} chunks is over {MAX_CHUNKS}. Fix: a smaller bucket",
    )
    if checkpoint_every:
        shape = tuple(getattr(checkpoint_indices, "shape", ()))
        kernel_assert(
            is_integer(checkpoint_every)
            and checkpoint_every > 0
            and checkpoint_every % CHUNK_BY_ALGORITHM[call.algorithm] == 0
            and len(shape) == 2
            and shape[0] == seqs[0]
            and shape[1] >= 1
            and checkpoint_indices.dtype == nl.int32,
            f"gdn_cte_bucket: `checkpoint_every` {checkpoint_every!r} must be a chunk multiple of tokens, with "
            f"`checkpoint_indices` [N, K] = "
            f"[{seqs[0]}, K] int32, got {shape}. Fix: one row per sequence slot, one column per checkpoint",
        )
