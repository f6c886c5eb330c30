"""A finite call never commits a non-finite result: un-normalised keys (β·‖k‖² > 2) overflow the recurrence, and every
host entry point that publishes states refuses the call naming `key` and the fix, with nothing written."""

from __future__ import annotations

import numpy as np
import pytest

import gdn_nki
from gdn_nki.host import buckets
from gdn_ref.contract import ContractError

HEADS, DK, DV, TOKENS = 1, 32, 16, 128  # β = 1, ‖k‖² ≈ 32: |1 − β‖k‖²| ≈ 31 per token, past fp32 within 30 tokens


def _packed(normalised: bool, seed: int = 0, tokens: int = TOKENS) -> dict[str, np.ndarray]:
    """Head-major packed tensors of one sequence: standard-normal keys, unit ones when ``normalised``."""
    rng = np.random.default_rng(seed)
    key = rng.standard_normal((1, HEADS, tokens, DK))
    query = rng.standard_normal((1, HEADS, tokens, DK))
    if normalised:
        key /= np.linalg.norm(key, axis=-1, keepdims=True)
        query /= np.linalg.norm(query, axis=-1, keepdims=True)
    return dict(
        query=query.astype(np.float32),
        key=key.astype(np.float32),
        value=rng.standard_normal((1, HEADS, tokens, DV)).astype(np.float32),
        g_log=np.full((1, HEADS, tokens), -0.01, np.float32),
        beta=np.ones((1, HEADS, tokens), np.float32),
    )


def _pool() -> np.ndarray:
    return np.random.default_rng(1).standard_normal((3, HEADS, DK, DV)).astype(np.float32)


def _assert_overflow_rejected(error: ContractError, argument: str = "key") -> None:
    (violation,) = error.violations
    assert violation.rule_id == "recurrence.overflow"
    assert violation.argument == argument
    assert "largest β·‖k‖² = " in violation.value
    strength = float(violation.value.split("= ")[1].split(" ")[0])
    assert strength > 2  # the expanding regime the rule names
    assert "use_qk_l2norm" in violation.fix and "L2-normalise q and k" in violation.fix


@pytest.fixture(autouse=True)
def _no_configured_buckets() -> None:
    buckets.configure_buckets([])
    yield
    buckets.configure_buckets([])


@pytest.mark.parametrize("bucket", [None, (TOKENS, 1)], ids=["trace_time", "bucketed"])
def test_prefill_varlen_overflow_is_refused_and_the_pool_is_untouched(bucket: tuple[int, int] | None) -> None:
    pool = _pool()
    before = pool.copy()
    with pytest.raises(ContractError) as caught:
        gdn_nki.prefill_varlen(**_packed(False), cu_seqlens=np.array([0, TOKENS]), recurrent_state=pool,
                               state_indices=np.array([1]), bucket=bucket)  # fmt: skip
    _assert_overflow_rejected(caught.value)
    assert caught.value.entry_point == "gdn_nki.prefill_varlen"
    np.testing.assert_array_equal(pool, before)


def test_bucketed_checkpoints_are_not_written_on_overflow() -> None:
    pool = _pool()
    before = pool.copy()
    with pytest.raises(ContractError) as caught:
        gdn_nki.prefill_varlen(**_packed(False, tokens=2 * TOKENS), cu_seqlens=np.array([0, 2 * TOKENS]),
                               recurrent_state=pool, state_indices=np.array([1]), checkpoint_every=TOKENS,
                               checkpoint_indices=np.array([[2, 0]]))  # fmt: skip
    _assert_overflow_rejected(caught.value)
    np.testing.assert_array_equal(pool, before)


@pytest.mark.parametrize("entry", ["simulate", "prefill"])
def test_simulate_and_prefill_refuse_overflow_with_the_state_untouched(entry: str) -> None:
    state = _pool()[:1]
    before = state.copy()
    args = _packed(False, tokens=TOKENS if entry == "simulate" else TOKENS - 5)
    kwargs = {"mask_pack": gdn_nki.build_mask_pack()} if entry == "simulate" else {}
    with pytest.raises(ContractError) as caught:
        getattr(gdn_nki, entry)(**args, recurrent_state=state, **kwargs)
    _assert_overflow_rejected(caught.value)
    np.testing.assert_array_equal(state, before)


def test_normalised_keys_still_complete_and_commit() -> None:
    pool = _pool()
    out, got = gdn_nki.prefill_varlen(**_packed(True), cu_seqlens=np.array([0, TOKENS]), recurrent_state=pool,
                                      state_indices=np.array([1]))  # fmt: skip
    assert got is pool and np.isfinite(out).all() and np.isfinite(pool).all()
    assert not np.array_equal(pool[1], _pool()[1])  # the row was committed


def test_check_values_false_trusts_the_caller_and_commits() -> None:
    pool = _pool()
    gdn_nki.prefill_varlen(**_packed(False), cu_seqlens=np.array([0, TOKENS]), recurrent_state=pool,
                           state_indices=np.array([1]), check_values=False)  # fmt: skip
    assert not np.isfinite(pool[1]).all()  # trusted: the overflow is the caller's, as documented


def _decode_call(normalised: bool) -> dict[str, np.ndarray]:
    """One request of 96 tokens from a pool row, token-major."""
    packed = _packed(normalised, tokens=96)
    token_major = {name: np.ascontiguousarray(np.moveaxis(x, 1, 2)) for name, x in packed.items()}
    return dict(
        query=token_major["query"], key=token_major["key"], value=token_major["value"],
        g_log=token_major["g_log"], beta=token_major["beta"],
    )  # fmt: skip


@pytest.mark.parametrize("use_qk_l2norm", [False, True])
def test_decode_step_refuses_overflow_and_puts_the_pool_back(use_qk_l2norm: bool) -> None:
    call = _decode_call(False)
    pool = np.zeros((3, HEADS, DK, DV), np.float32)
    rows = np.array([1], np.int32)
    if use_qk_l2norm:  # the kernel normalises k itself: the same call completes
        out, _ = gdn_nki.decode_step(call.pop("query"), call.pop("key"), call.pop("value"), pool, rows,
                                     use_qk_l2norm=True, **call)  # fmt: skip
        assert np.isfinite(out).all() and np.isfinite(pool).all() and pool[1].any()
        return
    with pytest.raises(ContractError) as caught:
        gdn_nki.decode_step(call.pop("query"), call.pop("key"), call.pop("value"), pool, rows, **call)
    _assert_overflow_rejected(caught.value)
    assert caught.value.entry_point == "gdn_nki.decode_step"
    assert not pool.any()
