"""numpy <-> torch for the torch adapters: exact bf16 (bit views, never a float round trip) on a chosen device.

On the CPU, ``torch.from_numpy`` shares the caller's memory; on another device arrays are copied over. Either way a
kernel writing a tensor in place changes the caller's array (``handoff.Handoff`` carries the write back), and a
tensor the kernel returns as its own argument comes back as the caller's numpy object.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from ..core import ImplementationError
from .handoff import Handoff

BF16 = np.dtype(ml_dtypes.bfloat16)


@dataclass(frozen=True)
class TorchIO:
    """Array conversion to torch tensors on ``device``."""

    torch: Any
    device: str

    @classmethod
    def create(cls, device: str | None = None) -> TorchIO:
        """Import torch and pick the device (default: cuda when torch sees one, else cpu)."""
        try:
            import torch
        except ImportError as exc:
            raise ImplementationError(f"the torch adapters need PyTorch (pip install torch): {exc}") from exc
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        try:
            torch.empty(1, device=device)
        except (RuntimeError, AssertionError) as exc:
            raise ImplementationError(f"--device {device!r} is not usable by torch {torch.__version__}: {exc}") from exc
        return cls(torch, device)

    def describe(self) -> str:
        return f"torch {self.torch.__version__.split('+')[0]} {self.device}"

    def to_kernel(self, x: np.ndarray) -> Any:
        """A tensor holding exactly ``x``'s values (bf16 through its bits; shares memory on the CPU)."""
        if x.dtype == BF16:
            tensor = self.torch.from_numpy(x.view(np.int16)).view(self.torch.bfloat16)
        else:
            tensor = self.torch.from_numpy(x)
        return tensor if self.device == "cpu" else tensor.to(self.device)

    def index(self, x: np.ndarray) -> Any:
        return self.torch.as_tensor(np.asarray(x, dtype=np.int64), device=self.device)

    def from_kernel(self, x: Any) -> np.ndarray:
        """A numpy array with exactly the tensor's values (bf16 -> ml_dtypes.bfloat16 through its bits)."""
        if not isinstance(x, self.torch.Tensor):
            return np.asarray(x)
        x = x.detach().cpu()
        if x.dtype == self.torch.bfloat16:
            return x.view(self.torch.int16).numpy().view(BF16)
        return x.numpy()


def wrap_torch_signature(fn: Callable[..., Any], io: TorchIO) -> Callable[..., Any]:
    """gdn_cte's numpy signature around a kernel with gdn_cte's signature and layout taking torch tensors.

    Args:
        fn (Callable): the kernel, called with gdn_cte's keyword arguments as tensors on ``io.device``.
        io (TorchIO): the conversion.

    Returns:
        Callable: every numpy argument becomes a tensor on the device; a write the kernel makes to one reaches the
        caller's array, whether it returned or raised (``Handoff``), and a returned tensor that IS one of the
        argument tensors (an in-place state) comes back as the caller's numpy object, holding the kernel's values.
    """

    def gdn_cte(**call: Any) -> tuple[np.ndarray, np.ndarray]:
        with Handoff(io) as handoff:
            tensors = {name: handoff.to_kernel(x) if isinstance(x, np.ndarray) else x for name, x in call.items()}
            result = fn(**tensors)
        if not isinstance(result, tuple):
            return result
        return tuple(_returned(item, tensors, call, io) for item in result)

    return gdn_cte


def _returned(item: Any, tensors: dict[str, Any], call: dict[str, Any], io: TorchIO) -> Any:
    """A returned tensor as numpy: the caller's own array when the tensor is the one made from it (the kernel's
    values are in it already, carried back), else the tensor's values."""
    for name, tensor in tensors.items():
        if tensor is item and isinstance(call[name], np.ndarray):
            return call[name]
    return io.from_kernel(item)


__all__ = ["TorchIO", "wrap_torch_signature"]
