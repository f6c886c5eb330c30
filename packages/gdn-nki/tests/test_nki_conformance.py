"""``gdn_nki.conformance.simulate_with_varlen``, what ``nox -s conformance`` checks: ``simulate`` for dense calls,
``prefill_varlen`` with ``cu_seqlens`` — bit for bit — and a declaration that opens gdn-spec's varlen area."""

from __future__ import annotations

import numpy as np

import gdn_nki
from gdn_nki.conformance import simulate_with_varlen
from gdn_spec.impl import load
from gdn_spec.regimes import Geometry
from nki_inputs import case, kernel_kwargs

LENGTHS = (37, 150)  # a sequence ending inside the first chunk, the next spanning a chunk edge


def test_a_dense_call_is_simulate_bit_for_bit() -> None:
    c = case("bfloat16", Geometry(B=1, Hk=1, Hv=2, S=128, Dk=32, Dv=16), seed=3, regime="initial_state")
    kwargs = kernel_kwargs(c, "schur")
    buffer = kwargs["recurrent_state"]
    out, state = simulate_with_varlen(**kwargs)
    expected_out, expected_state = gdn_nki.simulate(**kernel_kwargs(c, "schur"))
    assert state is buffer, "the supplied state is updated in place and returned, as simulate's"
    assert np.array_equal(out, expected_out) and np.array_equal(state, expected_state)


def test_cu_seqlens_runs_prefill_varlen_bit_for_bit() -> None:
    cases = [case("float32", Geometry(B=1, Hk=1, Hv=2, S=n, Dk=32, Dv=16), seed=i) for i, n in enumerate(LENGTHS)]
    packed = {
        name: np.concatenate([c.kernel[name] for c in cases], axis=2)
        for name in cases[0].kernel
        if name != "recurrent_state"
    }
    cu = np.cumsum((0, *LENGTHS)).astype(np.int64)
    out, state = simulate_with_varlen(**packed, scale=cases[0].scale, cu_seqlens=cu)
    expected_out, expected_state = gdn_nki.prefill_varlen(**packed, cu_seqlens=cu, scale=cases[0].scale)
    assert state.shape == (len(LENGTHS), 2, 32, 16), "one final state per sequence"
    assert np.array_equal(out, expected_out) and np.array_equal(state, expected_state)


def test_declares_varlen_for_the_conformance_suite() -> None:
    """``gdn_nki:simulate`` declares no varlen, so ``gdn-spec check gdn_nki:simulate`` skipped the varlen area."""
    caps = load("gdn_nki.conformance:simulate_with_varlen").capabilities
    assert caps.varlen and not load("gdn_nki:simulate").capabilities.varlen
    assert caps.bucket and caps.state_pool and caps.checkpoints and caps.read_rows  # the serving checks run
    simulated = load("gdn_nki:simulate").capabilities
    assert (caps.algorithms, caps.dtypes) == (simulated.algorithms, simulated.dtypes)
