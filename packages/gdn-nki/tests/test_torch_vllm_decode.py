"""vLLM's newer decode calls on its V-major pool [P, HV, V, K] (``gdn_nki.torch.vllm_decode``):
``vllm_fused_sigmoid_gating_delta_rule_update`` (and the shared name called with vLLM's keywords) and
``fused_recurrent_gated_delta_rule_packed_decode``, at users' configurations: K = V square heads with non-symmetric
states (a transposed read fails), [N, T] rows with ``num_accepted_tokens``, −1 rows, bf16, judged against the fp64
oracle; compiled fullgraph to one op, under ``FakeTensorMode``, and through the device path's recording stand-in.
Skipped without torch."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'gdn-nki[torch]'; nox -s integration)")

import gdn_nki.torch  # noqa: E402
from decode_inputs import assert_within  # noqa: E402
from gdn_nki.tkg.step import gdn_step  # noqa: E402
from gdn_nki.torch import device, ops  # noqa: E402
from gdn_ref import decode_steps, fused_gates  # noqa: E402
from gdn_ref.contract import ContractError  # noqa: E402
from torch_device import compile_backend, launch_replaced  # noqa: E402

HK, HV, K, V, P = 2, 4, 32, 32, 8  # K = V: a state read transposed has the right shape and the wrong values
ROWS = [[4, 1], [-1, -1], [0, 6]]  # [N, T]: a padding request between two
ACCEPTED = [2, 1, 1]  # request 0 starts from its second row (a speculative step rolled back)


def _pool() -> torch.Tensor:
    """A V-major pool whose states are far from symmetric: state.T differs from state everywhere it matters."""
    torch.manual_seed(21)
    return 0.1 * torch.randn(P, HV, V, K) + 0.2 * torch.triu(torch.ones(V, K))


def vllm_call(dtype: torch.dtype = torch.float32, n: int = 3, t: int = 2) -> dict[str, Any]:
    """vLLM's keyword call of its fused-gating update (qwen_gdn_linear_attn's spec-decode form), pool apart."""
    torch.manual_seed(8)
    tokens = n * t
    return dict(
        A_log=torch.rand(HV).log(), a=torch.randn(tokens, HV), b=torch.randn(tokens, HV), dt_bias=torch.randn(HV),
        q=torch.randn(1, tokens, HK, K).to(dtype), k=torch.randn(1, tokens, HK, K).to(dtype),
        v=torch.randn(1, tokens, HV, V).to(dtype), cu_seqlens=torch.arange(0, tokens + 1, t, dtype=torch.int32),
        ssm_state_indices=torch.tensor(ROWS, dtype=torch.int32),
        num_accepted_tokens=torch.tensor(ACCEPTED, dtype=torch.int32), use_qk_l2norm_in_kernel=True,
    )  # fmt: skip


def _np(x: torch.Tensor) -> np.ndarray:
    return x.detach().double().numpy()


def _oracle(call: dict[str, Any], pool: torch.Tensor, n: int = 3, t: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """fp64: each request from its V-major row (transposed to the oracle's [K, V]); the pool after the call."""
    g, beta = fused_gates(_np(call["a"]), _np(call["b"]), _np(call["A_log"]), _np(call["dt_bias"]))
    q, k, v = (_np(call[x]).reshape(n, t, *call[x].shape[2:]) for x in ("q", "k", "v"))
    rows = np.asarray(call["ssm_state_indices"]).reshape(n, -1)
    accepted = call.get("num_accepted_tokens")
    out = np.zeros((n, t, HV, V))
    after = _np(pool)
    for r in range(n):
        if rows[r, 0] < 0:
            continue
        start = rows[r, 0 if accepted is None else int(accepted[r]) - 1]
        state = _np(pool[start]).swapaxes(-1, -2)[None]
        o, states = decode_steps(q[r : r + 1], k[r : r + 1], v[r : r + 1], g.reshape(n, t, HV)[r : r + 1],
                                 beta.reshape(n, t, HV)[r : r + 1], K**-0.5, state, l2norm=True)  # fmt: skip
        out[r] = o[0]
        for step in range(t):
            after[rows[r, step]] = states[0, step].swapaxes(-1, -2)
    return out, after


SHARED_AND_OWN = ["vllm_fused_sigmoid_gating_delta_rule_update", "fused_sigmoid_gating_delta_rule_update"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("form", SHARED_AND_OWN)
def test_vllms_fused_gating_update_reads_and_writes_its_v_major_pool(dtype: torch.dtype, form: str) -> None:
    """[N, T] rows, num_accepted_tokens, a −1 request, K = V: the fp64 oracle on the V-major rows; the pool written
    at every row of the valid requests' tokens, the rest untouched; the pool itself returned."""
    call, pool = vllm_call(dtype), _pool()
    before = pool.clone()
    want_o, want_pool = _oracle(call, before)
    o, returned = getattr(gdn_nki.torch, form)(**call, initial_state=pool)
    assert returned is pool and o.dtype == dtype and tuple(o.shape) == (1, 6, HV, V)
    name = "bfloat16" if dtype == torch.bfloat16 else "float32"
    got = _np(o).reshape(3, 2, HV, V)
    for r in (0, 2):
        assert_within("out", got[r], want_o[r], name)
    assert torch.equal(o[0, 2:4], torch.zeros(2, HV, V, dtype=dtype))  # the padding request's rows
    for row in range(P):
        if row in (4, 1, 0, 6):
            assert_within("state", _np(pool[row]), want_pool[row], name)
        else:
            assert torch.equal(pool[row], before[row])


def test_it_is_sglangs_op_on_the_transposed_k_major_pool_bit_for_bit() -> None:
    call = vllm_call()
    k_major = _pool().transpose(-1, -2).contiguous()
    want = gdn_nki.torch.fused_sigmoid_gating_delta_rule_update(
        call["A_log"], call["a"], call["dt_bias"], 1.0, 20.0, call["q"], call["k"], call["v"], call["b"], k_major,
        call["ssm_state_indices"], None, True, call["cu_seqlens"], num_accepted_tokens=call["num_accepted_tokens"],
    )  # fmt: skip
    pool = _pool()
    o, _ = gdn_nki.torch.vllm_fused_sigmoid_gating_delta_rule_update(**call, initial_state=pool)
    assert torch.equal(o, want) and torch.equal(pool, k_major.transpose(-1, -2))


def _packed(dtype: torch.dtype = torch.bfloat16, rows: tuple[int, ...] = (5, -1, 2, 7)) -> dict[str, Any]:
    """vLLM's packed decode: B requests, one token each, mixed_qkv [B, 2·H·K + HV·V], out prefilled with junk."""
    torch.manual_seed(9)
    b = len(rows)
    return dict(
        mixed_qkv=torch.randn(b, 2 * HK * K + HV * V).to(dtype), a=torch.randn(b, HV), b=torch.randn(b, HV),
        A_log=torch.rand(HV).log(), dt_bias=torch.randn(HV), scale=K**-0.5, initial_state=_pool(),
        out=torch.full((b, 1, HV, V), 7.0, dtype=dtype), ssm_state_indices=torch.tensor(rows, dtype=torch.int32),
        use_qk_l2norm_in_kernel=True,
    )  # fmt: skip


def _unpacked(call: dict[str, Any]) -> dict[str, Any]:
    """The packed call as vLLM's fused-gating update's: q, k, v split from mixed_qkv, [B, 1] tokens."""
    mixed, b = call["mixed_qkv"], call["mixed_qkv"].shape[0]
    q, k, v = mixed.split([HK * K, HK * K, HV * V], dim=-1)
    return dict(A_log=call["A_log"], a=call["a"], b=call["b"], dt_bias=call["dt_bias"],
                q=q.reshape(b, 1, HK, K), k=k.reshape(b, 1, HK, K), v=v.reshape(b, 1, HV, V),
                ssm_state_indices=call["ssm_state_indices"], use_qk_l2norm_in_kernel=True)  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_decode_writes_out_and_the_v_major_pool_in_place(dtype: torch.dtype) -> None:
    call = _packed(dtype)
    before = call["initial_state"].clone()
    unpacked = {**_unpacked(call), "q": None, "k": None, "v": None}
    split = _unpacked(call)
    oracle_call = {**unpacked, **{x: split[x].reshape(1, 4, *split[x].shape[2:]) for x in ("q", "k", "v")},
                   "ssm_state_indices": call["ssm_state_indices"].reshape(4, 1)}  # fmt: skip
    want_o, want_pool = _oracle(oracle_call, before, n=4, t=1)
    out, pool = gdn_nki.torch.fused_recurrent_gated_delta_rule_packed_decode(**call)
    assert out is call["out"] and pool is call["initial_state"] and out.dtype == dtype
    name = "bfloat16" if dtype == torch.bfloat16 else "float32"
    for r in (0, 2, 3):
        assert_within("out", _np(out[r]), want_o[r], name)
    assert torch.equal(out[1], torch.zeros(1, HV, V, dtype=dtype))  # −1: zeros, as vLLM's kernel stores
    for row in range(P):
        if row in (5, 2, 7):
            assert_within("state", _np(pool[row]), want_pool[row], name)
        else:
            assert torch.equal(pool[row], before[row])


def test_packed_decode_is_the_fused_gating_update_of_its_split_projection_bit_for_bit() -> None:
    call = _packed()
    o, _ = gdn_nki.torch.vllm_fused_sigmoid_gating_delta_rule_update(**_unpacked(call), initial_state=_pool())
    out, _ = gdn_nki.torch.fused_recurrent_gated_delta_rule_packed_decode(**call)
    assert torch.equal(out, o.to(out.dtype))


# --- rejections by name, nothing written ----------------------------------------------------------------------------


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize(
    "drop_in", ["vllm_fused_sigmoid_gating_delta_rule_update", "vllm_fused_recurrent_gated_delta_rule"]
)
def test_a_bf16_pool_is_refused_with_a_fix_that_keeps_the_pool_in_place(drop_in: str, compiled: bool) -> None:
    """vLLM allocates its SSM state in the model's dtype unless told otherwise (``mamba_ssm_cache_dtype="auto"``):
    a bf16 pool is refused by name with the fix that keeps the update in place (allocate float32), not a converted
    copy (``.to(torch.float32)``: the call would update the copy and the caller's pool would stay stale), eager
    and compiled alike, nothing written."""
    call = {**vllm_call(), "initial_state": _pool().bfloat16()}
    if drop_in == "vllm_fused_recurrent_gated_delta_rule":
        a, b = (call.pop(name) for name in ("a", "b"))
        for name in ("A_log", "dt_bias"):
            call.pop(name)
        call.update(g=-a.float().abs().reshape(1, *a.shape[-2:]), beta=b.float().sigmoid().reshape(1, *b.shape[-2:]))
    pool = call["initial_state"]
    before = pool.clone()
    fn = getattr(gdn_nki.torch, drop_in)
    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(fn, fullgraph=True, backend=compile_backend())
    with pytest.raises(ContractError, match=r"`initial_state` dtype bfloat16") as error:
        fn(**call)
    fix = str(error.value).split("Fix: ", 1)[1]
    assert "allocate initial_state in float32" in fix and "--mamba-ssm-cache-dtype float32" in fix, fix
    assert not fix.startswith("pass initial_state.to("), fix
    assert torch.equal(pool, before)


@pytest.mark.parametrize(
    ("change", "argument"),
    [
        ({"is_kda": True}, "is_kda"),
        ({"inplace_final_state": False}, "inplace_final_state"),
        ({"beta": 2.0}, "beta"),
        ({"threshold": 5.0}, "threshold"),
        ({"ssm_state_indices": None}, "ssm_state_indices"),
        ({"ssm_state_indices": torch.tensor(ROWS, dtype=torch.float32)}, "ssm_state_indices"),
        ({"initial_state": _pool().double()}, "initial_state"),
    ],
)
def test_vllms_update_rejects_by_vllms_names_and_writes_nothing(change: dict[str, Any], argument: str) -> None:
    call = {**vllm_call(), "initial_state": _pool(), **change}
    pool = call["initial_state"]
    before = None if pool is None else pool.clone()
    with pytest.raises(ContractError, match=f"`{argument}`") as error:
        gdn_nki.torch.vllm_fused_sigmoid_gating_delta_rule_update(**call)
    message = str(error.value)
    assert message.startswith("gdn_nki.torch.vllm_fused_sigmoid_gating_delta_rule_update rejected the call")
    assert "initial_state_source" not in message and "initial_state_indices" not in message, message
    assert torch.equal(pool, before)


def test_the_shared_name_with_vllms_and_sglangs_keywords_is_rejected() -> None:
    call = {**vllm_call(), "initial_state": _pool(), "softplus_beta": 1.0}
    with pytest.raises(ContractError, match=r"`softplus_beta`.*\[keyword.mixed_forms\]"):
        gdn_nki.torch.fused_sigmoid_gating_delta_rule_update(**call)


@pytest.mark.parametrize(
    ("change", "argument"),
    [
        ({"out": torch.zeros(4, HV, V)}, "out"),
        ({"ssm_state_indices": torch.tensor([[5], [-1], [2], [7]], dtype=torch.int32)}, "ssm_state_indices"),
        ({"mixed_qkv": torch.zeros(4, 2 * HK * K + HV * V - 1)}, "mixed_qkv"),
        ({"initial_state": _pool()[:, :, :16].contiguous()}, "mixed_qkv"),  # V = 16: no head count fits the width
        ({"a": torch.zeros(4, HV + 1)}, "a"),
    ],
)
def test_packed_decode_rejects_by_name_and_writes_neither_buffer(change: dict[str, Any], argument: str) -> None:
    call = {**_packed(), **change}
    before = call["initial_state"].clone(), call["out"].clone()
    with pytest.raises(ContractError, match=f"`{argument}`") as error:
        gdn_nki.torch.fused_recurrent_gated_delta_rule_packed_decode(**call)
    assert str(error.value).startswith("gdn_nki.torch.fused_recurrent_gated_delta_rule_packed_decode rejected")
    assert torch.equal(call["initial_state"], before[0]) and torch.equal(call["out"], before[1])


# --- compiled, fake tensors, grad mode, the device path -------------------------------------------------------------

FORMS = {
    "vLLM's fused-gating update": (
        lambda: gdn_nki.torch.vllm_fused_sigmoid_gating_delta_rule_update,
        lambda: {**vllm_call(torch.bfloat16), "initial_state": _pool()},
    ),
    "the shared name, vLLM's keywords": (
        lambda: gdn_nki.torch.fused_sigmoid_gating_delta_rule_update,
        lambda: {**vllm_call(torch.bfloat16), "initial_state": _pool()},
    ),
    "packed decode": (lambda: gdn_nki.torch.fused_recurrent_gated_delta_rule_packed_decode, _packed),
}


@pytest.mark.parametrize("form", list(FORMS))
def test_compiled_fullgraph_is_one_op_without_a_graph_break_and_gives_eagers_bits(form: str) -> None:
    drop_in, make = (f() if i == 0 else f for i, f in enumerate(FORMS[form]))
    want_o, want_pool = drop_in(**make())
    torch._dynamo.reset()
    explained = torch._dynamo.explain(lambda **kwargs: drop_in(**kwargs))(**make())
    assert (explained.graph_break_count, explained.graph_count) == (0, 1), explained.break_reasons
    names = [str(n.target) for g in explained.graphs for n in g.graph.nodes if "gdn_nki" in str(n.target)]
    assert names == ["gdn_nki.fused_sigmoid_gating_delta_rule_update.default"]
    args = make()
    o, pool = torch.compile(drop_in, fullgraph=True, backend=compile_backend())(**args)
    assert torch.equal(o, want_o) and torch.equal(pool, want_pool)
    if form == "packed decode":
        assert torch.equal(args["out"], want_o)


def test_a_compiled_rejection_is_eagers_contract_error_and_writes_nothing() -> None:
    call = {**_packed(), "out": torch.zeros(4, HV, V)}
    before = call["initial_state"].clone()
    torch._dynamo.reset()
    compiled = torch.compile(gdn_nki.torch.fused_recurrent_gated_delta_rule_packed_decode, fullgraph=True,
                             backend=compile_backend())  # fmt: skip
    with pytest.raises(ContractError, match="`out`"):
        compiled(**call)
    assert torch.equal(call["initial_state"], before)


@pytest.mark.parametrize("form", list(FORMS))
def test_under_fake_tensors_the_results_have_their_shapes(form: str) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    drop_in, make = FORMS[form][0](), FORMS[form][1]
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        args = {n: mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for n, x in make().items()}
        o, pool = drop_in(**args)
        assert pool is args["initial_state"]
        want = (4, 1, HV, V) if form == "packed decode" else (1, 6, HV, V)
        assert tuple(o.shape) == want and o.dtype == torch.bfloat16
        with pytest.raises(ContractError, match="`initial_state`"):
            drop_in(**{**args, "initial_state": mode.from_tensor(_pool().half())})


def test_grad_mode_runs_and_a_backward_names_vllms_drop_in() -> None:
    call = {**vllm_call(), "initial_state": _pool()}
    call["q"].requires_grad_(True)
    o, _ = gdn_nki.torch.vllm_fused_sigmoid_gating_delta_rule_update(**call)
    assert o.requires_grad
    with pytest.raises(gdn_nki.torch.ForwardOnlyError, match="vllm_fused_sigmoid_gating_delta_rule_update"):
        o.sum().backward()


def test_the_device_path_gets_views_of_mixed_qkv_the_flag_and_the_pool_itself(monkeypatch: Any) -> None:
    """The packed decode on meta tensors, its op's device implementation called in the op's place, the launch
    recorded: ``gdn_step`` gets q, k, v as views of the caller's mixed_qkv, ``state_v_first=True`` and the pool."""
    calls = []

    def launch(kernel: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append((kernel, args, kwargs))
        return args[0].new_empty((*args[2].shape[:3], args[2].shape[3])), args[3]

    monkeypatch.setattr(ops, "fused_sigmoid_gating_op", device.fused_sigmoid_gating)
    call = {n: x.to("meta") if isinstance(x, torch.Tensor) else x for n, x in _packed().items()}
    with launch_replaced(launch):
        out, pool = gdn_nki.torch.fused_recurrent_gated_delta_rule_packed_decode(**call)
    [(kernel, launched, options)] = calls
    assert kernel is gdn_step and options["state_v_first"] is True and launched[3] is call["initial_state"]
    width = call["mixed_qkv"].shape[1]  # each a strided view of the packed rows (its row stride), not a copy
    assert [x.stride(0) for x in launched[:3]] == [width] * 3
    assert [tuple(x.shape) for x in launched[:3]] == [(4, 1, HK, K), (4, 1, HK, K), (4, 1, HV, V)]
    assert out is call["out"] and pool is call["initial_state"]
