"""Host conveniences: ``prefill`` for any S, the SPMD launch grid, and the backend in use (the package's layer
rules: ``test_layers.py``)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import gdn_nki
import nki_cpu
from gdn_nki.common import backend
from gdn_spec.regimes import Geometry
from nki_inputs import assert_matches_oracle, case, kernel_kwargs, run


@pytest.mark.parametrize("S", [1, 100, 129, 300])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("algorithm", ["schur", "neumann"])
def test_prefill_any_length_matches_oracle(algorithm: str, dtype: str, S: int) -> None:
    state_regime = algorithm == "schur"  # neumann takes no state
    geometry = Geometry(B=1, Hk=2, Hv=2, S=S, Dk=32, Dv=16)
    c = case(dtype, geometry, seed=S, regime="initial_state" if state_regime else "random")
    kwargs = kernel_kwargs(c, algorithm, mask_pack=None)  # prefill builds the pack for schur itself
    buffer = kwargs["recurrent_state"]
    out, state = gdn_nki.prefill(**kwargs)
    assert out.shape == (1, 2, S, 16), "outputs for the real tokens only"
    if buffer is not None:
        assert state is buffer, "prefill keeps the in-place state contract"
    assert_matches_oracle(c, out, state, f"prefill {algorithm} S={S}")


@pytest.mark.parametrize("algorithm", ["schur", "neumann"])
def test_prefill_on_a_multiple_is_simulate(algorithm: str) -> None:
    c = case("bfloat16", Geometry(B=1, Hk=1, Hv=1, S=256, Dk=32, Dv=16), seed=11)
    via_prefill = gdn_nki.prefill(**kernel_kwargs(c, algorithm))
    via_simulate = run(c, algorithm)
    for got, want in zip(via_prefill, via_simulate, strict=True):
        np.testing.assert_array_equal(got, want)


def test_prefill_rejects_what_simulate_rejects() -> None:
    c = case("float32", Geometry(B=1, Hk=1, Hv=1, S=100, Dk=32, Dv=16), seed=12)
    with pytest.raises(gdn_nki.ContractError, match="`g_log`"):
        gdn_nki.prefill(**kernel_kwargs(c, "schur", g_log=c.kernel["g_log"].astype(np.float64)))


def _prefill_call() -> dict:
    c = case("float32", Geometry(B=1, Hk=1, Hv=2, S=100, Dk=32, Dv=16), seed=13, regime="initial_state")
    return kernel_kwargs(c, "schur", mask_pack=None)


def test_prefill_reports_the_callers_sizes_before_padding() -> None:
    call = _prefill_call()
    call["key"] = np.ascontiguousarray(call["key"][:, :, :99])
    with pytest.raises(gdn_nki.ContractError, match=r"`key` shape \(1, 1, 99, 32\)") as info:
        gdn_nki.prefill(**call)
    assert "100" in str(info.value) and "127" not in str(info.value) and "128" not in str(info.value)


@pytest.mark.parametrize(
    ("change", "argument"),
    [
        (lambda c: c.update(g_log=c["g_log"][0]), "g_log"),  # 2-D
        (lambda c: c.update(algorithm=["schur"]), "algorithm"),  # unhashable
        (lambda c: c["g_log"].__setitem__((0, 1, 50), 0.01), "g_log"),  # a decay above 1
        (lambda c: c["value"].__setitem__((0, 0, 3, 1), np.nan), "value"),
    ],
    ids=["g_log_2d", "algorithm_list", "g_log_positive", "value_nan"],
)
def test_prefill_rejects_bad_arguments_by_name_and_writes_nothing(change, argument: str) -> None:
    call = _prefill_call()
    change(call)
    before = call["recurrent_state"].tobytes()
    with pytest.raises(gdn_nki.ContractError, match=f"`{argument}`"):
        gdn_nki.prefill(**call)
    assert call["recurrent_state"].tobytes() == before


@pytest.mark.parametrize("grid", ["2", 2.7, True, 0, -1])
def test_simulate_grid_must_be_a_positive_int(grid: object) -> None:
    c = case("float32", Geometry(B=1, Hk=1, Hv=2, S=128, Dk=16, Dv=16), seed=14)
    with pytest.raises(ValueError, match=r"`grid` value .* must be a positive int"):
        gdn_nki.simulate(**kernel_kwargs(c, "schur"), grid=grid)


@pytest.mark.nki_cpu_only  # nki-cpu's refusal / its readable arguments
def test_raw_kernel_refuses_a_read_only_state_by_name() -> None:
    c = case("float32", Geometry(B=1, Hk=1, Hv=1, S=128, Dk=16, Dv=16), seed=15, regime="initial_state")
    kwargs = kernel_kwargs(c, "schur")
    kwargs["recurrent_state"].setflags(write=False)
    with pytest.raises(ValueError, match="`recurrent_state`"):
        backend.simulate(gdn_nki.gdn_cte)(**kwargs)


# (B, Hv) with Hk = 1 over the LNC degrees a Trn2/Trn3 launch may use (1 or 2): lanes split evenly (4 lanes / 2
# programs, 6 / 2), unevenly (3 / 2: programs of 2 and 1 lanes) and with a program left without lanes (1 / 2).
GRID_CASES = [((1, 4), 2), ((2, 3), 2), ((1, 3), 2), ((1, 1), 2), ((1, 4), 1)]


@pytest.mark.parametrize(("lanes", "grid"), GRID_CASES, ids=[f"B{b}Hv{h}-grid{g}" for (b, h), g in GRID_CASES])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_launch_grid_gives_the_same_result(lanes: tuple[int, int], grid: int, dtype: str) -> None:
    B, Hv = lanes
    c = case(dtype, Geometry(B=B, Hk=1, Hv=Hv, S=256, Dk=32, Dv=16), seed=13 + grid, regime="initial_state")
    plain = run(c, "schur")
    split = run(c, "schur", grid=grid)
    if not backend.USING_REAL_NKI:
        assert len(nki_cpu.last_traces()) == grid, "one trace per program"
    np.testing.assert_array_equal(split[0], plain[0], err_msg=f"out with grid={grid}")
    np.testing.assert_array_equal(split[1], plain[1], err_msg=f"state with grid={grid}")
    assert_matches_oracle(c, *split, f"grid={grid}")


@pytest.mark.nki_cpu_only
def test_launch_grid_splits_the_lanes() -> None:
    """Each program traces only its own lanes: two programs each issue about half the instructions of one."""
    c = case("float32", Geometry(B=1, Hk=1, Hv=4, S=256, Dk=32, Dv=16), seed=14)
    run(c, "schur")
    whole = len(nki_cpu.last_trace().records)
    run(c, "schur", grid=2)
    halves = [len(t.records) for t in nki_cpu.last_traces()]
    # Half the lanes each, plus the per-program constants: equal halves, well under the whole.
    assert halves[0] == halves[1] and halves[0] < 0.6 * whole, (whole, halves)


@pytest.mark.parametrize("heads", [4, 3])
def test_launch_grid_neumann(heads: int) -> None:
    c = case("float32", Geometry(B=1, Hk=heads, Hv=heads, S=128, Dk=32, Dv=16), seed=15)
    grid = 2
    plain, split = run(c, "neumann"), run(c, "neumann", grid=grid)
    np.testing.assert_array_equal(split[0], plain[0])
    np.testing.assert_array_equal(split[1], plain[1])


def _real_nki_importable() -> bool:
    try:
        return importlib.util.find_spec("nki") is not None and importlib.util.find_spec("nki.isa") is not None
    except (ImportError, ValueError):
        return False


@pytest.mark.nki_cpu_only
def test_backend_reports_nki_cpu_here() -> None:
    if _real_nki_importable():
        pytest.skip("a real Neuron nki is installed: the backend is expected to use it")
    assert backend.USING_REAL_NKI is False
    assert backend.BACKEND_NAME == gdn_nki.BACKEND_NAME == "nki-cpu"
    assert backend.nki is nki_cpu and backend.simulate is nki_cpu.simulate
    assert backend.nl is nki_cpu.language and backend.nisa is nki_cpu.isa
    assert "nki-cpu" in gdn_nki.simulate.gdn_spec_capabilities["name"]


def test_prefill_varlen_scans_values_and_checks_grid() -> None:
    c = case("float32", Geometry(B=1, Hk=1, Hv=1, S=100, Dk=16, Dv=16), seed=16)
    kwargs = kernel_kwargs(c, "schur", mask_pack=None)
    kwargs.pop("recurrent_state")
    kwargs["value"][0, 0, 70, 2] = np.nan
    with pytest.raises(gdn_nki.ContractError, match=r"`value` value nan at index \[0, 0, 70, 2\]"):
        gdn_nki.prefill_varlen(**kwargs, cu_seqlens=np.array([0, 40, 100]))
    kwargs["value"][0, 0, 70, 2] = 0.0
    with pytest.raises(ValueError, match="`grid`"):
        gdn_nki.prefill_varlen(**kwargs, cu_seqlens=np.array([0, 40, 100]), grid=2.0)


@pytest.mark.parametrize("grid", [3, 4])
def test_launch_grid_outside_the_lnc_degrees_is_rejected_before_launch(grid: int) -> None:
    c = case("float32", Geometry(B=1, Hk=1, Hv=4, S=128, Dk=32, Dv=16), seed=16, regime="initial_state")
    buffer = c.kernel["recurrent_state"].copy()
    before = buffer.copy()
    with pytest.raises(gdn_nki.ContractError, match="`grid`") as info:
        run(c, "schur", recurrent_state=buffer, grid=grid)
    assert "grid=None, 1 or 2" in str(info.value)
    np.testing.assert_array_equal(buffer, before)


@pytest.mark.parametrize(
    ("version", "ok"), [("0.7.0", True), ("0.7.1+g1234", True), ("1.0", True), ("0.6.0", False), ("0.5.2", False)]
)
def test_nki_version_check(version: str, ok: bool) -> None:
    """The real nki is refused below NKI 0.7.0 (SDK 2.33) with an error naming both versions and the upgrade."""
    if ok:
        backend.check_nki_version(version)
        return
    with pytest.raises(ImportError, match=rf"Neuron SDK 2\.33 \(NKI 0\.7\.0\).*{version}.*pip install"):
        backend.check_nki_version(version)


def test_nki_version_unknown_warns() -> None:
    with pytest.warns(RuntimeWarning, match="cannot read the installed nki version"):
        backend.check_nki_version(None)
