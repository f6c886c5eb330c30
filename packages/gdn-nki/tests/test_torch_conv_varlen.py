"""vLLM's varlen ``causal_conv1d_update`` (``query_start_loc`` with ``num_accepted_tokens``, as vLLM's GDN layer
calls it in speculative decoding) on gdn-nki: against gdn-ref's fp64 varlen oracle, its rejections, its device path
(no value read on the host, the CPU path's bits), torch.compile and fake tensors. Skipped without torch."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'gdn-nki[torch]'; nox -s integration)")

from gdn_nki.common import backend  # noqa: E402
from gdn_nki.conv.step import gdn_conv_step  # noqa: E402
from gdn_nki.torch import conv, conv_device  # noqa: E402
from gdn_nki.torch.conv import causal_conv1d_update  # noqa: E402
from gdn_ref.contract import ContractError  # noqa: E402
from gdn_ref.conv import causal_conv1d_update_varlen  # noqa: E402
from gdn_spec.metrics import compare, describe  # noqa: E402
from torch_device import launch_replaced, skip_on_device, test_device  # noqa: E402

C, W, T, P, PAD = 32, 4, 4, 16, 99  # channels, width, max_query_len, pool rows, vLLM's pad_slot_id here
# 10 requests (two groups of the kernel's 8): one token, max_query_len, none, a padding row, and between
LENGTHS = [1, T, 2, 0, T, 3, 1, T, 2, T]
ROWS = [3, 7, 0, PAD, 12, 5, PAD, 9, 14, 1]
ACCEPTED = [1, 2, 3, 4, 4, 1, 2, 3, 1, 2]  # every rollback offset


def operands(dtype: torch.dtype, seed: int = 0, lengths: list[int] = LENGTHS) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    bounds = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]).tolist(), dtype=torch.int32)
    return dict(x=torch.randn(sum(lengths), C, generator=g).to(dtype),
                conv_state=torch.randn(P, C, W - 2 + T, generator=g).to(dtype),
                weight=(torch.randn(C, W, generator=g) * 0.5).to(dtype), bias=torch.randn(C, generator=g).to(dtype),
                conv_state_indices=torch.tensor(ROWS[: len(lengths)], dtype=torch.int32),
                num_accepted_tokens=torch.tensor(ACCEPTED[: len(lengths)], dtype=torch.int32),
                query_start_loc=bounds)  # fmt: skip


def call(args: dict[str, Any], **change: Any) -> torch.Tensor:
    """vLLM's call: ``causal_conv1d_update(x, conv_state, weight, bias, activation, conv_state_indices=...,
    num_accepted_tokens=..., query_start_loc=..., max_query_len=...)``."""
    kwargs = {**args, "activation": "silu", "max_query_len": T, "pad_slot_id": PAD, **change}
    return causal_conv1d_update(**kwargs)


def oracle(args: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    rows = args["conv_state_indices"].numpy().copy()
    rows[rows == PAD] = -1
    return causal_conv1d_update_varlen(args["x"].float().numpy(), args["weight"].float().numpy(),
                                       args["bias"].float().numpy(), args["conv_state"].float().numpy(),
                                       args["query_start_loc"].numpy(), rows, args["num_accepted_tokens"].numpy(), T,
                                       "silu")  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_varlen_matches_the_oracle_and_leaves_other_rows(dtype: torch.dtype) -> None:
    """Mixed lengths (1 token, max_query_len, none), pad_slot_id rows, every num_accepted_tokens offset, two groups
    of requests: out within the tolerance table of the fp64 oracle, the pool equal to the oracle's bit for bit (a
    window holds inputs), rows not named and padding requests' rows untouched, padding tokens' outputs zero."""
    args = operands(dtype)
    before = args["conv_state"].clone()
    out = call(args)
    want, after = oracle({**args, "conv_state": before})
    assert out.shape == args["x"].shape and out.dtype == dtype
    error = compare("out", out.float().numpy(), want, str(dtype).removeprefix("torch."))
    assert error.ok, describe([error])
    np.testing.assert_array_equal(args["conv_state"].float().numpy(), after.astype(np.float32))
    named = {r for r in ROWS if r != PAD}
    others = [r for r in range(P) if r not in named or r == ROWS[3]]  # ROWS[3]: no tokens, nothing written
    assert torch.equal(args["conv_state"][others], before[others])
    padding = np.repeat(np.array(ROWS) == PAD, LENGTHS)
    assert not out[torch.from_numpy(padding)].any()


def test_varlen_with_every_request_full_is_the_n_c_t_form() -> None:
    """Every request at max_query_len tokens: the varlen call gives the [N, C, T] in-row call's outputs and pool
    bit for bit (both run the in-row kernel)."""
    lengths = [T] * 6
    args = operands(torch.bfloat16, seed=4, lengths=lengths)
    pool = args["conv_state"].clone()
    out = call(args)
    x = args["x"].reshape(6, T, C).transpose(1, 2)
    ref = causal_conv1d_update(x, pool, args["weight"], args["bias"], "silu", args["conv_state_indices"],
                               args["num_accepted_tokens"], pad_slot_id=PAD)  # fmt: skip
    assert torch.equal(out, ref.transpose(1, 2).reshape(6 * T, C)) and torch.equal(args["conv_state"], pool)


def _bounds(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


TOTAL = sum(LENGTHS)
GOOD_BOUNDS = [0, 1, 5, 7, 7, 11, 14, 15, 19, 21, TOTAL]
BAD = {
    "decreasing": ({"query_start_loc": _bounds([0, 1, 5, 4, *GOOD_BOUNDS[4:]])}, "query_start_loc"),
    "wrong length": ({"query_start_loc": _bounds([0, 1, 5, 7, TOTAL])}, "query_start_loc"),
    "last is not the tokens": ({"query_start_loc": _bounds([*GOOD_BOUNDS[:-1], TOTAL - 1])}, "query_start_loc"),
    "not from 0": ({"query_start_loc": _bounds([1, *GOOD_BOUNDS[1:]])}, "query_start_loc"),
    "a request past max_query_len": ({"query_start_loc": _bounds([0, 1, 6, *GOOD_BOUNDS[3:]])}, "query_start_loc"),
    "max_query_len left at -1": ({"max_query_len": -1}, "max_query_len"),
    "without num_accepted_tokens": ({"num_accepted_tokens": None}, "query_start_loc"),
    "without conv_state_indices": ({"conv_state_indices": None}, "conv_state_indices"),
    "x [N, C, T]": ({"x": torch.randn(2, C, T)}, "x"),
    "accepted past max_query_len": (
        {"num_accepted_tokens": _bounds([1, 2, 3, 4, T + 1, 1, 2, 3, 1, 2])},
        "num_accepted_tokens",
    ),
    "row out of range": ({"conv_state_indices": _bounds([*ROWS[:-1], P])}, "conv_state_indices"),
}


@pytest.mark.parametrize(("change", "named"), BAD.values(), ids=BAD.keys())
def test_bad_calls_are_refused_by_name_with_nothing_written(change: dict[str, Any], named: str) -> None:
    args = operands(torch.float32, seed=2)
    before = args["conv_state"].clone()
    with pytest.raises(ContractError, match=rf"`{named}`"):
        call(args, **change)
    assert torch.equal(args["conv_state"], before)


@pytest.mark.parametrize("extra", [1, 3])
def test_a_row_longer_than_the_window_span_is_vllms_update(extra: int) -> None:
    """Rows of more than W − 2 + max_query_len entries: vLLM's kernel writes each request's first W − 2 + len and
    leaves the rest; so does gdn-nki (out and pool as the oracle's, bit for bit, every row's tail as it was)."""
    args = operands(torch.bfloat16, seed=3)
    args["conv_state"] = torch.randn(P, C, W - 2 + T + extra).to(torch.bfloat16)
    before = args["conv_state"].clone()
    out = call(args)
    want, after = oracle({**args, "conv_state": before})
    error = compare("out", out.float().numpy(), want, "bfloat16")
    assert error.ok, describe([error])
    np.testing.assert_array_equal(args["conv_state"].float().numpy(), after.astype(np.float32))
    assert torch.equal(args["conv_state"][:, :, W - 2 + T :], before[:, :, W - 2 + T :])


def test_a_row_shorter_than_the_window_span_is_refused() -> None:
    """Rows of fewer than W − 2 + max_query_len entries cannot hold the window at offset max_query_len − 1: refused
    naming conv_state, nothing written."""
    args = operands(torch.float32, seed=3)
    args["conv_state"] = torch.randn(P, C, W - 3 + T)
    before = args["conv_state"].clone()
    with pytest.raises(ContractError, match=r"`conv_state` L=5"):
        call(args)
    assert torch.equal(args["conv_state"], before)


def test_compile_fullgraph_bit_equal_to_eager_and_fake_tensors_give_the_shape() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    args = operands(torch.bfloat16, seed=5)
    eager_args = {**args, "conv_state": args["conv_state"].clone()}
    eager = call(eager_args)
    torch._dynamo.reset()
    compiled = torch.compile(call, fullgraph=True, backend="aot_eager")
    got = compiled(args)
    assert torch.equal(got, eager) and torch.equal(args["conv_state"], eager_args["conv_state"])
    with FakeTensorMode():
        fake = operands(torch.bfloat16, seed=5)
        assert call(fake).shape == (TOTAL, C)
        with pytest.raises(ContractError, match="`conv_state`"):
            call({**fake, "conv_state": torch.zeros(P, C, W - 3 + T, dtype=torch.bfloat16)})  # rows too short


def _op_args(args: dict[str, Any]) -> dict[str, Any]:
    rows = args["conv_state_indices"].clone()
    rows[rows == PAD] = -1
    return dict(x=args["x"], conv_state=args["conv_state"], weight=args["weight"], bias=args["bias"],
                query_start_loc=args["query_start_loc"], rows=rows, accepted=args["num_accepted_tokens"],
                max_query_len=T, activation="silu")  # fmt: skip


def test_device_path_reads_nothing_on_the_host_and_hands_the_kernel_the_pool() -> None:
    """On meta tensors (no values to read; or ``GDN_TORCH_DEVICE``'s): one launch of the in-row kernel on x laid out
    as [N, max_query_len, C], int32 rows and counts, the pool itself; out [tokens, C]."""
    where = torch.device("meta") if test_device().type == "cpu" else test_device()
    args = {k: v.to(where) if isinstance(v, torch.Tensor) else v for k, v in _op_args(operands(torch.float32)).items()}
    calls = []

    def launch(kernel: Any, *launched: Any, **options: Any) -> Any:
        calls.append((kernel, launched))
        return torch.empty_like(launched[0]), launched[1]

    with launch_replaced(launch):
        out = conv.causal_conv1d_update_varlen_op._init_fn(**args)  # the op's body: its device branch
    [(kernel, (x, pool, _, _, rows, accepted, activation))] = calls
    assert kernel is gdn_conv_step and pool is args["conv_state"] and activation == "silu"
    assert tuple(x.shape) == (len(LENGTHS), T, C) and x.is_contiguous()
    assert (rows.dtype, accepted.dtype, tuple(rows.shape)) == (torch.int32, torch.int32, (len(LENGTHS),))
    assert tuple(out.shape) == (TOTAL, C) and out.device.type == where.type


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_device_path_gives_the_cpu_paths_bits(dtype: torch.dtype) -> None:
    """The device path's on-device layout (gathers indexed by query_start_loc) with the launch run by nki-cpu: the
    CPU path's outputs and pool, bit for bit."""
    skip_on_device("nki-cpu interprets the launch on CPU tensors; on a device the kernel runs")
    want = _op_args(operands(dtype, seed=6))
    want_out = conv.causal_conv1d_update_varlen_op(**want)
    args = _op_args(operands(dtype, seed=6))
    with launch_replaced(lambda kernel, *a, **k: backend.simulate(kernel)(*a, **k)):
        out = conv_device.causal_conv1d_update_varlen(**args)
    assert torch.equal(out, want_out) and torch.equal(args["conv_state"], want["conv_state"])


def test_rows_not_named_are_never_read_and_pass_gdn_specs_varlen_check() -> None:
    """Every row the call does not name NaN-poisoned (row 0 among them: a padding request's −1 must not be read as a
    row, whose NaN the kernel's 0/1 matmuls would spread to the other requests of its group): the outputs and pool
    as the oracle's; and gdn-spec's conv-family ``varlen`` check (the third-party yardstick) through its vLLM
    adapter."""
    from gdn_spec.conv.adapters import vllm_update
    from gdn_spec.conv.checks import ConvCapabilities, check_varlen

    args = operands(torch.float32, seed=7)
    rows = torch.tensor([r if r != 0 else 2 for r in ROWS], dtype=torch.int32)
    args["conv_state_indices"] = rows
    unnamed = [r for r in range(P) if r not in set(rows.tolist())]
    args["conv_state"][unnamed] = float("nan")
    before = args["conv_state"].clone()
    out = call(args)
    want, after = oracle({**args, "conv_state": before})
    assert torch.isfinite(out).all()
    error = compare("out", out.numpy(), want, "float32")
    assert error.ok, describe([error])
    assert args["conv_state"].numpy().tobytes() == after.astype(np.float32).tobytes()
    check_varlen(vllm_update(causal_conv1d_update), ConvCapabilities(varlen=True, rejections=True), seed=0)
