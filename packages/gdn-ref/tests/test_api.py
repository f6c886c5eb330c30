"""The host gdn_cte: dtypes, the recurrent_state aliasing contract, rejection without side effects."""

from __future__ import annotations

from importlib.metadata import entry_points

import ml_dtypes
import numpy as np
import pytest

import gdn_ref
from gdn_ref import ContractError, build_mask_pack, chunked, gdn_cte, recurrent
from ref_inputs import assert_close, make_inputs

PACK = build_mask_pack()


def _call(x, algorithm: str = "schur", state: np.ndarray | None = None, **overrides):
    kwargs = dict(scale=x.scale, algorithm=algorithm, mask_pack=PACK if algorithm == "schur" else None)
    kwargs.update(overrides)
    return gdn_cte(x.query, x.key, x.value, x.g_log, x.beta, recurrent_state=state, **kwargs)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("algorithm", ["schur", "neumann"])
def test_output_dtypes_and_accuracy(algorithm: str, dtype) -> None:
    heads = dict(Hk=2, Hv=4) if algorithm == "schur" else dict(Hk=2, Hv=2)
    x = make_inputs(41, S=256, with_state=False, **heads).astype(dtype)
    out, state = _call(x, algorithm)
    assert out.dtype == np.dtype(dtype) and out.shape == x.value.shape
    assert state.dtype == np.float32 and state.shape == (1, heads["Hv"], 32, 16)
    out_ref, state_ref = recurrent(*x.args())
    bound = 1e-5 if dtype == np.float32 else 2e-2  # see test_chunked.TOLERANCES; bf16 adds the output cast
    assert_close(out, out_ref, bound, 5e-2, "out")
    assert_close(state, state_ref, bound, 5e-2, "state")


def test_bf16_call_is_the_bf16_operand_emulation() -> None:
    x = make_inputs(42, S=256, with_state=False).astype(ml_dtypes.bfloat16)
    out, state = _call(x)
    expected_out, expected_state = chunked(*x.args(), bf16_operands=True, mask_pack=PACK)
    np.testing.assert_array_equal(out, expected_out.astype(ml_dtypes.bfloat16))
    np.testing.assert_array_equal(state, expected_state)


def test_supplied_state_is_the_returned_object_updated_in_place() -> None:
    x = make_inputs(43, S=256).astype(np.float32)
    buffer = x.initial_state.copy()
    out, returned = _call(x, state=buffer)
    assert returned is buffer
    out_ref, state_ref = recurrent(*x.args())  # incoming contents are the initial state
    assert_close(out, out_ref, 1e-5, 1e-5, "out from supplied state")
    assert_close(buffer, state_ref, 1e-5, 1e-5, "state written in place")


def test_omitted_state_starts_from_zero_and_is_fresh() -> None:
    x = make_inputs(44, S=128, with_state=False).astype(np.float32)
    out_omitted, state_omitted = _call(x)
    zeros = np.zeros((1, 4, 32, 16), np.float32)
    out_zeros, state_zeros = _call(x, state=zeros)
    np.testing.assert_array_equal(out_omitted, out_zeros)
    np.testing.assert_array_equal(state_omitted, state_zeros)
    assert state_omitted is not zeros and np.any(state_omitted != 0)


def test_group_size_does_not_change_the_result() -> None:
    x = make_inputs(45, S=384, with_state=False).astype(np.float32)
    reference = _call(x)
    for group_size in (1, 3, 16):
        for got, want in zip(_call(x, group_size=group_size), reference, strict=True):
            np.testing.assert_array_equal(got, want)


REJECTED_CALLS = {
    "beta_bf16": lambda x: dict(beta=x.beta.astype(ml_dtypes.bfloat16)),
    "g_log_float64": lambda x: dict(g_log=x.g_log.astype(np.float64)),
    "key_dtype_mismatch": lambda x: dict(key=x.key.astype(ml_dtypes.bfloat16)),
    "seq_not_divisible": lambda x: {name: a[:, :, :100] for name, a in _tensors(x).items()},
    "mask_pack_missing": lambda x: dict(mask_pack=None),
    "mask_pack_corrupted": lambda x: dict(mask_pack=np.zeros_like(PACK)),
    "unknown_algorithm": lambda x: dict(algorithm="cholesky"),
    "group_size_zero": lambda x: dict(group_size=0),
    "group_size_too_big": lambda x: dict(group_size=17),
    "neumann_with_state": lambda x: dict(algorithm="neumann", mask_pack=None),
    "head_dim_too_big": lambda x: dict(query=np.zeros((1, 2, 128, 129), np.float32)),
}


def _tensors(x) -> dict[str, np.ndarray]:
    return dict(query=x.query, key=x.key, value=x.value, g_log=x.g_log, beta=x.beta)


@pytest.mark.parametrize("case", sorted(REJECTED_CALLS))
def test_rejected_call_leaves_state_bytes_untouched(case: str) -> None:
    x = make_inputs(46, S=128, Hk=2, Hv=4).astype(np.float32)
    state = x.initial_state.copy()
    before = state.tobytes()
    call = dict(**_tensors(x), scale=x.scale, algorithm="schur", mask_pack=PACK, group_size=8)
    call.update(REJECTED_CALLS[case](x))
    with pytest.raises(ContractError) as info:
        gdn_cte(**call, recurrent_state=state)
    assert isinstance(info.value, ValueError) and "Fix:" in str(info.value)
    assert state.tobytes() == before


def test_capabilities_and_entry_point_registration() -> None:
    assert gdn_cte.gdn_spec_capabilities == {
        "name": "gdn-ref",
        "algorithms": ("schur", "neumann"),
        "dtypes": ("float32", "bfloat16"),
    }
    registered = {ep.name: ep.value for ep in entry_points(group="gdn_spec.implementations")}
    assert registered.get("gdn-ref") == "gdn_ref:gdn_cte"
    assert gdn_ref.gdn_cte is gdn_cte
