"""The NKI API this package's kernel is written against: the real ``nki`` when importable, nki-cpu otherwise.

This is the only module of gdn-nki that knows two NKI implementations exist; every other module imports
``nki``, ``nl`` and ``nisa`` from here and writes plain NKI. It also hands the host nki-cpu's framework-tensor
helpers (numpy views of CPU torch tensors, bf16 by its bits), used whichever NKI runs the kernel.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import warnings

# The oldest NKI this kernel is written for: NKI 0.7.0, shipped with Neuron SDK 2.33. The kernel body is plain Python
# run by the 2.33 tracer — generators (lanes.py's software pipeline), ``x is None`` tests on optional tensor
# arguments and dataclasses all need 0.7.0's Python tracing (earlier frontends reject them) — and its run-time loads
# address HBM through ``.ap(scalar_offset=)`` on whole arguments, the form every page agrees on (docs/nki-sources.md
# §1.3, §2.6).
MIN_NKI_VERSION = (0, 7, 0)
MIN_SDK = "Neuron SDK 2.33 (NKI 0.7.0)"


def parse_version(text: str) -> tuple[int, ...]:
    """The leading numeric release of a version string: ``"0.7.0+abc"`` → ``(0, 7, 0)``, ``"2.33.1.dev"`` → (2, 33, 1)."""
    parts = []
    for piece in text.split("+")[0].split("."):
        digits = "".join(ch for ch in piece if ch.isdigit()) if piece[:1].isdigit() else ""
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def check_nki_version(version: str | None) -> None:
    """Refuse an NKI older than ``MIN_NKI_VERSION`` with a clear error; warn when the version cannot be read.

    Raises:
        ImportError: naming the installed version, the minimum and how to upgrade.
    """
    if version is None:
        warnings.warn(
            f"gdn-nki: cannot read the installed nki version; the kernel needs {MIN_SDK} or newer",
            RuntimeWarning,
            stacklevel=2,
        )
        return
    found = parse_version(version)
    if found < MIN_NKI_VERSION:
        raise ImportError(
            f"gdn-nki needs {MIN_SDK} or newer; the installed nki is {version}. Its kernel relies on the 2.33 "
            "Python tracer (generators, `is None` on optional tensors) and on NkiScalar offsets in compiled loops. "
            "Upgrade: pip install --upgrade --extra-index-url https://pip.repos.neuron.amazonaws.com nki neuronx-cc"
        )


def _installed_nki_version() -> str | None:
    try:
        return importlib.metadata.version("nki")
    except importlib.metadata.PackageNotFoundError:
        return None


def _real_nki_available() -> bool:
    """True when a real Neuron ``nki`` with ``nki.isa`` is installed (PyPI's placeholder has no ``isa``)."""
    try:
        return importlib.util.find_spec("nki") is not None and importlib.util.find_spec("nki.isa") is not None
    except (ImportError, ValueError):
        return False


USING_REAL_NKI = _real_nki_available()

if USING_REAL_NKI:  # pragma: no cover - needs the Neuron SDK
    check_nki_version(_installed_nki_version())
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


def last_program_fingerprints() -> tuple[str, ...] | None:
    """nki-cpu's ``Trace.fingerprint()`` of each program of the most recent launch (its static program), or None on
    the real ``nki``, whose traces nki-cpu cannot see."""
    if USING_REAL_NKI:  # pragma: no cover - needs the Neuron SDK
        return None
    return tuple(trace.fingerprint() for trace in nki.last_traces())


__all__ = [
    "BACKEND_NAME",
    "MIN_NKI_VERSION",
    "MIN_SDK",
    "USING_REAL_NKI",
    "check_nki_version",
    "last_program_fingerprints",
    "nisa",
    "nki",
    "nl",
    "numpy_to_torch",
    "simulate",
    "torch_to_numpy",
]
