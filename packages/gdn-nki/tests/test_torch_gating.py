"""``gdn_nki.torch.fused_gdn_gating`` (vLLM's prefill gates as the custom op ``gdn_nki::fused_gdn_gating``): vLLM's
signature and return shapes, the numbers against gdn-ref's fp64 formulas and HF's torch expressions, one op under
``torch.compile(fullgraph=True)`` and fake tensors, rejections naming the argument eagerly and under compile (when
the compiled graph first runs), and the device path (what reaches the kernel; no value read on the host).

Skipped without torch."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'gdn-nki[torch]'; nox -s integration)")

from gdn_nki.common import backend  # noqa: E402
from gdn_nki.gating.kernel import gdn_gating  # noqa: E402
from gdn_nki.torch import fused_gdn_gating  # noqa: E402
from gdn_nki.torch.gating import fused_gdn_gating_op  # noqa: E402
from gdn_ref.activations import log_decay64, sigmoid64  # noqa: E402
from gdn_ref.contract import ContractError  # noqa: E402
from gdn_spec.metrics import compare  # noqa: E402
from torch_device import launch_replaced, skip_on_device, test_device  # noqa: E402

T, H = 300, 32  # a prefill's tokens over Qwen3-Next's value heads
RECORDED_ON = torch.device("meta") if test_device().type == "cpu" else test_device()


def _operands(dtype: torch.dtype = torch.bfloat16, tokens: int = T, seed: int = 0) -> dict[str, Any]:
    """The layer's tensors as vLLM hands them over: a and b [T, H] in the model dtype, A_log and dt_bias fp32."""
    torch.manual_seed(seed)
    return dict(A_log=torch.empty(H).uniform_(-4.0, 2.0), a=(4 * torch.randn(tokens, H)).to(dtype),
                b=(4 * torch.randn(tokens, H)).to(dtype), dt_bias=torch.empty(H).uniform_(-2.0, 2.0))  # fmt: skip


def _oracle(args: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    x = (args["a"].float() + args["dt_bias"].float()).numpy()
    return log_decay64(x, args["A_log"].numpy())[None], sigmoid64(args["b"].float().numpy())[None]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_matches_the_oracle_and_hf_expressions(dtype: torch.dtype) -> None:
    args = _operands(dtype)
    g, beta = fused_gdn_gating(**args)
    assert g.shape == (1, T, H) and g.dtype == torch.float32
    assert beta.shape == (1, T, H) and beta.dtype == dtype
    ref_g, ref_beta = _oracle(args)
    name = str(dtype).removeprefix("torch.")
    for got, ref, tol in ((g, ref_g, "float32"), (beta, ref_beta, name)):
        error = compare("out", got.double().numpy(), ref, tol)
        assert error.ok, str(error)
    # HF's Qwen3NextGatedDeltaNet: g = -A_log.float().exp() * softplus(a.float() + dt_bias), beta = b.sigmoid()
    hf_g = -args["A_log"].float().exp() * torch.nn.functional.softplus(args["a"].float() + args["dt_bias"])
    assert compare("out", g[0].double().numpy(), hf_g.double().numpy(), "float32").ok
    assert (
        torch.equal(beta[0], args["b"].sigmoid())
        or compare("out", beta[0].double().numpy(), args["b"].sigmoid().double().numpy(), name).ok
    )


def test_vllm_keywords_and_positions() -> None:
    """vLLM's call ``fused_gdn_gating(A_log, a, b, dt_bias, beta=1.0, threshold=20.0)``, positional or by name."""
    args = _operands(seed=1)
    by_name = fused_gdn_gating(**args, beta=1.0, threshold=20.0)
    positional = fused_gdn_gating(args["A_log"], args["a"], args["b"], args["dt_bias"], 1.0, 20.0)
    assert all(torch.equal(x, y) for x, y in zip(by_name, positional, strict=True))


@pytest.mark.parametrize(
    ("change", "argument"),
    [
        ({"a": lambda a: a[None]}, "a"),
        ({"b": lambda a: torch.zeros(T, H + 1)}, "b"),
        ({"A_log": lambda a: torch.zeros(H - 1)}, "A_log"),
        ({"dt_bias": lambda a: torch.zeros(H, dtype=torch.float16)}, "dt_bias"),
        ({"dt_bias": lambda a: np.zeros(H, np.float32)}, "dt_bias"),  # not a tensor
        ({"beta": lambda a: True}, "beta"),
        ({"threshold": lambda a: 0.0}, "threshold"),
    ],
)
def test_rejections_name_the_argument(change: dict, argument: str) -> None:
    args = _operands()
    args.update({name: make(args["a"]) for name, make in change.items()})
    with pytest.raises(ContractError, match=f"`{argument}`") as error:
        fused_gdn_gating(**args)
    assert "gdn_nki.torch.fused_gdn_gating" in str(error.value)


def test_nan_rejected_on_the_cpu() -> None:
    args = _operands()
    args["b"][7, 3] = float("nan")
    with pytest.raises(ContractError, match="`b`"):
        fused_gdn_gating(**args)


def test_grad_mode_gives_the_no_grad_bits_and_backward_names_the_drop_in() -> None:
    """In grad mode (a and A_log requiring grad) the op runs, its outputs on the graph; a backward raises
    ``ForwardOnlyError`` naming the drop-in (an inference kernel, as every gdn_nki op)."""
    from gdn_nki.torch import ForwardOnlyError

    args = _operands(torch.float32, tokens=40, seed=6)
    with torch.no_grad():
        want = fused_gdn_gating(**args)
    args["a"].requires_grad_()
    args["A_log"].requires_grad_()
    g, beta = fused_gdn_gating(**args)
    assert torch.equal(g.detach(), want[0]) and torch.equal(beta.detach(), want[1]) and g.requires_grad
    with pytest.raises(ForwardOnlyError) as refused:
        g.sum().backward()
    assert refused.value.entry.endswith("fused_gdn_gating")


def test_compile_fullgraph_one_op_bit_equal_to_eager() -> None:
    args = _operands(seed=2)
    eager = fused_gdn_gating(**args)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(fused_gdn_gating)(**args)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    targets = [str(node.target) for graph in explained.graphs for node in graph.graph.nodes]
    assert sum("fused_gdn_gating" in t for t in targets) == 1
    torch._dynamo.reset()
    compiled = torch.compile(fused_gdn_gating, fullgraph=True, backend="eager")(**args)
    assert all(torch.equal(x, y) for x, y in zip(compiled, eager, strict=True))


def test_compiled_rejection_raises_the_eager_error() -> None:
    """A bad shape under ``torch.compile(fullgraph=True)``: the eager ``ContractError``, when the graph runs."""
    args = _operands(seed=3)
    args["dt_bias"] = torch.zeros(H + 2)
    with pytest.raises(ContractError) as eager:
        fused_gdn_gating(**args)
    torch._dynamo.reset()
    with pytest.raises(ContractError) as compiled:
        torch.compile(fused_gdn_gating, fullgraph=True, backend="eager")(**args)
    assert str(compiled.value) == str(eager.value) and "`dt_bias`" in str(compiled.value)


def test_fake_tensors_give_shapes_and_trace_time_rules() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        args = _operands()
        g, beta = fused_gdn_gating(**args)
        assert g.shape == (1, T, H) and g.dtype == torch.float32 and beta.dtype == torch.bfloat16
        with pytest.raises(ContractError, match="`threshold`"):
            fused_gdn_gating_op(args["A_log"], args["a"], args["b"], args["dt_bias"], 1.0, 5.0)


def test_opcheck() -> None:
    args = _operands(torch.float32, tokens=40, seed=4)
    torch.library.opcheck(fused_gdn_gating_op, (*args.values(), 1.0, 20.0))


@contextlib.contextmanager
def _launches(run: bool) -> Iterator[list[tuple[Any, tuple[Any, ...]]]]:
    """``device.launch`` replaced: recorded (empty outputs of the kernel's shapes), or also run by nki-cpu."""
    calls: list[tuple[Any, tuple[Any, ...]]] = []

    def launch(kernel: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append((kernel, args))
        if run:
            return backend.simulate(kernel)(*args, **kwargs)
        a, b = args[1], args[2]
        return a.new_empty((1, *a.shape), dtype=torch.float32), b.new_empty((1, *b.shape))

    with launch_replaced(launch):
        yield calls


def test_device_path_hands_the_kernel_the_tensors_and_reads_no_value() -> None:
    args = {name: x.to(RECORDED_ON) for name, x in _operands().items()}
    args["a"] = args["a"].t().contiguous().t()  # the same shape, not row-major: one copy makes it so
    with _launches(run=False) as calls:
        g, _ = fused_gdn_gating_op._init_fn(**args, beta=1.0, threshold=20.0)  # the op's body: the device path
    [(kernel, launched)] = calls
    assert kernel is gdn_gating
    a_log, a, b, dt_bias, softplus_beta, threshold = launched
    assert a.is_contiguous() and a.shape == (T, H) and b is args["b"] and a_log is args["A_log"]
    assert dt_bias is args["dt_bias"], "contiguous operands are handed over as they are"
    assert (softplus_beta, threshold) == (1.0, 20.0) and g.shape == (1, T, H) and g.device.type == RECORDED_ON.type


def test_device_path_rejects_before_any_launch() -> None:
    args = {name: x.to(RECORDED_ON) for name, x in _operands().items()}
    args["A_log"] = torch.zeros(3, device=RECORDED_ON)
    with _launches(run=False) as calls, pytest.raises(ContractError, match="`A_log`"):
        fused_gdn_gating_op._init_fn(**args, beta=1.0, threshold=20.0)
    assert calls == []


def test_device_path_gives_the_cpu_paths_bits() -> None:
    skip_on_device("nki-cpu interprets the launch on CPU tensors; on a device the kernel runs")
    args = _operands(seed=5)
    want = fused_gdn_gating_op(**args, beta=1.0, threshold=20.0)
    with _launches(run=True):
        got = fused_gdn_gating_op._init_fn(**args, beta=1.0, threshold=20.0)
    assert all(torch.equal(x, y) for x, y in zip(got, want, strict=True))
