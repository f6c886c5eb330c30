"""The conv entry points' rules fire on exactly what they name, and on nothing in a valid call."""

from __future__ import annotations

import numpy as np
import pytest

from gdn_ref.conv_rules import conv_index_violations, conv_prefill_violations, conv_step_violations

F32, I32 = np.float32, np.int32


def _step(**change):
    call = dict(x=np.zeros((2, 3, 32), F32), conv_pool=np.zeros((6, 32, 3), F32), weight=np.zeros((32, 4), F32),
                bias=np.zeros(32, F32), state_indices=np.zeros((2, 3), I32), num_accepted_tokens=np.ones(2, I32),
                activation="silu")  # fmt: skip
    call.update(change)
    return {v.rule_id for v in conv_step_violations(**call)}


STEP_CASES = {
    "conv.x": dict(x=np.zeros((2, 32), F32)),
    "conv.channels": dict(
        x=np.zeros((2, 3, 24), F32),
        weight=np.zeros((24, 4), F32),
        bias=np.zeros(24, F32),
        conv_pool=np.zeros((6, 24, 3), F32),
    ),
    "conv.width": dict(weight=np.zeros((32, 6), F32), conv_pool=np.zeros((6, 32, 5), F32)),
    "conv.window": dict(weight=np.zeros((32, 5), F32)),
    "conv.weight_channels": dict(weight=np.zeros((16, 4), F32)),
    "conv.bias": dict(bias=np.zeros(16, F32)),
    "conv.pool_channels": dict(conv_pool=np.zeros((6, 48, 3), F32)),
    "conv.pool_dtype": dict(conv_pool=np.zeros((6, 32, 3), np.float64)),
    "conv.activation": dict(activation="gelu"),
    "conv.state_indices": dict(state_indices=np.zeros((2, 3), np.int64)),
    "conv.num_accepted_tokens": dict(num_accepted_tokens=np.ones((2, 1), I32)),
    # vLLM's in-row form ([N] rows with num_accepted_tokens): a row of L = 3 < W − 2 + T = 5 entries
    "conv.in_row_window": dict(state_indices=np.zeros(2, I32)),
}


def test_the_in_row_form_takes_a_row_of_w_minus_2_plus_t() -> None:
    """[N] rows with num_accepted_tokens: a row of W − 2 + T = 5 entries (vLLM's W − 1 + num_spec) or more is well
    formed, one shorter is refused naming conv_pool and the length it needs."""
    assert _step(state_indices=np.zeros(2, I32), conv_pool=np.zeros((6, 32, 5), F32)) == set()
    found = conv_step_violations(np.zeros((2, 3, 32), F32), np.zeros((6, 32, 4), F32), np.zeros((32, 4), F32), None,
                                 np.zeros(2, I32), np.ones(2, I32), "silu")  # fmt: skip
    assert [(v.rule_id, v.argument) for v in found] == [("conv.in_row_window", "conv_pool")]
    assert "[P, C, 5]" in found[0].fix


def test_a_valid_step_breaks_nothing() -> None:
    assert _step() == set()


@pytest.mark.parametrize("rule", sorted(STEP_CASES))
def test_each_step_rule_fires_alone(rule: str) -> None:
    assert _step(**STEP_CASES[rule]) == {rule}


def test_index_values_are_named_for_the_conv_entry_point() -> None:
    found = conv_index_violations(np.array([[0, 1], [1, 2]]), None, 6, 2)
    assert [(v.rule_id, v.api) for v in found] == [("state_indices.distinct", "conv_decode_step")]


def _prefill(**change):
    call = dict(x=np.zeros((128, 32), F32), conv_pool=np.zeros((6, 32, 3), F32), weight=np.zeros((32, 4), F32),
                bias=None, cu_seqlens=np.array([0, 5, 9], I32), state_indices=np.array([0, 1], I32),
                activation="silu", checkpoint_every=128, checkpoint_indices=np.full((2, 1), -1, I32),
                read_indices=None)  # fmt: skip
    call.update(change)
    return {v.rule_id for v in conv_prefill_violations(**call)}


PREFILL_CASES = {
    "conv.x": dict(x=np.zeros((100, 32), F32)),
    "conv.state_indices": dict(state_indices=np.zeros(200, I32)),
    "conv.cu_seqlens": dict(cu_seqlens=np.array([0, 5], I32)),
    "conv.read_indices": dict(read_indices=np.zeros(3, I32)),
    "conv.checkpoint_every": dict(checkpoint_every=2),
    "conv.checkpoint_indices": dict(checkpoint_indices=np.zeros((3, 1), I32)),
}


def test_a_valid_prefill_breaks_nothing() -> None:
    assert _prefill() == set()


@pytest.mark.parametrize("rule", sorted(PREFILL_CASES))
def test_each_prefill_rule_fires_alone(rule: str) -> None:
    assert _prefill(**PREFILL_CASES[rule]) == {rule}


def test_an_entry_point_without_the_in_row_form_keeps_counts_to_per_token_rows() -> None:
    """``in_row=False`` (the fused block: its recurrent pool has no in-row form): [N] rows with num_accepted_tokens
    are refused naming num_accepted_tokens, whatever the row length."""
    found = conv_step_violations(np.zeros((2, 3, 32), F32), np.zeros((6, 32, 5), F32), np.zeros((32, 4), F32), None,
                                 np.zeros(2, I32), np.ones(2, I32), "silu", in_row=False)  # fmt: skip
    assert [(v.rule_id, v.argument) for v in found] == [("conv.num_accepted_tokens", "num_accepted_tokens")]
