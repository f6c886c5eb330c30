"""The serving loop of ``examples/serve_qwen3_next.py`` on a short stream: continuous batching on one pool of
recurrent states and conv windows, chunked prefill in prefill buckets, decode buckets, speculative verification
with the rollback of both states, prefix-cache hits from checkpoints of both the prefill kernels wrote, aborts —
every GatedDeltaNet computation between HF's projections on gdn-nki (conv, gating, recurrence, gated norm; HF's
fallback warning never logged), every request's greedy tokens HF's own fp32 ones, logits within 1e-4, one static
program per kernel and bucket, and the pool's bookkeeping loud when broken. Skipped, with the reason, without torch
and transformers (``nox -s integration`` installs both)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import pytest

from example_scripts import load_example
from gdn_nki.common import backend

torch = pytest.importorskip("torch", reason="torch is not installed (nox -s integration installs it)")
pytest.importorskip("transformers", reason="transformers is not installed (nox -s integration installs it)")


@contextlib.contextmanager
def transformers_warnings() -> Iterator[list[str]]:
    """Every warning transformers logs while open, ``warning_once``'s memory cleared first (a warning an earlier
    test already printed would otherwise be silent here)."""
    messages: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    logger, handler = logging.getLogger("transformers"), Keep(logging.WARNING)
    logging.Logger.warning_once.cache_clear()
    logger.addHandler(handler)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)


def _conv_inputs(model, tokens: list[int]) -> torch.Tensor:
    """The first layer's (a GatedDeltaNet's) conv inputs, q|k|v projected, [tokens, C], from HF's own modules."""
    layer = model.model.layers[0]
    la = layer.linear_attn
    with torch.no_grad():
        x = layer.input_layernorm(model.model.embed_tokens(torch.tensor([tokens])))
        q, k, v, *_ = la.fix_query_key_value_ordering(la.in_proj_qkvz(x), la.in_proj_ba(x))
        return torch.cat([t.reshape(1, t.shape[1], -1) for t in (q, k, v)], dim=-1)[0]


# The gdn_nki custom op each phase's drop-in calls (module, op name).
OP_OF_PHASE = {
    "conv_prefill": ("conv", "causal_conv1d_fn_op"),
    "prefill": ("ops", "chunk_pool_op"),
    "norm_prefill": ("norm", "rms_norm_gated_op"),
    "conv_decode": ("conv", "causal_conv1d_update_op"),
    "decode": ("ops", "fused_sigmoid_gating_op"),
    "norm_decode": ("norm", "rms_norm_gated_op"),
}


def test_served_stream_equals_hf_one_request_at_a_time_fp32(monkeypatch: pytest.MonkeyPatch) -> None:
    example = load_example("serve_qwen3_next")
    from serving.engine import Config
    from serving.kernels import Buckets

    import gdn_nki.torch

    # Every GDN computation of the engine goes through one gdn_nki custom op (the conv's, the recurrence's with its
    # gating, the gated norm's): the ops counted as the drop-ins call them, none bypassed by a host path.
    through_ops: list[str] = []
    for module, name in set(OP_OF_PHASE.values()):
        owner = getattr(gdn_nki.torch, module)
        op = getattr(owner, name)
        monkeypatch.setattr(
            owner, name, lambda *a, _op=op, _name=name, **kw: (through_ops.append(_name), _op(*a, **kw))[1]
        )

    # Small buckets keep the run short: a 296-token prompt takes two prefill steps, 1-token prompts share a bucket.
    config = Config(buckets=Buckets(prefill=((128, 2), (256, 4)), decode=(2, 4, 8)))
    requests = example.workload(count=6, max_prompt=300, max_new=10, seed=27, block=config.block)
    with transformers_warnings() as warned:
        engine, programs = example.serve("float32", requests, config, log=lambda line: None)
    # HF's conv and recurrence fallbacks announce themselves; serving called none of them.
    assert not [m for m in warned if "falling back" in m], warned
    assert through_ops == [OP_OF_PHASE[phase][1] for phase, _ in engine.model.kernels.calls], through_ops
    # Every GDN layer's forward ran all of its computations on gdn-nki: in each phase as many conv and gated-norm
    # launches, of gdn-nki's kernels (``programs`` checks each launch's kernel), as recurrence launches, per bucket.
    assert set(programs) == set(example.KERNEL_OF_PHASE), sorted(programs)
    for phase in ("prefill", "decode"):
        launches = {part: {bucket: sum(runs.values()) for bucket, runs in programs[f"{part}{phase}"].items()}
                    for part in ("conv_", "", "norm_")}  # fmt: skip
        assert launches["conv_"] == launches[""] == launches["norm_"], (phase, launches)
    # A prefix-cache row holds both states: its conv window is the conv's inputs at the prefix's last W - 1 tokens
    # (the GDN layer is the model's first, so its inputs at a position depend on that token alone).
    assert engine.prefix
    for prefix, entry in engine.prefix.items():
        window = engine.pool.windows[entry.rows[0]]
        want = _conv_inputs(engine.model.model, list(prefix))[-window.shape[1] :].T
        torch.testing.assert_close(window, want, rtol=1e-5, atol=1e-6)
    verdicts = example.judge(example.build_model(torch.float32), requests)

    assert verdicts and all(v.first_divergence is None for v in verdicts), verdicts
    assert max(v.max_logit_error for v in verdicts) <= example.LOGIT_TOLERANCE, verdicts
    stats = engine.stats
    # The stream exercised what it is meant to: aborts, cache hits (resumed from a row the prefill kernel wrote as a
    # checkpoint), drafts both accepted and rejected, a prompt longer than the largest prefill bucket (chunked
    # prefill), and pool rows handed to a second owner.
    assert stats["aborted"] >= 1 and stats["cache_hits"] >= 1 and stats["cached_tokens"] >= config.block, stats
    assert 0 < stats["accepted_drafts"] < stats["drafted"], stats
    assert any(len(r.prompt) > max(config.buckets.prefill)[0] for r in requests)
    rows = [row for row, _ in engine.pool.allocations]
    assert len(rows) > len(set(rows)), "no pool row was reused"
    # One compiled program per bucket over the whole run: every launch of a bucket had the same trace key (what a
    # compiling backend compiles on: shapes, dtypes, non-tensor values) and ran the same static program (nki-cpu's
    # fingerprint), distinct buckets ran distinct programs, and each phase used more than one bucket (so "one
    # program" is not one bucket by accident).
    for phase in example.KERNEL_OF_PHASE:
        buckets = programs[phase]
        assert len(buckets) >= 2, (phase, buckets)
        if not backend.USING_REAL_NKI:
            assert all(len(runs) == 1 for runs in buckets.values()), (phase, buckets)
            assert len({program for runs in buckets.values() for program in runs}) == len(buckets), (phase, buckets)


def test_a_row_not_owned_is_refused_and_poison_is_loud() -> None:
    example = load_example("serve_qwen3_next")
    from serving.engine import Config, Engine, Request
    from serving.kernels import Buckets
    from serving.model import PackedQwen3Next, RequestCache, Segment

    from gdn_ref.contract import ContractError

    model = example.build_model(torch.float32)
    pool = example.make_pool(model, 8)
    config = Config(spec_tokens=1, max_running=2, buckets=Buckets(prefill=((128, 2),), decode=(2,)))
    engine = Engine(PackedQwen3Next(model, pool, config.buckets), pool, config, log=lambda line: None)
    engine.submit(Request(0, [1, 2, 3], 5, 0))
    engine.submit(Request(1, [4, 5], 5, 0, abort_at=1))
    engine.step()  # both prefilled
    victim = engine.requests[1].cache.rows[engine.model.gdn_layers[0]][0]
    engine.step()  # request 1 aborted: its row poisoned, request 0 decoded
    assert torch.isnan(pool.states[victim]).all() and pool.owner[victim] is None

    # A cache that names a freed row is stopped before any kernel runs ...
    layer = engine.model.gdn_layers[0]
    stolen = RequestCache(0, {layer: [victim]}, length=1)
    with pytest.raises(AssertionError, match=f"pool row {victim} is owned by None"):
        engine.model.forward([Segment(stolen, [7])], decode=False)
    # ... and, with the ownership check bypassed, the kernel refuses the poisoned row itself.
    pool.owner[victim] = 0
    with pytest.raises(ContractError, match="finite"):
        engine.model.forward([Segment(stolen, [7])], decode=False)
