"""gdn_ref.block_rules: a fused decode-block call's rules fire on exactly what they name (shapes only, and the index
values on the host), each violation naming the argument and the entry point."""

from __future__ import annotations

import numpy as np
import pytest

from gdn_ref.block_rules import BLOCK, MAX_BLOCK_TOKENS, block_violations

HK, HV, DK, DV, E, W, P = 2, 4, 16, 8, 128, 4, 6
C = 2 * HK * DK + HV * DV


def _call(**change):
    f32 = np.float32
    call = dict(hidden=np.zeros((2, 1, E), f32), w_qkv=np.zeros((E, C), f32), w_z=np.zeros((E, HV * DV), f32),
                w_b=np.zeros((E, HV), f32), w_a=np.zeros((E, HV), f32), conv_weight=np.zeros((C, W), f32),
                conv_bias=None, A_log=np.zeros(HV, f32), dt_bias=np.zeros(HV, f32), norm_weight=np.ones(DV, f32),
                conv_pool=np.zeros((P, C, W - 1), f32), state_pool=np.zeros((P, HV, DK, DV), f32),
                state_indices=np.array([0, 3], np.int32), num_accepted_tokens=None)  # fmt: skip
    call.update(change)
    return call


def test_a_valid_call_has_no_violation():
    assert block_violations(**_call()) == []
    assert block_violations(**_call(state_indices=np.array([-1, 5], np.int32))) == []


@pytest.mark.parametrize(("change", "rule", "argument"), [
    ({"w_qkv": np.zeros((E, C + 2), np.float32), "conv_weight": np.zeros((C + 2, W), np.float32),
      "conv_pool": np.zeros((P, C + 2, W - 1), np.float32)}, "block.channels", "w_qkv"),
    ({"w_z": np.zeros((E, HV * DV + 1), np.float32)}, "block.z_width", "w_z"),
    ({"conv_pool": np.zeros((P + 1, C, W - 1), np.float32)}, "block.pool_rows", "conv_pool"),
    ({"conv_pool": np.zeros((P, C, W - 2), np.float32)}, "conv.window", "conv_pool"),
    ({"conv_weight": np.zeros((C, 6), np.float32), "conv_pool": np.zeros((P, C, 5), np.float32)}, "conv.width",
     "conv_weight"),
    ({"conv_bias": np.zeros(C + 1, np.float32)}, "conv.bias", "conv_bias"),
    ({"state_indices": np.array([2, 2], np.int32)}, "state_indices.distinct", "state_indices"),
    ({"state_indices": np.array([2, P], np.int32)}, "state_indices.range", "state_indices"),
])  # fmt: skip
def test_each_rule_names_its_argument(change, rule, argument):
    found = block_violations(**_call(**change))
    assert [(v.rule_id, v.argument) for v in found] == [(rule, argument)], found
    assert found[0].api == BLOCK


def test_the_hidden_size_and_the_token_count():
    n = MAX_BLOCK_TOKENS + 1
    wide = {w: np.zeros((E + 64, k), np.float32) for w, k in (("w_qkv", C), ("w_z", HV * DV), ("w_b", HV), ("w_a", HV))}
    found = block_violations(**_call(hidden=np.zeros((2, 1, E + 64), np.float32), **wide))
    assert [v.rule_id for v in found] == ["block.hidden_size"]
    found = block_violations(**_call(hidden=np.zeros((n, 1, E), np.float32), state_indices=np.full(n, -1, np.int32)),
                             host=False)  # fmt: skip
    assert [v.rule_id for v in found] == ["block.tokens"]
