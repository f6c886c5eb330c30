"""The decode family's own machinery: decode capabilities, family resolution, cases and their oracle, and the
rejection cases each breaking the rule they name."""

from __future__ import annotations

import numpy as np
import pytest

from gdn_ref.contract import validate_step
from gdn_ref.decode import decode_steps
from gdn_spec.decode.capabilities import DecodeCapabilities
from gdn_spec.decode.cases import Addressing, DecodeGeometry, expected, make_decode_case
from gdn_spec.decode.impl import is_decode, resolve_family
from gdn_spec.decode.rejections import CASES, valid_call
from gdn_spec.impl import ImplementationError

GEOMETRY = DecodeGeometry(N=3, T=3, Hk=2, Hv=4, Dk=16, Dv=8)


def test_capabilities_default_to_everything_and_check_every_key() -> None:
    caps = DecodeCapabilities.from_mapping({"gating": {"fused"}, "max_tokens": np.int64(1)}, "k")
    assert (
        caps.gating == ("fused",) and caps.max_tokens == 1 and caps.padding and caps.dtypes == ("float32", "bfloat16")
    )
    assert caps.lacks("gating", "precomputed") == "k declares gating=('fused',)"
    for bad, words in (
        ({"paddding": True}, "did you mean 'padding'"),
        ({"padding": "no"}, "must be a bool"),
        ({"dtypes": "float16"}, "must be a non-empty collection"),
        ({"max_tokens": 0}, "positive int"),
        ({"example_scale": 2}, r"in \(0, 1\]"),
    ):
        with pytest.raises(ImplementationError, match=words):
            DecodeCapabilities.from_mapping(bad, "k")


def test_family_is_detected_from_the_declaration_or_the_adapter() -> None:
    assert is_decode(resolve_family("decode_mutants:CORRECT"))
    assert not is_decode(resolve_family("mutants:CORRECT"))
    assert is_decode(resolve_family("mutants:CORRECT", family="decode"))  # what the user asked for
    with pytest.raises(ImplementationError, match="prefill adapter"):
        resolve_family("decode_mutants:CORRECT", adapter="fla-torch")
    with pytest.raises(ImplementationError, match="decode adapter"):
        resolve_family("mutants:CORRECT", adapter="hf-decode", family="prefill")
    with pytest.raises(ImplementationError, match="unknown adapter"):
        resolve_family("mutants:CORRECT", adapter="sglang-decode", family="decode")


@pytest.mark.parametrize("addressing", [Addressing(), Addressing(per_token=True, accepted=True, padding=1),
                                        Addressing(per_token=True, padding=1, last_row_live=True)])  # fmt: skip
def test_a_case_addresses_the_pool_as_declared(addressing: Addressing) -> None:
    geometry = GEOMETRY if addressing.per_token else DecodeGeometry(3, 1, 2, 4, 16, 8)
    case = make_decode_case("random", geometry, "float32", 3, addressing=addressing)
    rows = case.call["state_indices"].reshape(geometry.N, -1)
    assert (rows[rows[:, 0] < 0] == -1).all() and len(case.live) == geometry.N - addressing.padding
    live_rows = rows[case.live].reshape(-1)
    assert len(set(live_rows.tolist())) == live_rows.size  # distinct rows
    last = case.pool_before.shape[0] - 1
    assert (last in live_rows) == addressing.last_row_live
    assert validate_step({k: v for k, v in case.call.items() if k not in ("scale", "use_qk_l2norm")}) == []


def test_the_expectation_is_the_oracle_token_by_token() -> None:
    """expected() writes each live request's state after token t to row [n, t] and reads row [n, accepted - 1]:
    checked against decode_steps run request by request."""
    case = make_decode_case("random", GEOMETRY, "float32", 9, addressing=Addressing(per_token=True, accepted=True))
    out, pool, _ = expected(case)
    v = case.values
    for i, n in enumerate(case.live):
        start = case.pool_before[case.read_rows[n]][None].astype(np.float64)
        o, states = decode_steps(v["query"][n : n + 1], v["key"][n : n + 1], v["value"][n : n + 1],
                                 v["g_log"][n : n + 1], v["beta"][n : n + 1], case.call["scale"], start)  # fmt: skip
        assert np.allclose(out[i], o[0])
        assert np.allclose(pool[case.call["state_indices"][n]], states[0])


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_each_rejection_case_breaks_the_rule_it_names(case) -> None:
    """gdn-ref's step contract flags every case's call, naming the case's argument (the state pool's
    writability and NaN in a row to be read are the host's checks: gdn_nki.decode_step)."""
    if case.id in ("pool_read_only", "nan_in_read_row"):
        pytest.skip("checked by the host entry point, not validate_step")
    bad = case.build(valid_call(DecodeCapabilities("ref"), case, DecodeGeometry(3, 1, 2, 4, 32, 16)))
    tensors = {k: v for k, v in bad.items() if k not in ("scale", "use_qk_l2norm")}
    violations = validate_step(tensors, bad["scale"], bad["use_qk_l2norm"])
    assert case.argument in {v.argument for v in violations}, violations
