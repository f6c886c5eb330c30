"""The conv family (issue 43): checks any causal depthwise conv1d kernel on a conv-state pool must pass
(``checks``), adapters for kernels of other conventions (``adapters``), and ``python -m gdn_spec.conv``."""

from .checks import CAPABILITIES_ATTR, CHECKS, ConvCapabilities, ConvCheckError, Report, run

__all__ = ["CAPABILITIES_ATTR", "CHECKS", "ConvCapabilities", "ConvCheckError", "Report", "run"]
