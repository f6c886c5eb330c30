"""The recurrent_state contract through ``gdn_nki.simulate``: the caller's buffer is the second output, updated in
place, its incoming contents are the initial state; omitted means a zero start and a fresh array. Also: the
kernel writes nothing but its outputs, and identical calls give identical bytes."""

from __future__ import annotations

import numpy as np
import pytest

import gdn_nki
import nki_cpu
from gdn_spec.regimes import Geometry
from nki_cpu.cost import Engine
from nki_inputs import PACK, assert_agree, assert_matches_oracle, case, kernel_kwargs, run

DTYPES = ("float32", "bfloat16")
GEOMETRY = Geometry(B=2, Hk=1, Hv=2, S=256, Dk=32, Dv=16)  # GQA, Dk != Dv


@pytest.mark.parametrize("dtype", DTYPES)
def test_supplied_state_is_returned_updated_in_place_from_its_contents(dtype: str) -> None:
    c = case(dtype, GEOMETRY, seed=1, regime="initial_state")
    buffer = c.kernel["recurrent_state"].copy()
    incoming = buffer.copy()
    out, returned = run(c, "schur", recurrent_state=buffer)
    assert returned is buffer, "the second output must be the caller's array itself"
    assert not np.array_equal(buffer, incoming), "the buffer was not updated in place"
    assert buffer.dtype == np.float32 and buffer.shape == incoming.shape
    # Outputs and the buffer's new contents match the oracle started from the incoming contents.
    assert_matches_oracle(c, out, buffer, "supplied state")


def test_incoming_contents_matter() -> None:
    """Two buffers with different contents give different outputs (the kernel does not ignore the load)."""
    c = case("float32", GEOMETRY, seed=2, regime="initial_state")
    out_given, _ = run(c, "schur", recurrent_state=c.kernel["recurrent_state"].copy())
    out_zero, _ = run(c, "schur", recurrent_state=np.zeros_like(c.kernel["recurrent_state"]))
    assert not np.allclose(out_given, out_zero)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("algorithm", ["schur", "neumann"])
def test_omitted_state_is_a_zero_start_in_a_fresh_array(algorithm: str, dtype: str) -> None:
    geometry = Geometry(B=1, Hk=2, Hv=2, S=256, Dk=32, Dv=16)
    c = case(dtype, geometry, seed=3)
    assert c.kernel["recurrent_state"] is None
    kwargs = kernel_kwargs(c, algorithm)
    out, state = gdn_nki.simulate(**kwargs)
    assert state.dtype == np.float32 and state.shape == (1, 2, 32, 16)
    assert all(not np.shares_memory(state, x) for x in kwargs.values() if isinstance(x, np.ndarray))
    assert_matches_oracle(c, out, state, f"{algorithm} omitted state")
    if algorithm == "schur":  # neumann cannot take a state: compare with an explicit zero buffer on schur only
        zeros = np.zeros((1, 2, 32, 16), np.float32)
        explicit = run(c, "schur", recurrent_state=zeros)
        assert_agree((out, state), (explicit[0], zeros), dtype, "omitted state vs an explicit zero buffer")


def _hbm_loads() -> int:
    """DMA transfers out of HBM in the last launch's trace."""
    return sum(1 for r in nki_cpu.last_trace().records if r.engine is Engine.DMA and r.attrs.get("src") == "hbm")


@pytest.mark.nki_cpu_only
def test_omitted_state_emits_no_state_load() -> None:
    """Supplying a state costs exactly one HBM load per lane; omitting it costs none."""
    c = case("float32", GEOMETRY, seed=10)
    run(c, "schur")
    omitted = _hbm_loads()
    run(c, "schur", recurrent_state=np.zeros((2, 2, 32, 16), np.float32))
    assert _hbm_loads() == omitted + GEOMETRY.lanes


def test_non_contiguous_state_view_is_updated_in_place() -> None:
    """A state that is a strided view of a larger buffer is still written through (and only its elements)."""
    c = case("float32", GEOMETRY, seed=4, regime="initial_state")
    backing = np.full((2, 2, 32, 2 * 16), 7.0, np.float32)
    view = backing[..., ::2]
    view[...] = c.kernel["recurrent_state"]
    out, returned = run(c, "schur", recurrent_state=view)
    assert returned is view
    assert_matches_oracle(c, out, view, "strided state view")
    assert np.all(backing[..., 1::2] == 7.0), "elements between the view's were written"


@pytest.mark.parametrize("grid", [1, 2])
def test_supplied_state_in_place_under_a_launch_grid(grid: int) -> None:
    c = case("float32", GEOMETRY, seed=5, regime="initial_state")
    buffer = c.kernel["recurrent_state"].copy()
    out, returned = run(c, "schur", recurrent_state=buffer, grid=grid)
    assert returned is buffer
    assert_matches_oracle(c, out, buffer, f"grid={grid} with state")


@pytest.mark.parametrize("algorithm", ["schur", "neumann"])
def test_inputs_are_not_written(algorithm: str) -> None:
    geometry = Geometry(B=1, Hk=2, Hv=2, S=256, Dk=32, Dv=16)
    c = case("bfloat16", geometry, seed=6, regime="initial_state" if algorithm == "schur" else "random")
    kwargs = kernel_kwargs(c, algorithm)
    before = {name: x.copy() for name, x in kwargs.items() if isinstance(x, np.ndarray) and name != "recurrent_state"}
    gdn_nki.simulate(**kwargs)
    for name, x in before.items():
        np.testing.assert_array_equal(kwargs[name], x, err_msg=f"the kernel wrote into input {name}")
    if algorithm == "schur":
        np.testing.assert_array_equal(PACK, gdn_nki.build_mask_pack())


@pytest.mark.parametrize("algorithm", ["schur", "neumann"])
def test_identical_calls_give_identical_bytes(algorithm: str) -> None:
    c = case("bfloat16", Geometry(B=1, Hk=1, Hv=1, S=256, Dk=64, Dv=32), seed=9)
    first, second = run(c, algorithm), run(c, algorithm)
    assert first[0].tobytes() == second[0].tobytes() and first[1].tobytes() == second[1].tobytes()


class _InjectedLaunchError(RuntimeError):
    """Raised inside the kernel by the test, after some lanes stored their final state."""


def _fail_after_stores(monkeypatch: pytest.MonkeyPatch, stores: int) -> list[int]:
    """Make the kernel's ``store_state`` raise once ``stores`` lane states have really been stored."""
    done: list[int] = []
    real = gdn_nki.cte.hbm.store_state

    def store_then_fail(*args, **kwargs):
        if len(done) == stores:
            raise _InjectedLaunchError(f"injected failure after {stores} stored lane states")
        real(*args, **kwargs)
        done.append(1)

    monkeypatch.setattr(gdn_nki.cte.hbm, "store_state", store_then_fail)
    return done


@pytest.mark.parametrize(
    ("entry", "grid"), [("simulate", None), ("simulate", 2), ("prefill", None)], ids=["simulate", "grid2", "prefill"]
)
def test_a_launch_failing_after_some_lanes_stored_leaves_the_state_bytes_unchanged(
    monkeypatch: pytest.MonkeyPatch, entry: str, grid: int | None
) -> None:
    c = case("float32", GEOMETRY, seed=11, regime="initial_state")
    kwargs = kernel_kwargs(c, "schur")
    buffer = kwargs["recurrent_state"]
    before = buffer.tobytes()
    stored = _fail_after_stores(monkeypatch, stores=GEOMETRY.lanes - 1)
    if entry == "prefill":
        kwargs = {**kwargs, **{name: kwargs[name][:, :, :-5] for name in ("query", "key", "value", "g_log", "beta")}}
    if grid is not None:
        kwargs["grid"] = grid
    with pytest.raises(_InjectedLaunchError):
        getattr(gdn_nki, entry)(**kwargs)
    assert len(stored) == GEOMETRY.lanes - 1, "the failure must come after lanes were stored"
    assert buffer.tobytes() == before, "a failed launch changed the caller's recurrent_state"
