"""Packed variable-length prefill in ONE launch: the ``gdn_cte_varlen`` kernel and the rules of its layout.

Serving engines pack a batch's prompts back to back (``cu_seqlens``) and keep recurrent states in a pool. Here
every sequence is padded exactly (g = 0, β = 0 tokens) to its own chunk multiple and the padded sequences are
packed into batch row 0; each (sequence, value head) is one lane of the launch with its own token range and its
own state row (a *slot* of the pool). Units of the software pipeline span lanes (``lanes.py``), so short and long
sequences share grouped inverses exactly as the heads of a dense launch do.

The per-sequence chunk counts and slots are trace-time integers: one trace per distinct batch layout (see the
package README, "Varlen", for what that costs on Trainium and where NKI's on-device scalars would take over).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from gdn_ref.constants import CHUNK_BY_ALGORITHM, DEFAULT_ALGORITHM, DEFAULT_GROUP_SIZE
from gdn_ref.contract import Arguments, Violation, first_bad_index, validate

from .api import emit
from .backend import nki, nl
from .kernel_assert import assert_valid_call
from .lanes import packed_spans
from .tiles import FP32

# The dense rule about the state's shape is replaced by the pool's (``_pool_violations``); every other
# documented rule (dtype fp32, writable, neumann takes no state) applies to the pool as written.
_DENSE_STATE_SHAPE = "recurrent_state.shape"
# Before padding, the packed token count need not be a chunk multiple (each sequence is padded on its own).
_SEQ_DIVISIBLE = "seq.divisible"


def varlen_violations(
    query: Any,
    key: Any,
    value: Any,
    g_log: Any,
    beta: Any,
    scale: Any,
    algorithm: Any,
    mask_pack: Any,
    group_size: Any,
    recurrent_state: Any,
    seq_chunks: Any,
    state_slots: Any,
    *,
    host: bool = True,
    padded: bool = True,
    values: bool = True,
) -> list[Violation]:
    """Every broken rule of a packed-varlen launch: gdn_cte's documented rules on the packed tensors, plus the
    layout (``seq_chunks`` cover the tokens of batch row 0) and the pool (``state_slots`` distinct rows of it).

    Args:
        padded (bool): the tensors are already packed with each sequence padded (the kernel's view); False on the
            host before padding, where the token count need not be a chunk multiple and is not checked against
            ``seq_chunks``.
        values (bool): on the host, also scan every element (``gdn_ref.contract.check_values``).

    Returns:
        list[Violation]: empty when the launch is valid.
    """
    found = tensor_violations(
        query, key, value, g_log, beta, scale, algorithm, mask_pack, group_size, recurrent_state,
        host=host, padded=padded, values=values,
    )  # fmt: skip
    return found + layout_violations(
        query, value, algorithm, recurrent_state, seq_chunks, state_slots, padded=padded, tensors_valid=not found
    )


def layout_violations(
    query: Any,
    value: Any,
    algorithm: Any,
    recurrent_state: Any,
    seq_chunks: Any,
    state_slots: Any,
    *,
    padded: bool = True,
    tensors_valid: bool = True,
) -> list[Violation]:
    """The packed launch's own rules: ``seq_chunks`` cover the tokens of batch row 0 (``padded``: as
    ``varlen_violations``) and ``state_slots`` are distinct rows of the pool, the pool's only when the tensors'
    rules hold (``tensors_valid``). Nothing when query's layout or the algorithm is already wrong: the tensors'
    rules name that."""
    shape = tuple(getattr(query, "shape", ()))
    if len(shape) != 4 or not isinstance(algorithm, str) or algorithm not in CHUNK_BY_ALGORITHM:
        return []
    found = _layout_violations(shape, CHUNK_BY_ALGORITHM[algorithm], seq_chunks, padded)
    if not found and tensors_valid:
        found = _pool_violations(shape, value.shape, recurrent_state, len(seq_chunks), state_slots)
    return found


# Rules whose violation means the tensors' token axis is not where the head-major layout puts it (seq-first
# tensors, a 3-D query): cu_seqlens, judged against query.shape[2], would then be blamed for the tensors' mistake.
_TOKEN_LAYOUT_RULES = frozenset(
    f"{name}.{rule}" for name in ("query", "key", "value", "g_log", "beta") for rule in ("rank", "shape")
)


def packed_token_count(query: Any, found: Sequence[Violation]) -> int | None:
    """The packed token count T the tensors carry (``query.shape[2]``), or None when their layout rules are broken
    (``found``: the tensors' violations), so that cu_seqlens is not judged against a wrong T."""
    if any(v.rule_id in _TOKEN_LAYOUT_RULES for v in found) or len(getattr(query, "shape", ())) != 4:
        return None
    return int(query.shape[2])


def tensor_violations(
    query: Any,
    key: Any,
    value: Any,
    g_log: Any,
    beta: Any,
    scale: Any,
    algorithm: Any,
    mask_pack: Any,
    group_size: Any,
    recurrent_state: Any,
    *,
    host: bool = True,
    padded: bool = True,
    values: bool = True,
) -> list[Violation]:
    """gdn_cte's documented rules on the packed tensors, less the two a packed launch replaces: the dense state's
    shape (the pool's rules, ``varlen_violations``) and, before padding (``padded`` False), the token count's
    divisibility. The arguments are ``varlen_violations``'."""
    skipped = {_DENSE_STATE_SHAPE} if padded else {_DENSE_STATE_SHAPE, _SEQ_DIVISIBLE}
    found = validate(
        query, key, value, g_log, beta, scale, algorithm, mask_pack, group_size, recurrent_state,
        host=host, values=values,
    )  # fmt: skip
    return [v for v in found if v.rule_id not in skipped]


def state_slot_violations(state_indices: Any) -> list[Violation]:
    """The form of ``state_indices`` before its values are read: a 1-D sequence of integers (pool rows). Floats,
    strings, booleans and nested lists are rejected here rather than truncated or coerced by ``int()``."""
    if state_indices is None or _integer_vector(state_indices) is not None:
        return []
    return [_violation("state_indices.form", "state_indices", _describe_vector(state_indices),
                       "state_indices must be a 1-D integer array [N] of pool rows, one per sequence",
                       "pass integer row numbers, one per sequence, e.g. [3, 0]")]  # fmt: skip


def _integer_vector(values: Any) -> np.ndarray | None:
    """``values`` as a non-empty 1-D integer numpy array, or None when it is not one: ragged or nested lists,
    floats, strings, booleans and empty sequences are refused, never coerced."""
    try:
        array = np.asarray(values)
    except (ValueError, TypeError):  # a ragged nested list
        return None
    return array if array.ndim == 1 and array.size and array.dtype.kind in "iu" else None


def _describe_vector(values: Any) -> str:
    """What a value that is not an integer vector is, for a violation's message."""
    try:
        array = np.asarray(values)
    except (ValueError, TypeError):
        return f"a ragged {type(values).__name__} (not a rectangular array)"
    return "an empty sequence" if array.size == 0 else f"{array.dtype} of shape {array.shape}"


def pool_row_violations(rows_state: np.ndarray, rows: Sequence[int] | None) -> list[Violation]:
    """The values rule of ``recurrent_state`` on the rows a launch reads: a pool's shape is not the dense
    [B, Hv, Dk, Dv] the contract's scan expects, and its other rows are never read, so only the named ones are
    scanned (a NaN left in a free slot by an earlier request must not fail this one).

    Args:
        rows_state (np.ndarray): [N, Hv, Dk, Dv] fp32, the named rows in sequence order.
        rows (Sequence[int] | None): the pool row of each sequence (for the message), or None for a state of one
            row per sequence (no pool).

    Returns:
        list[Violation]: one violation naming the pool row (or sequence) and index of the first NaN/±Inf, or nothing.
    """
    where = first_bad_index(rows_state, lambda block: ~np.isfinite(block))
    if where is None:
        return []
    seq = where[0]
    if rows is None:
        at, fix = f"sequence {seq}, index {list(where)}", "pass a finite initial state for that sequence (or zeros)"
    else:
        at = f"pool row {rows[seq]} (sequence {seq}), index {[rows[seq], *where[1:]]}"
        fix = "reset that slot (zeros) before reusing it, or find where the previous request overflowed"
    return [_violation("recurrent_state.finite", "recurrent_state", f"value {float(rows_state[where])} at {at}",
                       "the initial state of every sequence must hold finite numbers: NaN and ±Inf reach every "
                       "token of the sequence through the state", fix)]  # fmt: skip


def _violation(rule_id: str, argument: str, value: str, rule: str, fix: str) -> Violation:
    return Violation(rule_id, argument, value, rule, fix)


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _layout_violations(shape: tuple[int, ...], chunk: int, seq_chunks: Any, padded: bool) -> list[Violation]:
    if shape[0] != 1:
        return [_violation("varlen.batch", "query", f"batch {shape[0]}", "packed sequences live in batch row 0 (B == 1)",
                           "pack the sequences into one row")]  # fmt: skip
    ok = isinstance(seq_chunks, tuple) and seq_chunks and all(_is_int(n) and n >= 1 for n in seq_chunks)
    if not ok:
        return [_violation("varlen.seq_chunks", "seq_chunks", f"value {seq_chunks!r}",
                           "seq_chunks must be a non-empty tuple of positive ints (chunks per sequence)",
                           "pass the padded length of each sequence divided by the chunk")]  # fmt: skip
    if padded and sum(seq_chunks) * chunk != shape[2]:
        return [_violation("varlen.cover", "seq_chunks", f"{sum(seq_chunks)} chunks of {chunk} tokens",
                           f"the sequences must cover exactly the S={shape[2]} packed tokens",
                           "pack each sequence padded to its chunk multiple, back to back")]  # fmt: skip
    return []


def _pool_violations(shape: tuple[int, ...], value_shape: Any, pool: Any, n_seqs: int, slots: Any) -> list[Violation]:
    if pool is None:
        if slots is None:
            return []
        return [_violation("state_indices.pool", "state_indices", f"{len(slots)} slot(s)",
                           "state slots index a state pool, so one must be supplied",
                           "pass the pool as recurrent_state (initial_state), or no slots")]  # fmt: skip
    expected_tail = (int(value_shape[1]), shape[3], int(value_shape[3]))
    pool_shape = tuple(int(d) for d in pool.shape)
    if len(pool_shape) != 4 or pool_shape[1:] != expected_tail or pool_shape[0] < 1:
        return [_violation("state_pool.shape", "recurrent_state", f"shape {pool_shape}",
                           f"the state pool must be [P, Hv, Dk, Dv] = [P, {', '.join(map(str, expected_tail))}]",
                           "allocate the pool with the value heads and head dims of this call")]  # fmt: skip
    if slots is None:
        if pool_shape[0] == n_seqs:
            return []
        return [_violation("state_pool.rows", "recurrent_state", f"{pool_shape[0]} row(s)",
                           f"without state slots the state holds one row per sequence ({n_seqs})",
                           "pass one state row per sequence, or name each sequence's slot")]  # fmt: skip
    bad = not isinstance(slots, tuple) or len(slots) != n_seqs or not all(_is_int(s) for s in slots)
    if bad:
        return [_violation("state_indices.count", "state_indices", f"value {slots!r}",
                           f"one integer slot per sequence ({n_seqs})", "pass one pool slot per sequence")]  # fmt: skip
    outside = [s for s in slots if not 0 <= s < pool_shape[0]]
    if outside:
        return [_violation("state_indices.range", "state_indices", f"slots {outside}",
                           f"every slot must index the pool's {pool_shape[0]} rows",
                           f"use slots in [0, {pool_shape[0]})")]  # fmt: skip
    repeated = sorted({s for s in slots if slots.count(s) > 1})
    if repeated:
        return [_violation("state_indices.distinct", "state_indices", f"slots {repeated} named twice",
                           "each sequence writes its final state to its slot, so slots must be distinct",
                           "give every sequence its own slot")]  # fmt: skip
    return []


@nki.jit
def gdn_cte_varlen(
    query: Any,
    key: Any,
    value: Any,
    g_log: Any,
    beta: Any,
    scale: float = 1.0,
    algorithm: str = DEFAULT_ALGORITHM,
    mask_pack: Any = None,
    group_size: int = DEFAULT_GROUP_SIZE,
    recurrent_state: Any = None,
    seq_chunks: tuple[int, ...] = (),
    state_slots: tuple[int, ...] | None = None,
) -> tuple[Any, Any]:
    """Chunked gated delta-rule prefill of packed sequences of different lengths, in one launch.

    Dimensions:
        N: sequences. T: packed tokens, the sum of the sequences' padded lengths (each a chunk multiple).
        P: rows of the state pool. Hk, Hv, Dk, Dv: as ``gdn_cte``.

    Args:
        query, key (nl.NkiTensor): [1, Hk, T, Dk] @ HBM, the sequences back to back, each padded with zero tokens
            to its chunk multiple.
        value (nl.NkiTensor): [1, Hv, T, Dv] @ HBM, packed the same way.
        g_log, beta (nl.NkiTensor): [1, Hv, T] fp32 @ HBM; padding tokens carry g = 0 and β = 0.
        scale, algorithm, mask_pack, group_size: as ``gdn_cte``.
        recurrent_state (nl.NkiTensor): optional [P, Hv, Dk, Dv] fp32 @ HBM state pool, MUTABLE IN/OUT: sequence
            i starts from row ``state_slots[i]`` and its final state is written back there; no other row is read
            or written. Omitted: zero starts, and a new [N, Hv, Dk, Dv] final state.
        seq_chunks (tuple[int, ...]): trace-time chunks per sequence, in packing order.
        state_slots (tuple[int, ...] | None): trace-time pool row per sequence, distinct; None = row i for
            sequence i (then P == N).

    Returns:
        tuple: ``out`` [1, Hv, T, Dv] in the compute dtype (padding rows hold the padding tokens' outputs), and the
        final states: the pool when one was supplied, else [N, Hv, Dk, Dv] fp32.

    Notes:
        Each (sequence, value head) is a lane with its own token range and state row; lanes are split over the
        launch grid like gdn_cte's. Every rule a trace can see is checked before anything is allocated or written;
        a violation stops the trace with an ``AssertionError`` listing each rule, argument and fix.
    """
    violations = varlen_violations(
        query, key, value, g_log, beta, scale, algorithm, mask_pack, group_size, recurrent_state, seq_chunks,
        state_slots, host=False,
    )  # fmt: skip
    assert_valid_call(violations)  # the tracer accepts no raise in a kernel (kernel_assert.py)
    value_heads, seq_len, dk, dv = value.shape[1], query.shape[2], query.shape[3], value.shape[3]
    out = nl.ndarray((1, value_heads, seq_len, dv), dtype=query.dtype, buffer=nl.shared_hbm)
    slots = tuple(range(len(seq_chunks))) if state_slots is None else state_slots
    final_state = recurrent_state
    if final_state is None:
        final_state = nl.ndarray((len(seq_chunks), value_heads, dk, dv), dtype=FP32, buffer=nl.shared_hbm)
    spans = packed_spans(seq_chunks, CHUNK_BY_ALGORITHM[algorithm], slots)
    call = Arguments(query, key, value, g_log, beta, scale, algorithm, mask_pack, group_size, recurrent_state)
    emit(call, out, final_state, spans)
    return out, final_state


def cu_seqlens_violations(cu_seqlens: Any, batch: int, total: int) -> list[Violation]:
    """The rules of FlashAttention-style cumulative sequence lengths over ``total`` packed tokens in one row."""
    values = _integer_vector(cu_seqlens)
    if values is None or values.size < 2:
        return [_violation("cu_seqlens.form", "cu_seqlens", _describe_vector(cu_seqlens),
                           "cu_seqlens must be a 1-D integer tensor [N + 1] (N >= 1 sequences)",
                           "pass the cumulative sequence lengths, e.g. [0, len0, len0 + len1, ...]")]  # fmt: skip
    found = []
    if batch != 1:
        found.append(_violation("cu_seqlens.batch", "cu_seqlens", f"with batch B={batch}",
                                "with cu_seqlens the sequences are packed into one row, so B must be 1",
                                "flatten the batch into [1, T_total, ...] and give its boundaries in cu_seqlens"))  # fmt: skip
    if values[0] != 0:
        found.append(_violation("cu_seqlens.start", "cu_seqlens", f"first entry {int(values[0])}",
                                "cu_seqlens must start at 0", "prepend 0"))  # fmt: skip
    steps = np.diff(values.astype(np.int64))
    if (steps <= 0).any():
        at = int(np.argmax(steps <= 0))
        found.append(_violation("cu_seqlens.increasing", "cu_seqlens",
                                f"entries {int(values[at])}, {int(values[at + 1])} at {at}, {at + 1}",
                                "cu_seqlens must be strictly increasing (every sequence has at least one token)",
                                "drop empty sequences" if steps[at] == 0 else "give cumulative lengths (each entry "
                                "the previous plus a sequence's length), not the lengths themselves"))  # fmt: skip
    if values[-1] != total:
        found.append(_violation("cu_seqlens.end", "cu_seqlens", f"last entry {int(values[-1])}",
                                f"cu_seqlens must end at the packed token count T={total}",
                                "give the boundaries of exactly the tokens passed"))  # fmt: skip
    return found


def padded_offsets(seq_lens: Sequence[int], chunk: int) -> tuple[list[int], tuple[int, ...]]:
    """Where each sequence starts in the packed, per-sequence-padded layout, and its chunk count."""
    chunks = tuple(-(-int(n) // chunk) for n in seq_lens)
    starts = list(np.cumsum((0, *chunks[:-1])) * chunk)
    return [int(s) for s in starts], chunks


def pack_padded(x: np.ndarray, cu_seqlens: Sequence[int], starts: list[int], padded_len: int) -> np.ndarray:
    """Copy the tokens (axis 2) of each sequence ``cu_seqlens[i]:cu_seqlens[i+1]`` of ``x`` to ``starts[i]`` of a
    zero array ``padded_len`` tokens long: the padding tokens are zeros (g = 0, β = 0 for the gates)."""
    shape = list(x.shape)
    shape[2] = padded_len
    packed = np.zeros(shape, dtype=x.dtype)
    for i, start in enumerate(starts):
        lo, hi = cu_seqlens[i], cu_seqlens[i + 1]
        packed[:, :, start : start + hi - lo] = x[:, :, lo:hi]
    return packed


def unpack_padded(x: np.ndarray, cu_seqlens: Sequence[int], starts: list[int]) -> np.ndarray:
    """The real tokens of a packed, per-sequence-padded array, back to back (the inverse of ``pack_padded``)."""
    return np.concatenate(
        [x[:, :, start : start + cu_seqlens[i + 1] - cu_seqlens[i]] for i, start in enumerate(starts)], axis=2
    )
