"""nki-cpu: an eager CPU interpreter of the NKI API (``nki.language`` / ``nki.isa``, Neuron SDK 2.33 subset).

Public API: :func:`jit`, :func:`simulate`, :mod:`language` (``nl``), :mod:`isa` (``nisa``), :func:`install_as_nki`
(opt-in ``import nki`` alias), :func:`last_trace` / :func:`last_traces` (instruction records for the cost model).
"""

from __future__ import annotations

from nki_cpu import isa, language
from nki_cpu.runtime import Kernel, install_as_nki, jit, last_trace, last_traces, simulate
from nki_cpu.tensor import NkiTensor

__all__ = [
    "Kernel",
    "NkiTensor",
    "install_as_nki",
    "isa",
    "jit",
    "language",
    "last_trace",
    "last_traces",
    "simulate",
]
