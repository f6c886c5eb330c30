"""Test-session setup for gdn-nki: single-threaded BLAS (the kernel runs through an interpreter of small tiles;
BLAS threads only contend with pytest-xdist workers and other work on the machine)."""

from __future__ import annotations

import os

import pytest

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers", "nki_cpu_only: reads nki-cpu's traces or types; skipped on the real Neuron SDK (nox -s neuron)"
    )


def pytest_collection_modifyitems(config, items) -> None:
    """On the real Neuron SDK, skip the tests that inspect the interpreter rather than the kernel's results."""
    from gdn_nki.common import backend

    if not backend.USING_REAL_NKI:
        return
    skip = pytest.mark.skip(reason="inspects nki-cpu (traces, records, dtypes); the real SDK runs the others")
    for item in items:
        if item.get_closest_marker("nki_cpu_only"):
            item.add_marker(skip)


@pytest.fixture
def loop_every_steady_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every steady run of a lane a compiled loop of one unit group per iteration (``lanes.STEADY_GROUPS`` = 1),
    as launches long enough to loop at the default do: the loop's machinery checked at shapes that run in seconds,
    which the default unrolls whole (``common.loop_plan``)."""
    from gdn_nki.cte import lanes

    monkeypatch.setattr(lanes, "STEADY_GROUPS", 1)
