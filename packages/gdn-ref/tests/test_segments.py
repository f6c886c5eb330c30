"""Context parallelism's math: a segment is an affine map of its entry state, and segments compose exactly."""

from __future__ import annotations

import numpy as np
import pytest

from gdn_ref.recurrent import recurrent
from gdn_ref.segments import compose, segment_affine, split_and_combine


def _inputs(seed: int, S: int = 40, Hk: int = 1, Hv: int = 2, Dk: int = 8, Dv: int = 6) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((1, Hk, S, Dk))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    return (
        rng.standard_normal((1, Hk, S, Dk)),
        k,
        rng.standard_normal((1, Hv, S, Dv)),
        -rng.uniform(0.0, 0.5, (1, Hv, S)),
        rng.uniform(0.0, 1.0, (1, Hv, S)),
    )


@pytest.mark.parametrize("boundaries", [[1], [17], [5, 6, 30], list(range(1, 40))])
def test_segments_from_zero_combine_to_the_whole_run(boundaries: list[int]) -> None:
    q, k, v, g, beta = _inputs(seed=len(boundaries))
    initial = np.random.default_rng(9).standard_normal((1, 2, 8, 6))
    out, state = split_and_combine(q, k, v, g, beta, boundaries, scale=0.3, initial_state=initial)
    ref_out, ref_state = recurrent(q, k, v, g, beta, 0.3, initial_state=initial)
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=1e-12)
    np.testing.assert_allclose(state, ref_state, rtol=0, atol=1e-12)


def test_a_reset_inside_a_segment_zeroes_its_transition_from_there() -> None:
    q, k, v, g, beta = _inputs(seed=3)
    g[..., 12] = -np.inf  # a document boundary: nothing before token 12 reaches token 12 or later
    _, _, transition, readout = segment_affine(q, k, v, g, beta)
    assert not transition.any()
    assert not readout[:, :, 12:].any() and readout[:, :, :12].any()
    out, state = split_and_combine(q, k, v, g, beta, [7, 20], initial_state=np.ones((1, 2, 8, 6)))
    ref_out, ref_state = recurrent(q, k, v, g, beta, initial_state=np.ones((1, 2, 8, 6)))
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=1e-12)
    np.testing.assert_allclose(state, ref_state, rtol=0, atol=1e-12)


def test_compose_is_the_run_of_both_segments() -> None:
    q, k, v, g, beta = _inputs(seed=5)
    first = segment_affine(q[:, :, :15], k[:, :, :15], v[:, :, :15], g[:, :, :15], beta[:, :, :15])
    then = segment_affine(q[:, :, 15:], k[:, :, 15:], v[:, :, 15:], g[:, :, 15:], beta[:, :, 15:])
    whole = segment_affine(q, k, v, g, beta)
    m, lo = compose((first[2], first[1]), (then[2], then[1]))
    np.testing.assert_allclose(m, whole[2], rtol=0, atol=1e-12)
    np.testing.assert_allclose(lo, whole[1], rtol=0, atol=1e-12)
