"""Test-session setup for gdn-nki: single-threaded BLAS (the kernel runs through an interpreter of small tiles;
BLAS threads only contend with pytest-xdist workers and other work on the machine)."""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
