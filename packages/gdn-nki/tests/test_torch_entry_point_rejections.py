"""The torch drop-ins at the edges (issue 41): each bad call is refused with a ``ContractError`` in the caller's
terms — its function, its argument names, its element indices — and every buffer keeps its bytes. Skipped where
torch is not installed."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'gdn-nki[torch]'; nox -s integration)")

from decode_inputs import step_inputs  # noqa: E402
from gdn_nki.host.torch_io import as_torch  # noqa: E402
from gdn_nki.torch import chunk_gated_delta_rule  # noqa: E402
from gdn_nki.torch_decode import (  # noqa: E402
    fused_recurrent_gated_delta_rule,
    fused_sigmoid_gating_delta_rule_update,
    vllm_fused_recurrent_gated_delta_rule,
)
from gdn_ref.contract import ContractError  # noqa: E402
from rejection_checks import DK, TENSORS, C, assert_refused, no_buckets, packed_tensors, random_pool  # noqa: E402

pytestmark = pytest.mark.usefixtures(no_buckets.__name__)  # every test starts and ends with no bucket configured


def _t(x: np.ndarray):
    return as_torch(np.ascontiguousarray(x))


def _seq_first(tensors: dict[str, np.ndarray]) -> list:
    """The head-major [1, H, T(, D)] packed tensors as FLA's seq-first [1, T, H(, D)] torch tensors."""
    return [_t(np.swapaxes(tensors[name], 1, 2)) for name in TENSORS]


def _vllm_packed(x, n: int, t: int) -> list:
    """q, k, v, g, beta of ``step_inputs`` packed as vLLM passes them: [1, N·T, ...] with cu_seqlens."""
    return [_t(a.reshape(1, n * t, *a.shape[2:])) for a in (x.query, x.key, x.value, x.g_log, x.beta)]


# --- the vLLM drop-in: the indices' rules before any row is read (item 1), in the caller's names ---


@pytest.mark.parametrize(
    ("change", "rule_id", "argument", "value"),
    [
        (dict(num_accepted_tokens=torch.tensor([1, 2], dtype=torch.int32)), "num_accepted_tokens.shape",
         "num_accepted_tokens", "shape (2,)"),
        (dict(num_accepted_tokens=torch.tensor(1, dtype=torch.int32)), "num_accepted_tokens.rank",
         "num_accepted_tokens", "shape ()"),
        (dict(num_accepted_tokens=torch.ones(3, 1, dtype=torch.int32)), "num_accepted_tokens.rank",
         "num_accepted_tokens", "shape (3, 1)"),
    ],
    ids=["accepted_short", "accepted_0d", "accepted_N_by_1"],
)  # fmt: skip
def test_vllm_drop_in_refuses_malformed_accepted_counts(change, rule_id, argument, value) -> None:
    x = step_inputs(43, "float32", N=3, T=2, P=8)
    rows = torch.tensor([[0, 1], [2, 3], [4, 5]], dtype=torch.int32)
    call = dict(initial_state=torch.from_numpy(x.pool), cu_seqlens=torch.tensor([0, 2, 4, 6], dtype=torch.int32),
                ssm_state_indices=rows, **change)  # fmt: skip
    assert_refused(lambda: vllm_fused_recurrent_gated_delta_rule(*_vllm_packed(x, 3, 2), **call), rule_id, argument,
                   value, [x.pool])  # fmt: skip


def test_vllm_drop_in_refuses_0d_indices_by_the_callers_name() -> None:
    x = step_inputs(44, "float32", N=3, T=1, P=8)
    error = assert_refused(
        lambda: vllm_fused_recurrent_gated_delta_rule(
            *_vllm_packed(x, 3, 1), initial_state=torch.from_numpy(x.pool), ssm_state_indices=torch.tensor(0),
            cu_seqlens=torch.tensor([0, 1, 2, 3]),
        ),
        "state_indices.rank", "ssm_state_indices", "shape ()", [x.pool],
    )  # fmt: skip
    assert "`state_indices`" not in str(error)


def test_vllm_drop_in_refuses_zero_requests() -> None:
    x = step_inputs(45, "float32", N=3, T=1, P=8)
    empty = [_t(a[:0]) for a in (x.query, x.key, x.value, x.g_log, x.beta)]
    assert_refused(
        lambda: vllm_fused_recurrent_gated_delta_rule(*empty, initial_state=torch.from_numpy(x.pool),
                                                      ssm_state_indices=torch.zeros(0, dtype=torch.int32)),
        "q.torch", "q", "shape (0, 1, 2, 32)", [x.pool],
    )  # fmt: skip


@pytest.mark.parametrize("check_values", [True, False])
@pytest.mark.parametrize("empty", ["batch", "tokens"])
def test_fla_decode_refuses_an_empty_batch_as_every_drop_in(empty: str, check_values: bool) -> None:
    """FLA's decode with B = 0 (or T = 0) is refused as vLLM's form and the chunk drop-in refuse it, naming q."""
    x = step_inputs(45, "float32", N=3, T=1, P=8)
    cut = (lambda a: a[:0]) if empty == "batch" else (lambda a: a[:, :0])
    q, k, v, g, beta = (_t(cut(a)) for a in (x.query, x.key, x.value, x.g_log, x.beta))
    shape = (0, 1, 2, 32) if empty == "batch" else (3, 0, 2, 32)
    assert_refused(lambda: fused_recurrent_gated_delta_rule(q, k, v, g, beta=beta, output_final_state=True,
                                                            check_values=check_values),
                   "q.torch", "q", f"shape {shape}", [])  # fmt: skip


def test_a_bad_element_is_named_at_the_callers_index() -> None:
    """A NaN in g of the packed row [1, N·T, HV] is reported where the caller put it, not at decode_step's
    [N, T, HV] index."""
    x = step_inputs(46, "float32", N=3, T=2, P=8)
    x.g_log[2, 1, 3] = np.nan  # request 2, token 1: packed token 5
    assert_refused(
        lambda: vllm_fused_recurrent_gated_delta_rule(
            *_vllm_packed(x, 3, 2), initial_state=torch.from_numpy(x.pool), cu_seqlens=torch.tensor([0, 2, 4, 6]),
            ssm_state_indices=torch.tensor([[0, 1], [2, 3], [4, 5]], dtype=torch.int32),
        ),
        "g_log.domain", "g", "value nan at index [0, 5, 3]", [x.pool],
    )  # fmt: skip


# --- gates in another layout with as many elements are refused, not reshaped (item 5) ---


def test_fla_drop_in_refuses_time_major_gates() -> None:
    x = step_inputs(47, "float32", N=3, T=2)
    q, k, v, g, beta = (_t(a) for a in (x.query, x.key, x.value, x.g_log, x.beta))
    time_major = _t(x.g_log.transpose(1, 0, 2))  # [T, B, HV] = (2, 3, 4): six tokens' gates, as [B, T, HV] has
    assert_refused(lambda: fused_recurrent_gated_delta_rule(q, k, v, time_major, beta=beta), "g.torch", "g",
                   "shape (2, 3, 4)", [x.g_log])  # fmt: skip
    assert_refused(lambda: fused_recurrent_gated_delta_rule(q, k, v, g, beta=_t(x.beta.transpose(1, 0, 2))),
                   "beta.torch", "beta", "shape (2, 3, 4)", [x.beta])  # fmt: skip


def test_vllm_drop_in_refuses_time_major_gates() -> None:
    x = step_inputs(48, "float32", N=3, T=2, P=8)
    q, k, v, beta = (_t(a) for a in (x.query, x.key, x.value, x.beta))
    rows = torch.tensor([[0, 1], [2, 3], [4, 5]], dtype=torch.int32)
    assert_refused(
        lambda: vllm_fused_recurrent_gated_delta_rule(q, k, v, _t(x.g_log.transpose(1, 0, 2)), beta,
                                                      initial_state=torch.from_numpy(x.pool), ssm_state_indices=rows),
        "g.torch", "g", "shape (2, 3, 4)", [x.pool],
    )  # fmt: skip


def test_sigmoid_gating_update_refuses_time_major_raw_gates() -> None:
    x = step_inputs(49, "float32", N=3, T=2, P=8)
    q, k, v = (_t(a) for a in (x.query, x.key, x.value))
    rows = torch.tensor([1, 4, 6], dtype=torch.int32)
    a_time_major = _t(x.a.transpose(1, 0, 2))
    error = assert_refused(
        lambda: fused_sigmoid_gating_delta_rule_update(_t(x.A_log), a_time_major, _t(x.dt_bias), 1.0, 20.0, q, k, v,
                                                       _t(x.b), torch.from_numpy(x.pool), rows),
        "a.torch", "a", "shape (2, 3, 4)", [x.pool],
    )  # fmt: skip
    assert "[B, T, HV] = (3, 2, 4) or [B·T, HV] = (6, 4)" in str(error)  # the two forms it takes, and only those


def test_decode_drop_ins_take_check_values() -> None:
    """``check_values=False`` skips the element scans, as ``decode_step``'s does: a caller that guarantees its data
    pays for no scan (here a NaN in a pool row the call reads reaches the output instead of being refused)."""
    x = step_inputs(50, "float32", N=2, T=1, P=4)
    x.pool[1, 0, 0, 0] = np.nan
    rows = torch.tensor([1, 2], dtype=torch.int32)
    q, k, v, g, beta = (_t(a) for a in (x.query, x.key, x.value, x.g_log, x.beta))
    assert_refused(lambda: vllm_fused_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=torch.from_numpy(
        x.pool), ssm_state_indices=rows), "recurrent_state.finite", "initial_state", "pool row 1", [x.pool])  # fmt: skip
    o, _ = vllm_fused_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=torch.from_numpy(x.pool),
                                                 ssm_state_indices=rows, check_values=False)  # fmt: skip
    assert torch.isnan(o[0]).any() and not torch.isnan(o[1]).any()
    o = fused_recurrent_gated_delta_rule(q, k, v, g, beta=beta, initial_state=_t(x.pool[:2]), check_values=False)[0]
    assert torch.isnan(o[1]).any()


# --- the FLA drop-in passes the host's refusals on, in its own terms (items 2, 3) ---


@pytest.mark.parametrize(
    ("bucket", "rule_id", "value"),
    [((6 * C, 129), "bucket.max_sequences", "N=129"), ((512 * C, 4), "bucket.max_chunks", "T=65536 (512 chunks)")],
    ids=["slots", "chunks"],
)
def test_chunk_drop_in_refuses_a_bucket_no_launch_can_run(bucket, rule_id, value) -> None:
    pool = random_pool(6, 63)
    assert_refused(
        lambda: chunk_gated_delta_rule(*_seq_first(packed_tensors(190, 64)), initial_state=torch.from_numpy(pool),
                                       cu_seqlens=torch.tensor([0, 140, 190]), state_indices=torch.tensor([3, 1]),
                                       bucket=bucket, scale=DK**-0.5),
        rule_id, "bucket", value, [pool],
    )  # fmt: skip


def test_chunk_drop_in_refuses_read_rows_without_a_pool() -> None:
    tensors = packed_tensors(190, 66)
    assert_refused(
        lambda: chunk_gated_delta_rule(*_seq_first(tensors), cu_seqlens=torch.tensor([0, 140, 190]),
                                       bucket=(3 * C, 2), read_indices=torch.tensor([-1, 1]), scale=DK**-0.5),
        "read_indices.pool", "read_indices", "2 pool row(s)", list(tensors.values()),
    )  # fmt: skip


# --- every bad sequence named in the caller's layout; check_values taken as the numpy entry points take it (item 8) ---


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the NaN check_values=False lets in
def test_chunk_drop_in_names_every_bad_sequence_and_takes_check_values() -> None:
    tensors = packed_tensors(190, 75)
    tensors["key"][0, 0, 7, 3] = np.nan  # sequence 0
    tensors["g_log"][0, 1, 160] = 0.5  # sequence 2
    pool = random_pool(6, 76)
    call = dict(initial_state=torch.from_numpy(pool), cu_seqlens=torch.tensor([0, 140, 150, 190]),
                state_indices=torch.tensor([3, 5, 1]), bucket=(4 * C, 4), scale=DK**-0.5)  # fmt: skip
    error = assert_refused(lambda: chunk_gated_delta_rule(*_seq_first(tensors), **call), "g_log.domain", "g",
                           "value 0.5 at index [0, 160, 1] (the kernel's `g_log` index [0, 1, 160]) (sequence 2)",
                           [pool])  # fmt: skip
    assert error.sequences == [0, 2]
    assert "`k` value nan at index [0, 7, 0, 3]" in str(error)
    chunk_gated_delta_rule(*_seq_first(tensors), **call, check_values=False)
    assert np.isnan(pool[3]).any() and np.isfinite(pool[5]).all()


# --- a rejection names the drop-in the caller called (item 6) ---


def test_the_drop_ins_name_themselves() -> None:
    x = step_inputs(81, "float32", N=2, T=1, P=4)
    q, k, v, g, beta = (_t(a) for a in (x.query, x.key, x.value, x.g_log, x.beta))
    pool, rows = torch.from_numpy(x.pool), torch.tensor([1, 1], dtype=torch.int32)  # a row named twice
    tensors = packed_tensors(190, 82)
    tensors["g_log"][0, 0, 3] = 1.0
    calls = {
        "gdn_nki.torch.chunk_gated_delta_rule": lambda: chunk_gated_delta_rule(
            *_seq_first(tensors), cu_seqlens=torch.tensor([0, 140, 190])),  # a host rule, restated
        "gdn_nki.torch.chunk_gated_delta_rule (its own rule)": lambda: chunk_gated_delta_rule(q, k, v, g, beta,
                                                                                              head_first=True),
        "gdn_nki.torch.vllm_fused_recurrent_gated_delta_rule": lambda: vllm_fused_recurrent_gated_delta_rule(
            q, k, v, g, beta, initial_state=pool, ssm_state_indices=rows),  # decode_step's rule
        "gdn_nki.torch.fused_recurrent_gated_delta_rule": lambda: fused_recurrent_gated_delta_rule(
            q, k, v, g, gk=g),  # its own rule
        "gdn_nki.torch.fused_sigmoid_gating_delta_rule_update": lambda: fused_sigmoid_gating_delta_rule_update(
            _t(x.A_log), _t(x.a), _t(x.dt_bias), 1.0, 20.0, q, k, v, _t(x.b), pool, rows),
    }  # fmt: skip
    for entry_point, call in calls.items():
        with pytest.raises(ContractError) as info:
            call()
        message = str(info.value)
        assert message.startswith(f"{entry_point.split()[0]} rejected the call"), message
        assert "gdn_cte" not in message and "gdn_step" not in message, message
