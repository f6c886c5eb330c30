"""Bad shapes and dtypes under ``torch.compile(fullgraph=True)``: every drop-in (the GDN prefill with varlen,
bucket and pool, FLA's decode, vLLM's pool decode, the fused-gating update, gdn_tkg, the three conv drop-ins and
vLLM's varlen conv update, FLA's gated norm and its module, vLLM's fused gating)
raises gdn-ref's ``ContractError`` with eager's message, leaves the caller's pool as it was, and a valid call of each
still compiles with no graph break. Runs on ``GDN_TORCH_DEVICE`` with ``GDN_TORCH_COMPILE_BACKEND`` (``nox -s
neuron``: the XLA device and torch-neuronx's ``neuron`` backend; never run there yet). Skipped without torch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'gdn-nki[torch]'; nox -s integration)")

from gdn_nki.torch import (  # noqa: E402
    FusedRMSNormGated,
    causal_conv1d,
    causal_conv1d_fn,
    causal_conv1d_update,
    fused_gdn_gating,
    rms_norm_gated,
    vllm_chunk_gated_delta_rule,
)
from gdn_nki.torch.traced_rejection import REJECTIONS  # noqa: E402
from gdn_ref.contract import ContractError  # noqa: E402
from test_torch_ops import BAD_SHAPES, CALLS, _randn, _set  # noqa: E402
from torch_device import compile_backend, on_device, test_device  # noqa: E402

CONV_C, CONV_W, CONV_P = 32, 4, 5


def conv_update_call() -> dict[str, Any]:
    """vLLM's conv decode of 3 requests × 2 tokens on a pool, a −1 row."""
    torch.manual_seed(7)
    return dict(x=_randn(3, CONV_C, 2), conv_state=_randn(CONV_P, CONV_C, CONV_W - 1), weight=_randn(CONV_C, CONV_W),
                bias=_randn(CONV_C), activation="silu", conv_state_indices=torch.tensor([2, -1, 4], dtype=torch.int32))  # fmt: skip


def conv_varlen_call() -> dict[str, Any]:
    """vLLM's varlen speculative conv update (``query_start_loc`` with ``num_accepted_tokens``): 3 requests of 2, 1
    and 0 tokens (max_query_len 2), a −1 row, rows one entry longer than W − 2 + max_query_len."""
    torch.manual_seed(14)
    return dict(x=_randn(3, CONV_C), conv_state=_randn(CONV_P, CONV_C, CONV_W + 1), weight=_randn(CONV_C, CONV_W),
                bias=_randn(CONV_C), activation="silu", conv_state_indices=torch.tensor([2, -1, 4], dtype=torch.int32),
                num_accepted_tokens=torch.tensor([2, 1, 1], dtype=torch.int32),
                query_start_loc=torch.tensor([0, 2, 3, 3], dtype=torch.int32), max_query_len=2)  # fmt: skip


def conv_fn_call() -> dict[str, Any]:
    """vLLM's packed conv prefill: two sequences, the first from its row's window."""
    torch.manual_seed(8)
    return dict(x=_randn(CONV_C, 50), weight=_randn(CONV_C, CONV_W), bias=_randn(CONV_C),
                conv_states=_randn(CONV_P, CONV_C, CONV_W - 1), query_start_loc=torch.tensor([0, 20, 50], dtype=torch.int32),
                cache_indices=torch.tensor([1, 3], dtype=torch.int32),
                has_initial_state=torch.tensor([True, False]), activation="silu")  # fmt: skip


def fla_conv_call() -> dict[str, Any]:
    """FLA's conv of two packed sequences from caches, final caches returned."""
    torch.manual_seed(9)
    return dict(x=_randn(1, 30, CONV_C), weight=_randn(CONV_C, CONV_W), bias=_randn(CONV_C),
                initial_state=_randn(2, CONV_C, CONV_W), output_final_state=True, activation="silu",
                cu_seqlens=torch.tensor([0, 12, 30], dtype=torch.int32))  # fmt: skip


def norm_call() -> dict[str, Any]:
    """FLA's gated RMSNorm of a [tokens, heads, D] output with its gate, as Qwen3-Next's layer calls it."""
    torch.manual_seed(10)
    return dict(x=_randn(6, 4, CONV_C), g=_randn(6, 4, CONV_C), weight=_randn(CONV_C), bias=None, activation="silu",
                eps=1e-6)  # fmt: skip


def norm_module_call() -> dict[str, Any]:
    """FLA's ``FusedRMSNormGated`` module's forward, prenorm with a residual."""
    torch.manual_seed(11)
    return dict(x=_randn(6, 4, CONV_C), g=_randn(6, 4, CONV_C), residual=_randn(6, 4, CONV_C), prenorm=True)


def vllm_prefill_call() -> dict[str, Any]:
    """vLLM's prefill (its own signature, three results): two packed sequences from initial states."""
    torch.manual_seed(12)
    return dict(q=_randn(1, 70, 2, 32), k=_randn(1, 70, 2, 32), v=_randn(1, 70, 4, 32), g=-torch.rand(1, 70, 4),
                beta=torch.rand(1, 70, 4), initial_state=_randn(2, 4, 32, 32, scale=0.1), output_final_state=True,
                cu_seqlens=torch.tensor([0, 25, 70], dtype=torch.int32), use_qk_l2norm_in_kernel=True)  # fmt: skip


def gating_call() -> dict[str, Any]:
    """vLLM's prefill gates of 9 tokens × 4 value heads from the a and b projections."""
    torch.manual_seed(13)
    return dict(A_log=_randn(4), a=_randn(9, 4), b=_randn(9, 4), dt_bias=_randn(4))


NORM_MODULE = FusedRMSNormGated(CONV_C, eps=1e-6, activation="silu").to(test_device())
ALL_CALLS: dict[str, tuple[Callable[..., Any], Callable[[], dict[str, Any]]]] = {
    **CALLS,
    "vLLM conv update": (causal_conv1d_update, conv_update_call),
    "vLLM conv varlen update": (causal_conv1d_update, conv_varlen_call),
    "vLLM conv prefill": (causal_conv1d_fn, conv_fn_call),
    "FLA conv": (causal_conv1d, fla_conv_call),
    "vLLM prefill": (vllm_chunk_gated_delta_rule, vllm_prefill_call),
    "FLA gated norm": (rms_norm_gated, norm_call),
    "FLA FusedRMSNormGated": (NORM_MODULE, norm_module_call),
    "vLLM fused gating": (fused_gdn_gating, gating_call),
}
BAD_CALLS = {
    **BAD_SHAPES,
    "prefill: unknown keyword": ("prefill on a pool, bucket, checkpoints", _set(chunk_indicez=lambda a: None)),
    "FLA decode: bf16 state": ("FLA decode", _set(initial_state=lambda a: a["initial_state"].bfloat16())),
    "fused gating: indices of two rows per request": (
        "fused gating update", _set(initial_state_indices=lambda a: torch.zeros(3, 2, dtype=torch.int32))),
    "conv update: weight of other channels": ("vLLM conv update", _set(weight=lambda a: _randn(CONV_C + 16, CONV_W))),
    "conv update: bf16 pool": ("vLLM conv update", _set(conv_state=lambda a: a["conv_state"].bfloat16())),
    "conv update: query_start_loc": ("vLLM conv update", _set(query_start_loc=lambda a: torch.arange(4))),
    "conv varlen: query_start_loc of another length": (
        "vLLM conv varlen update", _set(query_start_loc=lambda a: torch.tensor([0, 2, 3], dtype=torch.int32))),
    "conv varlen: rows shorter than the windows": (
        "vLLM conv varlen update", _set(conv_state=lambda a: _randn(CONV_P, CONV_C, CONV_W - 1))),
    "conv prefill: width 7": ("vLLM conv prefill", _set(weight=lambda a: _randn(CONV_C, 7))),
    "conv prefill: pool window too short": (
        "vLLM conv prefill", _set(conv_states=lambda a: _randn(CONV_P, CONV_C, CONV_W - 2))),
    "conv prefill: 3-D x": ("vLLM conv prefill", _set(x=lambda a: a["x"][None])),
    "FLA conv: bias of other channels": ("FLA conv", _set(bias=lambda a: _randn(CONV_C - 1))),
    "FLA conv: unknown option": ("FLA conv", _set(head_first=lambda a: True)),
    "norm: g of another shape": ("FLA gated norm", _set(g=lambda a: _randn(6, 4, CONV_C + 1))),
    "norm: weight of another width": ("FLA gated norm", _set(weight=lambda a: _randn(CONV_C - 2))),
    "norm: float64 x": ("FLA gated norm", _set(x=lambda a: a["x"].double())),
    "vLLM prefill: state of another K": (
        "vLLM prefill", _set(initial_state=lambda a: _randn(2, 4, 16, 32))),
    "norm: a bias": ("FLA gated norm", _set(bias=lambda a: _randn(CONV_C))),
    "norm: group_size": ("FLA gated norm", _set(group_size=lambda a: 8)),
    "norm module: g of another shape": ("FLA FusedRMSNormGated", _set(g=lambda a: _randn(6, 2, CONV_C))),
    "norm module: residual of another shape": (
        "FLA FusedRMSNormGated", _set(residual=lambda a: _randn(6, 4, CONV_C - 16))),
    "fused gating: dt_bias of other heads": ("vLLM fused gating", _set(dt_bias=lambda a: _randn(5))),
    "fused gating: b of other tokens": ("vLLM fused gating", _set(b=lambda a: _randn(8, 4))),
}  # fmt: skip


def _compiled(drop_in: Callable[..., Any]) -> Callable[..., Any]:
    torch._dynamo.reset()
    return torch.compile(lambda **kwargs: drop_in(**kwargs), fullgraph=True, backend=compile_backend())


def _tensors(args: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {name: x.detach().cpu().clone() for name, x in args.items() if isinstance(x, torch.Tensor)}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_compiled_rejection_is_eagers_contract_error_and_writes_nothing(case: str) -> None:
    call, change = BAD_CALLS[case]
    drop_in, make = ALL_CALLS[call]
    device = test_device()
    with pytest.raises(ContractError) as eager:
        drop_in(**on_device(change(make()), device))
    args = on_device(change(make()), device)
    before = _tensors(args)
    with pytest.raises(ContractError) as compiled:
        _compiled(drop_in)(**args)
    assert type(compiled.value) is type(eager.value)
    assert str(compiled.value) == str(eager.value)
    # judged while tracing (the rejection node raised it), not met by the CPU kernel when the graph ran
    assert any(str(entry.path).endswith("traced_rejection.py") for entry in compiled.traceback)
    after = _tensors(args)
    assert all(torch.equal(after[name], x) for name, x in before.items()), "a rejected call wrote a caller tensor"


def test_the_compiled_rejection_is_one_node_raising_at_run_time_and_a_fixed_call_recompiles() -> None:
    """The rejection is judged while tracing (one ``gdn_nki::rejected_call`` node, no graph break) and raised each
    time the graph runs; the same function called validly recompiles (the shapes differ) and runs."""
    drop_in, make = ALL_CALLS["vLLM verify"]
    bad = BAD_CALLS["verify: bf16 pool"][1](make())
    graphs: list[torch.fx.GraphModule] = []

    def recording(graph: torch.fx.GraphModule, inputs: Any) -> Callable[..., Any]:
        graphs.append(graph)
        return graph.forward

    torch._dynamo.reset()
    compiled = torch.compile(lambda **kwargs: drop_in(**kwargs), fullgraph=True, backend=recording)
    for _ in range(2):
        with pytest.raises(ContractError, match="initial_state"):
            compiled(**bad)
    [graph] = graphs
    assert [str(node.target) for node in graph.graph.nodes if "gdn_nki" in str(node.target)] == [
        "gdn_nki.rejected_call.default"
    ]
    discarded = torch.compile(lambda **kwargs: (drop_in(**kwargs), kwargs["q"] + 1)[1], fullgraph=True,
                              backend=compile_backend())  # fmt: skip
    with pytest.raises(ContractError, match="initial_state"):  # a rejection nothing reads is no dead code
        discarded(**bad)
    good = make()
    want = drop_in(**make())
    got = compiled(**good)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert len(REJECTIONS) >= 1


@pytest.mark.parametrize("name", list(ALL_CALLS))
def test_a_valid_call_of_each_drop_in_compiles_without_a_graph_break(name: str) -> None:
    drop_in, make = ALL_CALLS[name]
    args = on_device(make(), test_device())
    torch._dynamo.reset()
    explained = torch._dynamo.explain(lambda **kwargs: drop_in(**kwargs))(**args)
    assert (explained.graph_break_count, explained.graph_count) == (0, 1), explained.break_reasons
    nodes = [
        str(node.target) for graph in explained.graphs for node in graph.graph.nodes if "gdn_nki" in str(node.target)
    ]
    assert len(nodes) == 1 and "rejected_call" not in nodes[0], nodes


class _Called(torch.nn.Module):
    def __init__(self, drop_in: Callable[..., Any]) -> None:
        super().__init__()
        self.drop_in = drop_in

    def forward(self, **kwargs: Any) -> Any:
        return self.drop_in(**kwargs)


@pytest.mark.parametrize(
    "case", ["verify: bf16 pool", "conv prefill: width 7", "gdn_tkg: state of the wrong shape", "norm: float64 x"]
)
def test_export_raises_eagers_contract_error_while_tracing(case: str) -> None:
    """``torch.export`` (non-strict, its default: no dynamo) meets the op's fake implementation, which raises the
    ContractError itself: no program is made."""
    call, change = BAD_CALLS[case]
    drop_in, make = ALL_CALLS[call]
    with pytest.raises(ContractError) as eager:
        drop_in(**change(make()))
    with pytest.raises(ContractError) as exported:
        torch.export.export(_Called(drop_in), (), kwargs=on_device(change(make()), test_device()), strict=False)
    assert str(exported.value) == str(eager.value)


@pytest.mark.parametrize(
    "case", ["verify: bf16 pool", "prefill: unknown keyword", "conv prefill: width 7", "gdn_tkg: state of the wrong shape",
             "norm: float64 x", "norm module: g of another shape"]
)  # fmt: skip
def test_strict_export_raises_eagers_contract_error_itself(case: str) -> None:
    """``torch.export(strict=True)`` traces with dynamo, which would wrap a rejection raised in the traced code or by
    the op's fake implementation (``TorchRuntimeError``); the rejection is judged by a function dynamo runs itself
    (``traced_rejection``), so the caller gets eager's ContractError unwrapped, and no program."""
    call, change = BAD_CALLS[case]
    drop_in, make = ALL_CALLS[call]
    with pytest.raises(ContractError) as eager:
        drop_in(**change(make()))
    with pytest.raises(ContractError) as exported:
        torch.export.export(_Called(drop_in), (), kwargs=on_device(change(make()), test_device()), strict=True)
    assert type(exported.value) is type(eager.value)
    assert str(exported.value) == str(eager.value)
    assert exported.value.__cause__ is None


def test_strict_export_of_a_valid_call_is_one_op_node() -> None:
    drop_in, make = ALL_CALLS["vLLM verify"]
    program = torch.export.export(_Called(drop_in), (), kwargs=on_device(make(), test_device()), strict=True)
    ops = [str(node.target) for node in program.graph.nodes if "gdn_nki" in str(node.target)]
    assert ops == ["gdn_nki.vllm_fused_recurrent_gated_delta_rule.default"]


@pytest.mark.parametrize("case", [case for case in BAD_CALLS if case.startswith(("conv", "FLA conv", "norm:"))])
def test_conv_and_norm_rejections_under_fake_tensors_are_eagers(case: str) -> None:
    """The conv and norm ops' fake implementations run the host path's shape and dtype rules: under
    ``FakeTensorMode`` (no data, no dynamo) the conv and norm drop-ins raise eager's ContractError."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    call, change = BAD_CALLS[case]
    drop_in, make = ALL_CALLS[call]
    with pytest.raises(ContractError) as eager:
        drop_in(**change(make()))
    mode = FakeTensorMode()
    args = {name: mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for name, x in change(make()).items()}
    with mode, pytest.raises(ContractError) as faked:
        drop_in(**args)
    assert str(faked.value) == str(eager.value)
