"""The device the torch op tests build their tensors on: ``GDN_TORCH_DEVICE`` (default ``cpu``).

``nox -s neuron`` sets it to the Neuron session's XLA device, so the op tests run the device path there and check
its results against the CPU path; anywhere else the tests run on the CPU as before.
"""

from __future__ import annotations

import os
from typing import Any

import torch

DEVICE_VARIABLE = "GDN_TORCH_DEVICE"


def test_device() -> torch.device:
    """The device named by ``GDN_TORCH_DEVICE``; ``cpu`` when it is unset or empty."""
    return torch.device(os.environ.get(DEVICE_VARIABLE) or "cpu")


test_device.__test__ = False  # a helper, not a pytest test


def on_device(args: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """A call's keyword arguments with every tensor copied to ``device`` (other values as they are)."""
    return {name: x.to(device) if isinstance(x, torch.Tensor) else x for name, x in args.items()}
