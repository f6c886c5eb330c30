"""Run the conv family on a kernel named ``module:callable`` (optionally through an adapter): what
``python -m gdn_spec.conv`` and ``gdn-spec check --family conv`` share.

A kernel declaring prefill capabilities (or adapted as a prefill kernel) gets the prefill checks, else the decode
checks; the run's contract area is ``conv_prefill`` or ``conv_decode`` accordingly."""

from __future__ import annotations

import importlib
from typing import Any

from .adapters import ADAPTERS
from .checks import CAPABILITIES_ATTR, Report, run
from .prefill import PREFILL_CAPABILITIES_ATTR, run_prefill

DECODE_AREA, PREFILL_AREA = "conv_decode", "conv_prefill"


def load_kernel(spec: str, adapter: str | None = None, device: str | None = None) -> Any:
    """The callable ``module:callable``, wrapped by the named conv adapter when given.

    Raises:
        ImportError, AttributeError: the module or callable cannot be found. KeyError: an unknown adapter.
    """
    module, _, name = spec.partition(":")
    fn = getattr(importlib.import_module(module), name)
    return ADAPTERS[adapter](fn, device) if adapter else fn


def declares_conv(fn: Any) -> bool:
    """True when a callable declares conv-family capabilities (a conv kernel called directly)."""
    return any(getattr(fn, attr, None) is not None for attr in (CAPABILITIES_ATTR, PREFILL_CAPABILITIES_ATTR))


def run_kernel(kernel: Any, seed: int = 0) -> tuple[str, Report]:
    """The family's checks on ``kernel``: (its contract area, the report)."""
    if getattr(kernel, PREFILL_CAPABILITIES_ATTR, None) is not None:
        return PREFILL_AREA, run_prefill(kernel, seed=seed)
    return DECODE_AREA, run(kernel, seed=seed)
