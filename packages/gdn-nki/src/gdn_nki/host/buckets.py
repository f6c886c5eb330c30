"""Bucketed serving prefill on the host: choose a bucket, check the layout, pack and pad the batch to it, and launch
``gdn_cte_bucket`` once (``prefill_bucket``).

Buckets. A bucket is (T tokens, N sequence slots); every batch it holds runs the same compiled program. T counts
each sequence padded to its own chunk multiple, not its real tokens (``padded_tokens`` sizes a batch). A server
names its buckets once (``configure_buckets``, e.g. at model load, where it compiles them); a call without
``bucket=`` then takes the smallest configured bucket that holds it (fewest tokens, then fewest slots). With no
bucket configured and none passed, ``prefill_varlen`` keeps its trace-time form (one program per batch layout),
which is the faster choice for one-off calls: it pads nothing beyond each sequence's chunk multiple.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from gdn_ref import bucketed
from gdn_ref.bucketed import bucket_violations
from gdn_ref.constants import ALGORITHM_SCHUR, CHUNK_BY_ALGORITHM, CHUNK_SCHUR, DEFAULT_ALGORITHM, DEFAULT_GROUP_SIZE
from gdn_ref.contract import Arguments, ContractError, Violation, is_integer, names_entry_point, plain_int
from gdn_ref.masks import default_mask_pack
from gdn_ref.norm import API as NORM_API
from gdn_ref.packed import rows_need_pool, sequence_value_violations, tensor_violations

from ..common import backend
from ..common.state_layout import kmajor_shape
from ..cte.bucket import MAX_CHUNKS, MAX_POOL_ROWS, MAX_SEQUENCES, gdn_cte_bucket
from ..cte.plan import TOKEN_ARGUMENTS, packed_plan, pad_tokens
from ..norm.rules import output_norm_violations
from ..normed.bucket import gdn_cte_bucket_normed
from .conv import _finite
from .launch_grid import check_grid
from .overflow import largest_strength, refuse_overflow
from .pool_layout import checked_layout, kmajor
from .staging import commit, stage

_BUCKETS: list[tuple[int, int]] = []


@names_entry_point("gdn_nki.configure_buckets")
def configure_buckets(buckets: Sequence[tuple[int, int]]) -> None:
    """Set the buckets calls without ``bucket=`` choose from (an empty list: none; ``prefill_varlen`` then keeps
    its trace-time form).

    Args:
        buckets: (T, N) pairs of positive ints (numpy's too): T tokens, a multiple of the chunk (128: the bucket's
            program runs "schur") and at most ``MAX_CHUNKS`` chunks; N sequence slots, at most ``MAX_SEQUENCES``.
            T counts every sequence padded to its chunk multiple (``gdn_nki.padded_tokens``).

    Notes:
        A bucket no launch can run is refused here, naming it, rather than at every call it would be chosen for;
        nothing is configured then (the previous buckets stay).
    """
    chosen = []
    for bucket in buckets:
        ok = isinstance(bucket, (tuple, list)) and len(bucket) == 2
        if not ok or not all(is_integer(x) and x > 0 for x in bucket):
            raise ContractError([Violation("bucket.form", "buckets", f"entry {bucket!r}",
                                           "a bucket is (T tokens, N sequences), positive ints",
                                           "pass e.g. [(2048, 8), (8192, 16)]")])  # fmt: skip
        violations = bucket_limit_violations(bucket, CHUNK_SCHUR, "buckets")
        if bucket[0] % CHUNK_SCHUR:
            violations.insert(0, Violation("bucket.tokens", "buckets", f"entry {bucket!r}: T={bucket[0]}",
                                           f"T must be a multiple of the chunk ({CHUNK_SCHUR}: the bucket's program "
                                           'runs "schur")', f"round T up to a multiple of {CHUNK_SCHUR}"))  # fmt: skip
        if violations:
            raise ContractError(violations)
        chosen.append((int(bucket[0]), int(bucket[1])))
    _BUCKETS[:] = sorted(set(chosen))


def bucket_limit_violations(bucket: tuple[int, int], chunk: int, argument: str = "bucket") -> list[Violation]:
    """What one compiled bucket program can hold: at most ``MAX_SEQUENCES`` slots and ``MAX_CHUNKS`` chunks (the
    partitions and columns of its boundary tables). gdn-ref's bucketed rules are every kernel's; these are this
    kernel's. Nothing when the bucket's form is broken (its own rule reports that).

    Args:
        bucket: (T, N) as passed. chunk (int): the algorithm's chunk.
        argument (str): what the caller passed: "bucket", "buckets" (``configure_buckets``) or "cu_seqlens" (no
            bucket: the batch runs in one of its own size).

    Returns:
        list[Violation]: the broken limits, each naming ``argument`` and the bucket.
    """
    if not (isinstance(bucket, (tuple, list)) and len(bucket) == 2 and all(is_integer(x) for x in bucket)):
        return []
    tokens, slots = (int(x) for x in bucket)
    chunks = -(-tokens // chunk)
    sizes = {
        "buckets": (f"entry {(tokens, slots)}: N={slots}", f"entry {(tokens, slots)}: T={tokens} ({chunks} chunks)"),
        "cu_seqlens": (f"{slots} sequences", f"{tokens} tokens, each sequence padded to its chunk multiple "
                       f"({chunks} chunks)"),
    }.get(argument, (f"N={slots}", f"T={tokens} ({chunks} chunks)"))  # fmt: skip
    found = []
    if slots > MAX_SEQUENCES:
        found.append(Violation("bucket.max_sequences", argument, sizes[0],
                               f"a bucket's program has at most {MAX_SEQUENCES} sequence slots (one partition each "
                               "of its boundary tables)", f"use buckets of at most {MAX_SEQUENCES} slots and split "
                               "a larger batch over launches"))  # fmt: skip
    if tokens > MAX_CHUNKS * chunk:
        found.append(Violation("bucket.max_chunks", argument, sizes[1],
                               f"a bucket's program covers at most {MAX_CHUNKS} chunks of {chunk} tokens (a column "
                               f"each of its boundary tables): T <= {MAX_CHUNKS * chunk}",
                               f"use buckets of at most {MAX_CHUNKS * chunk} tokens, and prefill a longer prompt in "
                               "pieces (chunked prefill: each piece starts from the row the last one stored)"))  # fmt: skip
    return found


def configured_buckets() -> tuple[tuple[int, int], ...]:
    """The buckets set by ``configure_buckets``, smallest first."""
    return tuple(_BUCKETS)


def smallest_bucket(lengths: Sequence[int], chunk: int) -> tuple[int, int] | None:
    """The smallest configured bucket holding sequences of these lengths (each padded to its chunk multiple), or
    None when no bucket is configured; ``ContractError`` when buckets are configured but none holds the batch."""
    if not _BUCKETS:
        return None
    needed = bucketed.padded_tokens(lengths, chunk)
    for tokens, slots in _BUCKETS:
        if tokens >= needed and slots >= len(lengths) and tokens % chunk == 0:
            return tokens, slots
    raise ContractError([Violation("bucket.none_holds", "bucket", f"None for {len(lengths)} sequences of "
                                   f"{int(np.sum(lengths))} tokens in all, {needed} padded to their chunk multiples",
                                   f"no configured bucket holds the batch (configured: {list(_BUCKETS)}); a bucket's "
                                   f"T counts each sequence padded to its own chunk multiple ({chunk})",
                                   "configure a larger bucket, pass bucket=(T, N), or split the batch "
                                   "(gdn_nki.padded_tokens sizes a batch before it is formed)")])  # fmt: skip


@names_entry_point("gdn_nki.padded_tokens")
def padded_tokens(*, cu_seqlens: Any = None, lengths: Any = None, algorithm: str = DEFAULT_ALGORITHM) -> int:
    """The tokens a batch takes in a bucket: each sequence padded to its own chunk multiple, summed. What a
    scheduler compares with a bucket's T before it forms a batch (three prompts of 1024 tokens in all — 300, 300,
    424 — take 1280, not 1024: they do not fit a 1024-token bucket).

    Args:
        cu_seqlens: the batch's boundaries, [n + 1] integers from 0, non-decreasing (empty sequences allowed), or
        lengths: its sequence lengths, [n] non-negative integers (pass exactly one, by keyword).
        algorithm (str): whose chunk pads the sequences ("schur": 128, the bucket's program; "neumann": 64).

    Returns:
        int: the padded token count (a bucket of T >= it, and N >= n slots, holds the batch).

    Notes:
        ``ContractError`` (argument, value, rule, fix) for a malformed batch or an unknown algorithm.
    """
    found, chunk = [], CHUNK_BY_ALGORITHM.get(algorithm) if isinstance(algorithm, str) else None
    if chunk is None:
        found.append(Violation("algorithm.known", "algorithm", f"value {algorithm!r}",
                               f"algorithm must be one of {tuple(CHUNK_BY_ALGORITHM)}", 'pass algorithm="schur"'))  # fmt: skip
    sizes, broken = bucketed.batch_lengths(cu_seqlens, lengths)
    if found or broken:
        raise ContractError(found + broken)
    return bucketed.padded_tokens(sizes, chunk)


@names_entry_point("gdn_nki.prefill_bucket")
def prefill_bucket(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    g_log: np.ndarray,
    beta: np.ndarray,
    cu_seqlens: np.ndarray,
    bucket: tuple[int, int] | None = None,
    scale: float = 1.0,
    algorithm: str = DEFAULT_ALGORITHM,
    mask_pack: np.ndarray | None = None,
    group_size: int = DEFAULT_GROUP_SIZE,
    recurrent_state: np.ndarray | None = None,
    state_indices: np.ndarray | None = None,
    checkpoint_every: int | None = None,
    checkpoint_indices: np.ndarray | None = None,
    read_indices: np.ndarray | None = None,
    *,
    grid: int | None = None,
    check_values: bool = True,
    on_commit: Callable[[], None] | None = None,
    state_v_first: bool = False,
    z: np.ndarray | None = None,
    norm_weight: np.ndarray | None = None,
    norm_eps: float = 1e-6,
    norm_activation: str = "silu",
) -> tuple[np.ndarray, np.ndarray]:
    """Packed sequences in ONE launch of the bucket's program (``gdn_cte_bucket``), the pool read and written by
    the kernel; with ``z``, the layer's gated RMSNorm in the same launch (``gdn_cte_bucket_normed``).

    Dimensions:
        T: packed tokens passed; n: sequences (some may be empty); P: pool rows; K: checkpoints per sequence.

    Args:
        query, key, value, g_log, beta: head-major packed tensors, as ``prefill_varlen``.
        cu_seqlens: [n + 1] integers from 0, non-decreasing (a repeated entry is an empty sequence), ending at T.
        bucket: (T_bucket, N): the program to run; None: the smallest configured bucket holding the batch, or
            without configured buckets the batch's own size (module docstring). T_bucket counts every sequence
            padded to its chunk multiple (``padded_tokens``): N <= 128 slots, at most 511 chunks.
        scale, algorithm, mask_pack, group_size: as ``prefill_varlen`` (the bucket kernel needs "schur": it
            starts sequences from pool rows).
        recurrent_state: optional [P, Hv, Dk, Dv] fp32 pool, updated in place; omitted: every sequence starts
            from zero and a pool of n rows (row i = sequence i's final state) is made and returned, and the row
            arguments below are refused (they name rows of a pool; the trace-time form refuses them alike).
        state_indices: [n] pool rows, −1 = start from zero and store nothing; omitted: row i.
        checkpoint_every: tokens between checkpoints (a chunk multiple), or None.
        checkpoint_indices: [n, K] pool rows: row of the state after ``(k + 1) · checkpoint_every`` tokens of
            sequence i, −1 = none; a checkpoint past the sequence's length is not stored.
        read_indices: optional [n] pool rows sequence i starts from instead of its ``state_indices`` row (−1:
            zero), e.g. a prefix-cache row a request resumes from and must not overwrite; rows may repeat, none
            may be written by the launch for another sequence or a checkpoint. Omitted: the ``state_indices`` rows.
        grid, check_values, on_commit: as ``prefill_varlen`` (value heads are split over the grid's programs).
        state_v_first: the pool is V-major [P, Hv, Dv, Dk], read and written so by the kernel, as
            ``prefill_varlen``'s (a pool made here is V-major too).
        z: optional [1, T, Hv, Dv] in query's dtype, seq-first (the layer's z projection, packed as query): the
            gate of the gated RMSNorm folded into the output stage; out is then y = rmsnorm(o) · norm_weight ·
            act(z) per token and value head (FLA's ``FusedRMSNormGated``, HF's ``Qwen3NextRMSNormGated``).
        norm_weight: with ``z``, the norm's [Dv] float32 or bfloat16 weight, or None (no scale).
        norm_eps, norm_activation: with ``z``, the norm's eps (HF's ``rms_norm_eps``) and gate ("silu" / "swish"
            or "sigmoid").

    Returns:
        tuple: (out [1, Hv, T, Dv] in query's dtype — y with ``z``, bit for bit ``gated_rms_norm`` of the out
        without it and z head-major —, the pool).

    Notes:
        Every rule is checked before the launch (``gdn_ref.bucketed``, and what one bucket program holds), and with
        ``check_values`` the values of the inputs and of the pool rows the launch reads (a NaN left in a free row
        must not reach a sequence), every sequence holding a bad one named in the one error
        (``ContractError.sequences``); a rejected call changes nothing. On this CPU the kernel runs on a staged
        copy of the pool and only the rows it names are committed once it has completed; on Trainium the kernel
        writes the named rows of the device pool itself.
    """
    grid, group_size, checkpoint_every = check_grid(grid), plain_int(group_size), plain_int(checkpoint_every)
    v_first = checked_layout(query, value, recurrent_state, state_v_first)
    mask_pack = default_mask_pack(mask_pack, algorithm)
    given = kmajor(recurrent_state, v_first)  # what the rules and scans read; the kernel gets the caller's layout
    call = Arguments(query, key, value, g_log, beta, scale, algorithm, mask_pack, group_size, given)
    violations = tensor_violations(call, padded=False, values=False)
    if not violations and algorithm != ALGORITHM_SCHUR:
        violations = [Violation("bucket.algorithm", "algorithm", f"value {algorithm!r}",
                                'a bucket\'s program runs "schur" only: it starts every sequence from a pool row, and '
                                '"neumann" takes no initial state', 'pass algorithm="schur", or run "neumann" without '
                                "a bucket (prefill_varlen with no bucket configured)")]  # fmt: skip
    # Row arguments without a pool are refused, as the trace-time form refuses them (``state_indices.pool``): the
    # pool made below holds one row per sequence, and rows naming another layout would reorder or drop its states.
    violations += rows_need_pool(recurrent_state, state_indices=state_indices, checkpoint_indices=checkpoint_indices,
                                 read_indices=read_indices)  # fmt: skip
    violations += folded_norm_violations(query, value, z, norm_weight, norm_eps, norm_activation, check_values)
    if violations:
        raise ContractError(violations)
    chunk = CHUNK_BY_ALGORITHM[algorithm]
    bounds = np.asarray(cu_seqlens)
    seqs = max(bounds.size - 1, 0)
    pool = recurrent_state
    if pool is None:
        dk, dv = query.shape[3], value.shape[3]
        pool = np.zeros(kmajor_shape((seqs, value.shape[1], dk, dv), v_first), np.float32)
        read_indices = np.full(seqs, -1, np.int32)  # every sequence starts from zero: no row of the fresh pool is read
    rows = np.arange(seqs) if state_indices is None else state_indices
    violations = bucket_violations(
        cu_seqlens, query.shape[2], chunk, bucket, pool.shape[0], rows, checkpoint_every, checkpoint_indices,
        read_indices,
    )  # fmt: skip
    if not violations:
        violations = bucket_limit_violations(bucket, chunk) if bucket is not None else []
    if not violations and bucket is None:
        bucket = _choose(np.diff(bounds.astype(np.int64)), chunk)
        violations = bucket_violations(cu_seqlens, query.shape[2], chunk, bucket, pool.shape[0], rows)
        violations = violations or bucket_limit_violations(bucket, chunk, "cu_seqlens")  # the batch's own size
    if not violations and recurrent_state is not None:
        violations = _pool_violations(given, call)
    lengths = np.diff(bounds.astype(np.int64))
    if not violations and check_values:
        starts = rows if read_indices is None else read_indices
        reading = [i for i, (r, n) in enumerate(zip(starts, lengths, strict=True)) if r >= 0 and n > 0]
        read = [int(starts[i]) for i in reading]
        # every sequence with a bad value, its inputs' and its start row's, in one error (a server drops them)
        violations = sequence_value_violations(call, bounds, kmajor(pool, v_first)[read], read, reading)
    if violations:
        raise ContractError(violations)
    plan = packed_plan(lengths, chunk)
    tokens, slots = (int(x) for x in bucket)  # the rules took numpy's integers too; the kernel is given ints
    packed = {name: pad_tokens(plan.pack(getattr(call, name)), tokens - plan.padded_len) for name in TOKEN_ARGUMENTS}
    chunk_bounds = np.full(slots + 1, sum(plan.seq_chunks), np.int32)
    chunk_bounds[: seqs + 1] = np.cumsum((0, *plan.seq_chunks))
    slot_rows = np.full(slots, -1, np.int32)
    slot_rows[:seqs] = np.asarray(rows)
    extra = {}
    if checkpoint_every is not None:
        extra = {
            "checkpoint_every": checkpoint_every,
            "checkpoint_indices": _checkpoint_rows(checkpoint_indices, lengths, checkpoint_every, slots),
        }
    if read_indices is not None:
        extra["read_indices"] = np.full(slots, -1, np.int32)
        extra["read_indices"][:seqs] = np.asarray(read_indices)
    checkpoints = [] if checkpoint_every is None else [int(r) for r in extra["checkpoint_indices"].flat if r >= 0]
    named = [int(r) for r in slot_rows if r >= 0] + checkpoints
    kernel = gdn_cte_bucket
    if z is not None:  # z packed as q/k/v (head-major to pack), handed over seq-first
        head_major = pad_tokens(plan.pack(np.asarray(z).transpose(0, 2, 1, 3)), tokens - plan.padded_len)
        extra.update(z=np.ascontiguousarray(head_major.transpose(0, 2, 1, 3)), norm_weight=norm_weight,
                     eps=float(norm_eps), activation=norm_activation)  # fmt: skip
        kernel = gdn_cte_bucket_normed
    staged = stage(pool, ...)  # the kernel addresses the whole pool; only the named rows are committed
    kernel = kernel if grid is None else kernel[grid]
    out, _ = backend.simulate(kernel)(
        **packed, chunk_bounds=chunk_bounds, state_indices=slot_rows, state_pool=staged, scale=scale,
        algorithm=algorithm, mask_pack=mask_pack, group_size=group_size, state_v_first=v_first, **extra,
    )  # fmt: skip
    out = plan.unpack(out[:, :, : plan.padded_len])
    if check_values:  # the rows the launch computed from scanned values (an empty sequence's row carries its own)
        computed = [int(r) for r, n in zip(slot_rows[:seqs], lengths, strict=True) if r >= 0 and n > 0]
        written = {f"state pool row {r}": staged[r] for r in computed + checkpoints}  # none past a sequence's end
        refuse_overflow({"out": out, **written}, lambda: largest_strength(key, beta, 1))
    commit(pool, named, staged[named], on_commit)
    return out, pool


# The norm's rules name its arguments as the kernel does; this entry point's keywords are these.
_NORM_NAMES = {"x": "z", "g": "z", "weight": "norm_weight", "eps": "norm_eps", "activation": "norm_activation"}


def folded_norm_violations(
    query: Any, value: Any, z: Any, weight: Any, eps: Any, activation: Any, check_values: bool = False
) -> list[Violation]:
    """The folded norm's rules (``norm.rules.output_norm_violations``: z [1, T, Hv, Dv] in query's dtype, the
    weight, eps, the gate), named by this entry point's keywords, and with ``check_values`` finite z and weight;
    nothing without ``z``. A weight or option given without ``z`` is refused: it would be silently unused."""
    if z is None:
        given = [name for name, unset in (("norm_weight", weight is None), ("norm_eps", eps == 1e-6),
                                          ("norm_activation", activation == "silu")) if not unset]  # fmt: skip
        if not given:
            return []
        return [Violation("norm.fused_gate", given[0], "given without z", "the folded norm's options need its "
                          "gate z", "pass z (the layer's z projection), or drop " + given[0], NORM_API)]  # fmt: skip
    found = output_norm_violations(query, value, z, weight, eps, activation)
    if not found and check_values:
        found = [v for name, a in (("z", z), ("weight", weight)) for v in _finite(name, a, NORM_API, "norm.finite")]
    return [dataclasses.replace(v, argument=_NORM_NAMES.get(v.argument, v.argument)) for v in found]


def _choose(lengths: np.ndarray, chunk: int) -> tuple[int, int]:
    """The smallest configured bucket holding the batch, else the batch's own size (its padded tokens, its
    sequences)."""
    chosen = smallest_bucket(lengths, chunk)
    if chosen is not None:
        return chosen
    return max(chunk, bucketed.padded_tokens(lengths, chunk)), len(lengths)


def _pool_violations(pool: np.ndarray, call: Arguments) -> list[Violation]:
    """The pool is [P, Hv, Dk, Dv] float32, writable, with fewer than ``MAX_POOL_ROWS`` rows."""
    want = (call.value.shape[1], call.query.shape[3], call.value.shape[3])
    shape = tuple(getattr(pool, "shape", ()))
    if len(shape) == 4 and shape[1:] == want and getattr(pool, "dtype", None) == np.float32:
        if shape[0] >= MAX_POOL_ROWS:
            return [Violation("bucket.pool_rows", "recurrent_state", f"{shape[0]} rows",
                              f"the bucket kernel addresses pool rows through exact float32 tables: at most "
                              f"{MAX_POOL_ROWS - 1} rows", "keep the pool below 2**24 rows, or split it")]  # fmt: skip
        if getattr(getattr(pool, "flags", None), "writeable", True):
            return []
    return [Violation("bucket.pool", "recurrent_state", f"shape {shape} {getattr(pool, 'dtype', None)}",
                      f"the state pool must be a writable [P, {', '.join(map(str, want))}] float32 array",
                      "pass the pool the server keeps its recurrent states in")]  # fmt: skip


def _checkpoint_rows(table: np.ndarray, lengths: np.ndarray, every: int, slots: int) -> np.ndarray:
    """[N, K] int32 checkpoint rows per slot: the caller's, −1 past each sequence's length and for empty slots."""
    table = np.asarray(table)
    rows = np.full((slots, table.shape[1]), -1, np.int32)
    taken = (np.arange(1, table.shape[1] + 1)[None, :] * every) <= lengths[:, None]
    rows[: len(lengths)] = np.where(taken, table, -1)
    return rows
