"""gdn_conv_step's SBUF limit refused by name before the trace (review holes49 item 5): one group's tiles, the taps
and the bias must fit a partition's SBUF; fp32 at C = 16384 with T = 4 and [N, T] rows does not, and the host
entry point, the kernel's own check, the torch drop-in and the ops' trace-time rules (the fake and device paths)
raise a ``ContractError`` naming x (its channels, dtype and form), the limit and the fixes — not nki-cpu's
allocation failure — with the pool unchanged; the same call in bf16 runs."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import gdn_nki
from gdn_nki.common.backend import nl
from gdn_nki.conv.step import gdn_conv_step
from gdn_ref.contract import ContractError

C, W, L, N, T = 16384, 4, 3, 2, 4


def _call(dtype):
    rng = np.random.default_rng(14)
    x = rng.standard_normal((N, T, C)).astype(dtype)
    pool = rng.standard_normal((N * T, C, L)).astype(dtype)
    weight, bias = rng.standard_normal((C, W)).astype(dtype), rng.standard_normal(C).astype(dtype)
    rows = np.arange(N * T, dtype=np.int32).reshape(N, T)
    return x, pool, weight, bias, rows


def _assert_names_x(message: str) -> None:
    assert "`x`" in message and "C = 16384 channels in float32 with T = 4" in message, message
    assert f"over its {nl.tile_size.sbuf_fmax_bytes}" in message and "bfloat16" in message, message


def test_the_host_entry_point_refuses_it_by_name_and_bf16_runs() -> None:
    x, pool, weight, bias, rows = _call(np.float32)
    before = pool.copy()
    with pytest.raises(ContractError) as info:
        gdn_nki.conv_decode_step(x, pool, weight, bias, rows)
    _assert_names_x(str(info.value))
    assert np.array_equal(pool, before)
    out, _ = gdn_nki.conv_decode_step(*_call(ml_dtypes.bfloat16))
    assert out.shape == (N, T, C)


def test_the_kernel_stops_its_own_trace_with_the_rule() -> None:
    from gdn_nki.common import backend

    with pytest.raises(AssertionError) as info:
        backend.simulate(gdn_conv_step)(*_call(np.float32), None, "silu")
    _assert_names_x(str(info.value))


def test_the_torch_drop_in_and_the_trace_time_rules_refuse_it() -> None:
    torch = pytest.importorskip("torch")
    from gdn_nki.torch import causal_conv1d_update, rules

    x, pool, weight, bias, rows = (torch.from_numpy(a) for a in _call(np.float32))
    before = pool.clone()
    with pytest.raises(ContractError) as info:
        causal_conv1d_update(x.transpose(1, 2), pool, weight, bias, "silu", rows)
    _assert_names_x(str(info.value))
    assert torch.equal(pool, before)
    with pytest.raises(ContractError) as info:
        rules.conv_step(x, pool, weight, bias, rows, "silu")
    _assert_names_x(str(info.value))
