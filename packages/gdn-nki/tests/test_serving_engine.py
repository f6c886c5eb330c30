"""The serving engine of ``examples/serving/`` where the served stream of ``test_serve_qwen3_next.py`` cannot see a
bug: a model with two GatedDeltaNet layers (the tiny config has one, so a row or checkpoint of the wrong layer
there is the right one), and the prefix cache full while the entry a prefill reads is its only leaf (the entry must
not be evicted and its rows handed out under the launch that reads them). Skipped, with the reason, without torch
and transformers (``nox -s integration`` installs both)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from example_scripts import load_example

torch = pytest.importorskip("torch", reason="torch is not installed (nox -s integration installs it)")
pytest.importorskip("transformers", reason="transformers is not installed (nox -s integration installs it)")

TWO_GDN_LAYERS = ("linear_attention", "linear_attention", "full_attention")


def test_two_gdn_layers_resume_each_from_its_own_checkpoint_with_the_cache_full() -> None:
    """Request 1 shares request 0's first block: it resumes from the checkpoint request 0's prefill wrote, one row
    per GDN layer, and its own prefill crosses another block while the cache (one entry) is full of the entry it
    reads. Its tokens and logits must be HF's, and the entry it read must survive the launch."""
    example = load_example("serve_qwen3_next")
    from serving.engine import Config, Request
    from serving.kernels import CHUNK, Buckets

    config = Config(buckets=Buckets(prefill=((2 * CHUNK, 2),), decode=(2,)), max_running=2, spec_tokens=2,
                    cache_entries=1)  # fmt: skip
    block = config.block
    rng = torch.Generator().manual_seed(5)
    first = torch.randint(0, 256, (block + 3,), generator=rng).tolist()
    # Arrives once request 0's prefill has written the checkpoint; its prefill from block to 2 * block + 9 would
    # checkpoint at 2 * block, which the full cache can only give by evicting the entry this launch reads.
    second = first[:block] + torch.randint(0, 256, (block + 9,), generator=rng).tolist()
    requests = [Request(0, first, 3, arrival=0), Request(1, second, 3, arrival=2)]
    engine, _ = example.serve("float32", requests, config, log=lambda line: None, layer_types=TWO_GDN_LAYERS)
    verdicts = example.judge(example.build_model(torch.float32, layer_types=TWO_GDN_LAYERS), requests)

    assert len(engine.model.gdn_layers) == 2
    assert engine.stats["cache_hits"] == 1 and engine.stats["cached_tokens"] == block, engine.stats
    assert list(engine.prefix) == [tuple(first[:block])], "the entry read was evicted, or none was written"
    assert [v.rid for v in verdicts] == [0, 1] and all(v.first_divergence is None for v in verdicts), verdicts
    assert max(v.max_logit_error for v in verdicts) <= example.LOGIT_TOLERANCE, verdicts


def test_a_full_cache_evicts_a_leaf_but_never_one_this_step_reads() -> None:
    """The scheduler's choice alone, on a stub model (only its GDN layer list is used): with the cache full, a new
    checkpoint evicts the least recently used complete leaf, unless this step's prefill reads it (``pinned``);
    then there is no checkpoint and the entry keeps its rows."""
    load_example("serve_qwen3_next")  # puts examples/ on the path, for ``serving``
    from serving.engine import Config, Engine, Request
    from serving.pool import StatePool

    config = Config(max_running=2, spec_tokens=1, cache_entries=1)
    pool = StatePool(6, 1, 2, 2, windows=(16, 3, torch.float32))
    engine = Engine(SimpleNamespace(gdn_layers=[0, 2]), pool, config, log=lambda line: None)
    block = config.block
    reader, other = Request(0, list(range(3 * block)), 1, 0), Request(1, list(range(1, 3 * block + 1)), 1, 0)
    key = tuple(reader.prompt[:block])
    rows = engine._checkpoint_rows(reader, block, pinned=set())
    assert rows is not None and list(engine.prefix) == [key]
    engine.prefix[key].complete = True  # its launch has run

    assert engine._checkpoint_rows(reader, 2 * block, pinned={key}) is None
    assert list(engine.prefix) == [key] and [pool.owner[r] for r in rows.values()] == [("cache", 0, block)] * 2
    # Not read this step, the same entry is the one evicted: the refusal above was the pin's.
    assert engine._checkpoint_rows(other, block, pinned=set()) is not None
    assert list(engine.prefix) == [tuple(other.prompt[:block])]
    assert all(pool.owner[r] == ("cache", 1, block) for r in engine.prefix[tuple(other.prompt[:block])].rows.values())
