"""The engine's ONE seam to the GatedDeltaNet kernels, the programs they ran, and the guard that keeps HF's own
GDN functions off the serving path.

``GdnKernels`` is the only place that calls gdn-nki, and every call runs one of a few configured buckets, so a
compiling backend traces each bucket once for the whole run:

- ``prefill``: ``gdn_nki.torch.chunk_gated_delta_rule`` in its bucketed form (``bucket=(T, N)``): the packed
  sequences padded to the smallest configured prefill bucket that holds them, the pool as ``initial_state``, and
  per sequence the row it ends in (``state_indices``), the row it starts from (``read_indices``: its own row, a
  prefix-cache row it resumes from, or -1 for a zero state) and its prefix-cache checkpoint rows
  (``checkpoint_every`` = the cache's block, ``checkpoint_indices`` [N, T / block], -1 = none). The kernel reads
  and writes every one of those rows on device — no pool row is copied on the host anywhere on the serving path.
- ``decode``: vLLM's ``fused_recurrent_gated_delta_rule`` call (from ``gdn_nki.torch``, the one import: vLLM's
  keywords make it vLLM's pool form): every request the
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
from gdn_nki.torch import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule  # FLA's and vLLM's names
from gdn_ref.constants import CHUNK_BY_ALGORITHM, DEFAULT_ALGORITHM

# What HF's Qwen3-Next would call for a GatedDeltaNet core; none may run while the engine serves.
HF_GDN_FUNCTIONS = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule")
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
    """Prefill and decode of the GDN core on one state pool [P, Hv, K, V] fp32 (a torch tensor, updated in place).

    Tensors are seq-first and packed: q, k [1, T, Hk, K], v [1, T, Hv, V], g, beta [1, T, Hv]; q and k are
    L2-normalized in the kernel (Qwen3-Next's ``use_qk_l2norm_in_kernel``). ``calls`` lists (phase, bucket) per
    call, in order."""

    def __init__(self, pool: torch.Tensor, buckets: Buckets) -> None:
        self.pool, self.buckets = pool, buckets
        self.calls: list[tuple[str, tuple[int, int]]] = []

    def prefill(self, q, k, v, g, beta, cu_seqlens: list[int], rows: list[int], reads: list[int],
                checkpoints: list[list[int]]) -> torch.Tensor:  # fmt: skip
        """Sequence i starts from pool row ``reads[i]`` (-1: zero), ends in ``rows[i]``, and stores the state after
        each ``block`` of its tokens to ``checkpoints[i][j]`` (-1: none; at most T / block per sequence)."""
        lengths = [b - a for a, b in itertools.pairwise(cu_seqlens)]
        bucket = self.buckets.prefill_bucket(lengths)
        width = bucket[0] // self.buckets.block  # checkpoints a bucket's sequence can hold: a fixed program shape
        table = torch.full((len(rows), width), -1, dtype=torch.int32)
        for i, wanted in enumerate(checkpoints):
            table[i, : len(wanted)] = torch.tensor(wanted, dtype=torch.int32)
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
        slots = self.buckets.decode_bucket(n)
        self.calls.append(("decode", (slots, tokens)))
        pad = (slots - n) * tokens
        q, k, v, g, beta = (torch.cat([x, x.new_zeros((1, pad, *x.shape[2:]))], dim=1) for x in (q, k, v, g, beta))
        index = torch.full((slots, tokens), -1, dtype=torch.int32)
        index[:n] = torch.tensor(rows, dtype=torch.int32).reshape(n, -1)[:, :tokens]
        o, _ = fused_recurrent_gated_delta_rule(
            q, k, v, g=g, beta=beta, initial_state=self.pool, inplace_final_state=True, use_qk_l2norm_in_kernel=True,
            cu_seqlens=torch.arange(0, slots * tokens + 1, tokens, dtype=torch.int32),
            ssm_state_indices=index if tokens > 1 else index.reshape(slots),
            num_accepted_tokens=torch.tensor([*accepted, *[1] * (slots - n)], dtype=torch.int32)
            if tokens > 1 else None,
        )  # fmt: skip
        return o[:, : n * tokens]


@contextlib.contextmanager
def hf_gdn_forbidden() -> Iterator[None]:
    """HF's GDN core functions and its GatedDeltaNet forward replaced by ones that raise."""

    def forbidden(name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError(f"HF's {name} ran on the serving path")

        return call

    saved = {name: getattr(hf, name) for name in HF_GDN_FUNCTIONS}
    saved_forward = hf.Qwen3NextGatedDeltaNet.forward
    for name in HF_GDN_FUNCTIONS:
        setattr(hf, name, forbidden(name))
    hf.Qwen3NextGatedDeltaNet.forward = forbidden("Qwen3NextGatedDeltaNet.forward")
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(hf, name, fn)
        hf.Qwen3NextGatedDeltaNet.forward = saved_forward
