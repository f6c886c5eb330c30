"""The engine's ONE seam to the GatedDeltaNet kernels, how often they were traced, and the guard that keeps HF's
own GDN functions off the serving path.

``GdnKernels`` is the only place that calls gdn-nki. It is written against the API main has today:

- ``prefill``: ``gdn_nki.torch.chunk_gated_delta_rule`` on the packed sequences (``cu_seqlens``) with the pool
  as ``initial_state`` and one row per sequence (``state_indices``), read and written in place. Prefix-cache
  checkpoints are INTERIM: the engine stops a chunk of prefill at a block boundary and this seam copies the
  sequence's row into its checkpoint row on the host after the launch. With bucketed prefill (``prefill_varlen(
  ..., bucket=(T, N), checkpoint_every=, checkpoint_indices=)``) the kernel writes checkpoints into pool rows on
  device mid-sequence and pads the launch to a bucket; only ``prefill`` changes (the engine already passes the
  checkpoint rows), and the trace count below becomes one per bucket.
- ``decode``: vLLM's ``fused_recurrent_gated_delta_rule`` form (``gdn_nki.torch_decode``): every request the
  same T tokens, rows [N] (T = 1) or [N, T] (the state after token t to row [n, t], read from
  [n, num_accepted_tokens[n] - 1]) — speculative verification and its rollback without copying a state.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from transformers.models.qwen3_next import modeling_qwen3_next as hf

from gdn_nki import backend
from gdn_nki.torch import chunk_gated_delta_rule
from gdn_nki.torch_decode import vllm_fused_recurrent_gated_delta_rule

# What HF's Qwen3-Next would call for a GatedDeltaNet core; none may run while the engine serves.
HF_GDN_FUNCTIONS = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule")


class GdnKernels:
    """Prefill and decode of the GDN core on one state pool [P, Hv, K, V] fp32 (a torch tensor, updated in place).

    Tensors are seq-first and packed: q, k [1, T, Hk, K], v [1, T, Hv, V], g, beta [1, T, Hv]; q and k are
    L2-normalized in the kernel (Qwen3-Next's ``use_qk_l2norm_in_kernel``)."""

    def __init__(self, pool: torch.Tensor) -> None:
        self.pool = pool
        self.calls: Counter[str] = Counter()

    def prefill(self, q, k, v, g, beta, cu_seqlens: list[int], rows: list[int],
                checkpoint_rows: list[int | None]) -> torch.Tensor:  # fmt: skip
        """Sequence i resumes from and ends in pool row ``rows[i]``; when ``checkpoint_rows[i]`` is a row, the
        state at the sequence's end is also copied there (interim: see the module docstring)."""
        self.calls["prefill"] += 1
        o, _ = chunk_gated_delta_rule(
            q, k, v, g, beta, initial_state=self.pool, output_final_state=True, use_qk_l2norm_in_kernel=True,
            cu_seqlens=torch.tensor(cu_seqlens, dtype=torch.int32), state_indices=torch.tensor(rows),
        )  # fmt: skip
        for row, checkpoint in zip(rows, checkpoint_rows, strict=True):
            if checkpoint is not None:
                self.pool[checkpoint] = self.pool[row]  # INTERIM host copy; on device with checkpoint_indices
        return o

    def decode(self, q, k, v, g, beta, rows: list[list[int]], accepted: list[int]) -> torch.Tensor:
        """N requests of T tokens each: ``rows`` [N, T] (or [N] with T = 1), ``accepted`` [N] in [1, T]."""
        self.calls["decode"] += 1
        n, tokens = len(rows), q.shape[1] // len(rows)
        index = torch.tensor(rows, dtype=torch.int32)
        o, _ = vllm_fused_recurrent_gated_delta_rule(
            q, k, v, g, beta, initial_state=self.pool, use_qk_l2norm_in_kernel=True,
            cu_seqlens=torch.arange(0, n * tokens + 1, tokens, dtype=torch.int32),
            ssm_state_indices=index if tokens > 1 else index.reshape(n),
            num_accepted_tokens=torch.tensor(accepted, dtype=torch.int32) if tokens > 1 else None,
        )  # fmt: skip
        return o


def _trace_key(kernel: Any, args: tuple, kwargs: dict) -> tuple:
    """What a trace depends on: the kernel, every array's shape and dtype, every other argument's value (arrays'
    contents are device data a trace never reads)."""

    def part(x: Any) -> Any:
        if isinstance(x, np.ndarray):
            return ("array", x.shape, str(x.dtype))
        return x if isinstance(x, (int, float, str, bool, tuple, type(None))) else type(x).__name__

    name = getattr(kernel, "__name__", None) or getattr(getattr(kernel, "func", None), "__name__", repr(kernel))
    return (name, tuple(part(a) for a in args), tuple(sorted((k, part(v)) for k, v in kwargs.items())))


@contextlib.contextmanager
def counting_traces() -> Iterator[Counter]:
    """Count launches per distinct trace key: the number of keys is how many programs a compiling backend traces
    (nki-cpu interprets every launch; the real ``nki`` would trace each key once). Keys: ``_trace_key``."""
    seen: Counter = Counter()
    launch = backend.simulate

    def recording(kernel: Any) -> Any:
        run = launch(kernel)

        def call(*args: Any, **kwargs: Any) -> Any:
            seen[_trace_key(kernel, args, kwargs)] += 1
            return run(*args, **kwargs)

        return call

    backend.simulate = recording
    try:
        yield seen
    finally:
        backend.simulate = launch


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
