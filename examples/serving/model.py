"""HF's Qwen3-Next layers run over a packed batch of request segments, each with its own caches.

Every projection, layer norm, rotary embedding, attention function and MLP is the HF module's own (and so are the
GatedDeltaNet layer's weights); a GatedDeltaNet layer's conv, gating, recurrence and gated norm run on gdn-nki's
drop-ins, reached only through ``GdnKernels``. What this module adds is the bookkeeping HF's single-batch ``Cache``
cannot do for a continuous batch: per request a KV cache (host tensors) and, per GDN layer, rows of the shared pools
(the conv windows and the recurrent states, one row number for both). A forward leaves the KV caches untouched until
``commit`` says how many of a segment's tokens were accepted (speculative decoding rolls back the rest; the pools
roll back by the row decode reads next, ``RequestCache.accepted``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers.models.qwen3_next import modeling_qwen3_next as hf

from .kernels import Buckets, GdnKernels
from .pool import StatePool, check


@dataclass
class RequestCache:
    """One request's caches: KV per attention layer, and per GDN layer ``width`` pool rows, each a conv window and
    a recurrent state (row 0 holds both during prefill; a decode of T tokens writes both after token t to row t)."""

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
        self.kernels = GdnKernels(pool.states, pool.conv, buckets)
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
        """HF's in projections, gdn-nki's conv, gated delta rule (gating fused) and gated norm on the two pools at
        the segments' rows, HF's out projection."""
        q, k, v, z, b, a = la.fix_query_key_value_ordering(la.in_proj_qkvz(x), la.in_proj_ba(x))
        mixed = torch.cat([t.reshape(1, t.shape[1], -1) for t in (q, k, v)], dim=-1)[0]
        self._check_rows(i, segments)
        gate, kernels = (la.A_log, la.dt_bias), self.kernels
        if decode:
            rows = [s.cache.rows[i][: len(segments[0].tokens)] for s in segments]
            accepted = [s.cache.accepted for s in segments]
            bucket = (kernels.buckets.decode_bucket(len(segments)), len(segments[0].tokens))
            mixed = kernels.conv_decode(mixed, la.conv1d, la.activation, rows, accepted)
        else:
            # A prefix-cache hit reads both states from the entry's row, a continued prompt from its own row 0.
            reads = [s.read[1][i] if s.read else s.cache.rows[i][0] if s.cache.length else -1 for s in segments]
            checkpoints = [[entry[i] if entry else -1 for entry in s.checkpoints] for s in segments]
            own = [s.cache.rows[i][0] for s in segments]
            bucket = kernels.prefill_bucket(bounds)
            mixed = kernels.conv_prefill(mixed, la.conv1d, la.activation, bounds, own, reads, checkpoints)
        q, k, v = torch.split(mixed[None], [la.key_dim, la.key_dim, la.value_dim], dim=-1)
        q, k = (t.reshape(1, t.shape[1], -1, la.head_k_dim) for t in (q, k))
        v = v.reshape(1, v.shape[1], -1, la.head_v_dim)
        if decode:
            o = kernels.decode(q, k, v, a, b, gate, rows, accepted)
        else:
            o = kernels.prefill(q, k, v, a, b, gate, bounds, own, reads, checkpoints)
        check(torch.isfinite(o).all(), f"layer {i}: the GDN core's output holds NaN/Inf (a poisoned row was read)")
        o = kernels.norm("norm decode" if decode else "norm prefill", bucket, o[0], z[0], la.norm)
        return la.out_proj(o.reshape(1, o.shape[0], -1))

    def _check_rows(self, i: int, segments: list[Segment]) -> None:
        """Every row GDN layer ``i``'s launches will touch belongs to whom the segment says (before any launch)."""
        block = self.kernels.buckets.block
        for s in segments:
            self.pool.assert_owned(s.cache.rows[i], s.cache.rid)
            if s.read:
                self.pool.assert_owned([s.read[1][i]], s.read[0])
            for column, entry in enumerate(s.checkpoints):
                if entry:
                    at = s.cache.length + (column + 1) * block
                    self.pool.assert_owned([entry[i]], ("cache", s.cache.rid, at))

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
        """Keep the caches' effect of the segment's first ``accepted`` tokens (its GDN states, conv window and
        recurrent state, are in row ``accepted - 1`` after a decode, row 0 after a prefill)."""
        cache = segment.cache
        cache.kv = self.kv_after(segment, accepted, clone=False)
        cache.length += accepted
        segment.pending.clear()

    def kv_after(self, segment: Segment, tokens: int, clone: bool = True) -> dict:
        """The request's KV cache after the segment's first ``tokens`` tokens (before ``commit``): what a
        prefix-cache checkpoint inside the segment keeps beside its pool rows (which hold both GDN states)."""
        kv = dict(segment.cache.kv)
        for (kind, i), value in segment.pending.items():
            if kind == "kv":
                keep = segment.cache.length + tokens
                kv[i] = (value[0][:, :, :keep], value[1][:, :, :keep])
                kv[i] = tuple(x.clone() for x in kv[i]) if clone else kv[i]
        return kv
