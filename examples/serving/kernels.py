"""The engine's ONE seam to the GatedDeltaNet kernels, the programs they ran, and the guard that keeps HF's own
GDN functions (its recurrences, its causal conv and its gated RMSNorm) off the serving path.

``GdnKernels`` is the only place that calls gdn-nki, and every call runs one of a few configured buckets, so a
compiling backend traces each bucket once for the whole run:

- ``conv_prefill`` / ``conv_decode``: the layer's causal conv on the pool's conv windows, through gdn-nki's vLLM
  drop-ins (``gdn_nki.torch.causal_conv1d_fn`` with its serving keywords: the prefill bucket, read rows and the
  recurrent checkpoints' rows; ``causal_conv1d_update`` with [N, T] rows and ``num_accepted_tokens``) — the same
  rows as the recurrence's, so a prefix-cache hit restores both states and a rejected draft rolls both back;

- ``prefill``: ``gdn_nki.torch.chunk_gated_delta_rule`` in its bucketed form (``bucket=(T, N)``), the gating in
  the kernel (``use_gate_in_kernel``: −exp(A_log)·softplus(a + dt_bias) from the raw a; ``use_beta_sigmoid_in_kernel``:
  β = sigmoid(b)): the packed
  sequences padded to the smallest configured prefill bucket that holds them, the pool as ``initial_state``, and
  per sequence the row it ends in (``state_indices``), the row it starts from (``read_indices``: its own row, a
  prefix-cache row it resumes from, or -1 for a zero state) and its prefix-cache checkpoint rows
  (``checkpoint_every`` = the cache's block, ``checkpoint_indices`` [N, T / block], -1 = none). The kernel reads
  and writes every one of those rows on device — no pool row is copied on the host anywhere on the serving path.
- ``decode``: vLLM's / SGLang's ``fused_sigmoid_gating_delta_rule_update`` (the gating fused, as the prefill's):
  every request the same T tokens, rows [N] (T = 1) or [N, T] (the state after token t to row [n, t], read from
  [n, num_accepted_tokens[n] - 1]) — speculative verification and its rollback without copying a state. N is
  padded to the smallest configured decode bucket with -1 rows (vLLM's padding slots: zero work, nothing stored).
- ``norm_prefill`` / ``norm_decode``: FLA's ``rms_norm_gated`` (HF's ``Qwen3NextRMSNormGated``: its weight and eps,
  rmsnorm(o) · weight · silu(z)), its rows padded to the phase's bucket (tokens × value heads) so that it too runs
  one program per bucket.

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
from gdn_nki.torch import (
    causal_conv1d_fn,
    causal_conv1d_update,
    chunk_gated_delta_rule,
    fused_sigmoid_gating_delta_rule_update,
    rms_norm_gated,
)
from gdn_ref.constants import CHUNK_BY_ALGORITHM, DEFAULT_ALGORITHM

# What HF's Qwen3-Next would call for a GatedDeltaNet core and its causal conv (whose fallbacks print "falling back
# to its reference PyTorch implementation"); none may run while the engine serves, nor HF's gated norm.
HF_GDN_FUNCTIONS = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn",
                    "causal_conv1d_update", "causal_conv1d_forward")  # fmt: skip
HF_GDN_MODULES = (hf.Qwen3NextGatedDeltaNet, hf.Qwen3NextRMSNormGated)  # their forwards raise while serving
# HF's softplus (torch.nn.functional.softplus's defaults), which the fused gating reproduces.
SOFTPLUS_BETA, SOFTPLUS_THRESHOLD = 1.0, 20.0
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
    windows [P, C, W − 1] (torch tensors, updated in place; one row number names both), and the gated RMSNorm.

    Tensors are seq-first and packed: q, k [1, T, Hk, K], v [1, T, Hv, V], the raw gate a and β's logit b
    [1, T, Hv], the conv's input [T, C]; q and k are L2-normalized in the kernel (Qwen3-Next's
    ``use_qk_l2norm_in_kernel``). ``calls`` lists (phase, bucket) per call, in order."""

    def __init__(self, pool: torch.Tensor, windows: torch.Tensor, buckets: Buckets) -> None:
        self.pool, self.windows, self.buckets = pool, windows, buckets
        self.calls: list[tuple[str, tuple[int, int]]] = []

    def prefill_bucket_of(self, cu_seqlens: list[int]) -> tuple[int, int]:
        """The prefill bucket a packed batch runs in (every kernel of the phase)."""
        return self.buckets.prefill_bucket([b - a for a, b in itertools.pairwise(cu_seqlens)])

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

    def prefill(self, q, k, v, a, b, gate: tuple[torch.Tensor, torch.Tensor], cu_seqlens: list[int], rows: list[int],
                reads: list[int], checkpoints: list[list[int]]) -> torch.Tensor:  # fmt: skip
        """Sequence i starts from pool row ``reads[i]`` (-1: zero), ends in ``rows[i]``, and stores the state after
        each ``block`` of its tokens to ``checkpoints[i][j]`` (-1: none; at most T / block per sequence); the
        gating from the raw ``a``, ``b`` and ``gate`` = (A_log, dt_bias) in the kernel."""
        lengths = [b - a for a, b in itertools.pairwise(cu_seqlens)]
        bucket = self.buckets.prefill_bucket(lengths)
        table = self._checkpoint_table(bucket, checkpoints)
        self.calls.append(("prefill", bucket))
        o, _ = chunk_gated_delta_rule(
            q, k, v, a, b, initial_state=self.pool, output_final_state=True, use_qk_l2norm_in_kernel=True,
            use_gate_in_kernel=True, A_log=gate[0], dt_bias=gate[1], use_beta_sigmoid_in_kernel=True,
            cu_seqlens=torch.tensor(cu_seqlens, dtype=torch.int32), state_indices=torch.tensor(rows, dtype=torch.int32),
            read_indices=torch.tensor(reads, dtype=torch.int32), bucket=bucket,
            checkpoint_every=self.buckets.block, checkpoint_indices=table,
        )  # fmt: skip
        return o

    def decode(self, q, k, v, a, b, gate: tuple[torch.Tensor, torch.Tensor], rows: list[list[int]],
               accepted: list[int]) -> torch.Tensor:  # fmt: skip
        """N requests of T tokens each: ``rows`` [N, T] (or [N] with T = 1), ``accepted`` [N] in [1, T]; padded
        to the decode bucket with -1 rows (their outputs dropped); the gating fused, as the prefill's."""
        n, tokens = len(rows), q.shape[1] // len(rows)
        slots, index, count = self._decode_rows(rows, accepted, tokens)
        self.calls.append(("decode", (slots, tokens)))
        pad = (slots - n) * tokens
        q, k, v, a, b = (torch.cat([x, x.new_zeros((1, pad, *x.shape[2:]))], dim=1) for x in (q, k, v, a, b))
        o = fused_sigmoid_gating_delta_rule_update(
            gate[0], a, gate[1], SOFTPLUS_BETA, SOFTPLUS_THRESHOLD, q, k, v, b, self.pool,
            index if tokens > 1 else index.reshape(slots), use_qk_l2norm_in_kernel=True,
            cu_seqlens=torch.arange(0, slots * tokens + 1, tokens, dtype=torch.int32), num_accepted_tokens=count,
        )  # fmt: skip
        return o[:, : n * tokens]

    def norm(self, phase: str, bucket: tuple[int, int], o: torch.Tensor, z: torch.Tensor, norm: Any) -> torch.Tensor:
        """HF's gated RMSNorm (``Qwen3NextRMSNormGated``: its weight and eps, silu(z)) of o [tokens, Hv, V] on
        gdn-nki, its rows padded with zeros to ``bucket``'s tokens (the phase's program shape)."""
        heads, dim = o.shape[-2:]
        tokens = bucket[0] if phase == "norm_prefill" else bucket[0] * bucket[1]
        self.calls.append((phase, bucket))
        x, gate = (torch.zeros((tokens * heads, dim), dtype=t.dtype) for t in (o, z))
        used = o.numel() // dim
        x[:used], gate[:used] = o.reshape(-1, dim), z.reshape(-1, dim)
        y = rms_norm_gated(x, gate, norm.weight, None, activation=norm.activation, eps=norm.variance_epsilon)
        return y[:used].reshape(o.shape)


@contextlib.contextmanager
def hf_gdn_forbidden() -> Iterator[None]:
    """HF's GDN core and conv functions and its GatedDeltaNet and gated-norm forwards replaced by ones that raise."""

    def forbidden(name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError(f"HF's {name} ran on the serving path")

        return call

    saved = {name: getattr(hf, name) for name in HF_GDN_FUNCTIONS if hasattr(hf, name)}
    saved_forwards = {module: module.forward for module in HF_GDN_MODULES}
    for name in saved:
        setattr(hf, name, forbidden(name))
    for module in HF_GDN_MODULES:
        module.forward = forbidden(f"{module.__name__}.forward")
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(hf, name, fn)
        for module, forward in saved_forwards.items():
            module.forward = forward
