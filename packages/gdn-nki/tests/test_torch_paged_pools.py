"""Every pool drop-in on a pool that is a row-strided view, as vLLM's hybrid cache builds it.

vLLM gives a GDN layer one page per block and views the page as its conv state then its recurrent state
(vllm-project/vllm 00b08dc4, ``vllm/model_executor/layers/mamba/abstract.py``, ``MambaBase.bind_kv_cache``: the
page as the row stride, each state's own dense inner strides, a storage offset of the states before it).
``vllm_pages`` builds that layout. The decode drop-ins (vLLM's ``fused_recurrent_gated_delta_rule`` and
``fused_sigmoid_gating_delta_rule_update``, SGLang's), the conv drop-ins (``causal_conv1d_update`` in its decode,
[N, T], in-row and varlen forms; ``causal_conv1d_fn``) and the chunk prefill on a pool each run on the view and on a
contiguous copy of it: the outputs and the pool rows are bit for bit the contiguous call's, and every other byte of
the buffer (the other pool's rows, the padding, the rows not named) is as it was. The kernels get the view's span
and row stride, not a copy (``common.pool_rows``): the device paths' launches are recorded and run by nki-cpu, and
``torch.compile`` captures a call on the view with no graph break. vLLM's default conv layout, not a row of dense
[C, L], is refused by name.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'gdn-nki[torch]'; nox -s integration)")

import gdn_nki.torch  # noqa: E402
from gdn_nki.common import backend  # noqa: E402
from gdn_nki.torch import conv_device, device  # noqa: E402
from gdn_ref.contract import ContractError  # noqa: E402
from test_torch_ops import HV, K, V, prefill_pool_call  # noqa: E402
from torch_device import compile_backend, launch_replaced, skip_on_device  # noqa: E402

P, CONV_ROW, PAD = 7, (32, 3), 5  # pool rows; a conv state's row [C, W - 1]; a page's padding past its states


def _dense(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))


def vllm_pages(ssm_row: tuple[int, ...], seed: int, rows: int = P) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the layer's buffer, its conv pool, its recurrent pool) laid out as vLLM's ``MambaSpec`` pages: page b holds
    conv row b, then recurrent row b, then padding; each pool a view [rows, *row] at the page stride."""
    conv_n = math.prod(CONV_ROW)
    page = conv_n + math.prod(ssm_row) + PAD
    raw = torch.randn(rows * page, generator=torch.Generator().manual_seed(seed)) * 0.1
    conv = raw.as_strided((rows, *CONV_ROW), (page, *_dense(CONV_ROW)), 0)
    ssm = raw.as_strided((rows, *ssm_row), (page, *_dense(ssm_row)), conv_n)
    return raw, conv, ssm


def _randn(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _vllm_decode(hk: int, hv: int, dk: int, dv: int, dtype: torch.dtype, v_first: bool) -> Callable[..., Any]:
    """vLLM's fused_recurrent on a pool: 3 requests, one of them padding (−1)."""
    n = 3
    q, k = _randn(1, n, hk, dk, seed=1, dtype=dtype), _randn(1, n, hk, dk, seed=2, dtype=dtype)
    v = _randn(1, n, hv, dv, seed=3, dtype=dtype)
    g, beta = -torch.rand(1, n, hv, generator=torch.Generator().manual_seed(4)), torch.full((1, n, hv), 0.5)
    rows = torch.tensor([4, -1, 1], dtype=torch.int32)
    return lambda pool: gdn_nki.torch.vllm_fused_recurrent_gated_delta_rule(
        q, k, v, g, beta, initial_state=pool, cu_seqlens=torch.arange(n + 1, dtype=torch.int32),
        ssm_state_indices=rows, use_qk_l2norm_in_kernel=True, state_v_first=v_first)[0]  # fmt: skip


def _vllm_verify(hk: int, hv: int, dk: int, dv: int, dtype: torch.dtype, v_first: bool) -> Callable[..., Any]:
    """vLLM's speculative verification: [N, T] rows (a padding request), num_accepted_tokens."""
    n, t = 3, 2
    q, k = _randn(1, n * t, hk, dk, seed=5, dtype=dtype), _randn(1, n * t, hk, dk, seed=6, dtype=dtype)
    v = _randn(1, n * t, hv, dv, seed=7, dtype=dtype)
    g, beta = -torch.rand(1, n * t, hv, generator=torch.Generator().manual_seed(8)), torch.full((1, n * t, hv), 0.4)
    rows = torch.tensor([[6, 2], [-1, -1], [0, 3]], dtype=torch.int32)
    accepted = torch.tensor([2, 1, 1], dtype=torch.int32)
    return lambda pool: gdn_nki.torch.vllm_fused_recurrent_gated_delta_rule(
        q, k, v, g, beta, initial_state=pool, cu_seqlens=torch.arange(0, n * t + 1, t, dtype=torch.int32),
        ssm_state_indices=rows, num_accepted_tokens=accepted, use_qk_l2norm_in_kernel=True,
        state_v_first=v_first)[0]  # fmt: skip


def _sglang(hk: int, hv: int, dk: int, dv: int, dtype: torch.dtype, v_first: bool) -> Callable[..., Any]:
    """SGLang's fused_sigmoid_gating_delta_rule_update: 3 requests, one padding."""
    n = 3
    q, k = _randn(1, n, hk, dk, seed=9, dtype=dtype), _randn(1, n, hk, dk, seed=10, dtype=dtype)
    v, a, b = _randn(1, n, hv, dv, seed=11, dtype=dtype), _randn(n, hv, seed=12), _randn(n, hv, seed=13)
    a_log, dt_bias = torch.rand(hv, generator=torch.Generator().manual_seed(14)).log(), _randn(hv, seed=15)
    rows = torch.tensor([5, -1, 2], dtype=torch.int32)
    return lambda pool: gdn_nki.torch.fused_sigmoid_gating_delta_rule_update(
        a_log, a, dt_bias, 1.0, 20.0, q, k, v, b, pool, rows, use_qk_l2norm_in_kernel=True,
        cu_seqlens=torch.arange(n + 1, dtype=torch.int32), state_v_first=v_first)  # fmt: skip


def _vllm_sigmoid(hk: int, hv: int, dk: int, dv: int, dtype: torch.dtype, v_first: bool) -> Callable[..., Any]:
    """vLLM's fused_sigmoid_gating_delta_rule_update (its pool V-major, always)."""
    n = 2
    q, k = _randn(1, n, hk, dk, seed=16, dtype=dtype), _randn(1, n, hk, dk, seed=17, dtype=dtype)
    v, a, b = _randn(1, n, hv, dv, seed=18, dtype=dtype), _randn(n, hv, seed=19), _randn(n, hv, seed=20)
    a_log, dt_bias = torch.rand(hv, generator=torch.Generator().manual_seed(21)).log(), _randn(hv, seed=22)
    rows = torch.tensor([3, 0], dtype=torch.int32)
    return lambda pool: gdn_nki.torch.vllm_fused_sigmoid_gating_delta_rule_update(
        a_log, a, b, dt_bias, q, k, v, initial_state=pool, cu_seqlens=torch.arange(n + 1, dtype=torch.int32),
        ssm_state_indices=rows, use_qk_l2norm_in_kernel=True)[0]  # fmt: skip


CASES = {  # name -> (call maker, (Hk, Hv, Dk, Dv), io dtype, V-major pool)
    "vllm decode": (_vllm_decode, (2, 4, 32, 16), torch.float32, False),
    "vllm decode V-major bf16": (_vllm_decode, (2, 4, 16, 32), torch.bfloat16, True),
    "vllm decode two state tiles": (_vllm_decode, (2, 8, 128, 128), torch.float32, False),
    "vllm verify [N, T] rows": (_vllm_verify, (1, 2, 32, 32), torch.float32, False),
    "vllm verify V-major bf16": (_vllm_verify, (2, 4, 32, 16), torch.bfloat16, True),
    "sglang V-major": (_sglang, (2, 4, 32, 16), torch.float32, True),
    "sglang K-major bf16": (_sglang, (2, 4, 16, 32), torch.bfloat16, False),
    "vllm fused sigmoid": (_vllm_sigmoid, (2, 4, 32, 16), torch.float32, True),
}


def _ssm_row(case: str) -> tuple[int, int, int]:
    _, (_, hv, dk, dv), _, v_first = CASES[case]
    return (hv, dv, dk) if v_first else (hv, dk, dv)


def _expected_buffer(raw: torch.Tensor, ssm: torch.Tensor, pool: torch.Tensor) -> torch.Tensor:
    """``raw`` with only ``ssm``'s rows replaced by ``pool``'s: what a call may change, and nothing else."""
    want = raw.clone()
    want.as_strided(ssm.shape, ssm.stride(), ssm.storage_offset()).copy_(pool)
    return want


def rows_written_as_on_a_contiguous_pool(call: Callable[..., Any], raw: torch.Tensor, pool: torch.Tensor) -> list[int]:
    """Run ``call`` on a contiguous copy of ``pool``, then on ``pool`` (a view of ``raw``): the same result, the same
    rows, every other byte of ``raw`` as it was. Returns the rows the call wrote."""
    dense = pool.clone()
    want = call(dense)
    before = raw.clone()
    got = call(pool)
    assert torch.equal(got, want) and torch.equal(pool, dense)
    assert torch.equal(raw, _expected_buffer(before, pool, dense))  # conv rows, padding, rows not named: as they were
    old = before.as_strided(pool.shape, pool.stride(), pool.storage_offset())
    return [r for r in range(pool.shape[0]) if not torch.equal(dense[r], old[r])]


def _in_dtype(raw: torch.Tensor, pool: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The pages in ``dtype`` (the conv state is the model's dtype) and ``pool``'s view of them."""
    raw = raw.to(dtype)
    return raw, raw.as_strided(pool.shape, pool.stride(), pool.storage_offset())


@pytest.mark.parametrize("case", list(CASES))
def test_a_decode_drop_in_on_vllms_pages_gives_the_contiguous_pools_bits_and_leaves_every_other_byte(case: str) -> None:
    make, heads, dtype, v_first = CASES[case]
    call = make(*heads, dtype, v_first)
    raw, _, ssm = vllm_pages(_ssm_row(case), seed=len(case))
    assert not ssm.is_contiguous() and ssm.stride(0) > math.prod(ssm.shape[1:])
    changed = rows_written_as_on_a_contiguous_pool(call, raw, ssm)
    assert 0 < len(changed) < P, changed  # the call wrote rows, and left rows it does not name


def _recorder(calls: list[tuple[tuple[Any, ...], dict[str, Any]]]) -> Callable[..., Any]:
    """A launch that records what reaches the kernel and runs it in nki-cpu (the pool written in place)."""

    def launch(kernel: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append((args, kwargs))
        return backend.simulate(kernel)(*args, **kwargs)

    return launch


@pytest.mark.parametrize("v_first", [False, True])
def test_the_device_path_hands_the_kernel_the_views_span_and_gives_the_cpu_paths_bits(v_first: bool) -> None:
    """``torch/device.py``: the kernel's pool argument is the view's span — 1-D, the same storage from the view's
    first element, no copy — with ``state_row_stride`` the page; run by nki-cpu it gives the CPU path's bits."""
    skip_on_device("the launch is run by nki-cpu on CPU tensors")
    case = "vllm verify V-major bf16" if v_first else "vllm verify [N, T] rows"
    make, heads, dtype, _ = CASES[case]
    raw, _, ssm = vllm_pages(_ssm_row(case), seed=30)
    dense = ssm.clone()
    want_o = make(*heads, dtype, v_first)(dense)
    hk, hv, dk, dv = heads
    n, t = 3, 2
    q, k = _randn(1, n * t, hk, dk, seed=5, dtype=dtype), _randn(1, n * t, hk, dk, seed=6, dtype=dtype)
    v = _randn(1, n * t, hv, dv, seed=7, dtype=dtype)
    g, beta = -torch.rand(1, n * t, hv, generator=torch.Generator().manual_seed(8)), torch.full((1, n * t, hv), 0.4)
    rows = torch.tensor([[6, 2], [-1, -1], [0, 3]], dtype=torch.int32)
    before, calls = raw.clone(), []
    with launch_replaced(_recorder(calls)):
        o = device.vllm_fused_recurrent(q, k, v, g, beta, ssm, rows, torch.arange(0, n * t + 1, t, dtype=torch.int32),
                                        torch.tensor([2, 1, 1], dtype=torch.int32), None, True, v_first)  # fmt: skip
    ((args, kwargs),) = calls
    span = args[3]
    assert span.dim() == 1 and span.stride() == (1,) and kwargs["state_row_stride"] == ssm.stride(0)
    assert span.untyped_storage().data_ptr() == raw.untyped_storage().data_ptr()
    assert span.storage_offset() == ssm.storage_offset()
    assert span.numel() == (P - 1) * ssm.stride(0) + math.prod(ssm.shape[1:])
    assert torch.equal(o, want_o) and torch.equal(ssm, dense)
    assert torch.equal(raw, _expected_buffer(before, ssm, dense))


def test_a_dense_pool_reaches_the_kernel_as_it_did() -> None:
    """A contiguous pool is the kernel's argument itself, no ``state_row_stride``: its launch keeps its keywords."""
    skip_on_device("the launch is run by nki-cpu on CPU tensors")
    _, (hk, hv, dk, dv), _, _ = CASES["vllm decode"]
    pool = _randn(P, hv, dk, dv, seed=31) * 0.1
    q, k, v = _randn(1, 2, hk, dk, seed=32), _randn(1, 2, hk, dk, seed=33), _randn(1, 2, hv, dv, seed=34)
    g, beta = -torch.rand(1, 2, hv, generator=torch.Generator().manual_seed(35)), torch.full((1, 2, hv), 0.5)
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    with launch_replaced(_recorder(calls)):
        device.vllm_fused_recurrent(q, k, v, g, beta, pool, torch.tensor([1, 5], dtype=torch.int32),
                                    torch.arange(3, dtype=torch.int32), None, None, True)  # fmt: skip
    ((args, kwargs),) = calls
    assert args[3] is pool and "state_row_stride" not in kwargs


@pytest.mark.parametrize("case", ["vllm decode", "sglang V-major"])
def test_compiled_on_vllms_pages_has_no_graph_break_and_gives_eagers_bits(case: str) -> None:
    """``torch.compile`` captures the call on the view whole (the op declares the pool mutated; functionalization
    writes it back through the view): eager's outputs and buffer, bit for bit."""
    make, heads, dtype, v_first = CASES[case]
    call = make(*heads, dtype, v_first)
    raw, _, ssm = vllm_pages(_ssm_row(case), seed=40)
    eager_raw = raw.clone()
    eager_ssm = eager_raw.as_strided(ssm.shape, ssm.stride(), ssm.storage_offset())
    want_o = call(eager_ssm)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(call)(raw.clone().as_strided(ssm.shape, ssm.stride(), ssm.storage_offset()))
    assert (explained.graph_break_count, explained.graph_count) == (0, 1), explained.break_reasons
    torch._dynamo.reset()
    got_o = torch.compile(call, backend=compile_backend(), fullgraph=True)(ssm)
    assert torch.equal(got_o, want_o)
    assert torch.equal(raw, eager_raw)  # the pool rows as eager wrote them, every other byte as it was


# --- the conv decode drop-in on the conv pool of the same pages ----------------------------------------------------

C, L = CONV_ROW


def _conv_update(form: str, dtype: torch.dtype) -> Callable[..., Any]:
    """vLLM's causal_conv1d_update on a pool: a decode with a padding row, [N, T] rows, or vLLM's in-row form
    (``num_accepted_tokens`` with [N] rows: the window read from an offset in the row)."""
    gen = torch.Generator().manual_seed(50)
    weight, bias = torch.randn(C, L + 1 - (form in ("in-row", "varlen")), generator=gen), torch.randn(C, generator=gen)
    if form == "decode":
        x, rows, accepted = torch.randn(3, C, generator=gen), torch.tensor([4, -1, 1], dtype=torch.int32), None
    elif form == "[N, T] rows":
        x, rows = torch.randn(2, C, 2, generator=gen), torch.tensor([[6, 2], [0, 3]], dtype=torch.int32)
        accepted = torch.tensor([2, 1], dtype=torch.int32)
    elif form == "varlen":  # vLLM's packed speculative form: 1, 2 and 0 tokens (one request padding)
        x, rows = torch.randn(3, C, generator=gen).to(dtype), torch.tensor([5, -1, 2, 6], dtype=torch.int32)
        accepted, bounds = torch.tensor([1, 2, 2, 1], dtype=torch.int32), torch.tensor([0, 1, 1, 3, 3])
        return lambda pool: gdn_nki.torch.causal_conv1d_update(
            x, pool, weight, bias, "silu", rows, accepted, query_start_loc=bounds.to(torch.int32), max_query_len=2
        )
    else:
        x, rows = torch.randn(2, C, 2, generator=gen), torch.tensor([5, 2], dtype=torch.int32)
        accepted = torch.tensor([2, 1], dtype=torch.int32)
    x = x.to(dtype)
    return lambda pool: gdn_nki.torch.causal_conv1d_update(x, pool, weight, bias, "silu", rows, accepted)


@pytest.mark.parametrize("form", ["decode", "[N, T] rows", "in-row", "varlen"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_conv_update_on_vllms_pages_gives_the_contiguous_pools_bits_and_leaves_every_other_byte(
    form: str, dtype: torch.dtype
) -> None:
    """vLLM's conv pool laid out dim-first (``VLLM_SSM_CONV_STATE_LAYOUT=DS``: each row a dense [C, L])."""
    call = _conv_update(form, dtype)
    raw, conv = _in_dtype(*vllm_pages((2, 8, 8), seed=51)[:2], dtype)
    assert 0 < len(rows_written_as_on_a_contiguous_pool(call, raw, conv)) < P


def test_the_conv_update_refuses_vllms_default_state_len_first_pool_by_name() -> None:
    """vLLM's default conv layout ("SD") stores a row [L, C] and its GDN layer hands the kernels the transposed view
    [P, C, L] (channels unit-stride): not a row of dense [C, L], so refused naming ``conv_state``, nothing written."""
    conv_n = C * L
    page = conv_n + PAD
    raw = torch.randn(P * page)
    conv = raw.as_strided((P, L, C), (page, C, 1)).transpose(-1, -2)
    before = raw.clone()
    with pytest.raises(ContractError, match=r"`conv_state`.*each row dense"):
        _conv_update("decode", torch.float32)(conv)
    assert torch.equal(raw, before)


def test_the_conv_devices_path_hands_the_kernel_the_views_span() -> None:
    skip_on_device("the launch is run by nki-cpu on CPU tensors")
    call = _conv_update("in-row", torch.float32)
    raw, conv, _ = vllm_pages((2, 8, 8), seed=52)
    dense = conv.clone()
    want = call(dense)
    gen = torch.Generator().manual_seed(50)
    weight, bias = torch.randn(C, L, generator=gen), torch.randn(C, generator=gen)
    x = torch.randn(2, C, 2, generator=gen).transpose(1, 2).contiguous()
    before, calls = raw.clone(), []
    with launch_replaced(_recorder(calls)):
        out = conv_device.causal_conv1d_update(x, conv, weight, bias, torch.tensor([5, 2], dtype=torch.int32), "silu",
                                               torch.tensor([2, 1], dtype=torch.int32))  # fmt: skip
    ((args, kwargs),) = calls
    assert args[1].dim() == 1 and args[1].storage_offset() == conv.storage_offset()
    assert kwargs == {"state_row_stride": conv.stride(0), "state_len": L}
    assert torch.equal(out.transpose(1, 2), want) and torch.equal(conv, dense)
    assert torch.equal(raw, _expected_buffer(before, conv, dense))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_conv_prefill_on_vllms_pages_gives_the_contiguous_pools_bits_and_leaves_every_other_byte(
    dtype: torch.dtype,
) -> None:
    """vLLM's causal_conv1d_fn on the dim-first conv pool: three packed sequences, one from its stored window, one
    padding (−1: nothing read or stored), one starting empty."""
    gen = torch.Generator().manual_seed(60)
    x, weight = torch.randn(C, 12, generator=gen).to(dtype), torch.randn(C, L + 1, generator=gen)
    starts, rows = torch.tensor([0, 4, 9, 12], dtype=torch.int32), torch.tensor([4, -1, 1], dtype=torch.int32)
    initial = torch.tensor([True, False, False])

    def call(pool: torch.Tensor) -> torch.Tensor:
        return gdn_nki.torch.causal_conv1d_fn(x, weight, None, pool, starts, rows, initial, "silu")

    raw, conv = _in_dtype(*vllm_pages((2, 8, 8), seed=61)[:2], dtype)
    assert rows_written_as_on_a_contiguous_pool(call, raw, conv) == [1, 4]


def test_the_conv_prefills_device_path_hands_the_kernel_the_views_span() -> None:
    skip_on_device("the launch is run by nki-cpu on CPU tensors")
    gen = torch.Generator().manual_seed(62)
    x, weight = torch.randn(C, 9, generator=gen), torch.randn(C, L + 1, generator=gen)
    starts, rows = torch.tensor([0, 4, 9], dtype=torch.int32), torch.tensor([4, 1], dtype=torch.int32)
    raw, conv, _ = vllm_pages((2, 8, 8), seed=63)
    dense = conv.clone()
    want = gdn_nki.torch.causal_conv1d_fn(x, weight, None, dense, starts, rows, torch.tensor([True, False]), "silu")
    before, calls = raw.clone(), []
    with launch_replaced(_recorder(calls)):
        out = conv_device.causal_conv1d_fn(x.t().contiguous(), conv, weight, None, starts, rows,
                                           torch.tensor([4, -1], dtype=torch.int32), "silu", 0, None, None)  # fmt: skip
    ((args, kwargs),) = calls
    assert args[1].dim() == 1 and args[1].storage_offset() == conv.storage_offset()
    assert kwargs["state_row_stride"] == conv.stride(0) and kwargs["state_len"] == L
    assert torch.equal(out.t(), want) and torch.equal(conv, dense)
    assert torch.equal(raw, _expected_buffer(before, conv, dense))


def test_the_compiled_conv_update_on_vllms_pages_has_no_graph_break_and_gives_eagers_bits() -> None:
    call = _conv_update("in-row", torch.float32)
    raw, conv, _ = vllm_pages((2, 8, 8), seed=70)
    eager_raw = raw.clone()
    want = call(eager_raw.as_strided(conv.shape, conv.stride(), conv.storage_offset()))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(call)(raw.clone().as_strided(conv.shape, conv.stride(), conv.storage_offset()))
    assert (explained.graph_break_count, explained.graph_count) == (0, 1), explained.break_reasons
    torch._dynamo.reset()
    got = torch.compile(call, backend=compile_backend(), fullgraph=True)(conv)
    assert torch.equal(got, want) and torch.equal(raw, eager_raw)


# --- the chunk prefill on a pool of the same pages ----------------------------------------------------------------


def _prefill_pool_call(pool: torch.Tensor) -> dict[str, Any]:
    """``test_torch_ops``' bucketed prefill on a pool (a −1 row, a prefix-cache read row, a checkpoint) on ``pool``."""
    call = prefill_pool_call()
    call["initial_state"] = pool
    return call


def test_the_chunk_prefill_on_vllms_pages_gives_the_contiguous_pools_bits_and_leaves_every_other_byte() -> None:
    """The CPU path (``host.buckets`` stages the rows it writes, commits them through the caller's view)."""
    raw, _, ssm = vllm_pages((HV, K, V), seed=80, rows=12)

    def call(pool: torch.Tensor) -> torch.Tensor:
        o, returned = gdn_nki.torch.chunk_gated_delta_rule(**_prefill_pool_call(pool))
        assert returned is pool
        return o

    assert rows_written_as_on_a_contiguous_pool(call, raw, ssm) == [5]  # the checkpoint lies past its 37 tokens


def test_the_chunk_prefills_device_path_hands_the_bucket_kernel_the_views_span() -> None:
    skip_on_device("the launch is run by nki-cpu on CPU tensors")
    raw, _, ssm = vllm_pages((HV, K, V), seed=81, rows=12)
    dense = ssm.clone()
    want_o, _ = gdn_nki.torch.chunk_gated_delta_rule(**_prefill_pool_call(dense))
    args = _prefill_pool_call(ssm)
    before, calls = raw.clone(), []
    with launch_replaced(_recorder(calls)):
        o = device.chunk_pool(
            args["q"], args["k"], args["v"], args["g"], args["beta"], ssm, args["state_indices"], None, None,
            args["cu_seqlens"], args["checkpoint_indices"], args["read_indices"], None, False, False, False, "schur",
            8, [256, 4], 128,
        )  # fmt: skip
    ((launched, kwargs),) = calls
    span = launched[7]
    assert span.dim() == 1 and span.storage_offset() == ssm.storage_offset()
    assert kwargs["state_row_stride"] == ssm.stride(0)
    assert torch.equal(o, want_o) and torch.equal(ssm, dense)
    assert torch.equal(raw, _expected_buffer(before, ssm, dense))
