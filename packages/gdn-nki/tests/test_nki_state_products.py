"""The state's products: with bf16 compute they read the fp32 state as two bf16 parts at the bf16 matmul rate;
a lane without an initial state issues none for its first chunk."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nki_cpu
from gdn_nki.common import engines, tiles
from gdn_nki.common.backend import nisa, nki, nl
from gdn_nki.cte import products, state
from gdn_spec.regimes import Geometry
from nki_cpu.cost import Engine
from nki_inputs import assert_matches_oracle, case, run

BF16 = ml_dtypes.bfloat16


@nki.jit
def _split_kernel(block):
    hi_out = nl.ndarray(block.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
    lo_out = nl.ndarray(block.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
    tile = nl.load(block)
    with engines.balancing(engines.Balancer()):
        hi, lo = state.split_block(tile, nl.bfloat16)
    hi_copy = nl.ndarray(block.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.tensor_copy(dst=hi_copy, src=hi, engine=engines.VECTOR)
    nl.store(hi_out, hi_copy)
    nl.store(lo_out, lo)
    return hi_out, lo_out


@pytest.mark.nki_cpu_only
def test_bf16_split_is_the_truncation_plus_the_rounded_rest_within_2_to_the_minus_16() -> None:
    rng = np.random.default_rng(0)
    # magnitudes over many binades, both signs, and exact zeros
    block = (rng.standard_normal((128, 64)) * np.exp2(rng.integers(-30, 30, (128, 64)))).astype(np.float32)
    block[0, :8] = 0.0
    hi, lo = nki.simulate(_split_kernel)(block)
    truncated = (block.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    np.testing.assert_array_equal(np.asarray(hi).astype(np.float32), truncated)
    np.testing.assert_array_equal(np.asarray(lo), (block - truncated).astype(BF16))
    total = np.asarray(hi).astype(np.float64) + np.asarray(lo).astype(np.float64)
    assert np.all(np.abs(total - block) <= np.exp2(-16) * np.abs(block))
    # hi costs no instruction: the split is the one GpSimd subtract (the copy and stores are the test's)
    compute = [r for r in nki_cpu.last_trace().records if r.engine is not Engine.DMA]
    assert [(r.engine, r.opcode) for r in compute] == [(Engine.GPSIMD, "tensor_tensor"), (Engine.VECTOR, "tensor_copy")]


def _pe_matmuls() -> list:
    return [r for r in nki_cpu.last_trace().records if r.engine is Engine.PE and r.opcode == "nc_matmul"]


@pytest.mark.nki_cpu_only
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_state_products_run_at_the_compute_dtypes_rate(dtype: str) -> None:
    """bf16: no fp32 matmul reads the state (two bf16 passes per product); fp32: the products stay fp32."""
    geometry = Geometry(B=1, Hk=1, Hv=1, S=512, Dk=128, Dv=128)
    c = case(dtype, geometry, seed=4, regime="initial_state")
    out, state = run(c, "schur", recurrent_state=c.kernel["recurrent_state"].copy())
    assert_matches_oracle(c, out, state, f"{dtype} state products")
    # the state products are the accumulating matmuls with a 64-wide moving operand (a column block of the state)
    products = [r for r in _pe_matmuls() if r.attrs.get("moving_free") == 64 and r.attrs.get("accumulate")]
    parts = 2 if dtype == "bfloat16" else 1
    assert len(products) == parts * 2 * 2 * (geometry.S // 128)  # parts x (T S, Q_eff S) x blocks x chunks
    assert all(bool(r.attrs.get("fp32")) == (dtype == "float32") for r in products)


@pytest.mark.nki_cpu_only
@pytest.mark.parametrize("supply_state", [False, True])
def test_a_zero_start_issues_no_state_product_for_the_first_chunk(supply_state: bool) -> None:
    """One-chunk lanes: omitted state → only H and attn·U per block; a supplied (even zero) buffer is read."""
    geometry = Geometry(B=1, Hk=2, Hv=2, S=128, Dk=128, Dv=128)
    c = case("bfloat16", geometry, seed=5, supply_state=supply_state)
    state_in = None if not supply_state else c.kernel["recurrent_state"].copy()
    out, state = run(c, "schur", recurrent_state=state_in)
    assert_matches_oracle(c, out, state, "one-chunk lanes")
    per_lane_block = 2 if not supply_state else 2 + 2 * 2  # H and attn U, (+ two parts each of T S and Q_eff S)
    # (the Schur merge's level-6 matmuls on a 64x64 PE tile also stream 64 columns: not state products)
    moving64 = [r for r in _pe_matmuls() if r.attrs.get("moving_free") == 64 and "tile_position" not in r.attrs]
    assert len(moving64) == geometry.lanes * 2 * per_lane_block


@pytest.mark.nki_cpu_only
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_decayed_copy_link_gives_the_bytes_of_the_scale_add_link(dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A link after the first of a unit adds e^{γ_last}·S, made beside the previous link's split, to its PSUM
    product: the same fp32 roundings as one scalar_tensor_tensor, so the same bytes."""
    geometry = Geometry(B=1, Hk=1, Hv=1, S=512, Dk=128, Dv=128)
    c = case(dtype, geometry, seed=6, regime="model_gates")
    made = []
    original = state.State.decay_for_next

    def counted(self: state.State, j: int, decay_last: object) -> None:
        made.append(j)
        original(self, j, decay_last)

    monkeypatch.setattr(state.State, "decay_for_next", counted)
    with_copies = run(c, "schur")
    assert_matches_oracle(c, *with_copies, f"{dtype} decayed copies")
    chunks = geometry.S // 128
    assert len(made) == 2 * (chunks - 1), "every link but a unit's first reads a decayed copy (two blocks each)"
    assert _scale_adds() == 0, "no link scales and adds in one instruction (the first starts from zero)"
    monkeypatch.setattr(state.State, "decay_for_next", lambda self, j, decay_last: None)
    with_scale_add = run(c, "schur")
    assert _scale_adds() == len(made)
    for got, want in zip(with_copies, with_scale_add, strict=True):
        assert np.asarray(got).tobytes() == np.asarray(want).tobytes()


def _scale_adds() -> int:
    return sum(r.opcode == "scalar_tensor_tensor" for r in nki_cpu.last_trace().records)


@pytest.mark.nki_cpu_only
def test_chain_and_output_products_alternate_and_keep_each_sum(monkeypatch: pytest.MonkeyPatch) -> None:
    """A link's products and the previous chunk's output products alternate on the tensor engine; each PSUM tile
    still sums its terms in the same order, so issuing the groups one after the other gives the same bytes."""
    geometry = Geometry(B=1, Hk=1, Hv=1, S=512, Dk=128, Dv=128)
    c = case("bfloat16", geometry, seed=7, regime="initial_state")
    alternating = run(c, "schur", recurrent_state=c.kernel["recurrent_state"].copy())
    matmuls = [r for r in _pe_matmuls() if r.attrs.get("moving_free") == 64 and "tile_position" not in r.attrs]
    destinations = [r.writes[0].storage_id for r in matmuls]
    # somewhere two consecutive 64-column products write different PSUM tiles, then the first again
    triples = zip(destinations, destinations[1:], destinations[2:], strict=False)
    assert any(first == third != second for first, second, third in triples)

    def one_group_after_another(groups: list) -> None:
        for dst, terms in groups:
            for k, term in enumerate(terms):
                tiles.matmul(*term, dst=dst, accumulate=k > 0)

    monkeypatch.setattr(products, "issue", one_group_after_another)
    sequential = run(c, "schur", recurrent_state=c.kernel["recurrent_state"].copy())
    for got, want in zip(alternating, sequential, strict=True):
        assert np.asarray(got).tobytes() == np.asarray(want).tobytes()
