"""The element scans (contract.VALUE_RULES): g_log <= 0 and not NaN, beta in [0, 1], everything finite, -inf
accepted.

Each rejection names the argument and the first offending index, and writes nothing.
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

from gdn_ref import ContractError, build_mask_pack, gdn_cte
from gdn_ref.contract import VALUE_RULES, check_values, first_bad_index, validate
from ref_inputs import make_inputs

PACK = build_mask_pack()


def _call(dtype=np.float32) -> dict:
    x = make_inputs(91, S=128, Hk=1, Hv=2).astype(dtype)
    return dict(
        query=x.query, key=x.key, value=x.value, g_log=x.g_log, beta=x.beta, scale=x.scale,
        algorithm="schur", mask_pack=PACK, group_size=8, recurrent_state=x.initial_state.copy(),
    )  # fmt: skip


BAD_VALUES = [
    ("g_log", "g_log.domain", 0.05),
    ("g_log", "g_log.domain", np.inf),
    ("g_log", "g_log.domain", np.nan),
    *((name, f"{name}.finite", bad) for name in ("query", "key", "value") for bad in (np.nan, np.inf, -np.inf)),
    ("beta", "beta.domain", 1.5),
    ("beta", "beta.domain", -0.25),
    ("beta", "beta.finite", np.nan),
    ("beta", "beta.finite", -np.inf),
    ("recurrent_state", "recurrent_state.finite", np.nan),
    ("recurrent_state", "recurrent_state.finite", np.inf),
]


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("name", "rule_id", "bad"), BAD_VALUES, ids=[f"{n}={b}" for n, _, b in BAD_VALUES])
def test_bad_value_is_rejected_with_its_index_and_nothing_is_written(name, rule_id, bad, dtype) -> None:
    call = _call(dtype)
    where = (0, 0 if name in ("query", "key") else 1, 27, 3)[: call[name].ndim]
    call[name][where] = bad
    before = {k: v.tobytes() for k, v in call.items() if isinstance(v, np.ndarray)}
    with pytest.raises(ContractError) as info:
        gdn_cte(**call)
    message = str(info.value)
    assert f"[{rule_id}]" in message and f"`{name}`" in message
    assert re.search(rf"at index \[{', '.join(map(str, where))}\]", message), message
    assert {k: v.tobytes() for k, v in call.items() if isinstance(v, np.ndarray)} == before


def test_minus_inf_gate_is_accepted() -> None:
    call = _call()
    call["g_log"][0, 0, 5] = -np.inf
    out, state = gdn_cte(**call)
    assert np.isfinite(out).all() and np.isfinite(state).all()


@pytest.mark.parametrize("strength", [0.0, 1.0])
def test_beta_end_points_are_accepted(strength: float) -> None:
    """β = 0 (a padding token) and β = 1 (where an fp32 sigmoid saturates) are valid: the tokens write nothing
    or replace the value along their key."""
    call = _call()
    call["beta"][0, 1, 40:60] = strength
    assert validate(**call) == []
    out, state = gdn_cte(**call)
    assert np.isfinite(out).all() and np.isfinite(state).all()


def test_swapped_g_log_and_beta_is_rejected() -> None:
    call = _call()
    call["g_log"], call["beta"] = call["beta"], call["g_log"]
    with pytest.raises(ContractError, match=r"g_log\.domain"):
        gdn_cte(**call)


def test_opt_out_skips_only_the_scans() -> None:
    call = _call()
    call["value"][0, 0, 0, 0] = np.nan
    assert [v.rule_id for v in validate(**call)] == ["value.finite"]
    assert validate(**call, values=False) == []
    gdn_cte(**call, check_values=False)  # the caller vouched for its data: no scan, no error
    call["group_size"] = 0
    assert [v.rule_id for v in validate(**call, values=False)] == ["group_size.range"]


def test_check_values_is_the_scan_alone_and_finds_the_first_index() -> None:
    call = _call()
    call["key"][0, 0, 9, 1] = np.inf
    call["key"][0, 0, 3, 2] = np.nan  # earlier in C order: reported
    found = check_values(call["query"], call["key"], call["value"], call["g_log"], call["beta"])
    assert [(v.rule_id, v.value) for v in found] == [("key.finite", "value nan at index [0, 0, 3, 2]")]
    assert {r.split(".")[1] for r in VALUE_RULES} == {"domain", "finite"}


ARGUMENTS = ("query", "key", "value", "g_log", "beta", "recurrent_state")


@pytest.mark.parametrize("name", ARGUMENTS)
def test_check_values_scans_every_argument(name: str) -> None:
    """The scan the entry points call on their own (gdn-nki's prefill_varlen) finds a NaN in each argument it
    takes, beta and the state included; gdn_cte's rejections above run through ``validate`` instead."""
    call = _call()
    where = (0, 0 if name in ("query", "key") else 1, 27, 3)[: call[name].ndim]
    call[name][where] = np.nan
    found = check_values(*(call[n] for n in ARGUMENTS))
    rule = "g_log.domain" if name == "g_log" else f"{name}.finite"
    assert [(v.rule_id, v.value) for v in found] == [(rule, f"value nan at index [{', '.join(map(str, where))}]")]


def test_first_bad_index_crosses_scan_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    import gdn_ref.contract as contract

    monkeypatch.setattr(contract, "SCAN_BLOCK", 7)
    x = np.zeros((3, 5, 4), np.float32)
    x[2, 1, 3] = np.nan
    assert first_bad_index(x, np.isnan) == (2, 1, 3)
    assert first_bad_index(x[:, ::2], np.isnan) is None  # non-contiguous view: (2, 1) is skipped
    assert first_bad_index(np.zeros(0, np.float32), np.isnan) is None


def test_rule_with_broken_prerequisite_stays_silent() -> None:
    """Hk = 0 breaks query.rank; the head-divisibility rule must not divide by it."""
    call = _call()
    call["query"] = np.zeros((1, 0, 128, 32), np.float32)
    call["key"] = call["query"].copy()
    found = [v.rule_id for v in validate(**call)]
    assert "query.rank" in found and "heads.gqa_divisible" not in found
