"""Rejected calls: every documented rule (``gdn_ref.contract.RULES``, violated by gdn-spec's builders and by a
few more bad inputs of our own) is reported naming the argument, and nothing is written — through the host
``gdn_nki.simulate`` (all rules, ``ContractError``) and through the jitted kernel itself (the trace-time,
host=False rules, stopped by the kernel's assert-style check: the NKI tracer accepts no ``raise``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import gdn_nki
from gdn_nki.common import backend
from gdn_ref.contract import HOST_ONLY_RULES, RULES
from gdn_spec.contract import RULE_CASES, RuleCase, check_inputs, valid_call

Call = dict[str, Any]
DTYPES = ("float32", "bfloat16")


def _host(call: Call) -> Any:
    return gdn_nki.simulate(**call)


def _traced(call: Call) -> Any:
    return backend.simulate(gdn_nki.gdn_cte)(**call)


ENTRY_POINTS: dict[str, Callable[[Call], Any]] = {"host": _host, "traced": _traced}


def _snapshot(call: Call) -> dict[str, bytes]:
    return {name: x.tobytes() for name, x in call.items() if isinstance(x, np.ndarray)}


def _not_an_nki_dtype(call: Call) -> list[str]:
    """Arguments NKI cannot hold as a tensor at all (float64: NKI has no such dtype)."""
    return [name for name, x in call.items() if isinstance(x, np.ndarray) and x.dtype == np.float64]


def _assert_rejected(entry: str, call: Call, rule_id: str, argument: str) -> None:
    """The call raises ContractError listing ``rule_id``, its message names ``argument``, and no array changed.

    Calling the jitted kernel directly with a float64 array never reaches the kernel's checks: the NKI launcher
    refuses to make an HBM tensor of a dtype NKI lacks (nki-cpu raises TypeError naming the dtype). That refusal
    must still come before anything is written.
    """
    before = _snapshot(call)
    if entry == "traced" and _not_an_nki_dtype(call):
        with pytest.raises(TypeError, match="float64"):
            ENTRY_POINTS[entry](call)
        assert _snapshot(call) == before, f"{entry}: a refused launch changed an array"
        return
    if entry == "traced":
        with pytest.raises(AssertionError) as assertion:
            ENTRY_POINTS[entry](call)
        message = str(assertion.value)
        assert f"[{rule_id}]" in message, f"{entry}: expected [{rule_id}] in {message}"
        assert "Fix:" in message, f"{entry}: the message gives no fix: {message}"
    else:
        with pytest.raises(gdn_nki.ContractError) as info:
            ENTRY_POINTS[entry](call)
        ids = [v.rule_id for v in info.value.violations]
        assert rule_id in ids, f"{entry}: expected [{rule_id}], got {ids}"
        message = str(info.value)
    assert f"`{argument}`" in message, f"{entry}: the message does not name {argument}: {message}"
    assert _snapshot(call) == before, f"{entry}: a rejected call changed an array (recurrent_state or an input)"


def _rule_cases() -> list[Any]:
    params = []
    for rc in RULE_CASES:
        for algorithm in rc.algorithms:
            for dtype in DTYPES:
                # A traced kernel sees shapes and dtypes only: the host-only rules are the host's to enforce.
                entries = ("host",) if rc.host_only else tuple(ENTRY_POINTS)
                params.extend(
                    pytest.param(rc, algorithm, dtype, e, id=f"{rc.id}-{algorithm}-{dtype}-{e}") for e in entries
                )
    return params


def test_every_rule_has_a_rejection_case() -> None:
    assert {rc.id for rc in RULE_CASES} == {rule.id for rule in RULES}


@pytest.mark.parametrize(("rule_case", "algorithm", "dtype", "entry"), _rule_cases())
def test_documented_rule_is_rejected(rule_case: RuleCase, algorithm: str, dtype: str, entry: str) -> None:
    bad = rule_case.build(valid_call(algorithm, dtype, seed=3))
    expected = rule_case.violation(bad)
    _assert_rejected(entry, bad, expected.rule_id, expected.argument)


def _with(**changes: Any) -> Callable[[Call], Call]:
    return lambda call: {**call, **changes}


def _astype(name: str, dtype: Any) -> Callable[[Call], Call]:
    return lambda call: {**call, name: call[name].astype(dtype)}


def _tokens(S: int) -> Callable[[Call], Call]:
    def build(call: Call) -> Call:
        out = dict(call)
        for name in ("query", "key", "value", "g_log", "beta"):
            x = call[name]
            reps = -(-S // x.shape[2])
            out[name] = np.ascontiguousarray(np.concatenate([x] * reps, axis=2)[:, :, :S])
        return out

    return build


def _state_batch_plus_one(call: Call) -> Call:
    state = call["recurrent_state"]
    return {**call, "recurrent_state": np.concatenate([state, state], axis=0)}


def _gates_per_key_head(call: Call) -> Call:
    return {**call, "g_log": np.ascontiguousarray(call["g_log"][:, :1])}  # Hk = 1 rows for Hv = 2 value heads


def _query_as_list(call: Call) -> Call:
    return {**call, "query": call["query"].tolist()}


def _two_violations(call: Call) -> Call:
    return {**call, "beta": call["beta"].astype(np.float64), "group_size": 0}


# (id, base algorithm, builder, rule expected, argument named)
EXTRA_CASES = (
    ("group_size_17", "schur", _with(group_size=17), "group_size.range", "group_size"),
    ("group_size_float", "schur", _with(group_size=2.0), "group_size.range", "group_size"),
    ("group_size_bool", "schur", _with(group_size=True), "group_size.range", "group_size"),
    ("scale_inf", "schur", _with(scale=float("inf")), "scale.number", "scale"),
    ("scale_string", "neumann", _with(scale="0.1"), "scale.number", "scale"),
    ("algorithm_none", "schur", _with(algorithm=None), "algorithm.known", "algorithm"),
    ("state_bf16", "schur", _astype("recurrent_state", ml_dtypes.bfloat16), "recurrent_state.dtype", "recurrent_state"),
    ("state_batch", "schur", _state_batch_plus_one, "recurrent_state.shape", "recurrent_state"),
    ("beta_float64", "neumann", _astype("beta", np.float64), "beta.dtype", "beta"),
    ("g_log_per_key_head", "schur", _gates_per_key_head, "g_log.shape", "g_log"),
    ("query_int32", "schur", _astype("query", np.int32), "query.dtype", "query"),
    ("mask_pack_bf16", "schur", _astype("mask_pack", ml_dtypes.bfloat16), "mask_pack.dtype", "mask_pack"),
    ("schur_S64", "schur", _tokens(64), "seq.divisible", "query"),
    ("neumann_S96", "neumann", _tokens(96), "seq.divisible", "query"),
    ("query_list", "neumann", _query_as_list, "query.rank", "query"),
    ("two_at_once_beta", "schur", _two_violations, "beta.dtype", "beta"),
    ("two_at_once_group", "schur", _two_violations, "group_size.range", "group_size"),
)


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
@pytest.mark.parametrize(
    ("algorithm", "builder", "rule_id", "argument"), [c[1:] for c in EXTRA_CASES], ids=[c[0] for c in EXTRA_CASES]
)
def test_more_bad_inputs_are_rejected(
    algorithm: str, builder: Callable[[Call], Call], rule_id: str, argument: str, entry: str
) -> None:
    bad = builder(valid_call(algorithm, "float32", seed=4))
    assert rule_id in [v.rule_id for v in check_inputs(**bad)], "the case does not break the rule it claims to"
    _assert_rejected(entry, bad, rule_id, argument)


def test_host_only_rules_are_the_documented_pair() -> None:
    """The traced kernel skips exactly the rules that need tensor contents; simulate runs them (tested above)."""
    scans = {
        "g_log.domain",
        "beta.domain",
        *(f"{n}.finite" for n in ("query", "key", "value", "beta", "recurrent_state")),
    }
    assert frozenset({"mask_pack.contents", "recurrent_state.writable", *scans}) == HOST_ONLY_RULES


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_valid_base_calls_are_accepted(entry: str) -> None:
    """The calls the rejection cases start from run (so a rejection is the rule's doing, not the base call's)."""
    for algorithm in ("schur", "neumann"):
        call = valid_call(algorithm, "float32", seed=3)
        out, state = ENTRY_POINTS[entry](call)
        assert out.shape == call["value"].shape and np.isfinite(out).all() and np.isfinite(state).all()


class _NkiStyleDtype:
    """A dtype object as a real NKI tensor handle may carry: not numpy, a ``name`` and a dotted ``str``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return f"nki.language.{self.name}"


class _StrOnlyDtype:
    def __init__(self, name: str) -> None:
        self._name = name

    def __str__(self) -> str:
        return f"nki.language.{self._name}"


@pytest.mark.nki_cpu_only
@pytest.mark.parametrize("name", ["float32", "bfloat16", "float16", "int32", "uint8", "float8_e4m3"])
def test_dtype_reading_matches_nki_cpu(name: str) -> None:
    """``validate`` reads a tensor's dtype the same way whether it is nki-cpu's (a numpy dtype), a numpy / ml_dtypes
    type, a name string, or an NKI-style dtype object."""
    from gdn_ref.contract import dtype_name

    interpreter = getattr(backend.nl, name)  # nki-cpu's nl dtype: a numpy dtype
    assert dtype_name(interpreter) == name
    assert dtype_name(interpreter.type) == name  # the scalar type (np.float32, ml_dtypes.bfloat16, ...)
    for stand_in in (name, f"nki.language.{name}", _NkiStyleDtype(name), _StrOnlyDtype(name)):
        assert dtype_name(stand_in) == name, stand_in


def test_validate_reads_nki_style_dtypes() -> None:
    """The trace-time contract check rejects a bf16 ``beta`` whose dtype is an NKI-style object, naming it."""
    from types import SimpleNamespace

    from gdn_ref.contract import validate

    call = valid_call("schur", "bfloat16")
    handles = {
        name: SimpleNamespace(shape=x.shape, dtype=_NkiStyleDtype(np.dtype(x.dtype).name))
        for name, x in call.items()
        if isinstance(x, np.ndarray)
    }
    assert validate(**{**call, **handles}, host=False) == []
    handles["beta"] = SimpleNamespace(shape=call["beta"].shape, dtype=_NkiStyleDtype("bfloat16"))
    ids = [v.rule_id for v in validate(**{**call, **handles}, host=False)]
    assert ids == ["beta.dtype"], ids
