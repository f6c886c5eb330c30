"""Packed variable-length prefill in one launch (``gdn_nki.prefill_varlen`` / ``gdn_cte_varlen``): per-sequence
results equal separate calls, state pools, and every layout rule rejected with nothing written."""

from __future__ import annotations

import numpy as np
import pytest

import gdn_nki
import nki_cpu
from gdn_nki.cte.plan import packed_plan
from gdn_nki.cte.varlen import gdn_cte_varlen
from gdn_ref.constants import CHUNK_BY_ALGORITHM
from gdn_ref.contract import ContractError
from gdn_spec.regimes import Geometry
from nki_inputs import assert_matches_oracle, case

LENGTHS = (37, 200, 1, 130)  # one sequence shorter than a chunk, one a single token, one spanning chunks
HK, HV, DK, DV = 1, 2, 32, 16


def _packed(dtype: str, lengths: tuple[int, ...] = LENGTHS, seed: int = 0, regime: str = "random", hk: int = HK):
    """Head-major packed inputs of sequences of ``lengths`` and the per-sequence cases they were cut from."""
    cases = [case(dtype, Geometry(B=1, Hk=hk, Hv=HV, S=n, Dk=DK, Dv=DV), seed + i, regime, supply_state=True)
             for i, n in enumerate(lengths)]  # fmt: skip
    packed = {
        name: np.concatenate([c.kernel[name] for c in cases], axis=2)
        for name in ("query", "key", "value", "g_log", "beta")
    }
    cu = np.cumsum((0, *lengths)).astype(np.int64)
    states = np.concatenate([c.kernel["recurrent_state"] for c in cases], axis=0)
    return packed, cu, states, cases


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_one_launch_equals_separate_calls_bit_for_bit(dtype: str) -> None:
    packed, cu, states, cases = _packed(dtype)
    pool = states.copy()
    out, final = gdn_nki.prefill_varlen(**packed, cu_seqlens=cu, scale=cases[0].scale, recurrent_state=pool)
    assert final is pool, "the supplied state is updated in place and returned"
    if not gdn_nki.common.backend.USING_REAL_NKI:
        assert len(nki_cpu.last_traces()) == 1
    for i, c in enumerate(cases):
        alone_state = states[i : i + 1].copy()
        alone = gdn_nki.prefill(**{k: c.kernel[k] for k in packed}, scale=c.scale, recurrent_state=alone_state)
        got_out = out[:, :, cu[i] : cu[i + 1]]
        assert np.array_equal(got_out, alone[0]), f"sequence {i}: output differs from a separate call"
        assert np.array_equal(final[i : i + 1], alone_state), f"sequence {i}: final state differs"
        assert_matches_oracle(c, got_out, final[i : i + 1], f"varlen sequence {i}")


def test_state_pool_slots_only_named_rows_change() -> None:
    packed, cu, states, cases = _packed("bfloat16", seed=3)
    rng = np.random.default_rng(0)
    pool = rng.standard_normal((7, HV, DK, DV)).astype(np.float32)
    slots = np.array([5, 0, 6, 2])  # unsorted, both edges
    pool[slots] = states
    before = pool.copy()
    out, final = gdn_nki.prefill_varlen(
        **packed, cu_seqlens=cu, scale=cases[0].scale, recurrent_state=pool, state_indices=slots
    )
    assert final is pool
    untouched = [r for r in range(7) if r not in slots]
    assert pool[untouched].tobytes() == before[untouched].tobytes(), "rows not named must stay bit-identical"
    dense = states.copy()
    want_out, _ = gdn_nki.prefill_varlen(**packed, cu_seqlens=cu, scale=cases[0].scale, recurrent_state=dense)
    assert np.array_equal(out, want_out)
    assert np.array_equal(pool[slots], dense), "each slot holds its sequence's final state"


def test_without_state_starts_from_zero_and_returns_one_row_per_sequence() -> None:
    packed, cu, _, cases = _packed("float32", lengths=(5, 140), hk=HV)  # neumann: no head sharing
    out, final = gdn_nki.prefill_varlen(**packed, cu_seqlens=cu, scale=cases[0].scale, algorithm="neumann")
    assert out.shape == (1, HV, 145, DV) and final.shape == (2, HV, DK, DV)
    for i, c in enumerate(cases):
        alone = gdn_nki.prefill(**{k: c.kernel[k] for k in packed}, scale=c.scale, algorithm="neumann")
        assert np.array_equal(out[:, :, cu[i] : cu[i + 1]], alone[0])
        assert np.array_equal(final[i : i + 1], alone[1])


def test_grid_splits_lanes_of_different_sequences() -> None:
    packed, cu, states, cases = _packed("bfloat16", seed=5)
    want = gdn_nki.prefill_varlen(**packed, cu_seqlens=cu, scale=cases[0].scale, recurrent_state=states.copy())
    got = gdn_nki.prefill_varlen(**packed, cu_seqlens=cu, scale=cases[0].scale, recurrent_state=states.copy(), grid=2)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


BAD = {
    "not starting at 0": (dict(cu_seqlens=np.array([1, 40, 371])), "cu_seqlens.start"),
    "not increasing": (dict(cu_seqlens=np.array([0, 40, 40, 371])), "cu_seqlens.increasing"),
    "not ending at T": (dict(cu_seqlens=np.array([0, 40, 370])), "cu_seqlens.end"),
    "not integers": (dict(cu_seqlens=np.array([0.0, 40.0, 371.0])), "cu_seqlens.form"),
    "slot out of range": (dict(state_indices=np.array([0, 9])), "state_indices.range"),
    "slot repeated": (dict(state_indices=np.array([1, 1])), "state_indices.distinct"),
    "slot count": (dict(state_indices=np.array([1])), "state_indices.count"),
    "slots of floats": (dict(state_indices=np.array([1.5, 3.99])), "state_indices.form"),
    "slots of strings": (dict(state_indices=["3", "0"]), "state_indices.form"),
    "slots 2-D": (dict(state_indices=np.array([[3], [0]])), "state_indices.form"),
    "pool shape": (dict(recurrent_state=np.zeros((4, HV, DK, DV + 1), np.float32)), "state_pool.shape"),
    "pool dtype": (dict(recurrent_state=np.zeros((4, HV, DK, DV), np.float64)), "recurrent_state.dtype"),
    "rows without slots": (dict(state_indices=None), "state_pool.rows"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_layouts_are_rejected_naming_the_argument_and_nothing_is_written(name: str) -> None:
    packed, _, _, cases = _packed("float32", lengths=(40, 331), seed=7)
    pool = np.random.default_rng(1).standard_normal((4, HV, DK, DV)).astype(np.float32)
    kwargs = dict(cu_seqlens=np.array([0, 40, 371]), recurrent_state=pool, state_indices=np.array([3, 0]))
    overrides, rule = BAD[name]
    kwargs.update(overrides)
    state = kwargs["recurrent_state"]
    before = state.copy()
    with pytest.raises(ContractError) as err:
        gdn_nki.prefill_varlen(**packed, scale=cases[0].scale, **kwargs)
    assert rule in {v.rule_id for v in err.value.violations}, str(err.value)
    violation = next(v for v in err.value.violations if v.rule_id == rule)
    assert violation.argument in str(err.value)
    assert state.tobytes() == before.tobytes(), "a rejected call writes nothing"


def test_a_wrong_tensor_layout_is_reported_on_the_tensors_not_on_cu_seqlens() -> None:
    """Seq-first [1, T, H, D] tensors (FLA's layout) passed to the head-major entry point: cu_seqlens is judged
    against the tensors' token count, so the tensors are checked first and named."""
    packed, cu, _, cases = _packed("float32", lengths=(40, 331), seed=7)
    seq_first = {name: np.ascontiguousarray(np.swapaxes(x, 1, 2)) for name, x in packed.items()}
    with pytest.raises(ContractError) as err:
        gdn_nki.prefill_varlen(**seq_first, cu_seqlens=cu, scale=cases[0].scale)
    named = {v.argument for v in err.value.violations}
    assert "cu_seqlens" not in named and named & {"value", "g_log", "beta"}, str(err.value)


def test_a_violation_unrelated_to_the_layout_does_not_hide_a_cu_seqlens_one() -> None:
    packed, _, _, cases = _packed("float32", lengths=(40, 331), seed=7)
    with pytest.raises(ContractError) as err:
        gdn_nki.prefill_varlen(**packed, cu_seqlens=np.array([0, 40, 370]), scale=cases[0].scale, group_size=0)
    assert {"group_size.range", "cu_seqlens.end"} <= {v.rule_id for v in err.value.violations}, str(err.value)


def test_batch_of_two_with_cu_seqlens_is_rejected() -> None:
    packed, _, _, cases = _packed("float32", lengths=(64, 64), seed=9)
    doubled = {k: np.concatenate([v, v], axis=0) for k, v in packed.items()}
    with pytest.raises(ContractError, match="cu_seqlens"):
        gdn_nki.prefill_varlen(**doubled, cu_seqlens=np.array([0, 64, 128]), scale=cases[0].scale)


def test_a_failing_launch_never_writes_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    packed, cu, _, cases = _packed("float32", lengths=(130, 20), seed=11)
    pool = np.random.default_rng(2).standard_normal((3, HV, DK, DV)).astype(np.float32)
    before = pool.copy()
    original = gdn_nki.cte.chain.advance_state
    calls = []

    def fail_late(*args, **kwargs):  # the first lane's final state is stored before the failure
        calls.append(1)
        if len(calls) > 4:
            raise RuntimeError("injected failure")
        return original(*args, **kwargs)

    monkeypatch.setattr(gdn_nki.cte.chain, "advance_state", fail_late)
    writes = []
    watched = _WriteWatch(pool, writes)
    with pytest.raises(RuntimeError, match="injected"):
        gdn_nki.prefill_varlen(
            **packed, cu_seqlens=cu, scale=cases[0].scale, recurrent_state=watched, state_indices=np.array([2, 0])
        )
    assert len(calls) > 4, "the failure was injected after the first lane's state store"
    assert writes == [], "the launch wrote the caller's pool (staged rows are committed only on success)"
    assert pool.tobytes() == before.tobytes()


class _WriteWatch(np.ndarray):
    """A view of a pool that records every item assignment made through it (the host's commit)."""

    def __new__(cls, base: np.ndarray, writes: list) -> _WriteWatch:
        view = base.view(cls)
        view.writes = writes
        return view

    def __array_finalize__(self, obj: object) -> None:
        self.writes = getattr(obj, "writes", None)

    def __setitem__(self, key: object, value: object) -> None:
        if self.writes is not None:
            self.writes.append(key)
        super().__setitem__(key, value)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the opt-out run computes with Inf
def test_nan_in_a_named_pool_row_is_rejected_and_free_rows_are_not_scanned() -> None:
    packed, cu, _, cases = _packed("float32", lengths=(130, 20), seed=12)
    pool = np.random.default_rng(3).standard_normal((4, HV, DK, DV)).astype(np.float32)
    pool[1, 0, 3, 5] = np.nan  # a free slot: never read by this call
    kwargs = dict(cu_seqlens=cu, scale=cases[0].scale, recurrent_state=pool)
    gdn_nki.prefill_varlen(**packed, **kwargs, state_indices=np.array([2, 0]))
    pool[3, 1, 0, 2] = np.inf
    before = pool.copy()
    with pytest.raises(ContractError, match="pool row 3") as err:
        gdn_nki.prefill_varlen(**packed, **kwargs, state_indices=np.array([0, 3]))
    assert {v.rule_id for v in err.value.violations} == {"recurrent_state.finite"}
    assert "[3, 1, 0, 2]" in str(err.value)
    assert np.array_equal(pool, before, equal_nan=True), "a rejected call writes nothing"
    gdn_nki.prefill_varlen(**packed, **kwargs, state_indices=np.array([0, 3]), check_values=False)  # opt-out


def test_nan_in_a_per_sequence_state_names_the_sequence_not_a_pool_row() -> None:
    packed, cu, states, cases = _packed("float32", lengths=(130, 20), seed=12)
    states[1, 0, 2, 4] = np.nan
    with pytest.raises(ContractError, match=r"at sequence 1, index \[1, 0, 2, 4\]") as err:
        gdn_nki.prefill_varlen(**packed, cu_seqlens=cu, scale=cases[0].scale, recurrent_state=states)
    assert "pool" not in str(err.value) and "finite initial state for that sequence" in str(err.value)


VALUE_ARGUMENTS = ("query", "key", "value", "g_log", "beta", "recurrent_state")


@pytest.mark.parametrize("name", VALUE_ARGUMENTS)
def test_nan_in_any_value_argument_is_rejected_by_name_and_nothing_is_written(name: str) -> None:
    """Every tensor the kernel reads is scanned before the launch (``check_values``), beta included: a NaN in any
    one names that argument and its first index, and the state keeps its values."""
    packed, cu, states, cases = _packed("float32", lengths=(50, 90), seed=14)
    arrays = {**packed, "recurrent_state": states}
    where = (0, 0, 77, 3)[: arrays[name].ndim] if name != "recurrent_state" else (1, 0, 2, 4)
    arrays[name][where] = np.nan
    before = states.copy()
    with pytest.raises(ContractError) as err:
        gdn_nki.prefill_varlen(**arrays, cu_seqlens=cu, scale=cases[0].scale)
    rule = "g_log.domain" if name == "g_log" else f"{name}.finite"
    assert {v.rule_id for v in err.value.violations} == {rule}, str(err.value)
    assert f"`{name}`" in str(err.value) and f"[{', '.join(map(str, where))}]" in str(err.value), str(err.value)
    assert np.array_equal(states, before, equal_nan=True), "a rejected call writes nothing"


def test_the_kernels_own_state_rows_read_and_write_the_named_pool_rows() -> None:
    """``gdn_cte_varlen``'s ``state_rows`` (the host entry point stages rows and passes None): sequence i starts
    from pool row ``state_rows[i]`` and ends there, in the order given (not sorted), every other row untouched —
    the same results as the rows gathered into a per-sequence state."""
    lengths = (50, 130, 20)
    packed, _, states, cases = _packed("float32", lengths=lengths, seed=16)
    plan = packed_plan(lengths, CHUNK_BY_ALGORITHM["schur"])
    tensors = [plan.pack(packed[n]) for n in ("query", "key", "value", "g_log", "beta")]
    options = dict(
        scale=cases[0].scale, algorithm="schur", mask_pack=gdn_nki.build_mask_pack(), seq_chunks=plan.seq_chunks
    )
    slots = (4, 0, 2)  # neither sorted nor the identity
    pool = np.random.default_rng(4).standard_normal((5, HV, DK, DV)).astype(np.float32)
    pool[list(slots)] = states
    before = pool.copy()
    kernel = gdn_nki.common.backend.simulate(gdn_cte_varlen)
    out, _ = kernel(*tensors, **options, recurrent_state=pool, state_rows=slots)
    gathered = states.copy()
    want_out, _ = kernel(*tensors, **options, recurrent_state=gathered, state_rows=None)
    assert np.array_equal(out, want_out), "each sequence starts from its own row"
    assert np.array_equal(pool[list(slots)], gathered), "each sequence's final state lands in its own row"
    assert pool[[1, 3]].tobytes() == before[[1, 3]].tobytes(), "rows not named stay bit-identical"
