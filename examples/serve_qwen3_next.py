"""A stream of requests served by a small continuous-batching engine over HF transformers' Qwen3-Next, whose
GatedDeltaNet layers run on gdn-nki between HF's in and out projections — the causal conv1d, the gating, the gated
delta rule and the gated RMSNorm — judged token for token against HF's own model run one request at a time.

The tiny config of ``qwen3_next_layer.py`` (random weights, nothing downloaded). The engine (``serving/``) keeps
one pool for every request and GDN layer, each row holding a conv window (the model's dtype) and an fp32 recurrent
state: per request and layer T rows (T = the speculative width), allocated on arrival, freed (poisoned with NaN) on
completion or abort, and reused. Each step packs waiting prompts and chunks of long ones into ONE prefill per GDN
layer, in the smallest of a few configured prefill buckets (T tokens, N sequences) that holds them: vLLM's
``causal_conv1d_fn`` on the pool's windows, FLA's ``chunk_gated_delta_rule(..., bucket=(T, N))`` with the gating in
the kernel, FLA's ``rms_norm_gated`` — the layout and the pool rows are device data, so each bucket is one compiled
program per kernel. Every running request goes into ONE decode per GDN layer: vLLM's ``causal_conv1d_update`` and
``fused_sigmoid_gating_delta_rule_update`` with [N, T] rows and ``num_accepted_tokens`` (N padded to a decode
bucket with -1 rows), then ``rms_norm_gated``: T tokens verified at a time from an n-gram draft, both states rolled
back to the accepted prefix by reading the accepted token's row next step. Prefix cache: the prefill kernels write
the conv window and the state at every block boundary inside a prompt into the same rows the cache owns
(``checkpoint_every``, ``checkpoint_indices``), and a prompt that shares a block-aligned prefix with an earlier one
starts both from that row (``read_indices``: read on device, the request's own row written) — no pool row is
copied on the host. HF's GDN functions (its recurrences, its causal conv, whose fallback prints "falling back to
its reference PyTorch implementation", and its gated norm) are replaced by ones that raise while the engine runs.

Judged: fp32, every request's greedy tokens equal HF's ``generate`` and every logit within 1e-4; bf16, the
agreement is reported (first divergence, token match rate). Programs: every launch of a kernel and bucket had the
same trace key (kernel, shapes, dtypes, non-tensor values: what a compiling backend compiles on) and ran the same
static program (nki-cpu's ``Trace.fingerprint()``), one per kernel and bucket used
(``gdn_nki.traces.recording_launches``).

    python examples/serve_qwen3_next.py [--requests 12] [--max-prompt 600] [--dtype float32 bfloat16]
"""

from __future__ import annotations

import argparse
import functools
import logging
import random
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import Qwen3NextForCausalLM
from transformers.models.qwen3_next import modeling_qwen3_next as hf

from gdn_nki.traces import Launch, recording_launches

sys.path.insert(0, str(Path(__file__).resolve().parent))

from qwen3_next_layer import tiny_config
from serving.engine import Config, Engine, Request
from serving.kernels import hf_gdn_forbidden
from serving.model import PackedQwen3Next
from serving.pool import StatePool, check

LOGIT_TOLERANCE = 1e-4  # fp32
KERNEL_OF_PHASE = {"prefill": "gdn_cte_bucket", "decode": "gdn_step", "conv_prefill": "gdn_conv_bucket",
                   "conv_decode": "gdn_conv_step", "norm_prefill": "gdn_gated_rms_norm",
                   "norm_decode": "gdn_gated_rms_norm"}  # fmt: skip


def build_model(dtype: torch.dtype, seed: int = 0, layer_types: tuple[str, ...] | None = None) -> Qwen3NextForCausalLM:
    """The tiny config's model with random weights; ``layer_types``: other layers than its one GatedDeltaNet and one
    attention layer (with several GDN layers, a row or checkpoint of the wrong layer changes the result)."""
    torch.manual_seed(seed)
    config = tiny_config()
    if layer_types is not None:
        config.layer_types, config.num_hidden_layers = list(layer_types), len(layer_types)
        config.mlp_only_layers = list(range(len(layer_types)))  # dense MLPs, as the tiny config's
    config.max_position_embeddings = 8192
    model = Qwen3NextForCausalLM(config).eval()
    for module in model.modules():
        if isinstance(module, hf.Qwen3NextGatedDeltaNet):  # decay rates like a trained model's (see the layer example)
            module.A_log.data = torch.empty_like(module.A_log).uniform_(0.01, 0.4).log()
    model.generation_config.eos_token_id = None
    return model.to(dtype)


def workload(count: int, max_prompt: int, max_new: int, seed: int, block: int = Config().block) -> list[Request]:
    """Random lengths (1 token up to ``max_prompt``), random arrival steps, a third sharing one of two prefixes of
    one to two cache blocks, every fourth repeating an earlier prompt (a cache hit and drafts to accept), every
    fifth aborted a few steps after it arrives."""
    rng = random.Random(seed)
    shared = [[rng.randrange(256) for _ in range(rng.randrange(block + 1, 2 * block + block // 2))] for _ in range(2)]
    requests = []
    for rid in range(count):
        length = rng.choice([1, rng.randrange(2, 16), rng.randrange(16, max_prompt + 1)])
        prompt = [rng.randrange(256) for _ in range(length)]
        if rid % 3 == 1:
            prompt = shared[rid % 2] + prompt
        if rid % 4 == 3:
            prompt = list(requests[rng.randrange(rid)].prompt)
        arrival = rng.randrange(0, 2 * count)
        abort = arrival + rng.randrange(1, 6) if rid % 5 == 4 else None
        requests.append(Request(rid, prompt, rng.randrange(1, max_new + 1), arrival, abort))
    return requests


@dataclass
class Verdict:
    rid: int
    tokens: int
    first_divergence: int | None  # index of the first differing token, None if identical
    matched: int  # positions where both runs chose the same token
    max_logit_error: float


class _HfReferenceFallbacks(logging.Filter):
    """Drops HF's "falling back to its reference PyTorch implementation" notices while ``judge`` runs HF's own
    model: the reference is HF's torch path by design (the engine never calls it; its test checks that no such
    warning is logged while serving)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "falling back to its reference PyTorch implementation" not in record.getMessage()


def judge(model: Qwen3NextForCausalLM, requests: list[Request]) -> list[Verdict]:
    """Each request's served tokens against HF's own greedy ``generate`` (its own GDN path) of as many tokens."""
    # On transformers' handlers: a logger's own filters do not see its child loggers' records (hub_kernels').
    handlers, quiet = logging.getLogger("transformers").handlers, _HfReferenceFallbacks()
    for handler in handlers:
        handler.addFilter(quiet)
    try:
        return _judge(model, requests)
    finally:
        for handler in handlers:
            handler.removeFilter(quiet)


def _judge(model: Qwen3NextForCausalLM, requests: list[Request]) -> list[Verdict]:
    verdicts = []
    for r in requests:
        if not r.output:
            continue
        with torch.no_grad():
            theirs = model.generate(torch.tensor([r.prompt]), max_new_tokens=len(r.output), do_sample=False,
                                    output_logits=True, return_dict_in_generate=True)  # fmt: skip
        tokens = theirs.sequences[0, len(r.prompt) :].tolist()
        same = [a == b for a, b in zip(r.output, tokens, strict=True)]
        first = same.index(False) if False in same else None
        # Up to the first divergence: past it the two runs condition on different tokens.
        upto = len(same) if first is None else first + 1
        pairs = list(zip(r.logits, theirs.logits, strict=True))[:upto]
        error = max(float((ours - t[0].float()).abs().max()) for ours, t in pairs)
        verdicts.append(Verdict(r.rid, len(tokens), first, sum(same), error))
    return verdicts


def serve(
    dtype: str, requests: list[Request], config: Config, log=print, layer_types: tuple[str, ...] | None = None
) -> tuple[Engine, dict]:
    """Run ``requests`` through the engine on a fresh model (``build_model``'s ``layer_types``); returns the engine
    and its programs: per phase and bucket, how many launches ran each program (``programs``)."""
    model = build_model(getattr(torch, dtype), layer_types=layer_types)
    gdn = sum(t == "linear_attention" for t in model.config.layer_types)
    pool = make_pool(model, config.max_running * gdn * config.spec_tokens + config.cache_entries * gdn)
    engine = Engine(PackedQwen3Next(model, pool, config.buckets), pool, config, log)
    for r in requests:
        engine.submit(r)
    with hf_gdn_forbidden(), recording_launches() as launches:
        while not engine.idle:
            engine.step()
    check(pool.in_use == sum(len(e.rows) for e in engine.prefix.values()), "rows outlived their requests")
    return engine, programs(engine.model.kernels.calls, launches)


def make_pool(model: Qwen3NextForCausalLM, rows: int) -> StatePool:
    """A pool of ``rows`` rows for the model's GDN layers: fp32 states [Hv, Dk, Dv] and conv windows [C, W − 1] in
    the model's dtype (C = the q|k|v channels the conv runs over)."""
    c = model.config
    channels = 2 * c.linear_num_key_heads * c.linear_key_head_dim + c.linear_num_value_heads * c.linear_value_head_dim
    return StatePool(rows, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim,
                     windows=(channels, c.linear_conv_kernel_dim - 1, model.dtype))  # fmt: skip


def programs(calls: list[tuple[str, tuple[int, int]]], launches: list[Launch]) -> dict:
    """{phase: {bucket: Counter((trace key, program fingerprints))}} from the seam's calls (phase, bucket) and the
    launches in the same order (one per call): a program is what a compiling backend compiles (the trace key) and
    what nki-cpu ran (the fingerprints; None on the real ``nki``). A launch of another kernel than the phase's is an
    error."""
    check(len(calls) == len(launches), f"{len(calls)} kernel calls but {len(launches)} launches")
    found: dict[str, dict[tuple[int, int], Counter]] = {}
    for (phase, bucket), launch in zip(calls, launches, strict=True):
        check(launch.kernel == KERNEL_OF_PHASE[phase], f"{phase} launched {launch.kernel}")
        found.setdefault(phase, {}).setdefault(bucket, Counter())[launch.key, launch.programs] += 1
    return found


def summary(engine: Engine, programs: dict, verdicts: list[Verdict], dtype: str) -> list[str]:
    s = engine.stats
    done = sum(r.state == "done" for r in engine.requests.values())
    computed = s["prefill_tokens"]
    lines = [
        f"{dtype}: {len(engine.requests)} requests ({done} done, {s['aborted']} aborted) in {engine.step_no} steps; "
        f"pool high water {engine.pool.high_water}/{len(engine.pool.owner)} rows",
        f"  prefix cache (conv-window and state checkpoints written by the prefill kernels every {engine.config.block} "
        "tokens): "
        f"{s['cache_hits']} hits, {s['cached_tokens']} prompt tokens not recomputed "
        f"({s['cached_tokens'] / max(1, computed + s['cached_tokens']):.0%} of {computed + s['cached_tokens']})",
        f"  speculative decoding: {s['decode_steps']} decode steps, {s['accepted_drafts']}/{s['drafted']} drafted "
        "tokens accepted",
    ]
    for phase, buckets in sorted(programs.items()):
        for bucket, runs in sorted(buckets.items()):
            lines.append(f"  {phase} bucket {'x'.join(map(str, bucket)):>7} ({KERNEL_OF_PHASE[phase]}): "
                         f"{sum(runs.values())} launches, {len(runs)} program(s)")  # fmt: skip
    for v in verdicts:
        lines.append(f"  request {v.rid:2d}: {v.tokens:3d} tokens, match {v.matched / v.tokens:6.1%}, first divergence "
                     f"{'-' if v.first_divergence is None else v.first_divergence}, max |logit diff| to it {v.max_logit_error:.1e}")  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--max-prompt", type=int, default=600)
    parser.add_argument("--max-new", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    args = parser.parse_args(argv)
    ok = True
    for dtype in args.dtype:
        requests = workload(args.requests, args.max_prompt, args.max_new, args.seed)
        engine, ran = serve(dtype, requests, Config(), log=functools.partial(print, flush=True))
        verdicts = judge(build_model(getattr(torch, dtype)), requests)
        print("\n".join(summary(engine, ran, verdicts, dtype)))
        matched = sum(v.matched for v in verdicts)
        print(f"  {dtype} agreement with HF: {matched}/{sum(v.tokens for v in verdicts)} tokens, "
              f"{sum(v.first_divergence is None for v in verdicts)}/{len(verdicts)} requests identical")  # fmt: skip
        if dtype == "float32":
            exact = all(v.first_divergence is None and v.max_logit_error <= LOGIT_TOLERANCE for v in verdicts)
            print(f"  fp32 verdict: {'every token identical, logits within 1e-4' if exact else 'MISMATCH'}")
            ok &= exact
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
