"""``gdn_conv_bucket``: the causal depthwise conv1d of a GatedDeltaNet layer's prefill over packed sequences in a
bucket, each from its window in a conv-state pool (``gdn_ref.conv.causal_conv1d_prefill_pool``).

One compiled program per bucket (T tokens, N sequence slots) at fixed channels, width, window length and
checkpoint spacing, as the bucketed recurrence (``cte/bucket.py``): the layout — ``cu_seqlens``, the pool rows, the
checkpoint rows, the rows read — is device data the program never reads while it is built. Three passes, each on
``step.py``'s layout (a run of tokens on 16 partitions, channel s·F + f on partition s, 8 runs an instruction) and
its arithmetic (every tap's product in fp32, summed by one reduce in one order), so an output is the same bits
whichever pass computes it:

1. **bulk**: every token of the bucket as if the bucket were one sequence: runs of ``RUN`` tokens, each loaded with
   the L tokens before it (its halo: one contiguous load per run), outputs stored for every token. Wrong only at
   the first W − 1 tokens of each sequence, where the taps read the previous sequence's tokens.
2. **starts**: each sequence as a decode request over its first L tokens from its window (the pool row it reads,
   zeros for −1): the outputs of its first min(W − 1, length) tokens overwrite the bulk's, and where the sequence
   is at most L tokens long the window after its last token is its final window.
3. **windows**: the final window of each sequence longer than L (its last L tokens) and each checkpoint window
   (the L tokens before (k + 1)·``checkpoint_every``), loaded at a run-time row of x, turned channel-major and
   stored to its pool row.

Every run-time choice is a row: a table computed on device from the layout tensors gives each transfer its row of
x, ``out`` or the pool, −1 where the transfer must not happen (a token past a sequence's length, a final window
the other pass stores, a checkpoint past the end, a −1 pool row), and the DMA skips it (``oob_mode.skip``,
"nki.isa.dma_copy", SDK 2.33). The pool rows read are all loaded (pass 2) before any pool row is written.
"""

from __future__ import annotations

from typing import Any

from gdn_ref.conv_rules import conv_prefill_violations

from ..common.backend import nisa, nki, nl
from ..common.kernel_assert import assert_valid_call
from ..common.pool_rows import PoolRows
from ..common.tiles import FP32, sbuf
from .step import (
    PARTITIONS_PER_REQUEST,
    REQUESTS_PER_GROUP,
    _constants,
    _convolve,
    _pool_view,
    _TileSet,
    _token_last,
)

RUN = 8  # tokens of a bulk run (plus its halo): 8 runs = 64 tokens an instruction; T is a multiple of 128
# SBUF a partition keeps for what is live beside the bulk pass's tile set and taps: the layout tables, the 0/1
# slot replicator, the ones column (a few hundred bytes at N = 128 slots).
CONSTANTS_SLACK = 4096
INT32 = nl.int32


@nki.jit
def gdn_conv_bucket(
    x: Any,
    conv_pool: Any,
    weight: Any,
    bias: Any,
    cu_seqlens: Any,
    state_indices: Any,
    activation: str | None = "silu",
    checkpoint_every: int = 0,
    checkpoint_indices: Any = None,
    read_indices: Any = None,
    state_row_stride: int | None = None,
    state_len: int | None = None,
) -> tuple[Any, Any]:
    """Convolve up to N packed sequences of a bucket of T tokens, each from its window in a conv-state pool.

    Dimensions:
        T: tokens of the bucket, a multiple of 128. N: sequence slots, <= 128. C: channels, a multiple of 16. W:
        width, 2..5. L >= W − 1: inputs a window holds. P: pool rows. K: checkpoints per sequence.

    Args:
        x (nl.NkiTensor): [T, C] @ HBM float32 or bfloat16: the sequences back to back from token 0 (unpadded, as
            vLLM's ``query_start_loc`` packs them), then any tokens up to T (their outputs are not meaningful).
        conv_pool (nl.NkiTensor): [P, C, L] @ HBM, x's dtype, MUTABLE: only the rows named are read or written.
        weight, bias, activation: as ``gdn_conv_step``.
        cu_seqlens (nl.NkiTensor): [N + 1] int32 @ HBM, run-time: sequence i is tokens ``cu_seqlens[i] ..
            cu_seqlens[i + 1] − 1``; from 0, non-decreasing (an empty slot repeats a bound), at most T.
        state_indices (nl.NkiTensor): [N] int32 @ HBM, run-time: the row sequence i starts from and its final
            window goes to; −1: an empty window, nothing stored. Distinct among sequences with tokens.
        checkpoint_every (int): trace-time, tokens between checkpoint windows (>= L); 0: none.
        checkpoint_indices (nl.NkiTensor): [N, K] int32 @ HBM, run-time: the row of the window after
            ``(k + 1) · checkpoint_every`` tokens of sequence i; −1 or past its length: not stored.
        read_indices (nl.NkiTensor): [N] int32 @ HBM, run-time, optional: the row sequence i starts from when it is
            not the row it ends in (a prefix-cache hit); −1: an empty window.
        state_row_stride, state_len (int): trace-time; a pool of rows at their own stride, as ``gdn_conv_step``'s
            (``conv_pool`` its span).

    Returns:
        tuple: ``out`` [T, C] in x's dtype and ``conv_pool`` (the same buffer).

    Notes:
        The kernel trusts the run-time tensors (the host entry point ``gdn_nki.conv_prefill_bucket`` checks them),
        as ``gdn_cte_bucket`` does; the trace-time rules stop the trace before anything is allocated.
    """
    pool = PoolRows.of(conv_pool, state_row_stride, (x.shape[-1], state_len))
    assert_valid_call(
        conv_prefill_violations(
            x,
            pool.view,
            weight,
            bias,
            cu_seqlens,
            state_indices,
            activation,
            checkpoint_every,
            checkpoint_indices,
            read_indices,
        )
    )
    tokens, channels = x.shape
    state_len, width = pool.view.shape[2], weight.shape[1]
    seqs = state_indices.shape[0]
    per_part = channels // PARTITIONS_PER_REQUEST
    out = nl.ndarray((tokens, channels), dtype=x.dtype, buffer=nl.shared_hbm)
    taps, bias_column = _constants(weight, bias, per_part)
    ones = sbuf((128, 1), FP32)
    nisa.memset(dst=ones, value=1.0)
    shape = (state_len, width)
    tables = _Tables(cu_seqlens, state_indices, read_indices, checkpoint_every, checkpoint_indices, state_len, width)

    _bulk(x, out, taps, bias_column, ones, shape, activation)
    _starts(x, out, pool, taps, bias_column, ones, shape, activation, tables, seqs)
    _windows(x, pool, tables, seqs, per_part, state_len)
    return out, conv_pool


class _Tables:
    """The rows every run-time transfer uses, [1, ·] int32 tiles computed on device from the layout tensors (−1: no
    transfer). Per sequence i (s its first token, n its length, r its state row, q < L):

    | table | holds |
    |---|---|
    | ``read`` [N] | the row its window is loaded from (``read_indices``, else ``state_indices``) |
    | ``start_in`` [N, L] | s + q where q < n: its q-th token's row of x |
    | ``start_out`` [N, L] | s + q where q < min(n, W − 1): the row of ``out`` its start output overwrites |
    | ``start_keep`` [N, L] | r where q = n − 1 (n <= L): the window after its last token is its final window |
    | ``end_in``, ``end_keep`` [N] | s + n − L and r where n > L: its last L tokens, its final window |
    | ``ckpt_in``, ``ckpt_keep`` [N, K] | s + P − L and the checkpoint row where P = (k + 1)·every <= n |

    Each is ``(value + 1)·condition − 1`` on fp32 integers (exact below 2**24), so a −1 row stays −1.
    """

    def __init__(self, cu_seqlens: Any, state_indices: Any, read_indices: Any, every: int, ckpt: Any, state_len: int,
                 width: int):  # fmt: skip
        seqs = state_indices.shape[0]
        bounds = _row_f32(cu_seqlens, seqs + 1)
        first, end = bounds[:, 0:seqs], bounds[:, 1 : seqs + 1]
        length = _f32((1, seqs))
        nisa.tensor_tensor(dst=length, data1=end, data2=first, op=nl.subtract)
        rows = _row_f32(state_indices, seqs)
        self.read = _as_int(rows if read_indices is None else _row_f32(read_indices, seqs))
        start_in, start_out, start_keep = (_f32((1, seqs, state_len)) for _ in range(3))
        for q in range(state_len):
            _where(start_in[:, :, q], first, float(q), length, nl.greater, float(q))
            if q < width - 1:
                _where(start_out[:, :, q], first, float(q), length, nl.greater, float(q))
            else:
                nisa.memset(dst=start_out[:, :, q], value=-1.0)
            _where(start_keep[:, :, q], rows, 0.0, length, nl.equal, float(q + 1))
        self.start_in, self.start_out, self.start_keep = (_as_int(t) for t in (start_in, start_out, start_keep))
        end_in, end_keep = _f32((1, seqs)), _f32((1, seqs))
        _where(end_in, end, float(-state_len), length, nl.greater, float(state_len))
        _where(end_keep, rows, 0.0, length, nl.greater, float(state_len))
        self.end_in, self.end_keep = _as_int(end_in), _as_int(end_keep)
        self.ckpt_in = self.ckpt_keep = None
        if every:
            per_seq = ckpt.shape[1]
            ckpt_rows = _row_f32(ckpt, seqs * per_seq).reshape((1, seqs, per_seq))
            ckpt_in, ckpt_keep = _f32((1, seqs, per_seq)), _f32((1, seqs, per_seq))
            for k in range(per_seq):
                at = float((k + 1) * every)
                _where(ckpt_in[:, :, k], first, at - state_len, length, nl.greater_equal, at)
                _where(ckpt_keep[:, :, k], ckpt_rows[:, :, k], 0.0, length, nl.greater_equal, at)
            self.ckpt_in, self.ckpt_keep = _as_int(ckpt_in), _as_int(ckpt_keep)


def _f32(shape: tuple[int, ...]) -> Any:
    return sbuf(shape, FP32)


def _row_f32(tensor: Any, count: int) -> Any:
    """An int32 HBM tensor's first ``count`` elements as an fp32 row [1, count] (exact below 2**24)."""
    raw = sbuf((1, count), INT32)
    nisa.dma_copy(dst=raw, src=tensor.ap(pattern=[[count, 1], [1, count]], offset=0))
    row = _f32((1, count))
    nisa.tensor_copy(dst=row, src=raw)
    return row


def _where(dst: Any, value: Any, shift: float, length: Any, compare: Any, bound: float) -> None:
    """``dst = (value + shift + 1)·[length compare bound] − 1``: the row ``value + shift`` where the condition holds,
    else −1 (and −1 where ``value`` is −1 and ``shift`` 0)."""
    condition = _f32(tuple(dst.shape))
    nisa.tensor_scalar(dst=condition, data=length, op0=compare, operand0=bound)
    nisa.scalar_tensor_tensor(dst=dst, data=value, op0=nl.add, operand0=shift + 1.0, op1=nl.multiply,
                              operand1=condition)  # fmt: skip
    nisa.tensor_scalar(dst=dst, data=dst, op0=nl.subtract, operand0=1.0)


def _as_int(table: Any) -> Any:
    """An fp32 table as a flat [1, n] int32 tile (``nisa.scalar_load`` reads its elements)."""
    size = 1
    for n in table.shape[1:]:
        size *= n
    rows = sbuf((1, size), INT32)
    nisa.tensor_copy(dst=rows, src=table.reshape((1, size)))
    return rows


def _row(table: Any, at: int) -> Any:
    """Element ``at`` of a [1, n] int32 table as a run-time scalar."""
    return nisa.scalar_load(table[:, at : at + 1])


def _parts(j: int) -> slice:
    return slice(j * PARTITIONS_PER_REQUEST, (j + 1) * PARTITIONS_PER_REQUEST)


def _x_rows(tensor: Any, row: Any, count: int, cols: tuple[int, int] | None = None) -> tuple[Any, dict[str, Any]]:
    """``count`` consecutive rows of a [T, C] tensor from ``row`` (an int, or a run-time scalar: skipped outside)
    as [16, count, F] (partition s: channels s·F ..); ``cols`` (f0, n): only channels s·F + f0 .. + n − 1."""
    channels = tensor.shape[1]
    per_part = channels // PARTITIONS_PER_REQUEST
    f0, size = cols if cols is not None else (0, per_part)
    pattern = [[per_part, PARTITIONS_PER_REQUEST], [channels, count], [1, size]]
    if isinstance(row, int):
        return tensor.ap(pattern=pattern, offset=row * channels + f0), {}
    return tensor.ap(pattern=pattern, offset=f0, scalar_offset=row, indirect_dim=0), dict(_SKIP)


def _copy(dst: Any, src: tuple[Any, dict[str, Any]] | Any) -> None:
    """One DMA; ``src`` or ``dst`` may come as (view, keywords) from ``_x_rows``."""
    (dst, dst_kw), (src, src_kw) = (d if isinstance(d, tuple) else (d, {}) for d in (dst, src))
    nisa.dma_copy(dst=dst, src=src, **dst_kw, **src_kw)


def _bulk(x: Any, out: Any, taps: Any, bias_column: Any, ones: Any, shape: tuple[int, int], activation: Any) -> None:
    """Pass 1: every token from the L tokens before it (zeros before token 0)."""
    tokens = x.shape[0]
    state_len, width = shape
    per_part = x.shape[1] // PARTITIONS_PER_REQUEST
    run = bulk_run(x.dtype, per_part, state_len, width, bias_column is not None)
    tiles = _TileSet(x.dtype, per_part, state_len + run, state_len, width, None, bias_column, first_output=state_len)
    for base in range(0, tokens, run * REQUESTS_PER_GROUP):
        for j in range(REQUESTS_PER_GROUP):
            start = base + j * run
            if start == 0:  # no halo before the bucket: the memset zeros stay
                _copy(tiles.inputs[_parts(j), state_len:], _x_rows(x, 0, run))
            else:
                _copy(tiles.inputs[_parts(j)], _x_rows(x, start - state_len, state_len + run))
        _convolve(tiles, taps, ones, (state_len + run, state_len, width), activation)
        for j in range(REQUESTS_PER_GROUP):
            _copy(_x_rows(out, base + j * run, run), tiles.result[_parts(j)])


def bulk_run(dtype: Any, per_part: int, state_len: int, width: int, bias: bool) -> int:
    """The tokens of a bulk run: ``RUN``, halved until the run's tile set (``_TileSet``: the window, the inputs
    with their halo, each output's fp32 products and sum, the results) fits a partition's SBUF beside the taps, the
    bias and ``CONSTANTS_SLACK`` ("nki.language.tile_size", ``sbuf_fmax_bytes``, SDK 2.33). At Qwen3-Next's
    channels (C = 8192, 512 a partition) it is ``RUN``; Qwen3.5's C = 12288 in fp32 halves it (the same outputs,
    bit for bit: each output's arithmetic does not depend on the run; twice the instructions)."""
    size = 4 if dtype == FP32 else 2
    terms = width + bias
    constants = per_part * 4 * (width + bias) + CONSTANTS_SLACK
    run = RUN
    while run > 1:
        tile_set = per_part * ((2 * state_len + run) * size + run * (terms + 1) * 4 + run * size)
        if tile_set + constants <= nl.tile_size.sbuf_fmax_bytes:
            break
        run //= 2
    return run


def _starts(x: Any, out: Any, pool: Any, taps: Any, bias_column: Any, ones: Any, shape: tuple[int, int],
            activation: Any, tables: _Tables, seqs: int) -> None:  # fmt: skip
    """Pass 2: each sequence's first L tokens from its window; every pool row read before any is written.

    In ``starts_chunks`` channel chunks when every group's windows and the tile set do not fit SBUF at once (Qwen3.5's
    C = 12288 in fp32 at 128 slots): a chunk's windows are all read before any of its channels is written, and a
    channel's conv reads only its own channel, so the outputs and windows are the same bits whatever the chunks."""
    state_len, width = shape
    per_part = x.shape[1] // PARTITIONS_PER_REQUEST
    groups = -(-seqs // REQUESTS_PER_GROUP)
    chunks = starts_chunks(x.dtype, per_part, state_len, width, bias_column is not None, seqs)
    size = per_part // chunks
    # Every group's windows first (a tile each, zeros: a −1 row, an empty window, is a skipped load that leaves
    # them), so no pool row is written before every row is read; then one tile set convolves the groups in turn.
    windows = []
    for c in range(chunks):
        cols = (c * size, size)
        chunk_taps = taps if chunks == 1 else taps[:, c * size : (c + 1) * size]
        for g in range(groups):
            if not c:
                windows.append(sbuf((128, size, state_len), x.dtype))
            nisa.memset(dst=windows[g], value=0.0)
            for j in range(REQUESTS_PER_GROUP):
                i = g * REQUESTS_PER_GROUP + j
                if i < seqs:
                    _copy(windows[g][_parts(j)], (_pool_chunk(pool, _row(tables.read, i), cols), _SKIP))
        if not c:
            tiles = _TileSet(x.dtype, size, state_len, state_len, width, True,
                             bias_column if chunks == 1 else _chunk_of(bias_column, 0, size))  # fmt: skip
        elif bias_column is not None:  # the bias term of this chunk's channels (the tile set set the first's)
            for t in range(state_len):
                nisa.activation(dst=tiles.products[:, t, :, width], op=nl.copy, data=_chunk_of(bias_column, c, size))
        for g in range(groups):
            tiles.windows = windows[g]
            members = [
                (j, g * REQUESTS_PER_GROUP + j) for j in range(REQUESTS_PER_GROUP) if g * REQUESTS_PER_GROUP + j < seqs
            ]
            for j, i in members:
                for q in range(state_len):
                    _copy(tiles.inputs[_parts(j), q : q + 1], _x_rows(x, _row(tables.start_in, i * state_len + q), 1,
                                                                        cols))  # fmt: skip
            _convolve(tiles, chunk_taps, ones, (state_len, state_len, width), activation)
            for j, i in members:
                for q in range(state_len):
                    at = i * state_len + q
                    _copy(_x_rows(out, _row(tables.start_out, at), 1, cols), tiles.result[_parts(j), q : q + 1])
                    _copy((_pool_chunk(pool, _row(tables.start_keep, at), cols), _SKIP), tiles.kept[_parts(j), q])


_SKIP = {"oob_mode": nisa.oob_mode.skip}


def starts_chunks(dtype: Any, per_part: int, state_len: int, width: int, bias: bool, seqs: int) -> int:
    """The channel chunks of pass 2: 1, else the fewest (dividing F) whose windows of every group and tile set
    (``_set_bytes``: L tokens, every window kept) fit a partition's SBUF beside the taps, the bias, the layout
    tables (about 28 bytes a slot per window entry) and ``CONSTANTS_SLACK`` ("nki.language.tile_size",
    ``sbuf_fmax_bytes``, SDK 2.33). 1 up to Qwen3-Next's C = 8192 in fp32 at 128 slots; 2 at C = 12288 in fp32."""
    size = 4 if dtype == FP32 else 2
    groups = -(-seqs // REQUESTS_PER_GROUP)
    fixed = per_part * 4 * (width + bias) + CONSTANTS_SLACK + seqs * state_len * 28
    for chunks in range(1, per_part + 1):
        if per_part % chunks:
            continue
        part = per_part // chunks
        windows = groups * part * state_len * size
        tile_set = part * (3 * state_len * size + state_len * (width + 1) * 4 + state_len * 4
                           + state_len * state_len * size)  # fmt: skip
        if fixed + windows + tile_set <= nl.tile_size.sbuf_fmax_bytes:
            return chunks
    return per_part


def _chunk_of(tile: Any, c: int, size: int) -> Any:
    """Channels c·size .. of every partition of a [128, F] tile."""
    return tile[:, c * size : (c + 1) * size]


def _pool_chunk(pool: Any, row: Any, cols: tuple[int, int]) -> Any:
    """``_pool_view`` of channels (f0, count) of every partition: [16, count, L] of pool row ``row``."""
    _, channels, state_len = pool.view.shape
    per_part = channels // PARTITIONS_PER_REQUEST
    f0, count = cols
    if (f0, count) == (0, per_part):
        return _pool_view(pool, row)
    pattern = [[per_part * state_len, PARTITIONS_PER_REQUEST], [state_len, count], [1, state_len]]
    return pool.row(row, pattern, f0 * state_len)


def _windows(x: Any, pool: Any, tables: _Tables, seqs: int, per_part: int, state_len: int) -> None:
    """Pass 3: the final windows of sequences longer than L and the checkpoint windows, from x."""
    jobs = [(tables.end_in, tables.end_keep, i) for i in range(seqs)]
    if tables.ckpt_in is not None:
        jobs += [(tables.ckpt_in, tables.ckpt_keep, at) for at in range(tables.ckpt_in.shape[1])]
    inputs = sbuf((128, state_len, per_part), x.dtype)
    kept = sbuf((128, per_part, state_len), x.dtype)
    for base in range(0, len(jobs), REQUESTS_PER_GROUP):
        group = jobs[base : base + REQUESTS_PER_GROUP]
        for j, (rows_in, _, at) in enumerate(group):
            _copy(inputs[_parts(j)], _x_rows(x, _row(rows_in, at), state_len))
        nisa.activation(dst=kept[0 : len(group) * PARTITIONS_PER_REQUEST], op=nl.copy,
                        data=_token_last(inputs)[0 : len(group) * PARTITIONS_PER_REQUEST])  # fmt: skip
        for j, (_, rows_keep, at) in enumerate(group):
            _copy((_pool_view(pool, _row(rows_keep, at)), {"oob_mode": nisa.oob_mode.skip}), kept[_parts(j)])
