"""The conv and gated-norm ops' device path (``gdn_nki.torch.conv_device`` / ``norm_device``), the code that runs
on Trainium, tested as ``test_torch_device`` tests the recurrence's:

- on meta tensors with a recording stand-in for the kernel launch: what reaches the kernel — x token-major and
  contiguous, the bucket's static shapes (tokens rounded up to 128, one slot per sequence or the caller's N), int32
  row tables, the pool itself (not a copy) — and that no value is read on the host (a meta tensor has none); the
  ops' own bodies (the device branch of ``conv.py`` / ``norm.py``) route there; on ``GDN_TORCH_DEVICE`` the same on
  that device's tensors;
- on CPU tensors with the launch done by nki-cpu: the device path's padding and tables give the CPU path's bits,
  and the kernel writes the caller's pool (skipped on a device, where the kernel itself runs).

Skipped without torch."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'gdn-nki[torch]'; nox -s integration)")

from gdn_nki.common import backend  # noqa: E402
from gdn_nki.conv.prefill import gdn_conv_bucket  # noqa: E402
from gdn_nki.conv.step import gdn_conv_step  # noqa: E402
from gdn_nki.norm.kernel import gdn_gated_rms_norm  # noqa: E402
from gdn_nki.torch import conv, conv_device, norm, norm_device  # noqa: E402
from gdn_ref.contract import ContractError  # noqa: E402
from torch_device import launch_replaced, skip_on_device, test_device  # noqa: E402

RECORDED_ON = torch.device("meta") if test_device().type == "cpu" else test_device()
DEVICE = RECORDED_ON.type
INTERPRETED_ONLY = "nki-cpu interprets the launch on CPU tensors; on a device the kernel runs"
C, W, L, P = 32, 4, 3, 6  # channels, width, window, pool rows


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


def update_operands(seed: int = 0) -> dict[str, Any]:
    """``gdn_nki::causal_conv1d_update``'s operands: 3 requests × 2 tokens, token-major, a −1 row."""
    torch.manual_seed(seed)
    return dict(x=_randn(3, 2, C), conv_state=_randn(P, C, L), weight=_randn(C, W), bias=_randn(C),
                rows=torch.tensor([4, -1, 1], dtype=torch.int32), accepted=None, activation="silu")  # fmt: skip


def prefill_operands(tokens: int = 50, seed: int = 1) -> dict[str, Any]:
    """``gdn_nki::causal_conv1d_fn``'s operands: two packed sequences, the first from row 1's window, the second
    from an empty one, their final windows to rows 1 and 3."""
    torch.manual_seed(seed)
    return dict(x=_randn(tokens, C), conv_states=_randn(P, C, L), weight=_randn(C, W), bias=_randn(C),
                cu_seqlens=torch.tensor([0, 20, tokens], dtype=torch.int32),
                rows=torch.tensor([1, 3], dtype=torch.int32), read_rows=torch.tensor([1, -1], dtype=torch.int32),
                activation="silu")  # fmt: skip


def norm_operands(seed: int = 2) -> dict[str, Any]:
    torch.manual_seed(seed)
    return dict(x=_randn(5, 4, C), g=_randn(5, 4, C), weight=_randn(C), eps=1e-6, activation="silu")


def _on(args: dict[str, Any], where: torch.device) -> dict[str, Any]:
    return {name: x.to(where) if isinstance(x, torch.Tensor) else x for name, x in args.items()}


@contextlib.contextmanager
def recorded() -> Iterator[list[tuple[Any, tuple[Any, ...], dict[str, Any]]]]:
    """``device.launch`` replaced by a recorder returning empty outputs of each kernel's documented shapes."""
    calls: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []

    def launch(kernel: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append((kernel, args, kwargs))
        if kernel is gdn_gated_rms_norm:  # y, x's shape
            return torch.empty_like(args[0])
        return torch.empty_like(args[0]), args[1]  # conv: out like x, the pool

    with launch_replaced(launch):
        yield calls


@contextlib.contextmanager
def interpreted() -> Iterator[list[tuple[Any, tuple[Any, ...], dict[str, Any]]]]:
    """The launch as nki-cpu runs it on CPU torch tensors (numpy views: the pool is written in place), each launch
    recorded."""
    calls: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []

    def launch(kernel: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append((kernel, args, kwargs))
        return backend.simulate(kernel)(*args, **kwargs)

    with launch_replaced(launch):
        yield calls


def _layout(x: torch.Tensor) -> tuple[tuple[int, ...], torch.dtype, str]:
    return tuple(x.shape), x.dtype, x.device.type


# --- what reaches the kernel -----------------------------------------------------------------------------------------


def test_conv_update_op_on_a_device_hands_the_kernel_x_and_the_pool_itself() -> None:
    args = _on(update_operands(), RECORDED_ON)
    with recorded() as calls:
        out = conv.causal_conv1d_update_op._init_fn(**args)  # the op's body: its device branch
    [(kernel, launched, _)] = calls
    assert kernel is gdn_conv_step
    x, pool, weight, bias, rows, accepted, activation = launched
    assert x is args["x"] and pool is args["conv_state"], "the kernel must get x and the pool themselves"
    assert weight is args["weight"] and bias is args["bias"] and accepted is None and activation == "silu"
    assert _layout(rows) == ((3,), torch.int32, DEVICE)
    assert _layout(out) == ((3, 2, C), torch.float32, DEVICE)


@pytest.mark.parametrize(
    ("tokens", "bucket", "want"),
    [(50, None, (128, 2)), (128, None, (128, 2)), (50, (256, 4), (256, 4))],
    ids=["padded to 128", "a whole quantum as it is", "the caller's bucket"],
)
def test_conv_prefill_on_a_device_hands_the_kernel_the_bucket_and_the_pool_itself(
    tokens: int, bucket: tuple[int, int] | None, want: tuple[int, int]
) -> None:
    args = _on(prefill_operands(tokens), RECORDED_ON)
    with recorded() as calls:
        if bucket is None:
            out = conv.causal_conv1d_fn_op._init_fn(**args)  # the op's body: its device branch
        else:
            out = conv_device.causal_conv1d_fn(**args, bucket=bucket)
    [(kernel, launched, options)] = calls
    assert kernel is gdn_conv_bucket
    x, pool, weight, bias, bounds, rows, activation = launched
    total, slots = want
    assert _layout(x) == ((total, C), torch.float32, DEVICE) and x.is_contiguous()
    assert (x is args["x"]) == (total == tokens), "x is copied only to pad it to the bucket"
    assert pool is args["conv_states"], "the kernel must get the pool itself, not a copy"
    assert weight is args["weight"] and bias is args["bias"] and activation == "silu"
    assert _layout(bounds) == ((slots + 1,), torch.int32, DEVICE)
    assert _layout(rows) == ((slots,), torch.int32, DEVICE)
    assert set(options) == {"read_indices"} and _layout(options["read_indices"]) == ((slots,), torch.int32, DEVICE)
    assert _layout(out) == ((tokens, C), torch.float32, DEVICE)


def test_norm_op_on_a_device_hands_the_kernel_row_major_tensors() -> None:
    args = _on(norm_operands(), RECORDED_ON)
    args["x"] = args["x"].transpose(0, 1).contiguous().transpose(0, 1)  # the same shape, not row-major
    with recorded() as calls:
        y = norm.rms_norm_gated_op._init_fn(**args)  # the op's body: the device path
    [(kernel, launched, _)] = calls
    assert kernel is gdn_gated_rms_norm
    x, g, weight, eps, activation = launched
    assert x.is_contiguous() and _layout(x) == ((5, 4, C), torch.float32, DEVICE)
    assert g is args["g"] and weight is args["weight"], "row-major operands are handed over as they are"
    assert (eps, activation) == (1e-6, "silu") and _layout(y) == ((5, 4, C), torch.float32, DEVICE)


@pytest.mark.parametrize(
    ("call", "change", "named"),
    [
        (conv_device.causal_conv1d_update, {"weight": (C + 16, W)}, "`weight`"),
        (conv_device.causal_conv1d_fn, {"weight": (C, 7)}, "`weight`"),
        (conv_device.causal_conv1d_fn, {"conv_states": (P, C, W - 2)}, "`conv_pool`"),
        (norm_device.rms_norm_gated, {"g": (5, 4, C + 1)}, "`g`"),
    ],
    ids=["update: other channels", "prefill: width 7", "prefill: window too short", "norm: g of another shape"],
)
def test_the_device_paths_reject_a_bad_shape_before_any_launch(call: Any, change: dict, named: str) -> None:
    make = {conv_device.causal_conv1d_update: update_operands, conv_device.causal_conv1d_fn: prefill_operands,
            norm_device.rms_norm_gated: norm_operands}[call]  # fmt: skip
    args = _on({**make(), **{name: _randn(*shape) for name, shape in change.items()}}, RECORDED_ON)
    with recorded() as calls, pytest.raises(ContractError, match=named):
        call(**args)
    assert calls == []


# --- the device path on CPU tensors, its launch run by nki-cpu: the CPU path's bits ----------------------------------


def test_device_conv_update_gives_the_cpu_paths_bits_and_writes_the_callers_pool() -> None:
    skip_on_device(INTERPRETED_ONLY)
    want = update_operands()
    want_out = conv.causal_conv1d_update_op(**want)
    args = update_operands()
    with interpreted():
        out = conv_device.causal_conv1d_update(**args)
    assert torch.equal(out, want_out) and torch.equal(args["conv_state"], want["conv_state"])
    assert not torch.equal(args["conv_state"], update_operands()["conv_state"]), "the pool was not written"


def test_device_conv_update_with_per_token_rows_rolls_back_as_the_cpu_path() -> None:
    """[N, T] rows with ``num_accepted_tokens``: each request resumes from row ``rows[n, accepted[n] − 1]`` and
    keeps every token's window, on the device path exactly as on the CPU's."""
    skip_on_device(INTERPRETED_ONLY)

    def operands() -> dict[str, Any]:
        args = update_operands(seed=3)
        args["conv_state"] = _randn(8, C, L)
        args["rows"] = torch.tensor([[4, 5], [-1, -1], [1, 2]], dtype=torch.int32)
        args["accepted"] = torch.tensor([2, 1, 1], dtype=torch.int32)
        return args

    out = _device_update_as_the_cpu_path(operands)
    resumed_from_row_5 = conv.causal_conv1d_update_op(**{**operands(), "accepted": None})
    assert not torch.equal(out[0], resumed_from_row_5[0]), "request 0 did not resume from its accepted token"


def _device_update_as_the_cpu_path(operands: Any) -> torch.Tensor:
    """The device path's out on ``operands()`` (its launch run by nki-cpu): the CPU path's out and pool bit for bit,
    the counts [2, 1, 1] handed to the kernel."""
    want = operands()
    want_out = conv.causal_conv1d_update_op(**want)
    args = operands()
    with interpreted() as calls:
        out = conv_device.causal_conv1d_update(**args)
    assert torch.equal(out, want_out) and torch.equal(args["conv_state"], want["conv_state"])
    [(_, launched, _)] = calls
    assert launched[5].tolist() == [2, 1, 1], "the accepted counts did not reach the kernel"
    return out


def _in_row_operands(seed: int = 5) -> dict[str, Any]:
    """vLLM's in-row form: [N] rows, accepted counts 1..T = 2, rows of W − 2 + T inputs."""
    args = update_operands(seed=seed)
    args["conv_state"] = _randn(P, C, W - 2 + 2)
    args["accepted"] = torch.tensor([2, 1, 1], dtype=torch.int32)
    return args


def test_conv_update_op_on_a_device_hands_the_kernel_the_in_row_counts_unread() -> None:
    """The in-row form on a device: [N] rows and the [N] counts reach the kernel as int32 device tensors (on meta
    tensors: no value is read on the host), the pool itself."""
    args = _on(_in_row_operands(), RECORDED_ON)
    with recorded() as calls:
        conv.causal_conv1d_update_op._init_fn(**args)
    [(kernel, launched, _)] = calls
    assert kernel is gdn_conv_step and launched[1] is args["conv_state"]
    assert _layout(launched[4]) == ((3,), torch.int32, DEVICE) and _layout(launched[5]) == ((3,), torch.int32, DEVICE)


def test_device_conv_update_in_row_form_gives_the_cpu_paths_bits() -> None:
    """[N] rows with ``num_accepted_tokens`` (vLLM's in-row form): the device path reads each request's window at
    its count's offset in the row, exactly as the CPU path; a different count changes the output."""
    skip_on_device(INTERPRETED_ONLY)
    out = _device_update_as_the_cpu_path(_in_row_operands)
    from_offset_0 = conv.causal_conv1d_update_op(**{**_in_row_operands(), "accepted": torch.ones(3, dtype=torch.int32)})
    assert not torch.equal(out[0], from_offset_0[0]), "request 0 did not read its window at offset 1"


def test_device_conv_prefill_writes_the_checkpoint_rows_as_the_cpu_path() -> None:
    """``checkpoint_every`` / ``checkpoint_indices`` reach the kernel (padded to the bucket's slots) and the
    checkpoint rows get the CPU path's windows."""
    skip_on_device(INTERPRETED_ONLY)

    def operands() -> dict[str, Any]:
        args = prefill_operands(tokens=300)  # sequences of 20 and 280 tokens: checkpoints at 128 and 256 of the 2nd
        args["checkpoint_every"] = 128
        args["checkpoint_indices"] = torch.tensor([[-1, -1], [2, 4]], dtype=torch.int32)
        return args

    want = operands()
    want_out = conv.causal_conv1d_fn_op(**want)
    args = operands()
    with interpreted() as calls:
        out = conv_device.causal_conv1d_fn(**args, bucket=(384, 4))
    assert torch.equal(out, want_out) and torch.equal(args["conv_states"], want["conv_states"])
    [(_, _, options)] = calls
    assert options["checkpoint_every"] == 128
    assert options["checkpoint_indices"].tolist() == [[-1, -1], [2, 4]] + [[-1, -1]] * 2
    untouched = prefill_operands(tokens=300)["conv_states"]
    assert not torch.equal(args["conv_states"][[2, 4]], untouched[[2, 4]]), "no checkpoint stored"
    assert torch.equal(args["conv_states"][[0, 5]], untouched[[0, 5]]), "a row not named was written"


@pytest.mark.parametrize("bucket", [None, (256, 4)], ids=["bucket from shapes", "the caller's bucket"])
def test_device_conv_prefill_gives_the_cpu_paths_bits_and_writes_the_callers_pool(
    bucket: tuple[int, int] | None,
) -> None:
    skip_on_device(INTERPRETED_ONLY)
    want = prefill_operands()
    want_out = conv.causal_conv1d_fn_op(**want)
    args = prefill_operands()
    with interpreted() as calls:
        out = conv_device.causal_conv1d_fn(**args, bucket=bucket)
    assert torch.equal(out, want_out) and torch.equal(args["conv_states"], want["conv_states"])
    [(_, launched, options)] = calls
    slots = 2 if bucket is None else bucket[1]  # empty slots repeat the last bound and name no row
    assert launched[4].tolist() == [0, 20, 50] + [50] * (slots - 2)
    assert launched[5].tolist() == [1, 3] + [-1] * (slots - 2)
    assert options["read_indices"].tolist() == [1, -1] + [-1] * (slots - 2)
    untouched = prefill_operands()["conv_states"]
    assert not torch.equal(args["conv_states"][[1, 3]], untouched[[1, 3]]), "the final windows were not stored"
    assert torch.equal(args["conv_states"][[0, 2, 4, 5]], untouched[[0, 2, 4, 5]]), "a row not named was written"


def test_device_norm_gives_the_cpu_paths_bits() -> None:
    skip_on_device(INTERPRETED_ONLY)
    args = norm_operands()
    want = norm.rms_norm_gated_op(**args)
    with interpreted():
        got = norm_device.rms_norm_gated(**args)
    assert torch.equal(got, want)


# --- check_values: the value rules the conv and norm device paths trust, on demand ----------------------------------


def _vllm_update_call() -> dict[str, Any]:
    """vLLM's ``causal_conv1d_update`` call of ``update_operands``' tensors (x channel-major [N, C, T])."""
    args = update_operands()
    return dict(x=args["x"].transpose(1, 2), conv_state=args["conv_state"], weight=args["weight"], bias=args["bias"],
                activation="silu", conv_state_indices=args["rows"])  # fmt: skip


def test_check_values_of_the_conv_update_raises_the_cpus_error_and_neither_launches_nor_writes() -> None:
    from gdn_nki.torch import causal_conv1d_update, check_values
    from gdn_nki.traces import recording_launches

    args = _vllm_update_call()
    args["x"][2, 5, 1] = float("inf")
    with pytest.raises(ContractError) as on_cpu:
        causal_conv1d_update(**_vllm_update_call() | {"x": args["x"].clone()})
    args = _on(args, test_device())
    pool = args["conv_state"].cpu()
    with recording_launches() as launches, pytest.raises(ContractError) as checked:
        check_values(causal_conv1d_update, **args)
    assert str(checked.value) == str(on_cpu.value) and "`x`" in str(checked.value)
    assert launches == [] and torch.equal(args["conv_state"].cpu(), pool)


def test_check_values_passes_a_valid_conv_call_and_catches_a_repeated_row() -> None:
    from gdn_nki.torch import causal_conv1d_fn, check_values
    from gdn_nki.traces import recording_launches

    torch.manual_seed(3)
    args = dict(x=_randn(C, 50), weight=_randn(C, W), bias=_randn(C), conv_states=_randn(P, C, L),
                query_start_loc=torch.tensor([0, 20, 50], dtype=torch.int32),
                cache_indices=torch.tensor([1, 3], dtype=torch.int32), has_initial_state=torch.tensor([True, False]))  # fmt: skip
    args = _on(args, test_device())
    pool = args["conv_states"].cpu()
    with recording_launches() as launches:
        assert check_values(causal_conv1d_fn, **args) is None
    assert launches == [] and torch.equal(args["conv_states"].cpu(), pool)
    args["cache_indices"] = torch.tensor([3, 3], dtype=torch.int32, device=args["x"].device)
    with pytest.raises(ContractError, match="`cache_indices`"):
        check_values("causal_conv1d_fn", **args)


def test_check_values_of_the_gated_norm_finds_a_nan_gate() -> None:
    from gdn_nki.torch import check_values, rms_norm_gated

    args = _on(norm_operands(), test_device())
    args = dict(x=args["x"], g=args["g"], weight=args["weight"], bias=None, eps=1e-6)
    assert check_values(rms_norm_gated, **args) is None
    args["g"][0, 1, 2] = float("nan")
    with pytest.raises(ContractError, match="`g`"):
        check_values("rms_norm_gated", **args)


# --- the drop-ins whole: under fake tensors here, on GDN_TORCH_DEVICE against the CPU path under nox -s neuron -------

DROP_IN_CALLS = ("vLLM conv update", "vLLM conv prefill", "FLA conv", "FLA gated norm")
POOLS = {"vLLM conv update": "conv_state", "vLLM conv prefill": "conv_states"}  # the pool each call updates in place


def _drop_in(name: str) -> tuple[Any, Any]:
    from test_torch_traced_rejections import ALL_CALLS

    return ALL_CALLS[name]


def _items(result: Any) -> tuple[Any, ...]:
    return result if isinstance(result, tuple) else (result,)


@pytest.mark.parametrize("name", DROP_IN_CALLS)
def test_the_whole_conv_or_norm_drop_in_runs_under_fake_tensors_without_touching_data(name: str) -> None:
    """A fake tensor has no data (any read of a value raises): the drop-in's argument handling, layout and op give
    the CPU run's shapes and dtypes."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    drop_in, make = _drop_in(name)
    want = [None if x is None else (tuple(x.shape), x.dtype) for x in _items(drop_in(**make()))]
    mode = FakeTensorMode()
    args = {key: mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for key, x in make().items()}
    with mode:
        got = _items(drop_in(**args))
    assert [None if x is None else (tuple(x.shape), x.dtype) for x in got] == want
    assert all(x is None or isinstance(x, FakeTensor) for x in got)


@pytest.mark.parametrize("name", DROP_IN_CALLS)
def test_each_conv_or_norm_drop_in_on_the_test_device_matches_the_cpu_path(name: str) -> None:
    """On GDN_TORCH_DEVICE (the XLA device under nox -s neuron) each drop-in gives the CPU path's results and pool
    rows, to the fp32 kernel's rounding. Skipped on the CPU, where there is no second path to compare."""
    where = test_device()
    if where.type == "cpu":
        pytest.skip("GDN_TORCH_DEVICE is the CPU: the device path is compared only on a device (nox -s neuron)")
    drop_in, make = _drop_in(name)
    want_args, args = make(), _on(make(), where)
    want, got = _items(drop_in(**want_args)), _items(drop_in(**args))
    pairs = list(zip(want, got, strict=True))
    if name in POOLS:
        pairs.append((want_args[POOLS[name]], args[POOLS[name]]))
    for w, g in pairs:
        assert (w is None) == (g is None)
        if w is not None:
            assert g.device.type == where.type
            torch.testing.assert_close(g.cpu(), w, rtol=1e-4, atol=1e-4)
