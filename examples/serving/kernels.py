"""The engine's ONE seam to the GatedDeltaNet kernels, the programs they ran, and the guard that keeps HF's own
GDN functions (its recurrences and its causal conv) off the serving path.

``GdnKernels`` is the only place that calls gdn-nki, and every call runs one of a few configured buckets, so a
compiling backend traces each bucket once for the whole run:

- ``conv_prefill`` / ``conv_decode``: the layer's causal conv on the pool's conv windows, through gdn-nki's vLLM
  drop-ins (``gdn_nki.torch.causal_conv1d_fn`` with its serving keywords: the prefill bucket, read rows and the
  recurrent checkpoints' rows; ``causal_conv1d_update`` with [N, T] rows and ``num_accepted_tokens``) — the same
  rows as the recurrence's, so a prefix-cache hit restores both states and a rejected draft rolls both back;

- ``prefill``: ``gdn_nki.torch.chunk_gated_delta_rule`` in its bucketed form (``bucket=(T, N)``): the packed
  sequences padded to the smallest configured prefill bucket that holds them, the pool as ``initial_state``, and
  per sequence the row it ends in (``state_indices``), the row it starts from (``read_indices``: its own row, a
  prefix-cache row it resumes from, or -1 for a zero state) and its prefix-cache checkpoint rows
  (``checkpoint_every`` = the cache's block, ``checkpoint_indices`` [N, T / block], -1 = none). The kernel reads
  and writes every one of those rows on device — no pool row is copied on the host anywhere on the serving path.
- ``decode``: vLLM's ``fused_recurrent_gated_delta_rule`` form (``gdn_nki.torch_decode``): every request the
  same T tokens, rows [N] (T = 1) or [N, T] (the state after token t to row [n, t], read from
  [n, num_accepted_tokens[n] - 1]) — speculative verification and its rollback without copying a state. N is
  padded to the smallest configured decode bucket with -1 rows (vLLM's padding slots: zero work, nothing stored).

``gdn_nki.traces.recording_launches`` records each launch's kernel and static program (nki-cpu's
``Trace.fingerprint()``); with ``GdnKernels.calls`` (phase and bucket per call) it shows every launch of a bucket ran
one program.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers.models.qwen3_next import modeling_qwen3_next as hf

import gdn_nki
from gdn_nki.torch import causal_conv1d_fn, causal_conv1d_update, chunk_gated_delta_rule
from gdn_nki.torch_decode import vllm_fused_recurrent_gated_delta_rule
from gdn_ref.constants import CHUNK_BY_ALGORITHM, DEFAULT_ALGORITHM

# What HF's Qwen3-Next would call for a GatedDeltaNet core and its causal conv; none may run while the engine serves.
HF_GDN_FUNCTIONS = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn",
                    "causal_conv1d_update")  # fmt: skip
# The prefill kernel's chunk: a sequence takes its length rounded up to it of a bucket, checkpoints sit on it.
CHUNK = CHUNK_BY_ALGORITHM[DEFAULT_ALGORITHM]


@dataclass(frozen=True)
class Buckets:
    """The shapes the kernels are launched at: prefill (T tokens, N sequences), decode request counts N (each of
    the engine's T tokens), and the prefix-cache block (the checkpoint spacing, a multiple of ``CHUNK``). A
    prefill sequence takes its length rounded up to ``CHUNK`` of a bucket's T."""

    prefill: tuple[tuple[int, int], ...] = ((256, 4), (512, 4))
    decode: tuple[int, ...] = (2, 4, 8)
    block: int = CHUNK

    def __post_init__(self) -> None:
        if self.block % CHUNK or any(tokens % self.block for tokens, _ in self.prefill):
            raise ValueError(f"the block ({self.block}) must be a multiple of the kernel's chunk ({CHUNK}) and "
                             f"divide every prefill bucket's tokens ({sorted(self.prefill)})")  # fmt: skip

    def prefill_bucket(self, lengths: Sequence[int]) -> tuple[int, int]:
        """The smallest prefill bucket holding sequences of these lengths."""
        need = gdn_nki.padded_tokens(lengths=lengths)  # each sequence padded to its chunk multiple, as the bucket pads
        for tokens, slots in sorted(self.prefill):
            if tokens >= need and slots >= len(lengths):
                return tokens, slots
        raise ValueError(f"no prefill bucket of {sorted(self.prefill)} holds {len(lengths)} sequences of {need} "
                         "padded tokens; the engine packs no more than the largest holds")  # fmt: skip

    def decode_bucket(self, requests: int) -> int:
        """The smallest decode bucket holding ``requests`` requests."""
        for slots in sorted(self.decode):
            if slots >= requests:
                return slots
        raise ValueError(f"no decode bucket of {sorted(self.decode)} holds {requests} requests")


class GdnKernels:
    """Prefill and decode of the GDN core on one state pool [P, Hv, K, V] fp32 and of its causal conv on the conv
    windows [P, C, W − 1] (torch tensors, updated in place; one row number names both).

    Tensors are seq-first and packed: q, k [1, T, Hk, K], v [1, T, Hv, V], g, beta [1, T, Hv], the conv's input
    [T, C]; q and k are L2-normalized in the kernel (Qwen3-Next's ``use_qk_l2norm_in_kernel``). ``calls`` lists
    (phase, bucket) per call, in order."""

    def __init__(self, pool: torch.Tensor, windows: torch.Tensor, buckets: Buckets) -> None:
        self.pool, self.windows, self.buckets = pool, windows, buckets
        self.calls: list[tuple[str, tuple[int, int]]] = []

    def conv_prefill(self, mixed, weight, bias, activation, cu_seqlens: list[int], rows: list[int], reads: list[int],
                     checkpoints: list[list[int]]) -> torch.Tensor:  # fmt: skip
        """The conv of the packed sequences ``mixed`` [tokens, C] in the prefill bucket the recurrence runs in:
        sequence i starts from window row ``reads[i]`` (-1: an empty window), ends in ``rows[i]`` and stores its
        window after each ``block`` of its tokens to ``checkpoints[i][j]`` — the recurrent state's rows."""
        lengths = [b - a for a, b in itertools.pairwise(cu_seqlens)]
        bucket = self.buckets.prefill_bucket(lengths)
        self.calls.append(("conv_prefill", bucket))
        out = causal_conv1d_fn(
            mixed.T, weight, bias, self.windows, torch.tensor(cu_seqlens, dtype=torch.int32),
            torch.tensor(rows, dtype=torch.int32), activation=activation,
            read_indices=torch.tensor(reads, dtype=torch.int32), checkpoint_every=self.buckets.block,
            checkpoint_indices=self._checkpoint_table(bucket, checkpoints), bucket=bucket,
        )  # fmt: skip
        return out.T

    def conv_decode(self, mixed, weight, bias, activation, rows: list[list[int]], accepted: list[int]) -> torch.Tensor:
        """The conv of N requests × T tokens (``mixed`` [N·T, C]) on the windows, rows and rollback as ``decode``'s:
        the window after token t to row [n, t], read from [n, accepted[n] - 1]; padded to the decode bucket."""
        n, tokens = len(rows), mixed.shape[0] // len(rows)
        slots, index, count = self._decode_rows(rows, accepted, tokens)
        self.calls.append(("conv_decode", (slots, tokens)))
        x = torch.cat([mixed.reshape(n, tokens, -1), mixed.new_zeros((slots - n, tokens, mixed.shape[1]))])
        out = causal_conv1d_update(x.transpose(1, 2), self.windows, weight, bias, activation,
                                   index if tokens > 1 else index.reshape(slots),
                                   num_accepted_tokens=count)  # fmt: skip
        return out.transpose(1, 2)[:n].reshape(n * tokens, -1)

    def _checkpoint_table(self, bucket: tuple[int, int], checkpoints: list[list[int]]) -> torch.Tensor:
        """[sequences, T / block] checkpoint rows, -1 where none: a fixed width per bucket (the program's shape)."""
        table = torch.full((len(checkpoints), bucket[0] // self.buckets.block), -1, dtype=torch.int32)
        for i, wanted in enumerate(checkpoints):
            table[i, : len(wanted)] = torch.tensor(wanted, dtype=torch.int32)
        return table

    def _decode_rows(self, rows: list[list[int]], accepted: list[int], tokens: int):
        """The decode bucket's slots, the [slots, T] rows (-1: padding slots) and the accepted counts (None at
        T = 1)."""
        n = len(rows)
        slots = self.buckets.decode_bucket(n)
        index = torch.full((slots, tokens), -1, dtype=torch.int32)
        index[:n] = torch.tensor(rows, dtype=torch.int32).reshape(n, -1)[:, :tokens]
        count = torch.tensor([*accepted, *[1] * (slots - n)], dtype=torch.int32) if tokens > 1 else None
        return slots, index, count

    def prefill(self, q, k, v, g, beta, cu_seqlens: list[int], rows: list[int], reads: list[int],
                checkpoints: list[list[int]]) -> torch.Tensor:  # fmt: skip
        """Sequence i starts from pool row ``reads[i]`` (-1: zero), ends in ``rows[i]``, and stores the state after
        each ``block`` of its tokens to ``checkpoints[i][j]`` (-1: none; at most T / block per sequence)."""
        lengths = [b - a for a, b in itertools.pairwise(cu_seqlens)]
        bucket = self.buckets.prefill_bucket(lengths)
        table = self._checkpoint_table(bucket, checkpoints)
        self.calls.append(("prefill", bucket))
        o, _ = chunk_gated_delta_rule(
            q, k, v, g, beta, initial_state=self.pool, output_final_state=True, use_qk_l2norm_in_kernel=True,
            cu_seqlens=torch.tensor(cu_seqlens, dtype=torch.int32), state_indices=torch.tensor(rows, dtype=torch.int32),
            read_indices=torch.tensor(reads, dtype=torch.int32), bucket=bucket,
            checkpoint_every=self.buckets.block, checkpoint_indices=table,
        )  # fmt: skip
        return o

    def decode(self, q, k, v, g, beta, rows: list[list[int]], accepted: list[int]) -> torch.Tensor:
        """N requests of T tokens each: ``rows`` [N, T] (or [N] with T = 1), ``accepted`` [N] in [1, T]; padded
        to the decode bucket with -1 rows (their outputs dropped)."""
        n, tokens = len(rows), q.shape[1] // len(rows)
        slots, index, count = self._decode_rows(rows, accepted, tokens)
        self.calls.append(("decode", (slots, tokens)))
        pad = (slots - n) * tokens
        q, k, v, g, beta = (torch.cat([x, x.new_zeros((1, pad, *x.shape[2:]))], dim=1) for x in (q, k, v, g, beta))
        o, _ = vllm_fused_recurrent_gated_delta_rule(
            q, k, v, g, beta, initial_state=self.pool, use_qk_l2norm_in_kernel=True,
            cu_seqlens=torch.arange(0, slots * tokens + 1, tokens, dtype=torch.int32),
            ssm_state_indices=index if tokens > 1 else index.reshape(slots), num_accepted_tokens=count,
        )  # fmt: skip
        return o[:, : n * tokens]


@contextlib.contextmanager
def hf_gdn_forbidden() -> Iterator[None]:
    """HF's GDN core functions and its GatedDeltaNet forward replaced by ones that raise."""

    def forbidden(name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError(f"HF's {name} ran on the serving path")

        return call

    saved = {name: getattr(hf, name) for name in HF_GDN_FUNCTIONS if hasattr(hf, name)}
    saved_forward = hf.Qwen3NextGatedDeltaNet.forward
    for name in saved:
        setattr(hf, name, forbidden(name))
    hf.Qwen3NextGatedDeltaNet.forward = forbidden("Qwen3NextGatedDeltaNet.forward")
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(hf, name, fn)
        hf.Qwen3NextGatedDeltaNet.forward = saved_forward
