"""A kernel helper module for test_cost_sites: its instructions are charged to its callers' lines when it is
named in ``skip_files``."""

from __future__ import annotations

from nki_cpu import isa as nisa
from nki_cpu import language as nl


def doubled(src):
    dst = nl.ndarray(tuple(src.shape), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=dst, data=src, op0=nl.multiply, operand0=2.0)
    return dst
