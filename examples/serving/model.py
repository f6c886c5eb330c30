"""HF's Qwen3-Next layers run over a packed batch of request segments, each with its own caches.

Every projection, layer norm, weight, rotary embedding, attention function and MLP is the HF module's own; a
GatedDeltaNet layer's conv, gating, recurrence and gated RMSNorm run on gdn-nki, reached only through ``GdnKernels``.
What this module adds is the bookkeeping HF's single-batch ``Cache`` cannot do for a continuous batch: per request
a KV cache (host tensors), and per GDN layer its conv windows and recurrent states in rows of the shared pool (one
row number names both). A forward leaves the KV caches untouched until ``commit`` says how many of a segment's
tokens were accepted (speculative decoding rolls back the rest; the pool rows roll back by the rows the next step
reads).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers.models.qwen3_next import modeling_qwen3_next as hf

from .kernels import Buckets, GdnKernels
from .pool import StatePool, check


@dataclass
class RequestCache:
    """One request's caches: KV per attention layer, and per GDN layer ``width`` pool rows, each holding a conv
    window and a recurrent state (row 0 holds them during prefill; a decode of T tokens writes them after token t to
    row t)."""

    rid: int
    rows: dict[int, list[int]]
    kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    accepted: int = 1  # the current state is in rows[layer][accepted - 1]
    length: int = 0  # tokens in the caches


@dataclass
class Segment:
    """Tokens of one request in a packed forward.

    ``read``: (owner, {GDN layer: pool row}) of the rows a prefill starts from instead of the request's own (a
    prefix-cache entry it resumes from); None: the request's own row, or zero at its first token.
    ``checkpoints[k]``: {GDN layer: prefix-cache row} for the state after ``(k + 1) · block`` of the segment's
    tokens, or None."""

    cache: RequestCache
    tokens: list[int]
    read: tuple[object, dict[int, int]] | None = None
    checkpoints: list[dict[int, int] | None] = field(default_factory=list)
    pending: dict = field(default_factory=dict)


class PackedQwen3Next:
    """``model`` (``Qwen3NextForCausalLM``) over packed segments, its GDN cores on ``kernels``."""

    def __init__(self, model: hf.Qwen3NextForCausalLM, pool: StatePool, buckets: Buckets) -> None:
        self.model, self.pool = model, pool
        self.kernels = GdnKernels(pool.states, pool.windows, buckets)
        self.layers = list(model.model.layers)
        self.gdn_layers = [i for i, layer in enumerate(self.layers) if layer.block_type == "linear_attention"]

    @torch.no_grad()
    def forward(self, segments: list[Segment], decode: bool) -> torch.Tensor:
        """Logits [tokens, vocab] of the segments' tokens, in packing order. ``decode``: every segment has the
        same T tokens and reads its state from row ``accepted - 1`` (else: prefill, row 0 read and written)."""
        ids = torch.tensor([t for s in segments for t in s.tokens])[None]
        positions = torch.cat([torch.arange(s.cache.length, s.cache.length + len(s.tokens)) for s in segments])[None]
        bounds = [0]
        for s in segments:
            bounds.append(bounds[-1] + len(s.tokens))
        h = self.model.model.embed_tokens(ids)
        rotary = self.model.model.rotary_emb(h, positions)
        for i, layer in enumerate(self.layers):
            x = layer.input_layernorm(h)
            if layer.block_type == "linear_attention":
                mixed = self._gdn(i, layer.linear_attn, x, segments, bounds, decode)
            else:
                mixed = self._attention(i, layer.self_attn, x, rotary, segments, bounds)
            h = h + mixed
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.model.lm_head(self.model.model.norm(h))[0]

    def _gdn(self, i, la, x, segments, bounds, decode) -> torch.Tensor:
        q, k, v, z, b, a = la.fix_query_key_value_ordering(la.in_proj_qkvz(x), la.in_proj_ba(x))
        mixed = torch.cat([t.reshape(1, t.shape[1], -1) for t in (q, k, v)], dim=-1)[0]
        self._assert_rows(i, segments)
        taps = la.conv1d.weight.squeeze(1)
        if decode:
            rows = [s.cache.rows[i][: len(segments[0].tokens)] for s in segments]
            accepted = [s.cache.accepted for s in segments]
            mixed = self.kernels.conv_decode(mixed, taps, la.conv1d.bias, la.activation, rows, accepted)[None]
        else:
            rows, reads, checkpoints = self._prefill_rows(i, segments)
            mixed = self.kernels.conv_prefill(mixed, taps, la.conv1d.bias, la.activation, bounds, rows, reads,
                                              checkpoints)[None]  # fmt: skip
        q, k, v = torch.split(mixed, [la.key_dim, la.key_dim, la.value_dim], dim=-1)
        q, k = (t.reshape(1, t.shape[1], -1, la.head_k_dim) for t in (q, k))
        v = v.reshape(1, v.shape[1], -1, la.head_v_dim)
        gate = (la.A_log, la.dt_bias)  # the gating runs in the kernel, from the raw a and b
        if decode:
            o = self.kernels.decode(q, k, v, a, b, gate, rows, accepted)
            phase, bucket = "norm_decode", (self.kernels.buckets.decode_bucket(len(segments)), len(segments[0].tokens))
        else:
            o = self.kernels.prefill(q, k, v, a, b, gate, bounds, rows, reads, checkpoints)
            phase, bucket = "norm_prefill", self.kernels.prefill_bucket_of(bounds)
        check(torch.isfinite(o).all(), f"layer {i}: the GDN core's output holds NaN/Inf (a poisoned row was read)")
        o = self.kernels.norm(phase, bucket, o[0], z[0], la.norm)
        return la.out_proj(o.reshape(1, o.shape[0], -1))

    def _assert_rows(self, i: int, segments: list[Segment]) -> None:
        """Every pool row layer ``i``'s kernels will read or write belongs to who reads or writes it."""
        block = self.kernels.buckets.block
        for s in segments:
            self.pool.assert_owned(s.cache.rows[i], s.cache.rid)
            if s.read:
                self.pool.assert_owned([s.read[1][i]], s.read[0])
            for column, rows in enumerate(s.checkpoints):
                if rows:
                    at = s.cache.length + (column + 1) * block
                    self.pool.assert_owned([rows[i]], ("cache", s.cache.rid, at))

    def _prefill_rows(self, i: int, segments: list[Segment]) -> tuple[list[int], list[int], list[list[int]]]:
        """Layer ``i``'s prefill rows, the same for the conv and the recurrence: each segment's own row, the row it
        starts from (a prefix-cache row, its own row, or -1 at its first token) and its checkpoint rows."""
        rows = [s.cache.rows[i][0] for s in segments]
        reads = [s.read[1][i] if s.read else s.cache.rows[i][0] if s.cache.length else -1 for s in segments]
        checkpoints = [[rows[i] if rows else -1 for rows in s.checkpoints] for s in segments]
        return rows, reads, checkpoints

    def _attention(self, i, at, x, rotary, segments, bounds) -> torch.Tensor:
        shape = (*x.shape[:-1], -1, at.head_dim)
        q, gate = torch.chunk(at.q_proj(x).view(*x.shape[:-1], -1, at.head_dim * 2), 2, dim=-1)
        q = at.q_norm(q.view(shape)).transpose(1, 2)
        k = at.k_norm(at.k_proj(x).view(shape)).transpose(1, 2)
        v = at.v_proj(x).view(shape).transpose(1, 2)
        q, k = hf.apply_rotary_pos_emb(q, k, *rotary)
        outs = []
        for s, start, end in zip(segments, bounds, bounds[1:], strict=False):
            past_k, past_v = s.cache.kv.get(i, (k[:, :, :0], v[:, :, :0]))
            keys, values = torch.cat([past_k, k[:, :, start:end]], 2), torch.cat([past_v, v[:, :, start:end]], 2)
            past, new = past_k.shape[2], end - start
            allowed = torch.arange(past + new)[None, :] <= torch.arange(past, past + new)[:, None]
            mask = torch.zeros(allowed.shape, dtype=q.dtype).masked_fill(~allowed, torch.finfo(q.dtype).min)
            out, _ = hf.eager_attention_forward(at, q[:, :, start:end], keys, values, mask[None, None], at.scaling)
            outs.append(out)
            s.pending[("kv", i)] = (keys, values)  # committed as the first past + accepted positions
        out = torch.cat(outs, dim=1).reshape(*x.shape[:-1], -1)
        return at.o_proj(out * torch.sigmoid(gate.reshape(*x.shape[:-1], -1)))

    def commit(self, segment: Segment, accepted: int) -> None:
        """Keep the caches' effect of the segment's first ``accepted`` tokens (its conv window and GDN state are in
        row ``accepted - 1`` after a decode, row 0 after a prefill)."""
        cache = segment.cache
        cache.kv = self.kv_after(segment, accepted, clone=False)
        cache.length += accepted
        segment.pending.clear()

    def kv_after(self, segment: Segment, tokens: int, clone: bool = True) -> dict:
        """The request's KV cache after the segment's first ``tokens`` tokens (before ``commit``): what a
        prefix-cache checkpoint inside the segment keeps beside its pool rows (which hold both GDN states)."""
        kv = dict(segment.cache.kv)
        keep = segment.cache.length + tokens
        for (_, i), value in segment.pending.items():
            kv[i] = (value[0][:, :, :keep], value[1][:, :, :keep])
            kv[i] = tuple(x.clone() for x in kv[i]) if clone else kv[i]
        return kv
