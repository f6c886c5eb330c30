"""The torch drop-ins as ``torch.library`` custom ops: one import; every drop-in under ``FakeTensorMode`` without
touching data, with the CPU's ContractError for every shape rule at trace time; ``torch.library.opcheck`` of each
op (schema, declared mutations, fake implementation); HF's Qwen3-Next GatedDeltaNet layer under
``torch.compile(fullgraph=True)`` with zero graph breaks and eager's bits, and under ``torch.export`` with one node
per GDN call and the pool's mutation declared. Skipped, with the reason, without torch and transformers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'gdn-nki[torch]'; nox -s integration)")

from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode  # noqa: E402

import gdn_nki  # noqa: E402
import gdn_nki.torch  # noqa: E402
import gdn_nki.torch_decode  # noqa: E402
from gdn_nki.torch import ops  # noqa: E402
from gdn_nki.traces import recording_launches  # noqa: E402
from gdn_ref.contract import ContractError  # noqa: E402
from torch_device import (  # noqa: E402
    BACKEND_VARIABLE,
    DEVICE_VARIABLE,
    compile_backend,
    on_device,
    skip_on_device,
    test_device,
)

# The originals' names: FLA's two, vLLM's pool variant (its own name here: vLLM reuses FLA's), vLLM / SGLang's
# fused-gating update, AWS's gdn_tkg.
DROP_INS = (
    "chunk_gated_delta_rule",
    "fused_recurrent_gated_delta_rule",
    "vllm_fused_recurrent_gated_delta_rule",
    "fused_sigmoid_gating_delta_rule_update",
    "gdn_tkg",
)
HK, HV, K, V, P = 2, 4, 32, 32, 12


def test_one_import_holds_every_drop_in_and_torch_decode_still_does() -> None:
    for name in DROP_INS:
        assert name in gdn_nki.torch.__all__, name
    for name in gdn_nki.torch_decode.__all__:
        assert getattr(gdn_nki.torch_decode, name) is getattr(gdn_nki.torch, name), name


# --- calls: each drop-in with every serving option it has --------------------------------------------------------


def _randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape) * scale


def _l2(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True)


def prefill_pool_call() -> dict[str, Any]:
    """A packed prefill in a bucket on a pool: a −1 row, a read row (a prefix-cache hit), a checkpoint."""
    torch.manual_seed(1)
    tokens = 127
    return dict(
        q=_l2(_randn(1, tokens, HK, K)), k=_l2(_randn(1, tokens, HK, K)), v=_randn(1, tokens, HV, V),
        g=-torch.rand(1, tokens, HV) * 0.1, beta=torch.rand(1, tokens, HV), initial_state=_randn(P, HV, K, V, scale=0.1),
        output_final_state=True, cu_seqlens=torch.tensor([0, 37, 127], dtype=torch.int32),
        state_indices=torch.tensor([5, -1], dtype=torch.int32), read_indices=torch.tensor([2, -1], dtype=torch.int32),
        bucket=(256, 4), checkpoint_every=128, checkpoint_indices=torch.tensor([[6], [-1]], dtype=torch.int32),
    )  # fmt: skip


def prefill_call() -> dict[str, Any]:
    """FLA's plain call: two batch rows, initial states read, final states returned."""
    torch.manual_seed(2)
    return dict(q=_randn(2, 40, HK, K), k=_randn(2, 40, HK, K), v=_randn(2, 40, HV, V), g=-torch.rand(2, 40, HV),
                beta=torch.rand(2, 40, HV), initial_state=_randn(2, HV, K, V, scale=0.1), output_final_state=True,
                use_qk_l2norm_in_kernel=True)  # fmt: skip


def verify_call() -> dict[str, Any]:
    """vLLM's speculative verification: [N, T] rows (one padding request), num_accepted_tokens."""
    torch.manual_seed(3)
    n, t = 3, 2
    return dict(
        q=_randn(1, n * t, HK, K), k=_randn(1, n * t, HK, K), v=_randn(1, n * t, HV, V),
        g=-torch.rand(1, n * t, HV), beta=torch.rand(1, n * t, HV), initial_state=_randn(P, HV, K, V, scale=0.1),
        cu_seqlens=torch.arange(0, n * t + 1, t, dtype=torch.int32),
        ssm_state_indices=torch.tensor([[4, 1], [-1, -1], [0, 6]], dtype=torch.int32),
        num_accepted_tokens=torch.tensor([2, 1, 1], dtype=torch.int32), use_qk_l2norm_in_kernel=True,
    )  # fmt: skip


def fused_gating_call() -> dict[str, Any]:
    torch.manual_seed(4)
    n = 3
    return dict(
        A_log=torch.rand(HV).log(), a=_randn(n, HV), dt_bias=_randn(HV), softplus_beta=1.0, softplus_threshold=20.0,
        q=_randn(1, n, HK, K), k=_randn(1, n, HK, K), v=_randn(1, n, HV, V), b=_randn(n, HV),
        initial_state_source=_randn(P, HV, K, V, scale=0.1),
        initial_state_indices=torch.tensor([3, -1, 7], dtype=torch.int32), use_qk_l2norm_in_kernel=True,
        cu_seqlens=torch.arange(n + 1, dtype=torch.int32),
    )  # fmt: skip


def fla_decode_call() -> dict[str, Any]:
    torch.manual_seed(5)
    return dict(q=_randn(2, 1, HK, K), k=_randn(2, 1, HK, K), v=_randn(2, 1, HV, V), g=-torch.rand(2, 1, HV),
                beta=torch.rand(2, 1, HV), initial_state=_randn(2, HV, K, V, scale=0.1), output_final_state=True,
                use_qk_l2norm_in_kernel=True)  # fmt: skip


def tkg_call() -> dict[str, Any]:
    torch.manual_seed(6)
    bh = 2 * HV
    return dict(q=_randn(bh, K), k=_randn(bh, K), v=_randn(bh, V), b=_randn(bh), a=_randn(bh),
                A_log=torch.rand(HV).log(), dt_bias=_randn(HV), z=_randn(bh, V), norm_weight=torch.ones(V),
                state_in=_randn(bh, K, V, scale=0.1))  # fmt: skip


CALLS: dict[str, tuple[Callable[..., Any], Callable[[], dict[str, Any]]]] = {
    "prefill on a pool, bucket, checkpoints": (gdn_nki.torch.chunk_gated_delta_rule, prefill_pool_call),
    "prefill, FLA's call": (gdn_nki.torch.chunk_gated_delta_rule, prefill_call),
    "vLLM verify": (gdn_nki.torch.vllm_fused_recurrent_gated_delta_rule, verify_call),
    "fused gating update": (gdn_nki.torch.fused_sigmoid_gating_delta_rule_update, fused_gating_call),
    "FLA decode": (gdn_nki.torch.fused_recurrent_gated_delta_rule, fla_decode_call),
    "gdn_tkg": (gdn_nki.torch.gdn_tkg, tkg_call),
}


def _shapes(result: Any) -> list[Any]:
    items = result if isinstance(result, tuple) else (result,)
    return [None if x is None else (tuple(x.shape), x.dtype) for x in items]


def _fake(mode: FakeTensorMode, args: dict[str, Any]) -> dict[str, Any]:
    return {name: mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for name, x in args.items()}


def test_the_test_device_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """GDN_TORCH_DEVICE picks the device the calls are built on (nox -s neuron sets it); unset means the CPU."""
    monkeypatch.delenv(DEVICE_VARIABLE, raising=False)
    assert test_device() == torch.device("cpu")
    monkeypatch.setenv(DEVICE_VARIABLE, "meta")
    assert test_device() == torch.device("meta")
    moved = on_device(prefill_pool_call(), test_device())
    assert all(x.device.type == "meta" for x in moved.values() if isinstance(x, torch.Tensor))
    assert moved["bucket"] == (256, 4)
    with pytest.raises(pytest.skip.Exception, match="GDN_TORCH_DEVICE=meta: why"):
        skip_on_device("why")
    monkeypatch.delenv(DEVICE_VARIABLE)
    skip_on_device("the CPU runs everything")
    monkeypatch.delenv(BACKEND_VARIABLE, raising=False)
    assert compile_backend() == "aot_eager"
    monkeypatch.setenv(BACKEND_VARIABLE, "neuron")
    assert compile_backend() == "neuron"


@pytest.mark.parametrize("name", list(CALLS))
def test_each_drop_in_on_the_test_device_matches_the_cpu_path(name: str) -> None:
    """On GDN_TORCH_DEVICE (the XLA device under nox -s neuron) each drop-in gives the CPU path's results, to the
    fp32 kernel's rounding. Skipped on the CPU, where there is no second path to compare."""
    device = test_device()
    if device.type == "cpu":
        pytest.skip("GDN_TORCH_DEVICE is the CPU: the device path is compared only on a device (nox -s neuron)")
    drop_in, make = CALLS[name]
    want = drop_in(**make())
    got = drop_in(**on_device(make(), device))
    want_items = want if isinstance(want, tuple) else (want,)
    got_items = got if isinstance(got, tuple) else (got,)
    for w, g in zip(want_items, got_items, strict=True):
        assert (w is None) == (g is None)
        if w is not None:
            assert g.device.type == device.type
            torch.testing.assert_close(g.cpu(), w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", list(CALLS))
def test_the_whole_drop_in_runs_under_fake_tensors_without_touching_data(name: str) -> None:
    """A fake tensor has no data: any read of a value (.item(), .tolist(), .cpu(), numpy) raises. The results have
    the CPU run's shapes and dtypes, and a pool comes back as the pool itself."""
    drop_in, make = CALLS[name]
    want = _shapes(drop_in(**make()))
    mode = FakeTensorMode()
    args = _fake(mode, make())
    with mode:
        got = drop_in(**args)
    assert _shapes(got) == want
    items = got if isinstance(got, tuple) else (got,)
    assert all(x is None or isinstance(x, FakeTensor) for x in items)
    if name == "vLLM verify":
        assert got[1] is args["initial_state"]


def test_a_configured_bucket_is_chosen_from_shapes_alone_under_fake_tensors() -> None:
    args = prefill_pool_call()
    del args["bucket"]
    gdn_nki.configure_buckets([(128, 4), (256, 4), (512, 8)])
    try:
        # 127 tokens in 2 sequences may take up to 2 chunks of 128 once padded: (256, 4), whatever the lengths
        assert ops.rules.bucket_for(args["q"], args["cu_seqlens"], "schur") == (256, 4)
        mode = FakeTensorMode()
        fake = _fake(mode, args)
        with mode:
            o, pool = gdn_nki.torch.chunk_gated_delta_rule(**fake)
        assert tuple(o.shape) == (1, 127, HV, V) and pool is fake["initial_state"]
    finally:
        gdn_nki.configure_buckets([])


def test_the_shapes_bucket_gives_the_lengths_bucket_bits() -> None:
    """An empty sequence and one of 100 tokens need one chunk of 128 (the host path's choice from the lengths:
    (128, 4)); from shapes, 100 tokens in 2 sequences may need two ((256, 4)). Same bits either way."""
    args = prefill_pool_call()
    for name in ("q", "k", "v", "g", "beta"):
        args[name] = args[name][:, :100]
    args.update(cu_seqlens=torch.tensor([0, 0, 100], dtype=torch.int32), checkpoint_every=None,
                checkpoint_indices=None)  # fmt: skip
    del args["bucket"]
    gdn_nki.configure_buckets([(128, 4), (256, 4)])
    try:
        assert ops.rules.bucket_for(args["q"], args["cu_seqlens"], "schur") == (256, 4)
        host_pool = args["initial_state"].clone()
        with recording_launches() as launches:
            want_o, _ = gdn_nki.torch.chunk.chunk_gated_delta_rule(**{**args, "initial_state": host_pool})
            o, pool = gdn_nki.torch.chunk_gated_delta_rule(**args)
    finally:
        gdn_nki.configure_buckets([])
    assert [dict(launch.key[2])["query"][1][2] for launch in launches] == [128, 256]  # the bucket's tokens
    assert torch.equal(o, want_o) and torch.equal(pool, host_pool)


# Shape and dtype errors: the CPU raises them (eager, today's path), and the op's fake implementation raises the very
# same ContractError at trace time.
def _set(**changes: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def apply(args: dict[str, Any]) -> dict[str, Any]:
        return {**args, **{name: make(args) for name, make in changes.items()}}

    return apply


BAD_SHAPES = {
    "prefill: g head-first": ("prefill on a pool, bucket, checkpoints", _set(g=lambda a: a["g"].transpose(1, 2))),
    "prefill: Hv not a multiple of Hk": (
        "prefill, FLA's call", _set(q=lambda a: _randn(2, 40, 3, K), k=lambda a: _randn(2, 40, 3, K))),
    "prefill: head dim over 128": ("prefill, FLA's call", _set(
        q=lambda a: _randn(2, 40, HK, 160), k=lambda a: _randn(2, 40, HK, 160),
        initial_state=lambda a: _randn(2, HV, 160, V)))
    ,
    "prefill: bucket not a chunk multiple": ("prefill on a pool, bucket, checkpoints", _set(bucket=lambda a: (200, 4))),
    "prefill: bucket with too few slots": ("prefill on a pool, bucket, checkpoints", _set(bucket=lambda a: (256, 1))),
    "prefill: pool of the wrong heads": (
        "prefill on a pool, bucket, checkpoints", _set(initial_state=lambda a: _randn(P, HV + 1, K, V))),
    "prefill: checkpoint table of the wrong rows": (
        "prefill on a pool, bucket, checkpoints", _set(checkpoint_indices=lambda a: torch.full((3, 1), -1))),
    "prefill: cu_seqlens with two batch rows": ("prefill, FLA's call", _set(cu_seqlens=lambda a: torch.tensor([0, 80]))),
    "prefill: float16 v": ("prefill, FLA's call", _set(v=lambda a: a["v"].half())),
    "verify: [N] rows with T = 2": ("vLLM verify", _set(ssm_state_indices=lambda a: a["ssm_state_indices"][:, 0])),
    "verify: bf16 pool": ("vLLM verify", _set(initial_state=lambda a: a["initial_state"].bfloat16())),
    "verify: head dim over 128": ("vLLM verify", _set(
        q=lambda a: _randn(1, 6, HK, 160), k=lambda a: _randn(1, 6, HK, 160),
        initial_state=lambda a: _randn(P, HV, 160, V))),
    "fused gating: a of the wrong shape": ("fused gating update", _set(a=lambda a: _randn(3, HV + 1))),
    "fused gating: softplus beta 2": ("fused gating update", _set(softplus_beta=lambda a: 2.0)),
    "FLA decode: state of the wrong rows": ("FLA decode", _set(initial_state=lambda a: _randn(3, HV, K, V))),
    "gdn_tkg: state of the wrong shape": ("gdn_tkg", _set(state_in=lambda a: _randn(2 * HV, K, V + 1))),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD_SHAPES))
def test_every_shape_rule_raises_the_cpus_contract_error_at_trace_time(case: str) -> None:
    call, change = BAD_SHAPES[case]
    drop_in, make = CALLS[call]
    with pytest.raises(ContractError) as on_cpu:
        drop_in(**change(make()))
    mode = FakeTensorMode()
    args = _fake(mode, change(make()))
    with mode, pytest.raises(ContractError) as traced:
        drop_in(**args)
    assert str(traced.value) == str(on_cpu.value)
    # raised by the op's trace-time rules (its fake implementation), not by a host path that happens to check the
    # shape before it reads data; softplus_beta is a number, checked by the drop-in before the op
    raised_in = {entry.path.name for entry in traced.traceback}
    assert ("rules.py" in raised_in) != (case in NON_TENSOR_RULES), raised_in


NON_TENSOR_RULES = ("fused gating: softplus beta 2",)


# --- opcheck: schema, declared mutations, fake implementation, under every dispatch test opcheck runs ---------------


def _op_samples() -> dict[str, tuple[Any, tuple[Any, ...]]]:
    pool = prefill_pool_call()
    plain = prefill_call()
    verify = verify_call()
    fused = fused_gating_call()
    fla = fla_decode_call()
    tkg = tkg_call()
    return {
        "chunk_gated_delta_rule": (ops.chunk_op, (
            plain["q"], plain["k"], plain["v"], plain["g"], plain["beta"], plain["initial_state"], None, None, None,
            None, True, False, False, "schur", 8, None)),
        "chunk_gated_delta_rule_pool": (ops.chunk_pool_op, (
            pool["q"], pool["k"], pool["v"], pool["g"], pool["beta"], pool["initial_state"], pool["state_indices"],
            None, None, pool["cu_seqlens"], pool["checkpoint_indices"], pool["read_indices"], None, False, False,
            False, "schur", 8, [256, 4], 128)),
        "vllm_fused_recurrent_gated_delta_rule": (ops.vllm_fused_recurrent_op, (
            verify["q"], verify["k"], verify["v"], verify["g"], verify["beta"], verify["initial_state"],
            verify["ssm_state_indices"], verify["cu_seqlens"], verify["num_accepted_tokens"], None, True)),
        "fused_sigmoid_gating_delta_rule_update": (ops.fused_sigmoid_gating_op, (
            fused["A_log"], fused["a"], fused["dt_bias"], fused["q"], fused["k"], fused["v"], fused["b"],
            fused["initial_state_source"], fused["initial_state_indices"], fused["cu_seqlens"], 1.0, 20.0, None,
            True)),
        "fused_recurrent_gated_delta_rule": (ops.fused_recurrent_op, (
            fla["q"], fla["k"], fla["v"], fla["g"], fla["beta"], fla["initial_state"], None, None, True)),
        "gdn_tkg": (ops.gdn_tkg_op, tuple(tkg.values())),
    }  # fmt: skip


@pytest.mark.parametrize("name", list(_op_samples()))
def test_opcheck_each_op(name: str) -> None:
    op, args = _op_samples()[name]
    # aot_dispatch_dynamic traces with symbolic sizes; the rules specialize them (one kernel compile per shape)
    torch.library.opcheck(op, args, test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


def test_every_drop_in_is_an_op_of_the_gdn_nki_namespace() -> None:
    names = {name for name in dir(torch.ops.gdn_nki) if not name.startswith("_")}
    assert set(_op_samples()) <= names
    mutated = {name: [a.name for a in getattr(torch.ops.gdn_nki, name).default._schema.arguments
                      if a.alias_info is not None and a.alias_info.is_write] for name in _op_samples()}  # fmt: skip
    assert mutated == {
        "chunk_gated_delta_rule": [],
        "chunk_gated_delta_rule_pool": ["pool"],
        "vllm_fused_recurrent_gated_delta_rule": ["pool"],
        "fused_sigmoid_gating_delta_rule_update": ["pool"],
        "fused_recurrent_gated_delta_rule": [],
        "gdn_tkg": [],
    }
