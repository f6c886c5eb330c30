"""From sequence lengths to a launch's layout: where each sequence's tokens go and which state row it uses.

``packed_plan(lengths, chunk)`` is the one function that turns sequence lengths into the packed layout; every
varlen path uses it: the host pads and packs the caller's tokens with it and unpacks the outputs
(``host.prefill_varlen``), and the kernel builds its spans from it (``varlen.gdn_cte_varlen``, from the padded
lengths its trace-time ``seq_chunks`` give). A dense launch (one sequence per batch row) is ``dense_spans``.

A span is everything the pipeline needs to know about a sequence (``lanes``): its token range and its state row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# The arguments with a token axis (axis 2): what padding and packing change.
TOKEN_ARGUMENTS = ("query", "key", "value", "g_log", "beta")


@dataclass(frozen=True)
class Span:
    """One sequence of a launch: tokens ``[offset, offset + n_chunks·chunk)`` of batch row ``b``, with its
    initial and final state in row ``state_row`` of the state tensors (trace-time integers)."""

    b: int
    offset: int
    n_chunks: int
    state_row: int


def dense_spans(batch: int, seq_len: int, chunk: int) -> list[Span]:
    """One sequence per batch row, each the whole row, its state in the same row (gdn_cte's layout)."""
    return [Span(b, 0, seq_len // chunk, b) for b in range(batch)]


@dataclass(frozen=True)
class PackedPlan:
    """Sequences packed back to back in batch row 0, each padded (zero tokens) to its own chunk multiple.

    Attributes:
        chunk (int): the algorithm's chunk.
        lengths (tuple[int, ...]): real tokens per sequence.
        seq_chunks (tuple[int, ...]): chunks per sequence, ``ceil(length / chunk)``.
        starts (tuple[int, ...]): the first padded token of each sequence.
    """

    chunk: int
    lengths: tuple[int, ...]
    seq_chunks: tuple[int, ...]
    starts: tuple[int, ...]

    @property
    def padded_len(self) -> int:
        """Tokens of the packed, padded row."""
        return sum(self.seq_chunks) * self.chunk

    def spans(self, state_rows: Sequence[int]) -> list[Span]:
        """The launch's sequences, sequence i's state in row ``state_rows[i]``."""
        return [Span(0, start, n, row) for start, n, row in zip(self.starts, self.seq_chunks, state_rows, strict=True)]

    def pack(self, x: Any) -> np.ndarray:
        """Copy the real tokens (axis 2) of each sequence of ``x`` (packed back to back, no padding) to its start
        in a zero array ``padded_len`` tokens long: the padding tokens are zeros (g = 0, β = 0 for the gates)."""
        shape = list(x.shape)
        shape[2] = self.padded_len
        packed = np.zeros(shape, dtype=x.dtype)
        for source, start, length in zip(self._sources(), self.starts, self.lengths, strict=True):
            packed[:, :, start : start + length] = x[:, :, source : source + length]
        return packed

    def unpack(self, x: np.ndarray) -> np.ndarray:
        """The real tokens of a packed, padded array, back to back (the inverse of ``pack``)."""
        return np.concatenate(
            [x[:, :, start : start + length] for start, length in zip(self.starts, self.lengths, strict=True)], axis=2
        )

    def _sources(self) -> list[int]:
        """Where each sequence starts among the real tokens (``cu_seqlens[:-1]``)."""
        return [int(s) for s in np.cumsum((0, *self.lengths[:-1]))]


def packed_plan(lengths: Sequence[int], chunk: int) -> PackedPlan:
    """The packed layout of sequences of these lengths (each at least one token) for this chunk."""
    lengths = tuple(int(n) for n in lengths)
    seq_chunks = tuple(-(-n // chunk) for n in lengths)
    starts = [0]
    for n in seq_chunks[:-1]:
        starts.append(starts[-1] + n * chunk)
    return PackedPlan(chunk, lengths, seq_chunks, tuple(starts))


def pad_tokens(x: np.ndarray, pad: int) -> np.ndarray:
    """``x`` with ``pad`` zero tokens appended on axis 2 (g = 0, β = 0 for the gates: exact padding)."""
    widths = [(0, 0)] * x.ndim
    widths[2] = (0, pad)
    return np.pad(x, widths)
