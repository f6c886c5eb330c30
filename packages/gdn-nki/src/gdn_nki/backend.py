"""The NKI API this package's kernel is written against: the real ``nki`` when importable, nki-cpu otherwise.

This is the only module of gdn-nki that knows two NKI implementations exist; every other module imports
``nki``, ``nl`` and ``nisa`` from here and writes plain NKI. It also hands the host nki-cpu's framework-tensor
helpers (numpy views of CPU torch tensors, bf16 by its bits), used whichever NKI runs the kernel.
"""

from __future__ import annotations

import importlib.util


def _real_nki_available() -> bool:
    """True when a real Neuron ``nki`` with ``nki.isa`` is installed (PyPI's placeholder has no ``isa``)."""
    try:
        return importlib.util.find_spec("nki") is not None and importlib.util.find_spec("nki.isa") is not None
    except (ImportError, ValueError):
        return False


USING_REAL_NKI = _real_nki_available()

if USING_REAL_NKI:  # pragma: no cover - needs the Neuron SDK
    import nki
    import nki.isa as nisa
    import nki.language as nl

    simulate = nki.simulate
else:
    import nki_cpu as nki
    from nki_cpu import isa as nisa
    from nki_cpu import language as nl

    simulate = nki.simulate

from nki_cpu.frameworks import numpy_to_torch, torch_to_numpy  # noqa: E402 - host-side helpers, not NKI

BACKEND_NAME = "nki" if USING_REAL_NKI else "nki-cpu"

__all__ = ["BACKEND_NAME", "USING_REAL_NKI", "nisa", "nki", "nl", "numpy_to_torch", "simulate", "torch_to_numpy"]
