"""The ops' device path (``gdn_nki.torch.device``), the code that runs on Trainium, tested here two ways:

- on meta tensors with a recording stand-in for the kernel launch: what reaches the kernel — the tensors in its
  documented layout, the bucket's static shapes, int32 index tables, the pool itself (not a copy) — and that no
  value is read on the host (a meta tensor has none); on ``GDN_TORCH_DEVICE`` (``nox -s neuron``: the XLA device)
  the same on that device's tensors;
- on CPU tensors with the launch done by nki-cpu: the device path's packing, padding, index tables and unpacking
  give the CPU path's bits, and the kernel writes the caller's pool (skipped on a device, where the kernel itself
  runs: ``test_torch_ops`` compares each drop-in there with the CPU path).

And ``check_values``, the value rules the device path trusts, run on demand (on the device's tensors under
``GDN_TORCH_DEVICE``). Skipped without torch."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'gdn-nki[torch]'; nox -s integration)")

import gdn_nki.torch  # noqa: E402
from gdn_nki.common import backend  # noqa: E402
from gdn_nki.cte.bucket import gdn_cte_bucket  # noqa: E402
from gdn_nki.tkg.fused import gdn_tkg as gdn_tkg_kernel  # noqa: E402
from gdn_nki.tkg.step import gdn_step  # noqa: E402
from gdn_nki.torch import device  # noqa: E402
from gdn_nki.traces import recording_launches  # noqa: E402
from gdn_ref.contract import ContractError  # noqa: E402
from test_torch_ops import HK, HV, K, V, fla_decode_call, prefill_call, prefill_pool_call, tkg_call, verify_call  # noqa: E402
from torch_device import launch_replaced, on_device, skip_on_device, test_device  # noqa: E402

# Where the recorded launches get their tensors: meta tensors on the CPU (no data at all), else the test device's.
RECORDED_ON = torch.device("meta") if test_device().type == "cpu" else test_device()
DEVICE = RECORDED_ON.type
INTERPRETED_ONLY = "nki-cpu interprets the launch on CPU tensors; on a device the kernel runs (test_torch_ops)"


@contextlib.contextmanager
def recorded() -> Iterator[list[tuple[Any, tuple[Any, ...], dict[str, Any]]]]:
    """``device.launch`` replaced by a recorder returning empty outputs of each kernel's documented shapes."""
    calls: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []

    def launch(kernel: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append((kernel, args, kwargs))
        query, value = args[0], args[2]
        if kernel is gdn_cte_bucket:  # out [1, Hv, T, Dv], the pool
            return query.new_empty((1, value.shape[1], query.shape[2], value.shape[3])), args[7]
        if kernel is gdn_step:  # out [N, T, Hv, Dv], the pool
            return query.new_empty((*value.shape[:3], value.shape[3])), args[3]
        return query.new_empty((query.shape[0], value.shape[1])), args[9].new_empty(args[9].shape)

    with launch_replaced(launch):
        yield calls


def _recorded(args: dict[str, Any]) -> dict[str, Any]:
    return on_device(args, RECORDED_ON)


def _layout(x: torch.Tensor) -> tuple[tuple[int, ...], torch.dtype, str]:
    return tuple(x.shape), x.dtype, x.device.type


def test_prefill_on_a_pool_hands_the_kernel_the_bucket_layout_and_the_pool_itself() -> None:
    args = _recorded(prefill_pool_call())
    with recorded() as calls:
        o = device.chunk_pool(
            args["q"], args["k"], args["v"], args["g"], args["beta"], args["initial_state"], args["state_indices"],
            None, None, args["cu_seqlens"], args["checkpoint_indices"], args["read_indices"], None, False, False,
            False, "schur", 8, [256, 4], 128,
        )  # fmt: skip
    [(kernel, launched, options)] = calls
    assert kernel is gdn_cte_bucket
    q, k, v, g, beta, chunk_bounds, slots, pool = launched
    bucket = 256  # every token tensor head-major [1, H, T_bucket, D], contiguous (the kernel's HBM layout)
    assert [_layout(x) for x in (q, k, v, g, beta)] == [
        ((1, HK, bucket, K), torch.float32, DEVICE), ((1, HK, bucket, K), torch.float32, DEVICE),
        ((1, HV, bucket, V), torch.float32, DEVICE), ((1, HV, bucket), torch.float32, DEVICE),
        ((1, HV, bucket), torch.float32, DEVICE),
    ]  # fmt: skip
    assert all(x.is_contiguous() for x in (q, k, v, g, beta))
    slots_n = 4  # the bucket's N: tables padded to it
    assert _layout(chunk_bounds) == ((slots_n + 1,), torch.int32, DEVICE)
    assert _layout(slots) == ((slots_n,), torch.int32, DEVICE)
    assert pool is args["initial_state"], "the kernel must get the pool itself, not a copy"
    assert _layout(options["checkpoint_indices"]) == ((slots_n, 1), torch.int32, DEVICE)
    assert _layout(options["read_indices"]) == ((slots_n,), torch.int32, DEVICE)
    assert options["checkpoint_every"] == 128 and options["algorithm"] == "schur" and options["group_size"] == 8
    assert options["scale"] == K**-0.5 and _layout(options["mask_pack"])[2] == DEVICE
    assert _layout(o) == ((1, 127, HV, V), torch.float32, DEVICE)


def test_prefill_without_a_bucket_takes_its_worst_case_from_shapes() -> None:
    args = _recorded(prefill_call())  # 2 rows of 40 tokens: 2 sequences, at most 2 chunks of 128 once padded
    with recorded() as calls:
        o, final = device.chunk(args["q"], args["k"], args["v"], args["g"], args["beta"], args["initial_state"], None,
                                None, None, None, True, False, False, "schur", 8, None)  # fmt: skip
    [(_, launched, options)] = calls
    assert launched[0].shape[2] == 256 and launched[5].shape == (3,) and "read_indices" not in options
    assert launched[7] is final and final is not args["initial_state"]  # FLA's initial_state is only read
    assert _layout(o) == ((2, 40, HV, V), torch.float32, DEVICE)


def test_decode_hands_the_kernel_views_of_the_callers_rows_and_the_pool_itself() -> None:
    args = _recorded(verify_call())
    with recorded() as calls:
        o = device.vllm_fused_recurrent(
            args["q"], args["k"], args["v"], args["g"], args["beta"], args["initial_state"], args["ssm_state_indices"],
            args["cu_seqlens"], args["num_accepted_tokens"], None, True,
        )  # fmt: skip
    [(kernel, launched, options)] = calls
    assert kernel is gdn_step
    q, k, v, pool, rows, accepted = launched
    assert [tuple(x.shape) for x in (q, k, v)] == [(3, 2, HK, K), (3, 2, HK, K), (3, 2, HV, V)]
    # [N, T, H, D] is a view of the packed seq-first row: no copy in HBM
    assert q._base is args["q"] and v._base is args["v"]
    assert pool is args["initial_state"]
    assert _layout(rows) == ((3, 2), torch.int32, DEVICE) and _layout(accepted) == ((3,), torch.int32, DEVICE)
    assert _layout(options["g_log"]) == ((3, 2, HV), torch.float32, DEVICE) and options["use_qk_l2norm"] is True
    assert _layout(o) == ((1, 6, HV, V), torch.float32, DEVICE)


def test_gdn_tkg_hands_the_kernel_its_arguments_as_they_are() -> None:
    args = _recorded(tkg_call())
    with recorded() as calls:
        out, state = device.gdn_tkg(**args)
    [(kernel, launched, _)] = calls
    assert kernel is gdn_tkg_kernel and all(a is b for a, b in zip(launched, args.values(), strict=True))
    assert _layout(out) == ((2 * HV, V), torch.float32, DEVICE) and tuple(state.shape) == (2 * HV, K, V)


def test_the_device_path_rejects_a_bad_shape_before_any_launch() -> None:
    args = _recorded(prefill_pool_call())
    with recorded() as calls, pytest.raises(ContractError, match="`bucket`"):
        device.chunk_pool(args["q"], args["k"], args["v"], args["g"], args["beta"], args["initial_state"],
                          args["state_indices"], None, None, args["cu_seqlens"], None, None, None, False, False, False,
                          "schur", 8, [200, 4], None)  # fmt: skip
    assert calls == []


# --- the device path on CPU tensors, its launch run by nki-cpu: the CPU path's bits ---------------------------------


def _interpreted(kernel: Any, *args: Any, **kwargs: Any) -> Any:
    """The launch as nki-cpu runs it on CPU torch tensors (numpy views: the pool is written in place)."""
    return backend.simulate(kernel)(*args, **kwargs)


@contextlib.contextmanager
def interpreted() -> Iterator[None]:
    with launch_replaced(_interpreted):
        yield


def test_device_prefill_on_a_pool_gives_the_cpu_paths_bits() -> None:
    skip_on_device(INTERPRETED_ONLY)
    want_args = prefill_pool_call()
    want_o, want_pool = gdn_nki.torch.chunk_gated_delta_rule(**want_args)
    args = prefill_pool_call()
    pool = args["initial_state"]
    with interpreted():
        o = device.chunk_pool(
            args["q"], args["k"], args["v"], args["g"], args["beta"], pool, args["state_indices"], None, None,
            args["cu_seqlens"], args["checkpoint_indices"], args["read_indices"], None, False, False, False, "schur",
            8, [256, 4], 128,
        )  # fmt: skip
    assert torch.equal(o, want_o) and torch.equal(pool, want_pool)


def test_device_prefill_of_batch_rows_gives_the_cpu_paths_bits() -> None:
    skip_on_device(INTERPRETED_ONLY)
    args = prefill_call()
    want_o, want_final = gdn_nki.torch.chunk_gated_delta_rule(**args)
    with interpreted():
        o, final = device.chunk(args["q"], args["k"], args["v"], args["g"], args["beta"], args["initial_state"],
                                None, None, None, None, True, False, False, "schur", 8, None)  # fmt: skip
    assert torch.equal(o, want_o) and torch.equal(final, want_final)


@pytest.mark.parametrize("make", [verify_call, fla_decode_call])
def test_device_decode_gives_the_cpu_paths_bits(make: Any) -> None:
    skip_on_device(INTERPRETED_ONLY)
    want_args = make()
    args = make()
    if make is verify_call:
        want_o, want_pool = gdn_nki.torch.vllm_fused_recurrent_gated_delta_rule(**want_args)
        with interpreted():
            o = device.vllm_fused_recurrent(args["q"], args["k"], args["v"], args["g"], args["beta"],
                                            args["initial_state"], args["ssm_state_indices"], args["cu_seqlens"],
                                            args["num_accepted_tokens"], None, True)  # fmt: skip
        got_pool = args["initial_state"]
    else:
        want_o, want_pool = gdn_nki.torch.fused_recurrent_gated_delta_rule(**want_args)
        with interpreted():
            o, got_pool = device.fused_recurrent(args["q"], args["k"], args["v"], args["g"], args["beta"],
                                                 args["initial_state"], None, None, True)  # fmt: skip
    assert torch.equal(o, want_o) and torch.equal(got_pool, want_pool)


# --- check_values: the value rules the device path trusts, on demand --------------------------------------------


def test_check_values_raises_the_cpus_error_and_neither_launches_nor_writes() -> None:
    args = prefill_pool_call()
    args["q"][0, 3, 1, 0] = float("nan")
    with pytest.raises(ContractError) as on_cpu:
        gdn_nki.torch.chunk_gated_delta_rule(**args)
    args = on_device(args, test_device())
    pool = args["initial_state"].cpu()
    with recording_launches() as launches, pytest.raises(ContractError) as checked:
        gdn_nki.torch.check_values(gdn_nki.torch.chunk_gated_delta_rule, **args)
    assert str(checked.value) == str(on_cpu.value) and "`q`" in str(checked.value)
    assert launches == [] and torch.equal(args["initial_state"].cpu(), pool)


def test_check_values_passes_a_valid_call_without_a_launch_and_catches_duplicate_rows() -> None:
    args = on_device(verify_call(), test_device())
    pool = args["initial_state"].cpu()
    with recording_launches() as launches:
        assert gdn_nki.torch.check_values("vllm_fused_recurrent_gated_delta_rule", **args) is None
    assert launches == [] and torch.equal(args["initial_state"].cpu(), pool)
    args["ssm_state_indices"][2, 0] = 4  # row 4 is also request 0's
    with pytest.raises(ContractError, match=r"state_indices"):
        gdn_nki.torch.check_values(gdn_nki.torch.vllm_fused_recurrent_gated_delta_rule, **args)


def test_check_values_of_gdn_tkg_reads_its_keywords() -> None:
    args = on_device(tkg_call(), test_device())
    assert gdn_nki.torch.check_values(gdn_nki.torch.gdn_tkg, **args) is None
    args["a"][1] = float("inf")
    with pytest.raises(ContractError, match="`a`"):
        gdn_nki.torch.check_values("gdn_tkg", **args)
