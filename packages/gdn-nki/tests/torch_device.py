"""The device the torch op tests build their tensors on: ``GDN_TORCH_DEVICE`` (default ``cpu``), and the
``torch.compile`` backend they compile with: ``GDN_TORCH_COMPILE_BACKEND`` (default ``aot_eager``).

``nox -s neuron`` sets them to the Neuron session's XLA device and torch-neuronx's ``neuron`` backend, so the op,
compile and device-path tests run there (``test_torch_ops``, ``test_torch_compile``, ``test_torch_device``,
``test_torch_traced_rejections``); anywhere else they run on the CPU as before. What cannot run on a device is
skipped there with ``skip_on_device``, saying why.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

DEVICE_VARIABLE = "GDN_TORCH_DEVICE"
BACKEND_VARIABLE = "GDN_TORCH_COMPILE_BACKEND"


def test_device() -> torch.device:
    """The device named by ``GDN_TORCH_DEVICE``; ``cpu`` when it is unset or empty."""
    return torch.device(os.environ.get(DEVICE_VARIABLE) or "cpu")


test_device.__test__ = False  # a helper, not a pytest test


def on_device(args: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """A call's keyword arguments with every tensor copied to ``device`` (other values as they are)."""
    return {name: x.to(device) if isinstance(x, torch.Tensor) else x for name, x in args.items()}


def compile_backend() -> str:
    """The ``torch.compile`` backend named by ``GDN_TORCH_COMPILE_BACKEND``; ``aot_eager`` when it is unset or empty
    (dynamo's capture and AOT autograd's functionalization, run eagerly: what every backend receives)."""
    return os.environ.get(BACKEND_VARIABLE) or "aot_eager"


def skip_on_device(reason: str) -> None:
    """Skip the calling test when ``GDN_TORCH_DEVICE`` is not the CPU, saying why it cannot run on a device."""
    if test_device().type != "cpu":
        pytest.skip(f"not on GDN_TORCH_DEVICE={test_device()}: {reason}")


@contextlib.contextmanager
def launch_replaced(launch: Callable[..., Any]) -> Iterator[None]:
    """``gdn_nki.torch.device.launch`` — the one kernel launch of every op's device path — replaced by ``launch``
    for the context's duration (a recorder, or nki-cpu's interpreter)."""
    from gdn_nki.torch import device

    saved = device.launch
    device.launch = launch
    try:
        yield
    finally:
        device.launch = saved
