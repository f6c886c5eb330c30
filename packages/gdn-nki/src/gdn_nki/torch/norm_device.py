"""The gated RMSNorm op on a device (Neuron / XLA tensors): ``gdn_gated_rms_norm`` launched on the device tensors
through ``device.launch``, as the recurrence ops' device path (``device.py``) launches theirs (torch-neuronx, SDK
2.33, "How to work with NKI kernels from torch-neuronx").

The shape and dtype rules (``norm.rules.norm_violations``, the CPU's and the fake implementation's) run first, at
trace time; no value is read on the host (NaN / Inf in x, g or the weight is trusted, as FLA's kernel trusts it).
Layout: the kernel reads x and g row-major over [rows, D]; the drop-in's tensors are handed over as they are when
contiguous (the recurrence's output, HF's reshape to [tokens · heads, D]), and made contiguous otherwise — one copy
in HBM, the kernel's row-major read being its documented layout.
"""

from __future__ import annotations

from gdn_ref.contract import ContractError

from ..host.torch_io import import_torch
from ..norm.kernel import gdn_gated_rms_norm
from ..norm.rules import norm_violations
from . import device

torch = import_torch()
Tensor = torch.Tensor


def check_shapes(x: Tensor, g: Tensor | None, weight: Tensor | None, eps: float, activation: str) -> None:
    """The kernel's shape and dtype rules on (fake, meta or device) tensors: the CPU path's ``ContractError``."""
    found = norm_violations(x, g, weight, eps, activation)
    if found:
        raise ContractError(found)


def rms_norm_gated(x: Tensor, g: Tensor | None, weight: Tensor | None, eps: float, activation: str) -> Tensor:
    """``gdn_nki::rms_norm_gated`` on a device: y = x · rsqrt(mean(x²) + eps) · weight · act(g), one launch.

    Dimensions:
        D: the normalized (last) axis; any leading axes.

    Args:
        x (Tensor): [..., D] float32 or bfloat16.
        g (Tensor | None): x's shape and dtype: the gate; None: no gate.
        weight (Tensor | None): [D]; None: no scale.
        eps (float): added to mean(x²).
        activation (str): "swish" / "silu" or "sigmoid".

    Returns:
        Tensor: y, x's shape and dtype.

    Notes:
        Raises the CPU's ``ContractError`` for a bad shape or dtype before any launch.
    """
    check_shapes(x, g, weight, eps, activation)
    operands = [None if t is None else t.contiguous() for t in (x, g, weight)]
    return device.launch(gdn_gated_rms_norm, *operands, eps, activation)
