"""Framework tensors at a launch: CPU torch tensors in, torch out, as ``nki.simulate`` takes numpy or torch.

torch is never imported here: a caller holding a torch tensor has imported it already. A CPU tensor becomes a
numpy view of its memory (bfloat16 through its 16-bit pattern, never a float conversion), so in-place writes of
the kernel reach the caller's tensor.
"""

from __future__ import annotations

import sys
from typing import Any

import ml_dtypes
import numpy as np


def torch_module() -> Any:
    """The imported ``torch`` module, or None when no caller has imported it."""
    return sys.modules.get("torch")


def is_torch_tensor(value: Any) -> bool:
    torch = torch_module()
    return torch is not None and isinstance(value, torch.Tensor)


def torch_to_numpy(name: str, value: Any) -> np.ndarray:
    """The numpy view of a CPU torch tensor argument; any other device is reported by argument name."""
    torch = torch_module()
    if value.device.type != "cpu":
        raise TypeError(
            f"nki-cpu: kernel argument `{name}` is on device {value.device}; the simulator takes CPU tensors"
        )
    value = value.detach()
    if value.dtype == torch.bfloat16:
        return value.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return value.numpy()


def numpy_to_torch(array: np.ndarray) -> Any:
    """A torch tensor over a (fresh) numpy result."""
    torch = torch_module()
    array = np.ascontiguousarray(array)
    if array.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)
