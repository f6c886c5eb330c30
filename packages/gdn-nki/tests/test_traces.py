"""``gdn_nki.traces``: the one launch recorder (trace key and nki-cpu program per completed launch), and its count
of trace keys — what a compiling backend compiles on."""

from __future__ import annotations

import numpy as np
import pytest

import gdn_nki
from gdn_nki.common import backend
from gdn_nki.traces import recording_launches, trace_counts
from gdn_ref.constants import ALGORITHM_SCHUR, CHUNK_SCHUR
from gdn_spec.regimes import Geometry
from nki_inputs import case, kernel_kwargs

GEOMETRY = Geometry(1, 1, 1, CHUNK_SCHUR, 16, 16)


def test_launches_of_one_shape_share_a_key_and_a_program() -> None:
    """Two calls of one shape with other values are one trace key and one program; another scale (a non-tensor
    value) is another key. The recorder is removed on exit."""
    calls = [kernel_kwargs(case("float32", GEOMETRY, seed), ALGORITHM_SCHUR) for seed in (1, 2)]
    calls.append({**calls[0], "scale": calls[0]["scale"] / 2})
    launch = backend.simulate
    with recording_launches() as launches:
        for call in calls:
            gdn_nki.simulate(**call)
    assert backend.simulate is launch
    assert [x.kernel for x in launches] == [launches[0].kernel] * 3 and launches[0].kernel.startswith("gdn_cte")
    assert sorted(trace_counts(launches).values()) == [1, 2], trace_counts(launches)
    assert launches[0].key == launches[1].key != launches[2].key
    if not backend.USING_REAL_NKI:
        assert launches[0].programs is not None and launches[0].programs == launches[1].programs


def test_a_rejected_call_records_nothing_and_the_recorder_is_removed() -> None:
    """A call refused before its launch is no launch; the recorder is gone after the block, even one that raised."""
    call = kernel_kwargs(case("float32", GEOMETRY, 3), ALGORITHM_SCHUR)
    call["beta"] = np.full_like(call["beta"], 2.0)  # outside [0, 1]: refused by the host
    launch = backend.simulate
    with pytest.raises(Exception, match="beta"), recording_launches() as launches:
        gdn_nki.simulate(**call)
    assert launches == [] and backend.simulate is launch
