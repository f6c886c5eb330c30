"""The packed variable-length layout's rules as data, beside gdn_cte's own (``contract.RULES``).

A packed call is gdn_cte's on tensors [1, H, T, D] that hold N sequences back to back: on the host their
boundaries are ``cu_seqlens`` (FlashAttention's cumulative lengths over the T real tokens); a kernel sees each
sequence padded to its chunk multiple, ``seq_chunks`` chunks long. Each sequence starts from, and writes its final
state to, one row of the state: ``recurrent_state`` is then [N, Hv, Dk, Dv] (row i = sequence i) or a pool
[P, Hv, Dk, Dv] whose rows are named by ``state_indices``.

Every rule is a ``contract.Rule`` (id, sentence, arguments, check) in one of the tables below, and every broken
rule is reported as a ``contract.Violation`` naming the argument, the value, the rule and the fix, so an entry
point raises ``contract.ContractError`` for a packed layout exactly as for any other argument. Within a chained
table (``LAYOUT_RULES``, ``POOL_RULES``) a rule assumes the ones before it hold, and only the first broken one is
reported; the rules of ``CU_SEQLENS_RULES`` after its form rule are reported together.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .constants import CHUNK_BY_ALGORITHM
from .contract import VALUE_SCANS, Arguments, Rule, Violation, first_bad_index, is_integer

# The dense rule about the state's shape is replaced by the pool's (``POOL_RULES``); every other documented rule
# (dtype fp32, writable, neumann takes no state) applies to the pool as written.
DENSE_STATE_SHAPE = "recurrent_state.shape"
# Before padding, the packed token count need not be a chunk multiple (each sequence is padded on its own).
SEQ_DIVISIBLE = "seq.divisible"
# Rules whose violation means the tensors' token axis is not where the head-major layout puts it (seq-first
# tensors, a 3-D query): cu_seqlens, judged against query.shape[2], would then be blamed for the tensors' mistake.
TOKEN_LAYOUT_RULES = frozenset(
    f"{name}.{rule}" for name in ("query", "key", "value", "g_log", "beta") for rule in ("rank", "shape")
)


@dataclass(frozen=True)
class PackedCall:
    """What the packed rules read: the layout arguments, and the dimensions the tensors imply.

    Attributes:
        cu_seqlens: the host's sequence boundaries as passed (``CU_SEQLENS_RULES``).
        batch, tokens: the tensors' batch B and packed token count T (``query.shape[0]`` and ``[2]``).
        state_indices: the host's pool rows as passed (``STATE_INDICES_RULES``).
        seq_chunks: chunks per sequence (``LAYOUT_RULES``: the kernel's trace-time tuple, or the host's, derived).
        chunk: the algorithm's chunk; ``padded``: the tokens are already padded per sequence (the kernel's view).
        value_shape, state, state_rows: value's shape, the state or pool, and its row per sequence as a tuple of
            ints, or None for row i = sequence i (``POOL_RULES``).
    """

    cu_seqlens: Any = None
    batch: int = 1
    tokens: int = 0
    state_indices: Any = None
    seq_chunks: Any = None
    chunk: int = 0
    padded: bool = True
    query_shape: tuple[int, ...] = ()
    value_shape: tuple[int, ...] = ()
    state: Any = None
    state_rows: Any = None

    @property
    def boundaries(self) -> np.ndarray | None:
        """``cu_seqlens`` as a 1-D integer array of at least two entries, or None when its form is broken."""
        values = integer_vector(self.cu_seqlens)
        return values if values is not None and values.size >= 2 else None


def integer_vector(values: Any) -> np.ndarray | None:
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


# --- cu_seqlens: the host's sequence boundaries ---


def _cu_seqlens_form(call: PackedCall) -> Violation | None:
    if call.boundaries is not None:
        return None
    return Violation("cu_seqlens.form", "cu_seqlens", _describe_vector(call.cu_seqlens),
                     "cu_seqlens must be a 1-D integer tensor [N + 1] (N >= 1 sequences)",
                     "pass the cumulative sequence lengths, e.g. [0, len0, len0 + len1, ...]")  # fmt: skip


def _cu_seqlens_batch(call: PackedCall) -> Violation | None:
    if call.boundaries is None or call.batch == 1:
        return None
    return Violation("cu_seqlens.batch", "cu_seqlens", f"with batch B={call.batch}",
                     "with cu_seqlens the sequences are packed into one row, so B must be 1",
                     "flatten the batch into [1, T_total, ...] and give its boundaries in cu_seqlens")  # fmt: skip


def _cu_seqlens_start(call: PackedCall) -> Violation | None:
    values = call.boundaries
    if values is None or values[0] == 0:
        return None
    return Violation("cu_seqlens.start", "cu_seqlens", f"first entry {int(values[0])}", "cu_seqlens must start at 0",
                     "prepend 0")  # fmt: skip


def _cu_seqlens_increasing(call: PackedCall) -> Violation | None:
    values = call.boundaries
    if values is None:
        return None
    steps = np.diff(values.astype(np.int64))
    if not (steps <= 0).any():
        return None
    at = int(np.argmax(steps <= 0))
    fix = ("drop empty sequences" if steps[at] == 0 else
           "give cumulative lengths (each entry the previous plus a sequence's length), not the lengths themselves")  # fmt: skip
    return Violation("cu_seqlens.increasing", "cu_seqlens",
                     f"entries {int(values[at])}, {int(values[at + 1])} at {at}, {at + 1}",
                     "cu_seqlens must be strictly increasing (every sequence has at least one token)", fix)  # fmt: skip


def _cu_seqlens_end(call: PackedCall) -> Violation | None:
    values = call.boundaries
    if values is None or values[-1] == call.tokens:
        return None
    return Violation("cu_seqlens.end", "cu_seqlens", f"last entry {int(values[-1])}",
                     f"cu_seqlens must end at the packed token count T={call.tokens}",
                     "give the boundaries of exactly the tokens passed")  # fmt: skip


CU_SEQLENS_RULES: tuple[Rule, ...] = (
    Rule("cu_seqlens.form", "cu_seqlens: [N + 1] integers", ("cu_seqlens",), _cu_seqlens_form),
    Rule("cu_seqlens.batch", "with cu_seqlens, B == 1", ("cu_seqlens",), _cu_seqlens_batch),
    Rule("cu_seqlens.start", "cu_seqlens[0] == 0", ("cu_seqlens",), _cu_seqlens_start),
    Rule("cu_seqlens.increasing", "cu_seqlens[i] < cu_seqlens[i + 1]", ("cu_seqlens",), _cu_seqlens_increasing),
    Rule("cu_seqlens.end", "cu_seqlens[N] == T", ("cu_seqlens",), _cu_seqlens_end),
)


# --- state_indices: the host's pool rows, before their values are read ---


def _state_indices_form(call: PackedCall) -> Violation | None:
    if call.state_indices is None or integer_vector(call.state_indices) is not None:
        return None
    return Violation("state_indices.form", "state_indices", _describe_vector(call.state_indices),
                     "state_indices must be a 1-D integer array [N] of pool rows, one per sequence",
                     "pass integer row numbers, one per sequence, e.g. [3, 0]")  # fmt: skip


STATE_INDICES_RULES: tuple[Rule, ...] = (
    Rule("state_indices.form", "state_indices: [N] integer pool rows", ("state_indices",), _state_indices_form),
)


# --- the packed layout: seq_chunks cover the tokens of batch row 0 (chained) ---


def _packed_batch(call: PackedCall) -> Violation | None:
    if call.query_shape[0] == 1:
        return None
    return Violation("varlen.batch", "query", f"batch {call.query_shape[0]}",
                     "packed sequences live in batch row 0 (B == 1)", "pack the sequences into one row")  # fmt: skip


def _seq_chunks_form(call: PackedCall) -> Violation | None:
    seq_chunks = call.seq_chunks
    if isinstance(seq_chunks, tuple) and seq_chunks and all(is_integer(n) and n >= 1 for n in seq_chunks):
        return None
    return Violation("varlen.seq_chunks", "seq_chunks", f"value {seq_chunks!r}",
                     "seq_chunks must be a non-empty tuple of positive ints (chunks per sequence)",
                     "pass the padded length of each sequence divided by the chunk")  # fmt: skip


def _seq_chunks_cover(call: PackedCall) -> Violation | None:
    if not call.padded or sum(call.seq_chunks) * call.chunk == call.query_shape[2]:
        return None
    return Violation("varlen.cover", "seq_chunks", f"{sum(call.seq_chunks)} chunks of {call.chunk} tokens",
                     f"the sequences must cover exactly the S={call.query_shape[2]} packed tokens",
                     "pack each sequence padded to its chunk multiple, back to back")  # fmt: skip


LAYOUT_RULES: tuple[Rule, ...] = (
    Rule("varlen.batch", "packed sequences live in batch row 0", ("query",), _packed_batch),
    Rule("varlen.seq_chunks", "seq_chunks: positive ints, one per sequence", ("seq_chunks",), _seq_chunks_form),
    Rule("varlen.cover", "the padded sequences cover the packed tokens", ("seq_chunks",), _seq_chunks_cover),
)


# --- the state pool and its rows (chained) ---


def _pool_shape(call: PackedCall) -> tuple[int, ...]:
    return tuple(int(d) for d in call.state.shape)


def _expected_tail(call: PackedCall) -> tuple[int, int, int]:
    return int(call.value_shape[1]), call.query_shape[3], int(call.value_shape[3])


def _rows_need_pool(call: PackedCall) -> Violation | None:
    if call.state is not None or call.state_rows is None:
        return None
    return rows_need_pool(None, state_indices=call.state_rows)[0]


def rows_need_pool(state: Any, **rows: Any) -> list[Violation]:
    """Arguments naming pool rows (``state_indices``; in the bucketed form also ``checkpoint_indices`` and
    ``read_indices``), refused when no pool is supplied (``state`` None): the returned state is then one row per
    sequence, and rows naming a pool that does not exist would put the final states in the rows' order (or drop
    the -1 rows') instead of the sequences'.

    Args:
        state: the pool (``recurrent_state``) as passed, or None.
        rows: each row argument by name, as passed (None: not given).

    Returns:
        list[Violation]: one per row argument given without a pool.
    """
    if state is not None:
        return []
    found = []
    for name, values in rows.items():
        if values is None:
            continue
        vector = np.asarray(values) if integer_vector(values) is not None or np.ndim(values) == 2 else None
        value = f"{vector.size} pool row(s)" if vector is not None else _describe_vector(values)
        found.append(Violation(f"{name}.pool", name, value, f"{name} name rows of a state pool, so one must be "
                               "supplied", f"pass the pool as recurrent_state (initial_state), or no {name}"))  # fmt: skip
    return found


def _pool_layout(call: PackedCall) -> Violation | None:
    if call.state is None:
        return None
    tail, shape = _expected_tail(call), _pool_shape(call)
    if len(shape) == 4 and shape[1:] == tail and shape[0] >= 1:
        return None
    return Violation("state_pool.shape", "recurrent_state", f"shape {shape}",
                     f"the state pool must be [P, Hv, Dk, Dv] = [P, {', '.join(map(str, tail))}]",
                     "allocate the pool with the value heads and head dims of this call")  # fmt: skip


def _pool_rows(call: PackedCall) -> Violation | None:
    n_seqs = len(call.seq_chunks)
    if call.state is None or call.state_rows is not None or _pool_shape(call)[0] == n_seqs:
        return None
    return Violation("state_pool.rows", "recurrent_state", f"{_pool_shape(call)[0]} row(s)",
                     f"without state_indices the state holds one row per sequence ({n_seqs})",
                     "pass one state row per sequence, or name each sequence's pool row in state_indices")  # fmt: skip


def _row_count(call: PackedCall) -> Violation | None:
    rows, n_seqs = call.state_rows, len(call.seq_chunks)
    if call.state is None or rows is None:
        return None
    if isinstance(rows, tuple) and len(rows) == n_seqs and all(is_integer(r) for r in rows):
        return None
    return Violation("state_indices.count", "state_indices", f"value {rows!r}",
                     f"one integer pool row per sequence ({n_seqs})", "pass one pool row per sequence")  # fmt: skip


def _rows_in_pool(call: PackedCall) -> Violation | None:
    if call.state is None or call.state_rows is None:
        return None
    size = _pool_shape(call)[0]
    outside = [r for r in call.state_rows if not 0 <= r < size]
    if not outside:
        return None
    # -1 (vLLM's / SGLang's PAD_SLOT_ID) is a padding sequence only in the bucketed form (``gdn_ref.bucketed``)
    padding = (
        " (-1, a padding sequence's PAD_SLOT_ID, is accepted only by the bucketed form: pass bucket=(T, N), "
        "or configure buckets with gdn_nki.configure_buckets)"
        if -1 in outside
        else ""
    )
    return Violation("state_indices.range", "state_indices", f"rows {outside}",
                     f"every row must index the pool's {size} rows", f"use rows in [0, {size}){padding}")  # fmt: skip


def _rows_distinct(call: PackedCall) -> Violation | None:
    rows = call.state_rows
    if call.state is None or rows is None:
        return None
    repeated = sorted({r for r in rows if rows.count(r) > 1})
    if not repeated:
        return None
    return Violation("state_indices.distinct", "state_indices", f"rows {repeated} named twice",
                     "each sequence writes its final state to its pool row, so the rows must be distinct",
                     "give every sequence its own pool row")  # fmt: skip


POOL_RULES: tuple[Rule, ...] = (
    Rule("state_indices.pool", "state_indices index a state pool", ("state_indices",), _rows_need_pool),
    Rule("state_pool.shape", "the pool is [P, Hv, Dk, Dv] fp32", ("recurrent_state",), _pool_layout),
    Rule("state_pool.rows", "without state_indices, one state row per sequence", ("recurrent_state",), _pool_rows),
    Rule("state_indices.count", "state_indices: one pool row per sequence", ("state_indices",), _row_count),
    Rule("state_indices.range", "state_indices: rows of the pool", ("state_indices",), _rows_in_pool),
    Rule("state_indices.distinct", "state_indices: distinct rows", ("state_indices",), _rows_distinct),
)


def _all(rules: tuple[Rule, ...], call: PackedCall) -> list[Violation]:
    return [v for v in (rule.check(call) for rule in rules) if v is not None]


def _first(rules: tuple[Rule, ...], call: PackedCall) -> list[Violation]:
    """The first broken rule of a chained table (each rule assumes the ones before it hold)."""
    for rule in rules:
        violation = rule.check(call)
        if violation is not None:
            return [violation]
    return []


def cu_seqlens_violations(cu_seqlens: Any, batch: int, total: int) -> list[Violation]:
    """The rules of FlashAttention-style cumulative sequence lengths over ``total`` packed tokens in one row."""
    return _all(CU_SEQLENS_RULES, PackedCall(cu_seqlens=cu_seqlens, batch=batch, tokens=total))


def state_indices_violations(state_indices: Any) -> list[Violation]:
    """The form of ``state_indices`` before its values are read: a 1-D sequence of integers (pool rows). Floats,
    strings, booleans and nested lists are rejected here rather than truncated or coerced by ``int()``."""
    return _all(STATE_INDICES_RULES, PackedCall(state_indices=state_indices))


def layout_violations(
    query: Any,
    value: Any,
    algorithm: Any,
    recurrent_state: Any,
    seq_chunks: Any,
    state_rows: Any,
    *,
    padded: bool = True,
    tensors_valid: bool = True,
) -> list[Violation]:
    """The packed launch's own rules: ``seq_chunks`` cover the tokens of batch row 0 (``padded``: as
    ``packed_violations``) and ``state_rows`` are distinct rows of the pool, the pool's only when the tensors'
    rules hold (``tensors_valid``). Nothing when query's layout or the algorithm is already wrong: the tensors'
    rules name that."""
    shape = tuple(getattr(query, "shape", ()))
    if len(shape) != 4 or not isinstance(algorithm, str) or algorithm not in CHUNK_BY_ALGORITHM:
        return []
    call = PackedCall(
        seq_chunks=seq_chunks, chunk=CHUNK_BY_ALGORITHM[algorithm], padded=padded, query_shape=shape,
        value_shape=tuple(getattr(value, "shape", ())), state=recurrent_state, state_rows=state_rows,
    )  # fmt: skip
    found = _first(LAYOUT_RULES, call)
    if not found and tensors_valid:
        found = _first(POOL_RULES, call)
    return found


def tensor_violations(
    call: Arguments, *, host: bool = True, padded: bool = True, values: bool = True
) -> list[Violation]:
    """gdn_cte's documented rules on the packed tensors, less the two a packed launch replaces: the dense state's
    shape (``POOL_RULES``) and, before padding (``padded`` False), the token count's divisibility."""
    skipped = {DENSE_STATE_SHAPE} if padded else {DENSE_STATE_SHAPE, SEQ_DIVISIBLE}
    return [v for v in call.violations(host=host, values=values) if v.rule_id not in skipped]


def packed_violations(
    call: Arguments,
    seq_chunks: Any,
    state_rows: Any,
    *,
    host: bool = True,
    padded: bool = True,
    values: bool = True,
) -> list[Violation]:
    """Every broken rule of a packed launch: gdn_cte's documented rules on the packed tensors
    (``tensor_violations``), then the layout (``seq_chunks`` cover the tokens of batch row 0) and the pool
    (``state_rows`` distinct rows of it).

    Args:
        padded (bool): the tensors are already packed with each sequence padded (the kernel's view); False on the
            host before padding, where the token count need not be a chunk multiple and is not checked against
            ``seq_chunks``.
        values (bool): on the host, also scan every element (``contract.check_values``).

    Returns:
        list[Violation]: empty when the launch is valid.
    """
    found = tensor_violations(call, host=host, padded=padded, values=values)
    return found + layout_violations(
        call.query, call.value, call.algorithm, call.recurrent_state, seq_chunks, state_rows, padded=padded,
        tensors_valid=not found,
    )  # fmt: skip


def packed_token_count(query: Any, found: Sequence[Violation]) -> int | None:
    """The packed token count T the tensors carry (``query.shape[2]``), or None when their layout rules are broken
    (``found``: the tensors' violations), so that cu_seqlens is not judged against a wrong T."""
    if any(v.rule_id in TOKEN_LAYOUT_RULES for v in found) or len(getattr(query, "shape", ())) != 4:
        return None
    return int(query.shape[2])


def pool_row_violations(
    rows_state: np.ndarray, rows: Sequence[int] | None, sequences: Sequence[int] | None = None
) -> list[Violation]:
    """The values rule of ``recurrent_state`` on the rows a launch reads: a pool's shape is not the dense
    [B, Hv, Dk, Dv] the contract's scan expects, and its other rows are never read, so only the named ones are
    scanned (a NaN left in a free row by an earlier request must not fail this one).

    Args:
        rows_state (np.ndarray): [n, Hv, Dk, Dv] fp32, the rows read, one per sequence that reads one.
        rows (Sequence[int] | None): the pool row of each (for the message), or None for a state of one row per
            sequence (no pool).
        sequences (Sequence[int] | None): the sequence (or decode request) each row is read for; None: the k-th
            row is sequence k.

    Returns:
        list[Violation]: one per sequence whose row holds a NaN/±Inf, naming the pool row, the sequence
        (``Violation.sequence``) and the index of its first one, so that a server can drop every such sequence.
    """
    found = []
    for k, row_state in enumerate(rows_state):
        where = first_bad_index(row_state, lambda block: ~np.isfinite(block))
        if where is None:
            continue
        seq = k if sequences is None else int(sequences[k])
        if rows is None:
            at = f"sequence {seq}, index {[seq, *where]}"
            fix = "pass a finite initial state for that sequence (or zeros)"
        else:
            at = f"pool row {rows[k]} (sequence {seq}), index {[int(rows[k]), *where]}"
            fix = "reset that row (zeros) before reusing it, or find where the previous request overflowed"
        found.append(Violation("recurrent_state.finite", "recurrent_state", f"value {float(row_state[where])} at {at}",
                               "the initial state of every sequence must hold finite numbers: NaN and ±Inf reach "
                               "every token of the sequence through the state", fix, sequence=seq))  # fmt: skip
    return found


# The packed tensors: their tokens run along axis 2 ([1, H, T(, D)]), cut into sequences by cu_seqlens.
PACKED_TENSORS = ("query", "key", "value", "g_log", "beta")


def sequence_value_violations(
    call: Arguments,
    cu_seqlens: Sequence[int] | np.ndarray,
    states: np.ndarray | None = None,
    rows: Sequence[int] | None = None,
    sequences: Sequence[int] | None = None,
) -> list[Violation]:
    """The value rules (``contract.VALUE_SCANS``: g_log <= 0 and not NaN, the rest finite) of the packed tensors,
    per sequence: every sequence with a bad element, and in it each argument's first, at its index in the packed
    tensor and naming the sequence (``Violation.sequence``; ``ContractError.sequences`` lists them) — one
    request's NaN must not hide another's, so a server can drop them all and launch the rest.

    Dimensions:
        T: packed tokens; n: sequences (``cu_seqlens`` [n + 1], from 0, non-decreasing, ending at T).

    Args:
        call (Arguments): the packed call (query/key [1, Hk, T, Dk], value [1, Hv, T, Dv], g_log/beta [1, Hv, T]),
            its layout rules already holding.
        cu_seqlens: the sequences' token boundaries.
        states, rows, sequences: the initial states the launch reads, as ``pool_row_violations`` takes them
            (None: none read), reported in the same list.

    Returns:
        list[Violation]: by sequence, then in the rules' order; empty when every value is in its domain.

    Notes:
        A clean tensor is read once, as ``contract.check_values`` reads it; only a tensor holding a bad element is
        read again, sequence by sequence.
    """
    bounds = [int(b) for b in np.asarray(cu_seqlens)]
    found = []
    for scan in VALUE_SCANS.values():
        if scan.argument not in PACKED_TENSORS or scan.first(getattr(call, scan.argument)) is None:
            continue
        x = getattr(call, scan.argument)
        for seq, (start, end) in enumerate(itertools.pairwise(bounds)):
            violation = scan.first(x[:, :, start:end], origin=(0, 0, start), sequence=seq)
            if violation is not None:
                found.append(violation)
    if states is not None:
        found += pool_row_violations(states, rows, sequences)
    return sorted(found, key=lambda v: v.sequence)  # stable: each sequence's in the rules' order
