"""The conv and gated-norm drop-ins' rejections in the caller's terms (review47): the message starts with the
function the caller called (as the recurrence drop-ins' do: ``test_torch_entry_point_rejections.py``), names the
caller's arguments (vLLM's ``cache_indices`` / ``conv_states`` / ``query_start_loc``, FLA's ``initial_state``), not
the host entry points' (``conv_prefill_bucket``'s ``state_indices``, ``conv_pool``), leaves every buffer as it was,
and a bad ``rms_norm_gated`` call compiled with ``fullgraph=True`` raises eager's ``ContractError``."""

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
    rms_norm_gated,
)
from gdn_ref.contract import ContractError  # noqa: E402

C, W, P, D = 32, 4, 5, 16
# The host entry points and kernels a drop-in's rejection must not name in place of the drop-in itself.
INTERNAL_NAMES = ("conv_prefill_bucket", "conv_decode_step", "gated_rms_norm", "gdn_cte", "`conv_pool`")


def _randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)), dtype=dtype)


def _conv_fn(x=None, conv_states=None, cache_indices=None) -> Callable[[], Any]:
    """vLLM's packed conv prefill of two sequences (20 and 30 tokens) on a pool, with the given changes."""
    x = _randn(C, 50) if x is None else x
    rows = torch.tensor([1, 3], dtype=torch.int32) if cache_indices is None else cache_indices
    return lambda: causal_conv1d_fn(x, _randn(C, W), _randn(C), conv_states, torch.tensor([0, 20, 50]), rows,
                                    torch.tensor([True, False]), "silu")  # fmt: skip


def _conv_update(conv_state, rows=None, x=None) -> Callable[[], Any]:
    """vLLM's conv decode of 3 requests × 2 tokens on a pool, with the given changes."""
    x = _randn(3, C, 2) if x is None else x
    rows = torch.tensor([2, -1, 4], dtype=torch.int32) if rows is None else rows
    return lambda: causal_conv1d_update(x, conv_state, _randn(C, W), _randn(C), "silu", rows)


def _nan_at(x: torch.Tensor, at: tuple[int, ...]) -> torch.Tensor:
    x = x.clone()
    x[at] = float("nan")
    return x


# case -> (the drop-in's name, the pool it must leave as it was, the call, the argument the message must name)
def _cases() -> dict[str, tuple[str, torch.Tensor, Callable[[], Any], str]]:
    fn_pool, fn_pool_bf16, upd_pool, short_pool = (_randn(P, C, W - 1), _randn(P, C, W - 1), _randn(P, C, W - 1),
                                                  _randn(P, C, W - 2))  # fmt: skip
    fla_state = _nan_at(_randn(2, C, W), (1, 0, 3))
    return {
        "fn: a row named twice": (
            "causal_conv1d_fn",
            fn_pool,
            _conv_fn(conv_states=fn_pool, cache_indices=torch.tensor([3, 3], dtype=torch.int32)),
            "cache_indices",
        ),
        "fn: a pool of another dtype": (
            "causal_conv1d_fn",
            fn_pool_bf16,
            _conv_fn(x=_randn(C, 50, dtype=torch.bfloat16), conv_states=fn_pool_bf16),
            "conv_states",
        ),
        "fn: a NaN input": (
            "causal_conv1d_fn",
            fn_pool,
            _conv_fn(x=_nan_at(_randn(C, 50), (5, 30)), conv_states=fn_pool),
            "x",
        ),
        "update: a row named twice": (
            "causal_conv1d_update",
            upd_pool,
            _conv_update(upd_pool, rows=torch.tensor([2, 2, 4], dtype=torch.int32)),
            "conv_state_indices",
        ),
        "update: a window shorter than the taps read": (
            "causal_conv1d_update",
            short_pool,
            _conv_update(short_pool),
            "conv_state",
        ),
        "FLA conv: a NaN in a cache": (
            "causal_conv1d",
            fla_state,
            lambda: causal_conv1d(
                _randn(1, 50, C),
                _randn(C, W),
                _randn(C),
                initial_state=fla_state,
                activation="silu",
                cu_seqlens=torch.tensor([0, 20, 50]),
            ),
            "initial_state",
        ),
    }


@pytest.mark.parametrize("case", list(_cases()))
def test_a_conv_rejection_names_the_drop_in_and_the_callers_argument(case: str) -> None:
    name, pool, call, argument = _cases()[case]
    before = pool.clone()
    with pytest.raises(ContractError) as info:
        call()
    message = str(info.value)
    assert message.startswith(f"gdn_nki.torch.{name} rejected the call"), message
    assert f"`{argument}`" in message, message
    assert not any(internal in message for internal in INTERNAL_NAMES), message
    assert torch.equal(pool.nan_to_num(7.0), before.nan_to_num(7.0))


# case -> (x, g, weight, options) of a bad rms_norm_gated call
NORM_ARGUMENTS = {
    "x in float16": lambda: (_randn(8, D).half(), _randn(8, D).half(), _randn(D), {}),
    "a gate of another shape": lambda: (_randn(8, D), _randn(8, D // 2), _randn(D), {}),
    "a weight of another size": lambda: (_randn(8, D), _randn(8, D), _randn(D // 2), {}),
    "prenorm, a gate of another shape": lambda: (_randn(8, D), _randn(8, D // 2), _randn(D), {"prenorm": True}),
}


def _norm_call(x: torch.Tensor, g: torch.Tensor, weight: torch.Tensor, options: dict[str, Any]) -> Any:
    return rms_norm_gated(x, g, weight, None, "silu", **options)


@pytest.mark.parametrize("case", [*NORM_ARGUMENTS, "the module, a NaN input"])
def test_a_norm_rejection_names_rms_norm_gated(case: str) -> None:
    with pytest.raises(ContractError) as info:
        if case in NORM_ARGUMENTS:
            _norm_call(*NORM_ARGUMENTS[case]())
        else:
            FusedRMSNormGated(D, eps=1e-6)(_nan_at(_randn(8, D), (2, 3)), _randn(8, D))
    message = str(info.value)
    assert message.startswith("gdn_nki.torch.rms_norm_gated rejected the call"), message
    assert not any(internal in message for internal in INTERNAL_NAMES), message


@pytest.mark.parametrize("case", list(NORM_ARGUMENTS))
def test_a_norm_rejection_compiled_fullgraph_is_eagers(case: str) -> None:
    """Compiled with ``fullgraph=True``, a bad call raises eager's ContractError (type and message), not dynamo's
    ``Unsupported`` / ``TorchRuntimeError``."""
    *tensors, options = NORM_ARGUMENTS[case]()
    with pytest.raises(ContractError) as eager:
        _norm_call(*tensors, options)
    torch._dynamo.reset()
    compiled_call = torch.compile(lambda x, g, weight: _norm_call(x, g, weight, options), fullgraph=True,
                                  backend="aot_eager")  # fmt: skip
    with pytest.raises(ContractError) as compiled:
        compiled_call(*tensors)
    assert str(compiled.value) == str(eager.value)


@pytest.mark.parametrize(("nan_in", "named"), [("residual", "`residual` value nan at index [2, 3]"),
                                               ("x", "`x` value nan at index [2, 3]"),
                                               ("both", "`x` value nan at index [2, 3]")])  # fmt: skip
def test_a_nan_in_the_residual_is_named_residual(nan_in: str, named: str) -> None:
    """The kernel normalizes x + residual; a NaN the caller put in ``residual`` is reported as ``residual``'s (with
    its own index), one in x as x's."""
    x, residual = _randn(8, D), _randn(8, D) * 3
    if nan_in in ("x", "both"):
        x = _nan_at(x, (2, 3))
    if nan_in in ("residual", "both"):
        residual = _nan_at(residual, (2, 3))
    with pytest.raises(ContractError) as info:
        rms_norm_gated(x, _randn(8, D), _randn(D), None, residual=residual)
    assert named in str(info.value), str(info.value)
