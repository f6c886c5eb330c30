"""The ops on a device (Neuron / XLA tensors): the ``@nki.jit`` kernels launched on the device tensors, as
torch-neuronx runs them ("How to work with NKI kernels from torch-neuronx", Neuron docs, SDK 2.33: a kernel called
on device tensors is compiled once per shapes, dtypes and non-tensor values, then runs on the device).

Nothing here reads a device value on the host. The trace-time rules (``rules.py``) read shapes and dtypes; the
bucket is the caller's or comes from shapes alone; each sequence is packed and padded to its chunk multiple by
torch ops in the graph (index tables built on the device from ``cu_seqlens``, one gather per tensor); the pool
is handed to the kernel itself, which reads and writes its named rows. The value rules (NaN / Inf, g ≤ 0, β in
[0, 1], index range and duplicates, equal decode lengths) would need a sync: this path trusts them, as vLLM's and
FlashInfer's kernels do; ``gdn_nki.torch.check_values`` runs them on demand (a server's debug mode).

Layout: the prefill kernels read head-major [1, H, T, D] rows; FLA's tensors are seq-first [B, T, H, D]. The
packing gather writes its result head-major, so the transposition is that one copy, which the packing needs anyway
(each sequence moves to its padded place). The decode kernel reads [N, T, H, D], a view of FLA's packed row.

``launch`` is the one call of a kernel; the tests replace it with a recorder to see what reaches the kernel.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from gdn_ref.constants import CHUNK_BY_ALGORITHM
from gdn_ref.masks import build_mask_pack

from ..cte.bucket import gdn_cte_bucket
from ..host.torch_io import import_torch, rejection
from ..normed.bucket import gdn_cte_bucket_normed
from ..tkg.fused import gdn_tkg as gdn_tkg_kernel
from ..tkg.step import gdn_step
from . import chunk as host_chunk
from . import rules

torch = import_torch()
Tensor = torch.Tensor


def run_kernel(kernel: Any, *args: Any, **kwargs: Any) -> Any:
    """Launch an ``@nki.jit`` kernel on device tensors (torch-neuronx: the call itself runs it on the device)."""
    return kernel(*args, **kwargs)


# The kernel launch every device implementation makes; a test swaps in a recorder.
launch: Callable[..., Any] = run_kernel


def chunk(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, initial_state: Tensor | None,
          A_log: Tensor | None, dt_bias: Tensor | None, cu_seqlens: Tensor | None, scale: float | None,
          use_qk_l2norm: bool, use_beta_sigmoid: bool, use_gate: bool, algorithm: str, group_size: int,
          bucket: list[int] | None, z: Tensor | None = None, norm_weight: Tensor | None = None,
          norm_eps: float = 1e-6, norm_activation: str = "silu") -> tuple[Tensor, Tensor]:  # fmt: skip
    """``gdn_nki::chunk_gated_delta_rule`` on a device: the bucket kernel on a fresh pool of one row per sequence
    (a copy of ``initial_state``, or zeros), which is the final state; with ``z``, the one with the gated RMSNorm
    in its output stage (``gdn_cte_bucket_normed``)."""
    n_seqs = rules.prefill(q, k, v, g, beta, initial_state, None, A_log, dt_bias, cu_seqlens, use_gate, scale,
                           algorithm, group_size, bucket)  # fmt: skip
    norm = _folded_norm(q, v, z, norm_weight, norm_eps, norm_activation)
    tail = (v.shape[2], q.shape[3], v.shape[3])
    if initial_state is None:
        pool = q.new_zeros((n_seqs, *tail), dtype=torch.float32)
        reads = torch.full((n_seqs,), -1, dtype=torch.int32, device=q.device)
    else:
        pool, reads = initial_state.to(torch.float32, copy=True), None
    rows = torch.arange(n_seqs, dtype=torch.int32, device=q.device)
    gates = fused_gates(g, beta, A_log, dt_bias, use_beta_sigmoid, use_gate)
    o = _bucketed(q, k, v, *gates, pool, rows, reads, cu_seqlens, None, None, n_seqs, scale, use_qk_l2norm,
                  algorithm, group_size, bucket, norm=norm)  # fmt: skip
    return o, pool


def chunk_pool(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, pool: Tensor, state_indices: Tensor,
               A_log: Tensor | None, dt_bias: Tensor | None, cu_seqlens: Tensor | None,
               checkpoint_indices: Tensor | None, read_indices: Tensor | None, scale: float | None,
               use_qk_l2norm: bool, use_beta_sigmoid: bool, use_gate: bool, algorithm: str, group_size: int,
               bucket: list[int] | None, checkpoint_every: int | None, state_v_first: bool = False,
               z: Tensor | None = None, norm_weight: Tensor | None = None, norm_eps: float = 1e-6,
               norm_activation: str = "silu") -> Tensor:  # fmt: skip
    """``gdn_nki::chunk_gated_delta_rule_pool`` on a device: the bucket kernel on the pool itself (V-major with
    ``state_v_first``: the kernel reads and writes it so); with ``z``, ``gdn_cte_bucket_normed``."""
    n_seqs = rules.prefill(q, k, v, g, beta, pool, state_indices, A_log, dt_bias, cu_seqlens, use_gate, scale,
                           algorithm, group_size, bucket, checkpoint_every, checkpoint_indices, read_indices,
                           v_first=state_v_first)  # fmt: skip
    norm = _folded_norm(q, v, z, norm_weight, norm_eps, norm_activation)
    gates = fused_gates(g, beta, A_log, dt_bias, use_beta_sigmoid, use_gate)
    return _bucketed(q, k, v, *gates, pool, state_indices, read_indices, cu_seqlens, checkpoint_every,
                     checkpoint_indices, n_seqs, scale, use_qk_l2norm, algorithm, group_size, bucket,
                     state_v_first, norm)  # fmt: skip


def _folded_norm(q: Tensor, v: Tensor, z: Tensor | None, weight: Tensor | None, eps: float,
                 activation: str) -> dict[str, Any] | None:  # fmt: skip
    """The folded norm's rules checked (``rules.folded_norm``), then its arguments for ``_bucketed``, or None."""
    rules.folded_norm(q, v, z, weight, eps, activation)
    if z is None:
        return None
    return {"z": z, "norm_weight": weight, "eps": float(eps), "activation": activation}


def fused_gates(g: Tensor | None, beta: Tensor | None, A_log: Tensor | None, dt_bias: Tensor | None,
                use_beta_sigmoid: bool, use_gate: bool) -> tuple[Tensor | None, Tensor | None]:  # fmt: skip
    """The log-decay and β in fp32, the fused activations done by torch ops in the graph (fp32, as FLA's kernels
    do them; the CPU path evaluates them in fp64 rounded once, so these may differ by an fp32 ulp). None stays
    None."""
    g = None if g is None else g.to(torch.float32)
    beta = None if beta is None else beta.to(torch.float32)
    if use_beta_sigmoid and beta is not None:
        beta = torch.sigmoid(beta)
    if use_gate and A_log is not None and g is not None:
        bias = 0.0 if dt_bias is None else dt_bias.to(torch.float32).reshape(-1)
        g = -A_log.to(torch.float32).reshape(-1).exp() * torch.nn.functional.softplus(g + bias)
    return g, beta


def bucket_shape(tokens: int, n_seqs: int, algorithm: str, bucket: list[int] | None) -> tuple[int, int]:
    """The caller's bucket, else the batch's own worst case read from shapes (``rules.worst_case_tokens``)."""
    if bucket is not None:
        return int(bucket[0]), int(bucket[1])
    chunk_tokens = CHUNK_BY_ALGORITHM[algorithm]
    return max(chunk_tokens, rules.worst_case_tokens(tokens, n_seqs, chunk_tokens)), n_seqs


def _bucketed(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, pool: Tensor, rows: Tensor,
              reads: Tensor | None, cu_seqlens: Tensor | None, checkpoint_every: int | None,
              checkpoint_indices: Tensor | None, n_seqs: int, scale: float | None, use_qk_l2norm: bool,
              algorithm: str, group_size: int, bucket: list[int] | None, state_v_first: bool = False,
              norm: dict[str, Any] | None = None) -> Tensor:  # fmt: skip
    """Pack, launch ``gdn_cte_bucket`` once (``gdn_cte_bucket_normed`` with ``norm``: z packed seq-first as the
    kernel reads it, the weight, eps and gate), unpack: o (or y) [B, T, Hv, V] seq-first."""
    batch, seq_len, _, dk = q.shape
    tokens = batch * seq_len
    bucket_tokens, slots = bucket_shape(tokens, n_seqs, algorithm, bucket)
    if use_qk_l2norm:
        q, k = host_chunk._l2norm(q), host_chunk._l2norm(k)
    layout = PackedLayout.build(cu_seqlens, batch, seq_len, CHUNK_BY_ALGORITHM[algorithm], bucket_tokens, q.device)
    extra: dict[str, Any] = {}
    if checkpoint_every is not None and checkpoint_indices is not None:
        extra = {"checkpoint_every": checkpoint_every,
                 "checkpoint_indices": _slots(layout.checkpoints(checkpoint_indices, checkpoint_every), slots)}  # fmt: skip
    if reads is not None:
        extra["read_indices"] = _slots(reads, slots)
    if state_v_first:  # a K-major launch keeps its keywords as they were
        extra["state_v_first"] = True
    kernel, gate = gdn_cte_bucket, ()
    if norm is not None:
        kernel, gate = gdn_cte_bucket_normed, (layout.pack(norm["z"], head_major=False), norm["norm_weight"])
        extra.update(eps=norm["eps"], activation=norm["activation"])
    span, strided = pool_span(pool)  # a row-strided pool: its span, no copy (``common.pool_rows``)
    out, _ = launch(
        kernel, *(layout.pack(x) for x in (q, k, v, g, beta)), *gate, layout.chunk_bounds(slots),
        _slots(rows, slots), span, scale=dk**-0.5 if scale is None else scale, algorithm=algorithm,
        mask_pack=mask_pack(q.device, algorithm), group_size=group_size, **extra, **strided,
    )  # fmt: skip
    return layout.unpack(out, batch, seq_len)


def _slots(table: Tensor, slots: int) -> Tensor:
    """A per-sequence int32 table ([n] or [n, K]) padded with −1 rows to the bucket's N slots."""
    table = table.to(torch.int32)
    pad = table.new_full((slots - table.shape[0], *table.shape[1:]), -1)
    return torch.cat([table, pad])


class PackedLayout:
    """Where each token of the packed seq-first row goes in a bucket of T tokens, each sequence padded to its chunk
    multiple (g = 0, β = 0, zero q/k/v: they neither decay nor write the state), built on the device from
    ``cu_seqlens`` by torch ops: no value is read on the host."""

    def __init__(self, cu: Tensor, padded_starts: Tensor, chunk_tokens: int, bucket_tokens: int) -> None:
        self.cu, self.padded_starts, self.chunk_tokens = cu, padded_starts, chunk_tokens
        n_seqs = cu.shape[0] - 1
        position = torch.arange(bucket_tokens, device=cu.device)
        seq = torch.searchsorted(padded_starts[1:], position, right=True).clamp(max=max(n_seqs - 1, 0))
        offset = position - padded_starts[seq]
        lengths = cu[1:] - cu[:-1]
        self.valid = (position < padded_starts[-1]) & (offset < lengths[seq])
        self.source = torch.where(self.valid, cu[seq] + offset, 0)
        self.lengths = lengths

    @classmethod
    def build(cls, cu_seqlens: Tensor | None, batch: int, seq_len: int, chunk_tokens: int, bucket_tokens: int,
              device: Any) -> PackedLayout:  # fmt: skip
        """From ``cu_seqlens``, or B rows of T tokens as B sequences, on ``device``."""
        if cu_seqlens is None:
            cu = torch.arange(batch + 1, dtype=torch.int64, device=device) * seq_len
        else:
            cu = cu_seqlens.to(device=device, dtype=torch.int64)
        chunks = (cu[1:] - cu[:-1] + chunk_tokens - 1) // chunk_tokens
        padded_starts = torch.cat([chunks.new_zeros(1), torch.cumsum(chunks, 0) * chunk_tokens])
        return cls(cu, padded_starts, chunk_tokens, bucket_tokens)

    def pack(self, x: Tensor, head_major: bool = True) -> Tensor:
        """Seq-first [B, T, H(, D)] -> head-major [1, H, T_bucket(, D)] (``head_major=False``: seq-first
        [1, T_bucket, H(, D)], as the folded norm reads z), padding tokens zero."""
        flat = x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])
        taken = flat.index_select(0, self.source)
        keep = self.valid.reshape(-1, *([1] * (taken.dim() - 1)))
        taken = torch.where(keep, taken, torch.zeros((), dtype=taken.dtype, device=taken.device))
        return (taken.movedim(0, 1) if head_major else taken).unsqueeze(0).contiguous()

    def chunk_bounds(self, slots: int) -> Tensor:
        """[N + 1] int32: sequence i is chunks ``chunk_bounds[i] .. chunk_bounds[i + 1] − 1``, empty slots last."""
        bounds = (self.padded_starts // self.chunk_tokens).to(torch.int32)
        return torch.cat([bounds, bounds[-1:].expand(slots + 1 - bounds.shape[0])])

    def checkpoints(self, table: Tensor, every: int) -> Tensor:
        """The caller's [n, K] checkpoint rows, −1 past each sequence's length (as the host path drops them)."""
        taken = torch.arange(1, table.shape[1] + 1, device=table.device)[None, :] * every <= self.lengths[:, None]
        return torch.where(taken, table.to(torch.int32), -1)

    def unpack(self, out: Tensor, batch: int, seq_len: int) -> Tensor:
        """The kernel's head-major [1, Hv, T_bucket, Dv] back to seq-first [B, T, Hv, Dv], padding dropped."""
        token = torch.arange(batch * seq_len, device=self.cu.device)
        seq = torch.searchsorted(self.cu[1:], token, right=True).clamp(max=max(self.cu.shape[0] - 2, 0))
        position = self.padded_starts[seq] + token - self.cu[seq]
        rows = out[0].index_select(1, position)
        return rows.movedim(1, 0).reshape(batch, seq_len, *rows.shape[::2]).contiguous()


_MASK_PACKS: dict[tuple[str, str], Tensor] = {}


def mask_pack(device: Any, algorithm: str) -> Tensor | None:
    """schur's mask pack on ``device``, made once per device (a constant of every launch); None for neumann."""
    if algorithm != "schur":
        return None
    key = (str(device), algorithm)
    if key not in _MASK_PACKS:
        _MASK_PACKS[key] = torch.from_numpy(build_mask_pack()).to(device)
    return _MASK_PACKS[key]


def fused_recurrent(q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, beta: Tensor | None,
                    initial_state: Tensor | None, cu_seqlens: Tensor | None, scale: float | None,
                    use_qk_l2norm: bool) -> tuple[Tensor, Tensor]:  # fmt: skip
    """``gdn_nki::fused_recurrent_gated_delta_rule`` on a device: ``gdn_step`` on a fresh pool of one row per
    sequence (a copy of ``initial_state``, or zeros), which is the final state. Packed sequences must share one
    length (trusted)."""
    n_seqs, tokens = rules.fla_decode(q, k, v, g, beta, initial_state, cu_seqlens)
    if not tokens:
        raise rejection("cu_seqlens", f"{n_seqs} sequences sharing {q.shape[1]} tokens", "on a device the packed "
                        "sequences share one length (one program per (N, T))", "split the batch by length")  # fmt: skip
    tail = (v.shape[2], q.shape[3], v.shape[3])
    pool = q.new_zeros((n_seqs, *tail), dtype=torch.float32) if initial_state is None else initial_state.clone()
    per_token = (n_seqs, tokens, v.shape[2])
    g_log = q.new_zeros(per_token, dtype=torch.float32) if g is None else g.to(torch.float32).reshape(per_token)
    strength = q.new_ones(per_token, dtype=torch.float32) if beta is None else beta.to(torch.float32).reshape(per_token)
    rows = torch.arange(n_seqs, dtype=torch.int32, device=q.device)
    out = _step(q, k, v, pool, rows, None, dict(g_log=g_log, beta=strength), n_seqs, tokens, scale, use_qk_l2norm)
    return out, pool


def vllm_fused_recurrent(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor | None, pool: Tensor,
                         ssm_state_indices: Tensor, cu_seqlens: Tensor | None, num_accepted_tokens: Tensor | None,
                         scale: float | None, use_qk_l2norm: bool, state_v_first: bool = False) -> Tensor:  # fmt: skip
    """``gdn_nki::vllm_fused_recurrent_gated_delta_rule`` on a device: ``gdn_step`` on the pool itself (V-major with
    ``state_v_first``)."""
    n_seqs, tokens = rules.pool_decode(q, k, v, pool, ssm_state_indices, cu_seqlens, num_accepted_tokens, scale,
                                       use_qk_l2norm, {"g": g, "beta": beta}, v_first=state_v_first)  # fmt: skip
    per_token = (n_seqs, tokens, v.shape[2])
    strength = q.new_ones(per_token, dtype=torch.float32) if beta is None else beta.to(torch.float32).reshape(per_token)
    gates = dict(g_log=g.to(torch.float32).reshape(per_token), beta=strength)
    accepted = None if num_accepted_tokens is None else num_accepted_tokens.to(torch.int32)
    return _step(q, k, v, pool, ssm_state_indices, accepted, gates, n_seqs, tokens, scale, use_qk_l2norm,
                 state_v_first)  # fmt: skip


def fused_sigmoid_gating(A_log: Tensor, a: Tensor, dt_bias: Tensor, q: Tensor, k: Tensor, v: Tensor, b: Tensor,
                         pool: Tensor, initial_state_indices: Tensor, cu_seqlens: Tensor | None, softplus_beta: float,
                         softplus_threshold: float, scale: float | None, use_qk_l2norm: bool,
                         num_accepted_tokens: Tensor | None = None, state_v_first: bool = False) -> Tensor:  # fmt: skip
    """``gdn_nki::fused_sigmoid_gating_delta_rule_update`` on a device: ``gdn_step``'s fused gating on the pool
    (V-major with ``state_v_first``: the kernel reads and writes it so)."""
    gates = {"a": a, "b": b, "A_log": A_log, "dt_bias": dt_bias}
    n_seqs, tokens = rules.pool_decode(q, k, v, pool, initial_state_indices, cu_seqlens, num_accepted_tokens, scale,
                                       use_qk_l2norm, gates, name="initial_state_indices", v_first=state_v_first)  # fmt: skip
    per_token = (n_seqs, tokens, v.shape[2])
    fused = dict(a=a.to(torch.float32).reshape(per_token), b=b.to(torch.float32).reshape(per_token),
                 A_log=A_log.to(torch.float32), dt_bias=dt_bias.to(torch.float32))  # fmt: skip
    accepted = None if num_accepted_tokens is None else num_accepted_tokens.to(torch.int32)
    return _step(q, k, v, pool, initial_state_indices, accepted, fused, n_seqs, tokens, scale, use_qk_l2norm,
                 state_v_first)  # fmt: skip


def _step(q: Tensor, k: Tensor, v: Tensor, pool: Tensor, rows: Tensor, accepted: Tensor | None,
          gates: dict[str, Tensor], n_seqs: int, tokens: int, scale: float | None, use_qk_l2norm: bool,
          state_v_first: bool = False) -> Tensor:  # fmt: skip
    """One ``gdn_step`` launch on [N, T, ...] views of the seq-first rows; o back as [B, T, HV, V]."""

    def requests(x: Tensor) -> Tensor:
        return x.reshape(n_seqs, tokens, *x.shape[2:])

    span, strided = pool_span(pool)
    out, _ = launch(
        gdn_step, requests(q), requests(k), requests(v), span, rows.to(torch.int32), accepted, **gates,
        scale=float(q.shape[-1]) ** -0.5 if scale is None else scale, use_qk_l2norm=bool(use_qk_l2norm),
        **({"state_v_first": True} if state_v_first else {}),  # a K-major launch keeps its keywords as they were
        **strided,
    )  # fmt: skip
    return out.reshape(*v.shape[:3], v.shape[3])


def pool_span(pool: Tensor) -> tuple[Tensor, dict[str, int]]:
    """A pool as a kernel takes it, and the keyword saying so: the pool itself when contiguous; else (rows at their
    own stride, each dense: ``rules`` refused any other layout) its span, a 1-D view of the same storage from its
    first element to its last (``Tensor.as_strided``: no copy), and ``state_row_stride`` (``common.pool_rows``)."""
    if pool.is_contiguous():
        return pool, {}
    stride = int(pool.stride(0))
    length = (pool.shape[0] - 1) * stride + math.prod(pool.shape[1:])
    return pool.as_strided((length,), (1,)), {"state_row_stride": stride}


def gdn_tkg(q: Tensor, k: Tensor, v: Tensor, b: Tensor, a: Tensor, A_log: Tensor, dt_bias: Tensor, z: Tensor,
            norm_weight: Tensor, state_in: Tensor) -> tuple[Tensor, Tensor]:  # fmt: skip
    """``gdn_nki::gdn_tkg`` on a device: the kernel on the device tensors as they are (its own layout)."""
    rules.tkg(q, k, v, b, a, A_log, dt_bias, z, norm_weight, state_in)
    return launch(gdn_tkg_kernel, q, k, v, b, a, A_log, dt_bias, z, norm_weight, state_in)
