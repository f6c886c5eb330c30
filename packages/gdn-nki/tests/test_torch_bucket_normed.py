"""The gated RMSNorm folded into the bucketed prefill through the torch drop-in (``chunk_gated_delta_rule`` with
``z=``, ``norm_weight=``): bit for bit the drop-in without it then ``rms_norm_gated`` (a pool with a −1 row, a read
row and a checkpoint; FLA's batch rows; bf16 and fp32); the device path (``device.py``, its launch interpreted by
nki-cpu) gives the CPU path's bits; under ``FakeTensorMode`` and ``torch.compile(backend="aot_eager",
fullgraph=True)`` with zero graph breaks; ``opcheck`` of both ops with the norm; bad norm arguments refused by name,
eagerly and at trace time alike, the pool untouched. Skipped without torch."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'gdn-nki[torch]'; nox -s integration)")

from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode  # noqa: E402

import gdn_nki  # noqa: E402
from gdn_nki.common import backend  # noqa: E402
from gdn_nki.torch import ForwardOnlyError, chunk_gated_delta_rule, device, ops, rms_norm_gated  # noqa: E402
from gdn_ref.contract import ContractError  # noqa: E402
from torch_device import launch_replaced, skip_on_device  # noqa: E402

HK, HV, K, V, P = 2, 4, 32, 32, 12
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def _l2(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True)


def pool_call(dtype: torch.dtype = torch.bfloat16) -> dict[str, Any]:
    """Two packed prompts in the bucket (256, 4), the second ending at its last chunk (37 → 128, 128: 256): the
    first resumes from row 2 (a prefix-cache hit), ends in row 5 and checkpoints to row 6 (past its length: not
    stored); the second is a −1 row. z and the weight: the layer's."""
    torch.manual_seed(1)
    tokens = 165
    return dict(
        q=_l2(torch.randn(1, tokens, HK, K)).to(dtype), k=_l2(torch.randn(1, tokens, HK, K)).to(dtype),
        v=torch.randn(1, tokens, HV, V).to(dtype), g=-torch.rand(1, tokens, HV) * 0.1,
        beta=torch.rand(1, tokens, HV), initial_state=torch.randn(P, HV, K, V) * 0.1, output_final_state=True,
        cu_seqlens=torch.tensor([0, 37, tokens], dtype=torch.int32), state_indices=torch.tensor([5, -1], dtype=torch.int32),
        read_indices=torch.tensor([2, -1], dtype=torch.int32), bucket=(256, 4), checkpoint_every=128,
        checkpoint_indices=torch.tensor([[6], [-1]], dtype=torch.int32),
        z=(2 * torch.randn(1, tokens, HV, V)).to(dtype), norm_weight=1 + 0.5 * torch.randn(V),
    )  # fmt: skip


def rows_call(dtype: torch.dtype = torch.bfloat16) -> dict[str, Any]:
    """FLA's call: two batch rows, initial states read, final states returned; the norm's gate a sigmoid."""
    torch.manual_seed(2)
    return dict(q=torch.randn(2, 40, HK, K).to(dtype), k=torch.randn(2, 40, HK, K).to(dtype),
                v=torch.randn(2, 40, HV, V).to(dtype), g=-torch.rand(2, 40, HV), beta=torch.rand(2, 40, HV),
                initial_state=torch.randn(2, HV, K, V) * 0.1, output_final_state=True, use_qk_l2norm_in_kernel=True,
                z=torch.randn(2, 40, HV, V).to(dtype), norm_weight=torch.randn(V).to(dtype), norm_eps=1e-5,
                norm_activation="sigmoid")  # fmt: skip


CALLS = {"pool": pool_call, "batch rows": rows_call}
NORM = ("z", "norm_weight", "norm_eps", "norm_activation")


def _two_launches(args: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """The drop-in without the norm (its own bucket: the fused call's), then ``rms_norm_gated``."""
    norm = {name: args.pop(name) for name in NORM if name in args}
    if "bucket" not in args:
        args["bucket"] = (256, 2)  # the batch's own size, as the fused call chooses it
    o, state = chunk_gated_delta_rule(**args)
    y = rms_norm_gated(o, norm["z"], norm["norm_weight"], None, activation=norm.get("norm_activation", "silu"),
                       eps=norm.get("norm_eps", 1e-6))  # fmt: skip
    return y, state


def _bits(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got.view(torch.uint8) if got.dtype != torch.bfloat16 else got.view(torch.int16),
                       want.view(torch.uint8) if want.dtype != torch.bfloat16 else want.view(torch.int16))  # fmt: skip


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("name", list(CALLS))
def test_bit_for_bit_the_drop_in_then_the_norm(name: str, dtype: str) -> None:
    want_y, want_state = _two_launches(CALLS[name](DTYPES[dtype]))
    args = CALLS[name](DTYPES[dtype])
    y, state = chunk_gated_delta_rule(**args)
    _bits(y, want_y)
    _bits(state, want_state)
    if name == "pool":
        assert state is args["initial_state"]


@contextlib.contextmanager
def interpreted() -> Iterator[None]:
    """``device.launch`` run by nki-cpu on the CPU tensors (numpy views: the pool is written in place)."""
    with launch_replaced(lambda kernel, *a, **kw: backend.simulate(kernel)(*a, **kw)):
        yield


def test_the_device_path_gives_the_cpu_paths_bits() -> None:
    """``device.chunk_pool`` packs z seq-first in the bucket's layout and launches ``gdn_cte_bucket_normed``."""
    skip_on_device("nki-cpu interprets the launch on CPU tensors; on a device the kernel runs")
    want_y, want_pool = chunk_gated_delta_rule(**pool_call())
    a = pool_call()
    pool, launched = a["initial_state"], []
    with launch_replaced(lambda kernel, *x, **kw: launched.append(kernel) or backend.simulate(kernel)(*x, **kw)):
        y = device.chunk_pool(
            a["q"], a["k"], a["v"], a["g"], a["beta"], pool, a["state_indices"], None, None, a["cu_seqlens"],
            a["checkpoint_indices"], a["read_indices"], None, False, False, False, "schur", 8, [256, 4], 128,
            z=a["z"], norm_weight=a["norm_weight"],
        )  # fmt: skip
    assert launched == [gdn_nki.gdn_cte_bucket_normed]
    _bits(y, want_y)
    _bits(pool, want_pool)


def _fake(mode: FakeTensorMode, args: dict[str, Any]) -> dict[str, Any]:
    return {name: mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for name, x in args.items()}


@pytest.mark.parametrize("name", list(CALLS))
def test_runs_under_fake_tensors_without_touching_data(name: str) -> None:
    want = chunk_gated_delta_rule(**CALLS[name]())
    mode = FakeTensorMode()
    args = _fake(mode, CALLS[name]())
    with mode:
        got = chunk_gated_delta_rule(**args)
    assert all(isinstance(x, FakeTensor) for x in got)
    assert [(x.shape, x.dtype) for x in got] == [(x.shape, x.dtype) for x in want]


def test_compiled_with_no_graph_break_gives_eagers_bits() -> None:
    args = pool_call()
    before = args["initial_state"].clone()

    def step(q, k, v, z):
        return chunk_gated_delta_rule(q, k, v, **{n: x for n, x in args.items() if n not in ("q", "k", "v", "z")},
                                      z=z)[0]  # fmt: skip

    inputs = [args[name] for name in ("q", "k", "v", "z")]
    eager = step(*inputs)
    eager_pool = args["initial_state"].clone()
    args["initial_state"].copy_(before)
    explained = torch._dynamo.explain(step)(*inputs)
    assert (explained.graph_break_count, explained.graph_count) == (0, 1), explained.break_reasons
    nodes = [node.target for graph in explained.graphs for node in graph.graph.nodes]
    assert torch.ops.gdn_nki.chunk_gated_delta_rule_pool.default in nodes
    args["initial_state"].copy_(before)
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(*inputs)
    _bits(compiled, eager)
    _bits(args["initial_state"], eager_pool)


def test_opcheck_both_ops_with_the_norm() -> None:
    p, r = pool_call(), rows_call()
    samples = [
        (ops.chunk_pool_op, (p["q"], p["k"], p["v"], p["g"], p["beta"], p["initial_state"], p["state_indices"], None,
                             None, p["cu_seqlens"], p["checkpoint_indices"], p["read_indices"], None, False, False,
                             False, "schur", 8, [256, 4], 128, False, p["z"], p["norm_weight"], 1e-6, "silu")),
        (ops.chunk_op, (r["q"], r["k"], r["v"], r["g"], r["beta"], r["initial_state"], None, None, None, None, True,
                        False, False, "schur", 8, None, r["z"], r["norm_weight"], 1e-5, "sigmoid")),
    ]  # fmt: skip
    for op, sample in samples:
        torch.library.opcheck(op, sample, test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


BAD = {
    "z head-major": ({"z": lambda a: a["z"].transpose(1, 2).contiguous()}, "z"),
    "z float32": ({"z": lambda a: a["z"].float()}, "z"),
    "weight too short": ({"norm_weight": lambda a: a["norm_weight"][: V // 2]}, "norm_weight"),
    "eps zero": ({"norm_eps": lambda a: 0.0}, "norm_eps"),
    "gate unknown": ({"norm_activation": lambda a: "gelu"}, "norm_activation"),
    "weight without z": ({"z": lambda a: None}, "norm_weight"),
}


def _bad(case: str) -> dict[str, Any]:
    change, _ = BAD[case]
    args = pool_call()
    args.update({name: make(args) for name, make in change.items()})
    return args


@pytest.mark.parametrize("case", list(BAD))
def test_bad_norm_arguments_are_refused_by_name_eagerly_and_at_trace_time(case: str) -> None:
    argument = BAD[case][1]
    args = _bad(case)
    before = args["initial_state"].clone()
    with pytest.raises(ContractError, match=f"`{argument}`") as eager:
        chunk_gated_delta_rule(**args)
    assert torch.equal(args["initial_state"], before)  # nothing written
    if case == "weight without z":
        return  # no z: the call is the host path's to refuse (the op never sees a norm without its gate)
    mode = FakeTensorMode()
    fake = _fake(mode, _bad(case))
    with mode, pytest.raises(ContractError, match=f"`{argument}`") as traced:
        chunk_gated_delta_rule(**fake)
    assert [v.rule_id for v in traced.value.violations] == [v.rule_id for v in eager.value.violations]


@pytest.mark.parametrize("name", list(CALLS))
def test_a_gate_on_the_graph_puts_y_on_it_and_backward_names_the_drop_in(name: str) -> None:
    """Forward-only, as the drop-in without the norm: z requiring grad (alone) puts y on the graph, whose backward
    raises naming the drop-in, never a silently detached y; y keeps the no-grad bits."""
    want, _ = chunk_gated_delta_rule(**CALLS[name]())
    args = CALLS[name]()
    args["z"].requires_grad_()
    y, _ = chunk_gated_delta_rule(**args)
    _bits(y.detach(), want)
    assert y.requires_grad
    with pytest.raises(ForwardOnlyError, match="chunk_gated_delta_rule"):
        y.sum().backward()
