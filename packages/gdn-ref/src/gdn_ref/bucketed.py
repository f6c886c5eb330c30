"""The rules of a bucketed serving launch's layout (a bucket of T tokens and N sequence slots): what a host checks
before it hands the layout to a kernel that reads it on device and trusts it.

They differ from a trace-time packed launch's (``gdn_ref.packed``) where a server's batches do: a sequence may be
empty, a slot may have no pool row (−1: start from zero, store nothing, the padding-slot convention of vLLM and
SGLang), and checkpoint rows (``checkpoint_indices``) are pool rows too. Each rule returns ``Violation``s naming
the argument, the value, the rule and the fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .contract import Violation, is_integer
from .packed import _describe_vector, integer_vector


def bucket_violations(
    cu_seqlens: Any,
    tokens: int,
    chunk: int,
    bucket: Any,
    pool_rows: int,
    state_indices: Any,
    checkpoint_every: Any = None,
    checkpoint_indices: Any = None,
    read_indices: Any = None,
) -> list[Violation]:
    """Every broken rule of a bucketed launch's layout.

    Args:
        cu_seqlens: [n + 1] integers from 0, non-decreasing (empty sequences allowed), ending at ``tokens``.
        tokens (int): packed real tokens passed.
        chunk (int): the algorithm's chunk.
        bucket: (T, N): T a positive chunk multiple holding every sequence padded to its chunk multiple, N >= n;
            None: not checked (the host has not chosen one yet).
        pool_rows (int): rows P of the state pool.
        state_indices: [n] integers, each −1 or a row in [0, P); distinct among sequences with tokens.
        checkpoint_every: None, or tokens between checkpoints, a positive chunk multiple.
        checkpoint_indices: with ``checkpoint_every`` (and only with it), [n, K] integers, each −1 or a pool row;
            distinct from each other and from the live ``state_indices``.
        read_indices: None (each sequence starts from its ``state_indices`` row), or [n] integers, each −1 (start
            from zero) or a pool row; rows may repeat, but none may be a row the launch writes for another
            sequence or a checkpoint (the launch would both read and overwrite it).

    Returns:
        list[Violation]: empty when the layout is valid.
    """
    bounds = integer_vector(cu_seqlens)
    if bounds is None or bounds.size < 2:
        return [Violation("bucket.cu_seqlens", "cu_seqlens", _describe_vector(cu_seqlens),
                          "cu_seqlens must be a 1-D integer tensor [n + 1] (n >= 1 sequence slots)",
                          "pass the cumulative sequence lengths, e.g. [0, len0, len0 + len1, ...]")]  # fmt: skip
    found = _bounds_violations(bounds.astype(np.int64), tokens)
    lengths = np.diff(bounds.astype(np.int64))
    if bucket is not None:
        found += _bucket_violations(bucket, lengths, chunk)
    found += _rows_violations(state_indices, lengths, pool_rows, checkpoint_every, checkpoint_indices, chunk)
    if read_indices is not None and not found:
        found += _read_violations(read_indices, state_indices, lengths, pool_rows, checkpoint_indices)
    return found


def padded_tokens(lengths: Sequence[int] | np.ndarray, chunk: int) -> int:
    """Tokens of sequences of these lengths packed with each padded to its own chunk multiple: what a bucket's T
    must hold (three prompts of 1024 tokens in all take 1280 tokens at chunk 128 when none is a chunk multiple)."""
    return int(sum(-(-int(n) // chunk) for n in lengths)) * chunk


def batch_lengths(cu_seqlens: Any = None, lengths: Any = None) -> tuple[np.ndarray | None, list[Violation]]:
    """A batch's sequence lengths from exactly one of its forms, with the rules each form keeps.

    Args:
        cu_seqlens: [n + 1] integers from 0, non-decreasing (a repeated entry is an empty sequence).
        lengths: [n] non-negative integers (a list of ints, or an integer array; empty: no sequence).

    Returns:
        tuple: the lengths as int64 [n] (None when a rule is broken), and the violations.
    """
    if (cu_seqlens is None) == (lengths is None):
        given = "both" if lengths is not None else "neither"
        return None, [Violation("batch.form", "cu_seqlens", f"{given} of cu_seqlens and lengths",
                                "a batch is given by its boundaries (cu_seqlens) or by its sequence lengths",
                                "pass cu_seqlens=... or lengths=..., one of them")]  # fmt: skip
    if cu_seqlens is not None:
        bounds = integer_vector(cu_seqlens)
        if bounds is None or bounds.size < 1:
            return None, [Violation("batch.cu_seqlens", "cu_seqlens", _describe_vector(cu_seqlens),
                                    "cu_seqlens must be a 1-D integer tensor [n + 1]",
                                    "pass the cumulative sequence lengths, e.g. [0, len0, len0 + len1, ...]")]  # fmt: skip
        bounds = bounds.astype(np.int64)
        found = _bounds_violations(bounds, int(bounds[-1]))
        return (None if found else np.diff(bounds)), found
    if np.size(lengths) == 0:
        return np.zeros(0, np.int64), []
    values = integer_vector(lengths)
    if values is None or (values < 0).any():
        value = _describe_vector(lengths) if values is None else f"{values.tolist()}"
        return None, [Violation("batch.lengths", "lengths", value, "lengths are the sequences' token counts: a 1-D "
                                "sequence of non-negative integers", "pass e.g. lengths=[300, 300, 424]")]  # fmt: skip
    return values.astype(np.int64), []


def _padding_text(lengths: np.ndarray, chunk: int, shown: int = 4) -> str:
    """How each sequence pads, for a message: "300 -> 384, 300 -> 384, 424 -> 512" (the first ``shown``)."""
    parts = [f"{int(n)} -> {-(-int(n) // chunk) * chunk}" for n in lengths[:shown]]
    return ", ".join(parts) + (f", ... ({len(lengths)} sequences)" if len(lengths) > shown else "")


def _bounds_violations(bounds: np.ndarray, tokens: int) -> list[Violation]:
    found = []
    if bounds[0] != 0:
        found.append(Violation("bucket.cu_seqlens_start", "cu_seqlens", f"first entry {int(bounds[0])}",
                               "cu_seqlens must start at 0", "prepend 0"))  # fmt: skip
    steps = np.diff(bounds)
    if (steps < 0).any():
        at = int(np.argmax(steps < 0))
        found.append(Violation("bucket.cu_seqlens_order", "cu_seqlens",
                               f"entries {int(bounds[at])}, {int(bounds[at + 1])} at {at}, {at + 1}",
                               "cu_seqlens must be non-decreasing (an empty sequence repeats an entry)",
                               "give cumulative lengths, not the lengths themselves"))  # fmt: skip
    if bounds[-1] != tokens:
        found.append(Violation("bucket.cu_seqlens_end", "cu_seqlens", f"last entry {int(bounds[-1])}",
                               f"cu_seqlens must end at the packed token count T={tokens}",
                               "give the boundaries of exactly the tokens passed"))  # fmt: skip
    return found


def _bucket_violations(bucket: Any, lengths: np.ndarray, chunk: int) -> list[Violation]:
    shape = tuple(bucket) if isinstance(bucket, (tuple, list)) else None
    if shape is None or len(shape) != 2 or not all(is_integer(x) for x in shape):
        return [Violation("bucket.form", "bucket", f"value {bucket!r}", "a bucket is (T tokens, N sequences), ints",
                          "pass bucket=(T, N), e.g. (4096, 8)")]  # fmt: skip
    total, slots = shape
    needed = padded_tokens(lengths.clip(min=0), chunk)
    found = []
    if total <= 0 or total % chunk:
        found.append(Violation("bucket.tokens", "bucket", f"T={total}",
                               f"T must be a positive multiple of the chunk ({chunk})",
                               f"round T up to a multiple of {chunk}"))  # fmt: skip
    elif needed > total:
        real = int(lengths.clip(min=0).sum())
        found.append(Violation("bucket.holds_tokens", "bucket", f"T={total} for {len(lengths)} sequences of {real} "
                               "tokens in all", f"a bucket's T counts each sequence padded to its own chunk multiple "
                               f"({chunk}): these take {needed} tokens ({_padding_text(lengths, chunk)})",
                               f"use a bucket of at least {needed} tokens (size a batch by the sum of its lengths "
                               f"each rounded up to {chunk})"))  # fmt: skip
    if slots < len(lengths):
        found.append(Violation("bucket.holds_sequences", "bucket", f"N={slots}",
                               f"the call has {len(lengths)} sequences", f"use a bucket of at least {len(lengths)} slots"))  # fmt: skip
    return found


def _rows_violations(
    state_indices: Any,
    lengths: np.ndarray,
    pool_rows: int,
    checkpoint_every: Any,
    checkpoint_indices: Any,
    chunk: int,
) -> list[Violation]:
    rows, found = _pool_row_vector("state_indices", state_indices, lengths, pool_rows,
                                   "pass one row per sequence; -1 for a sequence without a state row")  # fmt: skip
    if rows is None:
        return found
    named = [int(r) for r, n in zip(rows, lengths, strict=True) if r >= 0 and n > 0]
    state_rows = list(named)
    if checkpoint_every is None and checkpoint_indices is not None:
        return [*found, Violation("bucket.checkpoint_every", "checkpoint_every", "value None",
                                  "checkpoint_indices name the rows of checkpoints taken every checkpoint_every "
                                  "tokens: without it none would be stored", f"pass checkpoint_every (a multiple of "
                                  f"{chunk}), or drop checkpoint_indices")]  # fmt: skip
    if checkpoint_every is not None:
        if not (is_integer(checkpoint_every) and checkpoint_every > 0 and checkpoint_every % chunk == 0):
            return [*found, Violation("bucket.checkpoint_every", "checkpoint_every", f"value {checkpoint_every!r}",
                                      f"checkpoints are taken every positive multiple of the chunk ({chunk}) tokens",
                                      f"pass a multiple of {chunk}, e.g. {2 * chunk}")]  # fmt: skip
        table = np.asarray(checkpoint_indices) if checkpoint_indices is not None else None
        if table is not None and table.dtype.kind not in "iu":
            table = None
        if table is None or table.ndim != 2 or table.shape[0] != len(lengths) or not table.shape[1]:
            shape = None if table is None else table.shape
            return [*found, Violation("bucket.checkpoint_indices", "checkpoint_indices", f"shape {shape}",
                                      f"checkpoint_indices must be [n, K] = [{len(lengths)}, K] integers",
                                      "one row per sequence, one pool row (or -1) per checkpoint")]  # fmt: skip
        found += _in_pool("checkpoint_indices", table.reshape(-1), pool_rows)
        named += [int(r) for r in table.reshape(-1) if r >= 0]
    repeated = sorted({r for r in named if named.count(r) > 1})
    if repeated:
        # named by the argument that repeats a row: state_indices when two live sequences share one
        argument = "state_indices" if any(state_rows.count(r) > 1 for r in repeated) else "checkpoint_indices"
        found.append(Violation("bucket.rows_distinct", argument, f"rows {repeated} named twice",
                               "each live sequence's state row and each checkpoint row is written by one store, so "
                               "they must be distinct", "give every sequence and checkpoint its own pool row"))  # fmt: skip
    return found


def _read_violations(
    read_indices: Any, state_indices: Any, lengths: np.ndarray, pool_rows: int, checkpoint_indices: Any
) -> list[Violation]:
    """``read_indices``: [n] rows (or −1), none written by the launch except as the same sequence's state row."""
    reads, found = _pool_row_vector("read_indices", read_indices, lengths, pool_rows,
                                    "pass the row each sequence starts from; -1 to start from zero")  # fmt: skip
    if reads is None:
        return found
    rows = integer_vector(state_indices)
    written = {int(r): i for i, (r, n) in enumerate(zip(rows, lengths, strict=True)) if r >= 0 and n > 0}
    if checkpoint_indices is not None:
        written.update({int(r): -1 for r in np.asarray(checkpoint_indices).reshape(-1) if r >= 0})
    clashes = sorted({int(r) for i, (r, n) in enumerate(zip(reads, lengths, strict=True))
                      if n > 0 and r >= 0 and written.get(int(r), i) != i})  # fmt: skip
    if clashes:
        found.append(Violation("bucket.read_rows_written", "read_indices", f"rows {clashes}",
                               "a row a sequence starts from must not be written by the same launch for another "
                               "sequence or as a checkpoint", "start from a row this launch does not write"))  # fmt: skip
    return found


def _pool_row_vector(
    name: str, values: Any, lengths: np.ndarray, pool_rows: int, fix: str
) -> tuple[np.ndarray | None, list[Violation]]:
    """``values`` as [n] pool rows (each −1 or in the pool), or None and the violation of its form."""
    rows = integer_vector(values)
    if rows is None or rows.shape != lengths.shape:
        return None, [Violation(f"bucket.{name}", name, _describe_vector(values),
                                f"{name} must be [n] = [{len(lengths)}] integers, one pool row (or -1) per sequence",
                                fix)]  # fmt: skip
    return rows, _in_pool(name, rows, pool_rows)


def _in_pool(name: str, rows: Sequence[int] | np.ndarray, pool_rows: int) -> list[Violation]:
    outside = sorted({int(r) for r in rows if not -1 <= r < pool_rows})
    if not outside:
        return []
    return [Violation(f"bucket.{name}_range", name, f"rows {outside}",
                      f"every row must be -1 (none) or a row of the pool's {pool_rows}",
                      f"use rows in [0, {pool_rows}) or -1")]  # fmt: skip
