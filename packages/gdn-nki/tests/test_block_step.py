"""``gdn_block_step`` (one launch: in_proj, conv, SiLU, GQA, gating, recurrence, gated norm on both pools) through
``gdn_nki.block_decode_step``, against gdn-ref's fp64 block oracle within gdn-spec's tolerance table; the rows no
request names bit-identical in both pools; bad calls rejected with both pools untouched."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import gdn_nki
from gdn_nki.block import step as block_step
from gdn_nki.common import backend
from gdn_ref.block import gdn_block_decode_pool
from gdn_ref.contract import ContractError
from gdn_spec.metrics import compare

HK, HV, DK, DV, E, W, L, P = 2, 4, 16, 8, 256, 4, 3, 12
C = 2 * HK * DK + HV * DV
NAMES = ("w_qkv", "w_z", "w_b", "w_a", "conv_weight", "conv_bias", "A_log", "dt_bias", "norm_weight")


def _layer(
    seed: int, dtype: type, bias: bool = True, dims: tuple[int, ...] = (HK, HV, DK, DV, E)
) -> dict[str, np.ndarray | None]:
    """The block's weights at heads and hidden size ``dims`` (Hk, Hv, Dk, Dv, E)."""
    hk, hv, dk, dv, e = dims
    c = 2 * hk * dk + hv * dv
    rng = np.random.default_rng(seed)
    r = rng.standard_normal
    return {
        "w_qkv": (r((e, c)) * 0.08).astype(dtype),
        "w_z": (r((e, hv * dv)) * 0.08).astype(dtype),
        "w_b": (r((e, hv)) * 0.08).astype(dtype),
        "w_a": (r((e, hv)) * 0.08).astype(dtype),
        "conv_weight": (r((c, W)) * 0.5).astype(dtype),
        "conv_bias": (r(c) * 0.1).astype(dtype) if bias else None,
        "A_log": (r(hv) * 0.3).astype(np.float32),
        "dt_bias": (r(hv) * 0.3).astype(np.float32),
        "norm_weight": (1.0 + 0.1 * r(dv)).astype(np.float32),
    }


def _pools(seed: int, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed + 100)
    conv_pool = rng.standard_normal((P, C, L)).astype(dtype)
    state_pool = (rng.standard_normal((P, HV, DK, DV)) * 0.2).astype(np.float32)
    return conv_pool, state_pool


def _run(hidden, layer, conv_pool, state_pool, rows, accepted, **kwargs):
    return gdn_nki.block_decode_step(hidden, *(layer[n] for n in NAMES), conv_pool, state_pool, rows, accepted,
                                     **kwargs)  # fmt: skip


CASES = [
    pytest.param(np.array([3, -1, 0, 7], np.int32), None, 1, np.float32, id="N-rows-padding-fp32"),
    pytest.param(np.array([[0, 1], [-1, -1], [4, 5]], np.int32), np.array([2, 1, 1], np.int32), 2, np.float32,
                 id="NT-rows-rollback-fp32"),
    pytest.param(np.array([[9, 2, 6], [1, 10, 11]], np.int32), np.array([3, 2], np.int32), 3, ml_dtypes.bfloat16,
                 id="NT-rows-rollback-bf16"),
    pytest.param(np.array([5, 2], np.int32), None, 2, ml_dtypes.bfloat16, id="N-rows-two-tokens-bf16"),
]  # fmt: skip


@pytest.mark.parametrize(("rows", "accepted", "t_len", "dtype"), CASES)
def test_block_matches_the_oracle_and_leaves_other_rows(rows, accepted, t_len, dtype):
    layer = _layer(3, dtype)
    conv_pool, state_pool = _pools(3, dtype)
    hidden = np.random.default_rng(9).standard_normal((rows.shape[0], t_len, E)).astype(dtype)
    ref_out, ref_conv, ref_state = gdn_block_decode_pool(
        hidden, **layer, conv_pool=conv_pool, state_pool=state_pool, state_indices=rows, num_key_heads=HK,
        num_accepted_tokens=accepted,
    )  # fmt: skip
    before_conv, before_state = conv_pool.copy(), state_pool.copy()
    out, conv_after, state_after = _run(hidden, layer, conv_pool, state_pool, rows, accepted)
    assert conv_after is conv_pool and state_after is state_pool  # updated in place
    name = np.dtype(dtype).name
    assert out.dtype == np.dtype(dtype) and out.shape == (rows.shape[0], t_len, HV * DV)
    written = sorted({int(x) for x in rows.reshape(-1) if x >= 0})
    for output, got, ref in (("out", out, ref_out), ("state", conv_pool[written], ref_conv[written]),
                             ("state", state_pool[written], ref_state[written])):  # fmt: skip
        error = compare(output, got, ref, name)
        assert error.ok, error
    padding = rows.reshape(rows.shape[0], -1)[:, 0] < 0
    assert not np.any(np.asarray(out[padding], dtype=np.float32))  # padding requests: zeros out
    kept = [i for i in range(P) if i not in written]
    assert conv_pool[kept].tobytes() == before_conv[kept].tobytes()
    assert state_pool[kept].tobytes() == before_state[kept].tobytes()


def test_block_without_conv_bias():
    layer = _layer(4, np.float32, bias=False)
    conv_pool, state_pool = _pools(4, np.float32)
    rows = np.array([2, 8], np.int32)
    hidden = np.random.default_rng(1).standard_normal((2, 1, E)).astype(np.float32)
    ref_out, _, ref_state = gdn_block_decode_pool(hidden, **layer, conv_pool=conv_pool, state_pool=state_pool,
                                                  state_indices=rows, num_key_heads=HK)  # fmt: skip
    out, _, _ = _run(hidden, layer, conv_pool, state_pool, rows, None)
    assert compare("out", out, ref_out, "float32").ok
    assert compare("state", state_pool[[2, 8]], ref_state[[2, 8]], "float32").ok


def _bad_calls() -> list:
    """(what to change, the argument the error must name)."""
    return [
        pytest.param({"conv_weight": np.zeros((C, 7), np.float32)}, "conv_weight", id="conv-width"),
        pytest.param({"conv_pool": np.zeros((P, C, 2), np.float32)}, "conv_pool", id="window-longer-than-state"),
        pytest.param({"conv_pool": np.zeros((P, C + 16, L), np.float32)}, "conv_pool", id="pool-channels"),
        pytest.param({"conv_weight": np.zeros((C + 16, W), np.float32)}, "conv_weight", id="weight-channels"),
        pytest.param({"w_qkv": np.zeros((E, C + 16), np.float32)}, "w_qkv", id="qkv-channels"),
        pytest.param({"w_z": np.zeros((E, HV * DV + 8), np.float32)}, "w_z", id="z-width"),
        pytest.param({"rows": np.array([3, P], np.int32)}, "state_indices", id="row-out-of-range"),
        pytest.param({"rows": np.array([3, 3], np.int32)}, "state_indices", id="row-repeated"),
        pytest.param({"conv_pool": np.zeros((P + 1, C, L), np.float32)}, "conv_pool", id="pool-rows-differ"),
        pytest.param(
            {
                "hidden": np.zeros((2, 1, E + 8), np.float32),
                **{
                    w: np.zeros((E + 8, n), np.float32)
                    for w, n in (("w_qkv", C), ("w_z", HV * DV), ("w_b", HV), ("w_a", HV))
                },
            },
            "hidden",
            id="hidden-size",
        ),
        pytest.param({"A_log": np.zeros(HV, np.float64)}, "A_log", id="A_log-dtype"),
        pytest.param({"accepted": np.array([1, 1], np.int32)}, "num_accepted_tokens", id="accepted-with-N-rows"),
        pytest.param({"rows": np.array([3.0, 4.0], np.float32)}, "state_indices", id="float-rows"),
        pytest.param(
            {"hidden": np.zeros((0, 1, E), np.float32), "rows": np.zeros(0, np.int32)}, "hidden", id="no-requests"
        ),
        pytest.param(
            {"hidden": np.zeros((257, 4, E), np.float32), "rows": np.arange(257, dtype=np.int32)},
            "hidden",
            id="too-many-tokens",
        ),
    ]


@pytest.mark.parametrize(("change", "argument"), _bad_calls())
def test_bad_call_names_the_argument_and_changes_no_row(change, argument):
    layer = _layer(5, np.float32)
    conv_pool, state_pool = _pools(5, np.float32)
    call = {
        "hidden": np.ones((2, 1, E), np.float32),
        "rows": np.array([3, 4], np.int32),
        "conv_pool": conv_pool,
        "accepted": None,
    }
    for key, value in change.items():
        if key in call:
            call[key] = value
        else:
            layer = {**layer, key: value}
    pools = (call["conv_pool"].copy(), state_pool.copy())
    with pytest.raises(ContractError) as caught:
        _run(call["hidden"], layer, call["conv_pool"], state_pool, call["rows"], call["accepted"])
    assert any(v.argument == argument for v in caught.value.violations), caught.value
    assert "gdn_nki.block_decode_step" in str(caught.value)
    assert call["conv_pool"].tobytes() == pools[0].tobytes() and state_pool.tobytes() == pools[1].tobytes()


def test_nan_in_a_read_row_is_rejected_before_anything_is_written():
    layer = _layer(6, np.float32)
    conv_pool, state_pool = _pools(6, np.float32)
    state_pool[4, 1, 2, 3] = np.nan
    before = conv_pool.copy(), state_pool.copy()
    with pytest.raises(ContractError) as caught:
        _run(np.ones((2, 1, E), np.float32), layer, conv_pool, state_pool, np.array([3, 4], np.int32), None)
    assert caught.value.violations[0].argument == "state_pool"
    assert conv_pool.tobytes() == before[0].tobytes()
    assert np.array_equal(state_pool, before[1], equal_nan=True)


def test_a_launch_failing_part_way_puts_both_pools_back(monkeypatch):
    layer = _layer(7, np.float32)
    conv_pool, state_pool = _pools(7, np.float32)
    before = conv_pool.copy(), state_pool.copy()

    def failing(kernel):
        def run(*args):
            args[10][3] = 0.0  # the launch wrote the rows it names ...
            args[11][4] = 0.0
            raise RuntimeError("device lost")  # ... and then failed

        return run

    monkeypatch.setattr(backend, "simulate", failing)
    with pytest.raises(RuntimeError, match="device lost"):
        _run(np.ones((2, 1, E), np.float32), layer, conv_pool, state_pool, np.array([3, 4], np.int32), None)
    assert conv_pool.tobytes() == before[0].tobytes() and state_pool.tobytes() == before[1].tobytes()


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_gdn_block_tkg_is_the_documented_functional_block(dtype):
    """AWS's signature: hidden [B, 1, H], W_in_a before W_in_b, fp32 taps, no bias, a K-input conv state; the
    inputs only read, the new states returned."""
    layer = _layer(8, dtype, bias=False)
    taps = layer["conv_weight"].astype(np.float32)
    rng = np.random.default_rng(8)
    batch = 3
    hidden = rng.standard_normal((batch, 1, E)).astype(dtype)
    conv_state = rng.standard_normal((batch, C, W)).astype(dtype)  # K inputs, HF's layout
    recurrent_state = (rng.standard_normal((batch, HV, DK, DV)) * 0.2).astype(np.float32)
    given = conv_state.copy(), recurrent_state.copy()
    core_out, new_conv, new_state = gdn_nki.gdn_block_tkg(
        hidden, layer["w_qkv"], layer["w_z"], layer["w_a"], layer["w_b"], taps, conv_state, layer["A_log"],
        layer["dt_bias"], layer["norm_weight"], recurrent_state,
    )  # fmt: skip
    ref_out, ref_conv, ref_state = gdn_block_decode_pool(
        hidden, layer["w_qkv"], layer["w_z"], layer["w_b"], layer["w_a"], taps, None, layer["A_log"],
        layer["dt_bias"], layer["norm_weight"], conv_state, recurrent_state, np.arange(batch, dtype=np.int32), HK,
    )  # fmt: skip
    name = np.dtype(dtype).name
    assert core_out.shape == (batch, 1, HV * DV) and new_conv.shape == conv_state.shape
    assert compare("out", core_out, ref_out, name).ok
    assert compare("state", new_conv, ref_conv, name).ok and compare("state", new_state, ref_state, name).ok
    # the window slid by one, ending in the token's raw q|k|v: its first K − 1 inputs are the old last K − 1, exactly
    assert new_conv[:, :, : W - 1].tobytes() == conv_state[:, :, 1:].tobytes()
    assert conv_state.tobytes() == given[0].tobytes() and recurrent_state.tobytes() == given[1].tobytes()


def test_nan_in_an_input_is_named():
    layer = _layer(6, np.float32)
    conv_pool, state_pool = _pools(6, np.float32)
    hidden = np.ones((2, 1, E), np.float32)
    hidden[1, 0, 5] = np.inf
    with pytest.raises(ContractError) as caught:
        _run(hidden, layer, conv_pool, state_pool, np.array([3, 4], np.int32), None)
    v = caught.value.violations[0]
    assert (v.argument, v.rule_id, v.api) == ("hidden", "block.finite", "gdn_block_step") and "[1, 0, 5]" in v.value


def test_a_launch_grid_is_refused_before_anything_is_written():
    layer = _layer(9, np.float32)
    conv_pool, state_pool = _pools(9, np.float32)
    before = conv_pool.copy(), state_pool.copy()
    hidden = np.ones((2, 1, E), np.float32)
    with pytest.raises(AssertionError, match="one program"):
        backend.simulate(gdn_nki.gdn_block_step[2])(hidden, *(layer[n] for n in NAMES), conv_pool, state_pool,
                                                    np.array([3, 4], np.int32))  # fmt: skip
    assert conv_pool.tobytes() == before[0].tobytes() and state_pool.tobytes() == before[1].tobytes()


@pytest.mark.parametrize("t_len", [1, 2])
def test_conv_writing_q_k_v_itself_gives_the_copies_bits(t_len, monkeypatch):
    """Heads of whole conv partitions (C / 16 = 8 channels: q, k 32, v 64) make the conv write q, k and v as tensors
    of their own; the copies out of one conv output (the path of other shapes) must give the same bits. 18 requests:
    the recurrence's compiled loop, whose run-time request rows index those tensors; T = 1 ([N] rows: the conv's
    last trip in channel runs) and T = 2 ([N, T] rows, rollback)."""
    hk, hv, dk, dv, e, pool_rows, n_req = 2, 4, 16, 16, 128, 40, 18
    channels = 2 * hk * dk + hv * dv
    assert block_step.split_parts(channels, (hk * dk, hk * dk, hv * dv))
    layer = _layer(5, np.float32, dims=(hk, hv, dk, dv, e))
    rng = np.random.default_rng(6)
    r = rng.standard_normal
    hidden = r((n_req, t_len, e)).astype(np.float32)
    rows = rng.permutation(pool_rows)[: n_req * t_len].astype(np.int32).reshape((n_req, t_len)[: 1 + (t_len > 1)])
    rows[[3, 17]] = -1
    accepted = rng.integers(1, t_len + 1, n_req).astype(np.int32) if t_len > 1 else None
    conv_pool = r((pool_rows, channels, L)).astype(np.float32)
    state_pool = (r((pool_rows, hv, dk, dv)) * 0.2).astype(np.float32)
    ref_out, ref_conv, ref_state = gdn_block_decode_pool(
        hidden, **layer, conv_pool=conv_pool, state_pool=state_pool, state_indices=rows, num_key_heads=hk,
        num_accepted_tokens=accepted,
    )  # fmt: skip
    results = []
    for split in (True, False):
        if not split:
            monkeypatch.setattr(block_step, "split_parts", lambda *_: False)
        pools = conv_pool.copy(), state_pool.copy()
        out, _, _ = _run(hidden, layer, *pools, rows, accepted)
        results.append((out, *pools))
    for got, copied in zip(*results, strict=True):
        assert got.tobytes() == copied.tobytes()
    written = sorted({int(x) for x in rows.reshape(-1) if x >= 0})
    out, conv_after, state_after = results[0]
    for output, got, ref in (("out", out, ref_out), ("state", conv_after[written], ref_conv[written]),
                             ("state", state_after[written], ref_state[written])):  # fmt: skip
        error = compare(output, got, ref, "float32")
        assert error.ok, error
