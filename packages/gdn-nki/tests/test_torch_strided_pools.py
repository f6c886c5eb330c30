"""One rule for a pool updated in place, shared by every drop-in that takes one (review holes49 item 4): what its
kernel cannot address in place is refused, as no staged copy of a pool is made on a device (the pool is the
kernel's own argument). Every pool kernel addresses rows at their own stride (vLLM's hybrid cache,
``test_torch_paged_pools``), so the chunk, vLLM's and SGLang's decode and both conv drop-ins refuse only a pool
whose rows are not dense inside, with the same ``ContractError`` — naming the pool argument, its strides, the rule
and the fix — from the drop-in and from the ops' trace-time rules (the fake and device paths), the buffer
unchanged; the same values at a row stride run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'gdn-nki[torch]'; nox -s integration)")

from decode_inputs import step_inputs  # noqa: E402
from gdn_nki.torch import (  # noqa: E402
    causal_conv1d_fn,
    causal_conv1d_update,
    chunk_gated_delta_rule,
    fused_sigmoid_gating_delta_rule_update,
    rules,
)
from gdn_nki.torch_decode import vllm_fused_recurrent_gated_delta_rule  # noqa: E402
from gdn_ref.contract import ContractError  # noqa: E402

C, W, P = 32, 4, 6


def _row_strided(pool: np.ndarray) -> torch.Tensor:
    """``pool``'s values in a view of a buffer twice as wide per row: every row at twice the dense stride (a
    per-layer slice of one shared cache allocation)."""
    holder = torch.zeros(pool.shape[0], 2 * int(np.prod(pool.shape[1:])), dtype=torch.from_numpy(pool).dtype)
    view = holder[:, : int(np.prod(pool.shape[1:]))].view(pool.shape[0], *pool.shape[1:])
    view.copy_(torch.from_numpy(pool))
    return view


def _t(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x))


def _chunk(pool: torch.Tensor) -> Callable[[], Any]:
    x = step_inputs(1, "float32", N=1, T=8, Hk=2, Hv=2, Dk=16, Dv=16, P=P)
    return lambda: chunk_gated_delta_rule(_t(x.query), _t(x.key), _t(x.value), _t(x.g_log), _t(x.beta),
                                          initial_state=pool, state_indices=torch.tensor([3]))  # fmt: skip


def _vllm_decode(pool: torch.Tensor) -> Callable[[], Any]:
    x = step_inputs(2, "float32", N=2, T=1, P=P)
    flat = [_t(a.reshape(1, 2, *a.shape[2:])) for a in (x.query, x.key, x.value, x.g_log, x.beta)]
    return lambda: vllm_fused_recurrent_gated_delta_rule(*flat, initial_state=pool, cu_seqlens=torch.tensor([0, 1, 2]),
                                                         ssm_state_indices=torch.tensor([4, 1], dtype=torch.int32))  # fmt: skip


def _sglang_decode(pool: torch.Tensor) -> Callable[[], Any]:
    x = step_inputs(3, "float32", N=2, T=1, P=P)
    flat = [_t(a.reshape(1, 2, *a.shape[2:])) for a in (x.query, x.key, x.value)]
    a, b = (_t(g.reshape(2, -1)) for g in (x.a, x.b))
    return lambda: fused_sigmoid_gating_delta_rule_update(_t(x.A_log), a, _t(x.dt_bias), 1.0, 20.0, *flat, b, pool,
                                                          torch.tensor([4, 1], dtype=torch.int32),
                                                          cu_seqlens=torch.tensor([0, 1, 2]))  # fmt: skip


def _conv_update(pool: torch.Tensor) -> Callable[[], Any]:
    g = torch.Generator().manual_seed(4)
    x, weight = torch.randn(2, C, 1, generator=g), torch.randn(C, W, generator=g)
    return lambda: causal_conv1d_update(x, pool, weight, None, "silu", torch.tensor([4, 1], dtype=torch.int32))


def _conv_fn(pool: torch.Tensor) -> Callable[[], Any]:
    g = torch.Generator().manual_seed(5)
    x, weight = torch.randn(C, 9, generator=g), torch.randn(C, W, generator=g)
    return lambda: causal_conv1d_fn(x, weight, None, pool, torch.tensor([0, 4, 9]),
                                    torch.tensor([4, 1], dtype=torch.int32), torch.tensor([True, False]))  # fmt: skip


ROW_STRIDED = {  # name -> (the call on a pool, the pool's own [P, ...] values, the argument the rejection names)
    "chunk_gated_delta_rule": (_chunk, (P, 2, 16, 16), "initial_state"),
    "vllm fused_recurrent_gated_delta_rule": (_vllm_decode, (P, 4, 32, 16), "initial_state"),
    "fused_sigmoid_gating_delta_rule_update": (_sglang_decode, (P, 4, 32, 16), "initial_state_source"),
    "causal_conv1d_update": (_conv_update, (P, C, W - 1), "conv_state"),
    "causal_conv1d_fn": (_conv_fn, (P, C, W - 1), "conv_states"),
}


def _inner_strided(pool: np.ndarray) -> torch.Tensor:
    """``pool``'s values in a view whose rows are not dense inside: its last dim every other element."""
    holder = torch.zeros(*pool.shape[:-1], 2 * pool.shape[-1], dtype=torch.from_numpy(pool).dtype)
    view = holder[..., ::2]
    view.copy_(torch.from_numpy(pool))
    return view


@pytest.mark.parametrize("name", list(ROW_STRIDED))
def test_every_drop_in_refuses_a_pool_whose_rows_are_not_dense_inside_alike(name: str) -> None:
    call, shape, argument = ROW_STRIDED[name]
    values = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
    pool = _inner_strided(values)
    before = pool.clone()
    with pytest.raises(ContractError) as info:
        call(pool)()
    message = str(info.value)
    assert f"`{argument}`" in message and "strides" in message and "each row dense" in message, message
    assert f"{argument}.contiguous()" in message, message
    assert torch.equal(pool, before)
    call(_row_strided(values))()  # the same values at a row stride only: addressed


def test_the_ops_trace_time_rules_refuse_what_the_kernels_cannot_address() -> None:
    """The fake and device paths' rules (no CPU host path runs there): the same rejections, and rows at their own
    stride pass them."""
    inner, pool = (f(np.zeros((P, C, W - 1), np.float32)) for f in (_inner_strided, _row_strided))
    x, weight = torch.zeros(2, 1, C), torch.zeros(C, W)
    rows = torch.tensor([4, 1], dtype=torch.int32)
    with pytest.raises(ContractError, match=r"`conv_state`.*each row dense"):
        rules.conv_step(x, inner, weight, None, rows, "silu")
    rules.conv_step(x, pool, weight, None, rows, "silu")
    prefill = (torch.zeros(9, C), weight, None, torch.tensor([0, 4, 9], dtype=torch.int32), rows,
               torch.tensor([-1, -1], dtype=torch.int32), "silu")  # fmt: skip
    with pytest.raises(ContractError, match=r"`conv_states`.*each row dense"):
        rules.conv_prefill(prefill[0], inner, *prefill[1:])
    rules.conv_prefill(prefill[0], pool, *prefill[1:])
    x = step_inputs(2, "float32", N=2, T=1, P=P)
    flat = [_t(a.reshape(1, 2, *a.shape[2:])) for a in (x.query, x.key, x.value, x.g_log, x.beta)]
    decode = (torch.tensor([4, 1], dtype=torch.int32), torch.tensor([0, 1, 2]), None, None, False,
              {"g": flat[3], "beta": flat[4]})  # fmt: skip
    with pytest.raises(ContractError, match=r"`initial_state`.*each row dense"):
        rules.pool_decode(*flat[:3], _inner_strided(np.zeros((P, 4, 32, 16), np.float32)), *decode)
    rules.pool_decode(*flat[:3], _row_strided(np.zeros((P, 4, 32, 16), np.float32)), *decode)
