"""The engine's ONE seam to gdn-nki, the programs it ran, and the guard that keeps HF's own GatedDeltaNet code off
the serving path.

``GdnKernels`` is the only place that calls gdn-nki. A GatedDeltaNet layer's computations between HF's in and out
projections are gdn-nki's drop-ins (``gdn_nki.torch``), three launches per layer per phase, every one at a
configured bucket, so a compiling backend traces each bucket once for the whole run:

- prefill: vLLM's ``causal_conv1d_fn`` (the depthwise conv and SiLU over q|k|v; the conv-state pool, ``cache_indices``
  the rows the sequences end in, gdn-nki's ``read_indices`` the rows they start from, its ``checkpoint_every`` /
  ``checkpoint_indices`` the block-boundary windows), then FLA's ``chunk_gated_delta_rule`` in its bucketed form
  with the gating fused (``use_gate_in_kernel``: −exp(A_log)·softplus(a + dt_bias); ``use_beta_sigmoid_in_kernel``:
  β = sigmoid(b)) on the recurrent-state pool with the same rows, reads and checkpoint table, then FLA's
  ``rms_norm_gated`` (HF's gated RMSNorm: rmsnorm(o) · weight · silu(z)). The conv and the recurrence store their
  checkpoints at the same positions into the same row numbers of their two pools, so a prefix-cache hit restores
  both states from one row number, read on device.
- decode: vLLM's ``causal_conv1d_update`` and ``fused_sigmoid_gating_delta_rule_update`` with the same [N, T] rows
  (the window / state after token t to row [n, t]) and ``num_accepted_tokens`` (resume from row [n, a − 1]):
  speculative verification and the rollback of both states without copying either; N padded to the smallest
  configured decode bucket with −1 rows (vLLM's padding slots: zero work, nothing stored); then ``rms_norm_gated``.

The norm's rows are padded to the phase's bucket (its tokens × value heads), so it too runs one program per bucket.
``gdn_nki.traces.recording_launches`` records each launch's kernel and static program (nki-cpu's
``Trace.fingerprint()``); with ``GdnKernels.calls`` (phase and bucket per launch) it shows every launch of a bucket
ran one program.
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

# What HF's Qwen3-Next would call for a GatedDeltaNet layer's conv, core and gated norm; none may run while the
# engine serves (HF's conv functions are the ones that print "falling back to its reference PyTorch implementation").
HF_GDN_FUNCTIONS = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn",
                    "causal_conv1d_update", "causal_conv1d_forward")  # fmt: skip
# The launches of one phase of a GDN layer, in order, and the kernel each runs.
KERNEL_OF_PHASE = {
    "conv prefill": "gdn_conv_bucket",
    "prefill": "gdn_cte_bucket",
    "norm prefill": "gdn_gated_rms_norm",
    "conv decode": "gdn_conv_step",
    "decode": "gdn_step",
    "norm decode": "gdn_gated_rms_norm",
}
# The prefill kernel's chunk: a sequence takes its length rounded up to it of a bucket, checkpoints sit on it.
CHUNK = CHUNK_BY_ALGORITHM[DEFAULT_ALGORITHM]
# HF's softplus (torch.nn.functional.softplus's defaults), which the fused gating reproduces.
SOFTPLUS_BETA, SOFTPLUS_THRESHOLD = 1.0, 20.0


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
    """A GatedDeltaNet layer's conv, gated delta rule and gated norm on two pools: recurrent states [P, Hv, K, V]
    fp32 and conv windows [P, C, W − 1] in the model's dtype (torch tensors, updated in place, row r of one and of
    the other belonging to the same owner).

    Tensors are packed, token-major: ``mixed`` (q|k|v before the conv) [tokens, C]; a, b [1, tokens, Hv] (the raw
    gate and β's logit); q and k are L2-normalized in the kernel (Qwen3-Next's ``use_qk_l2norm_in_kernel``).
    ``calls`` lists (phase, bucket) per launch, in order (phases: ``KERNEL_OF_PHASE``)."""

    def __init__(self, pool: torch.Tensor, conv_pool: torch.Tensor, buckets: Buckets) -> None:
        self.pool, self.conv_pool, self.buckets = pool, conv_pool, buckets
        self.calls: list[tuple[str, tuple[int, int]]] = []

    def prefill_bucket(self, cu_seqlens: list[int]) -> tuple[int, int]:
        """The prefill bucket of a packed batch."""
        return self.buckets.prefill_bucket([b - a for a, b in itertools.pairwise(cu_seqlens)])

    def checkpoint_table(self, bucket: tuple[int, int], checkpoints: list[list[int]]) -> torch.Tensor:
        """[n, T / block] rows of the checkpoints (−1: none): a fixed width per bucket, a fixed program shape."""
        table = torch.full((len(checkpoints), bucket[0] // self.buckets.block), -1, dtype=torch.int32)
        for i, wanted in enumerate(checkpoints):
            table[i, : len(wanted)] = torch.tensor(wanted, dtype=torch.int32)
        return table

    def conv_prefill(self, mixed: torch.Tensor, conv: torch.nn.Conv1d, activation: str, cu_seqlens: list[int],
                     rows: list[int], reads: list[int], checkpoints: list[list[int]]) -> torch.Tensor:  # fmt: skip
        """Sequence i's windows: read from conv row ``reads[i]`` (−1: empty), its last written to ``rows[i]``, the
        one after each ``block`` of its tokens to ``checkpoints[i][j]``. Returns silu(conv(mixed)) [tokens, C]."""
        bucket = self.prefill_bucket(cu_seqlens)
        self.calls.append(("conv prefill", bucket))
        out = causal_conv1d_fn(
            mixed.t(), conv.weight.squeeze(1), conv.bias, self.conv_pool, torch.tensor(cu_seqlens, dtype=torch.int32),
            cache_indices=torch.tensor(rows, dtype=torch.int32), activation=activation,
            read_indices=torch.tensor(reads, dtype=torch.int32), checkpoint_every=self.buckets.block,
            checkpoint_indices=self.checkpoint_table(bucket, checkpoints), bucket=bucket,
        )  # fmt: skip
        return out.t()

    def prefill(self, q, k, v, a, b, gate: tuple[torch.Tensor, torch.Tensor], cu_seqlens: list[int],
                rows: list[int], reads: list[int], checkpoints: list[list[int]]) -> torch.Tensor:  # fmt: skip
        """Sequence i starts from pool row ``reads[i]`` (-1: zero), ends in ``rows[i]``, and stores the state after
        each ``block`` of its tokens to ``checkpoints[i][j]`` (-1: none; at most T / block per sequence); the
        gating from the raw a, b and ``gate`` = (A_log, dt_bias) in the kernel."""
        bucket = self.prefill_bucket(cu_seqlens)
        self.calls.append(("prefill", bucket))
        o, _ = chunk_gated_delta_rule(
            q, k, v, a, b, initial_state=self.pool, output_final_state=True, use_qk_l2norm_in_kernel=True,
            use_gate_in_kernel=True, A_log=gate[0], dt_bias=gate[1], use_beta_sigmoid_in_kernel=True,
            cu_seqlens=torch.tensor(cu_seqlens, dtype=torch.int32), state_indices=torch.tensor(rows, dtype=torch.int32),
            read_indices=torch.tensor(reads, dtype=torch.int32), bucket=bucket,
            checkpoint_every=self.buckets.block, checkpoint_indices=self.checkpoint_table(bucket, checkpoints),
        )  # fmt: skip
        return o

    def conv_decode(self, mixed: torch.Tensor, conv: torch.nn.Conv1d, activation: str, rows: list[list[int]],
                    accepted: list[int]) -> torch.Tensor:  # fmt: skip
        """N requests of T tokens each: ``rows`` [N, T] (or [N] with T = 1), ``accepted`` [N] in [1, T]: the
        window after token t to row [n, t], read from [n, accepted − 1]. Returns silu(conv(mixed)) [N·T, C]."""
        slots, index, accepted_t = self._decode_layout(rows, accepted)
        tokens = mixed.shape[0] // len(rows)
        self.calls.append(("conv decode", (slots, tokens)))
        x = torch.zeros((slots, tokens, mixed.shape[1]), dtype=mixed.dtype)
        x[: len(rows)] = mixed.reshape(len(rows), tokens, -1)
        out = causal_conv1d_update(
            x.transpose(1, 2), self.conv_pool, conv.weight.squeeze(1), conv.bias, activation=activation,
            conv_state_indices=index, num_accepted_tokens=accepted_t,
        )  # fmt: skip
        return out.transpose(1, 2)[: len(rows)].reshape(-1, mixed.shape[1])

    def decode(self, q, k, v, a, b, gate: tuple[torch.Tensor, torch.Tensor], rows: list[list[int]],
               accepted: list[int]) -> torch.Tensor:  # fmt: skip
        """N requests of T tokens each, rows and ``accepted`` as ``conv_decode``'s; the gating fused (vLLM's /
        SGLang's ``fused_sigmoid_gating_delta_rule_update``), the outputs of padding slots dropped."""
        n = len(rows)
        slots, index, accepted_t = self._decode_layout(rows, accepted)
        tokens = q.shape[1] // n
        self.calls.append(("decode", (slots, tokens)))
        pad = (slots - n) * tokens
        q, k, v, a, b = (torch.cat([x, x.new_zeros((1, pad, *x.shape[2:]))], dim=1) for x in (q, k, v, a, b))
        o = fused_sigmoid_gating_delta_rule_update(
            gate[0], a, gate[1], SOFTPLUS_BETA, SOFTPLUS_THRESHOLD, q, k, v, b, self.pool, index,
            use_qk_l2norm_in_kernel=True, cu_seqlens=torch.arange(0, slots * tokens + 1, tokens, dtype=torch.int32),
            num_accepted_tokens=accepted_t,
        )  # fmt: skip
        return o[:, : n * tokens]

    def _decode_layout(self, rows: list[list[int]], accepted: list[int]) -> tuple[int, torch.Tensor, Any]:
        """(slots, indices [slots, T] or [slots] with −1 padding, num_accepted_tokens [slots] or None at T = 1)."""
        n, tokens = len(rows), len(rows[0])
        slots = self.buckets.decode_bucket(n)
        index = torch.full((slots, tokens), -1, dtype=torch.int32)
        index[:n] = torch.tensor(rows, dtype=torch.int32)
        if tokens == 1:
            return slots, index.reshape(slots), None
        return slots, index, torch.tensor([*accepted, *[1] * (slots - n)], dtype=torch.int32)

    def norm(self, phase: str, bucket: tuple[int, int], o: torch.Tensor, z: torch.Tensor, norm: Any) -> torch.Tensor:
        """HF's gated RMSNorm (``Qwen3NextRMSNormGated``: its weight and eps, silu(z)) of o [tokens, Hv, V], its
        rows padded with zeros to ``bucket``'s tokens (the phase's program shape)."""
        heads, dim = o.shape[-2:]
        padded = bucket[0] if phase == "norm prefill" else bucket[0] * bucket[1]
        self.calls.append((phase, bucket))
        x, gate = (torch.zeros((padded * heads, dim), dtype=t.dtype) for t in (o, z))
        x[: o.numel() // dim], gate[: o.numel() // dim] = o.reshape(-1, dim), z.reshape(-1, dim)
        y = rms_norm_gated(x, gate, norm.weight, None, activation=norm.activation, eps=norm.variance_epsilon)
        return y[: o.numel() // dim].reshape(o.shape)


@contextlib.contextmanager
def hf_gdn_forbidden() -> Iterator[None]:
    """HF's GDN core, conv and gated-norm functions and its GatedDeltaNet forward replaced by ones that raise."""

    def forbidden(name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError(f"HF's {name} ran on the serving path")

        return call

    saved = {name: getattr(hf, name) for name in HF_GDN_FUNCTIONS}
    classes = (hf.Qwen3NextGatedDeltaNet, hf.Qwen3NextRMSNormGated)
    saved_forwards = {cls: cls.forward for cls in classes}
    for name in HF_GDN_FUNCTIONS:
        setattr(hf, name, forbidden(name))
    for cls in classes:
        cls.forward = forbidden(f"{cls.__name__}.forward")
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(hf, name, fn)
        for cls, forward in saved_forwards.items():
            cls.forward = forward
