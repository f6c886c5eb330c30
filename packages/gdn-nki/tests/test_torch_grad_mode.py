"""Every drop-in in grad mode (no ``torch.no_grad()``: users' training and eval code), its float inputs requiring
grad: eager gives the no-grad bits with its outputs on the autograd graph, ``torch.compile(fullgraph=True)`` traces
it with no graph break (``torch._dynamo.explain``) and gives the same bits, and a ``.backward()`` through either
raises ``ForwardOnlyError`` naming the drop-in. Skipped without torch."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'gdn-nki[torch]'; nox -s integration)")

from gdn_nki.torch import ForwardOnlyError  # noqa: E402
from test_torch_traced_rejections import ALL_CALLS  # noqa: E402
from torch_device import compile_backend, on_device, test_device  # noqa: E402

# The state each call updates in place (a pool): left off the graph, as a serving engine's buffer is.
WRITTEN = {
    "prefill on a pool, bucket, checkpoints": "initial_state",
    "vLLM verify": "initial_state",
    "fused gating update": "initial_state_source",
    "vLLM conv update": "conv_state",
    "vLLM conv varlen update": "conv_state",
    "vLLM conv prefill": "conv_states",
}
# The public name a backward through each call names.
ENTRY = {
    "prefill on a pool, bucket, checkpoints": "chunk_gated_delta_rule",
    "prefill, FLA's call": "chunk_gated_delta_rule",
    "vLLM verify": "vllm_fused_recurrent_gated_delta_rule",
    "fused gating update": "fused_sigmoid_gating_delta_rule_update",
    "FLA decode": "fused_recurrent_gated_delta_rule",
    "gdn_tkg": "gdn_tkg",
    "vLLM conv update": "causal_conv1d_update",
    "vLLM conv varlen update": "causal_conv1d_update",
    "vLLM conv prefill": "causal_conv1d_fn",
    "FLA conv": "causal_conv1d",
    "vLLM prefill": "chunk_gated_delta_rule",  # vLLM's signature over FLA's drop-in, whose op it runs
    "FLA gated norm": "rms_norm_gated",
    "FLA FusedRMSNormGated": "rms_norm_gated",
    "vLLM fused gating": "fused_gdn_gating",
}


def _grad_args(name: str) -> dict[str, Any]:
    """The call on the test device, each floating-point tensor it only reads a leaf that requires grad."""
    args = on_device(ALL_CALLS[name][1](), test_device())
    for key, x in args.items():
        if isinstance(x, torch.Tensor) and x.is_floating_point() and key != WRITTEN.get(name):
            args[key] = x.detach().clone().requires_grad_()
    return args


def _items(result: Any) -> list[Any]:
    return [x for x in (result if isinstance(result, tuple) else (result,)) if x is not None]


def _assert_backward_refused(name: str, outputs: list[Any]) -> None:
    """Each output on the graph; a backward through the first raises ForwardOnlyError naming the drop-in."""
    on_graph = [x for x in outputs if x.requires_grad]
    assert on_graph and on_graph[0] is outputs[0], "the output is on the autograd graph"
    with pytest.raises(ForwardOnlyError, match="forward-only") as refused:
        outputs[0].float().sum().backward()
    assert refused.value.entry.endswith(ENTRY[name]), refused.value.entry
    assert "torch.no_grad()" in str(refused.value) and "differentiable implementation" in str(refused.value)


@pytest.mark.parametrize("name", list(ENTRY))
def test_eager_grad_mode_gives_the_no_grad_bits_and_backward_names_the_drop_in(name: str) -> None:
    drop_in, make = ALL_CALLS[name]
    with torch.no_grad():
        want = _items(drop_in(**on_device(make(), test_device())))
    got = _items(drop_in(**_grad_args(name)))
    assert len(got) == len(want)
    assert all(torch.equal(g.detach().cpu(), w.cpu()) for g, w in zip(got, want, strict=True))
    if name == "prefill on a pool, bucket, checkpoints":
        # eager runs the host path, which also records the pool's update: its refusal names the kernel
        with pytest.raises(ForwardOnlyError, match="forward-only"):
            got[0].sum().backward()
        return
    _assert_backward_refused(name, got)


@pytest.mark.parametrize("name", list(ENTRY))
def test_compiled_grad_mode_has_no_graph_break_gives_eagers_bits_and_backward_names_the_drop_in(name: str) -> None:
    drop_in, make = ALL_CALLS[name]
    with torch.no_grad():
        want = _items(drop_in(**on_device(make(), test_device())))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(lambda **kwargs: drop_in(**kwargs))(**_grad_args(name))
    assert (explained.graph_break_count, explained.graph_count) == (0, 1), explained.break_reasons
    torch._dynamo.reset()
    compiled = torch.compile(lambda **kwargs: drop_in(**kwargs), fullgraph=True, backend=compile_backend())
    got = _items(compiled(**_grad_args(name)))
    assert len(got) == len(want)
    assert all(torch.equal(g.detach().cpu(), w.cpu()) for g, w in zip(got, want, strict=True))
    _assert_backward_refused(name, got)


def test_without_grad_nothing_goes_on_a_graph_and_no_copy_is_made() -> None:
    """Inputs that require grad under ``torch.no_grad()``, or inputs that do not in grad mode: plain results."""
    for name in ("vLLM verify", "FLA gated norm"):
        drop_in, make = ALL_CALLS[name]
        with torch.no_grad():
            assert not any(x.requires_grad for x in _items(drop_in(**_grad_args(name))))
        assert not any(x.requires_grad for x in _items(drop_in(**on_device(make(), test_device()))))
