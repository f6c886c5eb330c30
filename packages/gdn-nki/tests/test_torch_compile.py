"""HF transformers' Qwen3-Next GatedDeltaNet layer with gdn-nki's drop-ins under ``torch.compile`` and
``torch.export``: a packed prefill in a bucket on a pool (a −1 row, a prefix-cache read row, a checkpoint), and a
speculative verification step ([N, T] rows, a padding request, ``num_accepted_tokens``). Compiled with
``fullgraph=True`` there is no graph break (``torch._dynamo.explain`` agrees) and the output and the pool are eager's
bits; exported, each GDN call is one ``gdn_nki`` op node and the pool's update is declared as a mutation. On
``GDN_TORCH_DEVICE`` with ``GDN_TORCH_COMPILE_BACKEND`` (``nox -s neuron``: the XLA device, torch-neuronx's
``neuron`` backend) the layer, its pool and the model run on that device (``torch_device.py``; HF's reference
tokens stay the CPU's). Skipped, with the reason, without torch and transformers (``nox -s integration`` installs
both)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from example_scripts import load_example

torch = pytest.importorskip("torch", reason="torch is not installed (nox -s integration installs it)")
pytest.importorskip("transformers", reason="transformers is not installed (nox -s integration installs it)")

from torch.export.graph_signature import OutputKind  # noqa: E402
from transformers.models.qwen3_next import modeling_qwen3_next as hf  # noqa: E402

from gdn_nki.torch import chunk_gated_delta_rule, vllm_fused_recurrent_gated_delta_rule  # noqa: E402
from torch_device import compile_backend, test_device  # noqa: E402

POOL_ROWS = 12


class Served(torch.nn.Module):
    """HF's GatedDeltaNet layer with the engine's state pool as a buffer (what a serving model holds)."""

    def __init__(self) -> None:
        super().__init__()
        example = load_example("qwen3_next_layer")
        torch.manual_seed(0)
        model = hf.Qwen3NextModel(example.tiny_config()).eval()
        self.layer = model.layers[0].linear_attn
        config = model.config
        heads, dk, dv = config.linear_num_value_heads, config.linear_key_head_dim, config.linear_value_head_dim
        self.register_buffer("pool", torch.randn(POOL_ROWS, heads, dk, dv) * 0.1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.layer(hidden)


def prefill_core(served: Served) -> Callable[..., Any]:
    """Two packed prompts in the bucket (256, 4): the first resumes from row 2 (a prefix-cache hit), ends in row 5
    and checkpoints its state after 128 tokens to row 6 (past its length: not stored); the second is a −1 row."""
    on = dict(dtype=torch.int32, device=served.pool.device)
    cu = torch.tensor([0, 37, 160], **on)
    rows, reads = torch.tensor([5, -1], **on), torch.tensor([2, -1], **on)
    checkpoints = torch.tensor([[6], [-1]], **on)

    def core(q, k, v, g, beta, **kwargs):  # HF's torch_chunk_gated_delta_rule's call
        return chunk_gated_delta_rule(
            q, k, v, g, beta, initial_state=served.pool, output_final_state=True, use_qk_l2norm_in_kernel=True,
            cu_seqlens=cu, state_indices=rows, read_indices=reads, bucket=(256, 4), checkpoint_every=128,
            checkpoint_indices=checkpoints,
        )  # fmt: skip

    return core


def verify_core(served: Served) -> Callable[..., Any]:
    """Three requests of T = 2 tokens: rows [N, T], the second a padding request, the first accepting both."""
    on = dict(dtype=torch.int32, device=served.pool.device)
    cu = torch.arange(0, 7, 2, **on)
    rows = torch.tensor([[4, 1], [-1, -1], [0, 6]], **on)
    accepted = torch.tensor([2, 1, 1], **on)

    def core(q, k, v, g, beta, **kwargs):
        o, _ = vllm_fused_recurrent_gated_delta_rule(
            q, k, v, g, beta, initial_state=served.pool, cu_seqlens=cu, ssm_state_indices=rows,
            num_accepted_tokens=accepted, use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        return o, None

    return core


STEPS = {"prefill": (prefill_core, 160), "verify": (verify_core, 6)}


@contextlib.contextmanager
def swapped(core: Callable[..., Any]) -> Iterator[None]:
    """The one-line change a model makes: HF's module-level GDN function replaced by the drop-in."""
    saved = hf.torch_chunk_gated_delta_rule
    hf.torch_chunk_gated_delta_rule = core
    try:
        yield
    finally:
        hf.torch_chunk_gated_delta_rule = saved


def _step(name: str) -> tuple[Served, torch.Tensor, Callable[..., Any]]:
    make, tokens = STEPS[name]
    device = test_device()
    served = Served().to(device)
    torch.manual_seed(1)
    return served, torch.randn(1, tokens, served.layer.hidden_size).to(device), make(served)


@pytest.mark.parametrize("name", list(STEPS))
def test_compiled_layer_has_no_graph_break_and_gives_eagers_bits(name: str) -> None:
    served, hidden, core = _step(name)
    before = served.pool.clone()
    with torch.no_grad(), swapped(core):
        eager = served(hidden)
        eager_pool = served.pool.clone()
        assert not torch.equal(eager_pool, before), "the step wrote no pool row"
        served.pool.copy_(before)
        explained = torch._dynamo.explain(served)(hidden)
        assert (explained.graph_break_count, explained.graph_count) == (0, 1), explained.break_reasons
        served.pool.copy_(before)
        torch._dynamo.reset()
        compiled = torch.compile(served, fullgraph=True, backend=compile_backend())(hidden)
    assert torch.equal(compiled, eager)
    assert torch.equal(served.pool, eager_pool)


@pytest.mark.parametrize("name", list(STEPS))
def test_export_has_one_op_node_per_gdn_call_and_declares_the_pool_mutation(name: str) -> None:
    served, hidden, core = _step(name)
    before = served.pool.clone()
    with torch.no_grad(), swapped(core):
        eager = served(hidden)
        eager_pool = served.pool.clone()
        served.pool.copy_(before)
        program = torch.export.export(served, (hidden,))
    ops = [node.target for node in program.graph.nodes if "gdn_nki" in str(node.target)]
    pool_op = "chunk_gated_delta_rule_pool" if name == "prefill" else "vllm_fused_recurrent_gated_delta_rule"
    assert ops == [getattr(torch.ops.gdn_nki, pool_op).default]
    functional = program.run_decompositions()
    mutations = [(spec.kind, spec.target) for spec in functional.graph_signature.output_specs
                 if spec.kind != OutputKind.USER_OUTPUT]  # fmt: skip
    assert mutations == [(OutputKind.BUFFER_MUTATION, "pool")]
    module = program.module()
    with torch.no_grad():
        exported = module(hidden)
    assert torch.equal(exported, eager)
    assert torch.equal(module.pool, eager_pool)


# --- the model: HF's tiny Qwen3-Next generating under torch.compile with the drop-ins --------------------------------

PROMPT, NEW_TOKENS = 16, 4


def test_compiled_model_generates_hfs_fp32_greedy_tokens_and_no_gdn_call_breaks_the_graph() -> None:
    """Prefill through ``chunk_gated_delta_rule``, each decode step through ``fused_recurrent_gated_delta_rule``,
    the model's forward compiled (HF's own code may break the graph elsewhere: its cache, its generation loop);
    the greedy fp32 tokens are HF's eager ones, and no graph break happens inside gdn-nki."""
    from transformers import Qwen3NextForCausalLM

    from gdn_nki.torch import fused_recurrent_gated_delta_rule

    example = load_example("qwen3_next_layer")
    torch.manual_seed(0)
    model = Qwen3NextForCausalLM(example.tiny_config()).eval()
    ids = torch.randint(0, 256, (2, PROMPT))
    with torch.no_grad():
        theirs = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)  # HF on the CPU: the reference
    model, ids = model.to(test_device()), ids.to(test_device())
    with torch.no_grad():
        saved = hf.torch_chunk_gated_delta_rule, hf.torch_recurrent_gated_delta_rule
        hf.torch_chunk_gated_delta_rule = chunk_gated_delta_rule
        hf.torch_recurrent_gated_delta_rule = fused_recurrent_gated_delta_rule
        try:
            eager = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)
            torch._dynamo.reset()
            explained = torch._dynamo.explain(model.forward)(ids, use_cache=False)
            # a decode step on the prompt's cache: the GDN layers' FLA decode calls
            prompt = model(ids, use_cache=True)
            step = prompt.logits[:, -1:].argmax(-1)
            torch._dynamo.reset()
            explained_step = torch._dynamo.explain(model.forward)(step, past_key_values=prompt.past_key_values,
                                                                  use_cache=True)  # fmt: skip
            forward = model.forward
            model.forward = torch.compile(forward, backend=compile_backend())
            try:
                compiled = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)
            finally:
                model.forward = forward
        finally:
            hf.torch_chunk_gated_delta_rule, hf.torch_recurrent_gated_delta_rule = saved
    assert torch.equal(eager.cpu(), theirs) and torch.equal(compiled.cpu(), theirs)
    for explanation, op in ((explained, torch.ops.gdn_nki.chunk_gated_delta_rule.default),
                            (explained_step, torch.ops.gdn_nki.fused_recurrent_gated_delta_rule.default)):  # fmt: skip
        in_gdn_nki = [reason for reason in explanation.break_reasons
                      if any("gdn_nki" in frame.filename for frame in reason.user_stack)]  # fmt: skip
        assert in_gdn_nki == [], in_gdn_nki
        captured = [
            node.target for graph in explanation.graphs for node in graph.graph.nodes if "gdn_nki" in str(node.target)
        ]
        assert captured == [op], "each GDN call (the tiny model has one GDN layer) is one graph node"


# --- grad mode: the layer as users' training / eval code runs it (no torch.no_grad()) ------------------------------


def test_compiled_layer_in_grad_mode_has_no_graph_break_gives_eagers_bits_and_backward_names_the_kernel() -> None:
    """HF's layer with its weights requiring grad, FLA's prefill and gated norm swapped in (HF's conv is Dao-AILab's,
    which gdn-nki does not replace): the compiled forward is one graph with eager's (and no_grad's) bits, and a
    backward raises ``ForwardOnlyError`` naming the drop-in the backward reaches first (the norm, after the core)."""
    from gdn_nki.torch import ForwardOnlyError, FusedRMSNormGated

    served, hidden, _ = _step("prefill")
    layer = served.layer
    layer.norm = FusedRMSNormGated(layer.head_v_dim, eps=layer.norm.variance_epsilon, activation="silu").to(
        hidden.device
    )
    assert all(p.requires_grad for p in served.parameters())
    with swapped(chunk_gated_delta_rule):
        with torch.no_grad():
            want = served(hidden)
        eager = served(hidden)
        torch._dynamo.reset()
        explained = torch._dynamo.explain(served)(hidden)
        assert (explained.graph_break_count, explained.graph_count) == (0, 1), explained.break_reasons
        ops = [node.target for graph in explained.graphs for node in graph.graph.nodes if "gdn_nki" in str(node.target)]
        assert ops == [torch.ops.gdn_nki.chunk_gated_delta_rule.default, torch.ops.gdn_nki.rms_norm_gated.default]
        torch._dynamo.reset()
        compiled = torch.compile(served, fullgraph=True, backend=compile_backend())(hidden)
    assert eager.requires_grad and compiled.requires_grad
    assert torch.equal(eager.detach(), want) and torch.equal(compiled.detach(), want)
    for out in (eager, compiled):
        with pytest.raises(ForwardOnlyError, match=r"gdn_nki\.torch\.rms_norm_gated is forward-only"):
            out.sum().backward()
