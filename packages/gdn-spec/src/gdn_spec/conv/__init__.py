"""The conv family (issue 43): checks any causal depthwise conv1d kernel on a conv-state pool must pass
(``checks``: the decode step; ``prefill``: packed sequences, checkpoints), adapters for kernels of other conventions (``adapters``), and ``python -m gdn_spec.conv``."""

from .checks import CAPABILITIES_ATTR, CHECKS, ConvCapabilities, ConvCheckError, Report, run
from .prefill import PREFILL_CAPABILITIES_ATTR, PREFILL_CHECKS, PrefillCapabilities, run_prefill

__all__ = [
    "CAPABILITIES_ATTR",
    "CHECKS",
    "PREFILL_CAPABILITIES_ATTR",
    "PREFILL_CHECKS",
    "ConvCapabilities",
    "ConvCheckError",
    "PrefillCapabilities",
    "Report",
    "run",
    "run_prefill",
]
