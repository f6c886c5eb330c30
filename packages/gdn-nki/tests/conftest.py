"""Test-session setup for gdn-nki: single-threaded BLAS (the kernel runs through an interpreter of small tiles;
BLAS threads only contend with pytest-xdist workers and other work on the machine)."""

from __future__ import annotations

import os

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
    import pytest

    skip = pytest.mark.skip(reason="inspects nki-cpu (traces, records, dtypes); the real SDK runs the others")
    for item in items:
        if item.get_closest_marker("nki_cpu_only"):
            item.add_marker(skip)
