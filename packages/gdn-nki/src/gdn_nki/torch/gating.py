"""vLLM's ``fused_gdn_gating`` (``vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py``) on gdn-nki's NKI
kernel, as the ``torch.library`` custom op ``gdn_nki::fused_gdn_gating``: the prefill gates g = −exp(A_log) ·
softplus(a + dt_bias) and β = sigmoid(b) of a Qwen3-Next GatedDeltaNet layer, computed on device instead of by
torch before the recurrence's launch.

The op has three implementations, as the other drop-ins' (``ops.py``, ``norm.py``): on the CPU the host entry
point ``gdn_nki.host.gating.fused_gdn_gating`` (every rule, the value scan); under fake tensors the shape and dtype
rules (``gdn_nki.gating.rules``, the CPU's very ``ContractError``) and empty outputs; on another device the
``@nki.jit`` kernel launched on the device tensors (``device.launch``), its rules checked first, no value read on
the host (NaN / Inf are trusted, as vLLM's Triton kernel trusts them).
"""

from __future__ import annotations

import numpy as np

from gdn_ref.contract import ContractError, names_entry_point

from ..gating.kernel import gdn_gating
from ..gating.rules import gating_violations
from ..host.gating import fused_gdn_gating as host_gating
from ..host.torch_io import as_numpy, as_torch, import_torch, rejection
from . import device
from .forward_only import forbid_backward
from .traced_rejection import rejects_at_trace_time

torch = import_torch()
Tensor = torch.Tensor


def check_shapes(A_log: Tensor, a: Tensor, b: Tensor, dt_bias: Tensor, beta: float, threshold: float) -> None:
    """The kernel's shape, dtype and option rules on (fake, meta or device) tensors: the CPU path's
    ``ContractError``."""
    found = gating_violations(A_log, a, b, dt_bias, beta, threshold)
    if found:
        raise ContractError(found)


@torch.library.custom_op("gdn_nki::fused_gdn_gating", mutates_args=())
def fused_gdn_gating_op(
    A_log: Tensor,
    a: Tensor,
    b: Tensor,
    dt_bias: Tensor,
    beta: float,
    threshold: float,
) -> tuple[Tensor, Tensor]:
    """(g, beta_output) on a device: the kernel, its rules checked first."""
    check_shapes(A_log, a, b, dt_bias, beta, threshold)
    operands = [t.contiguous() for t in (A_log, a, b, dt_bias)]
    return device.launch(gdn_gating, *operands, beta, threshold)


@fused_gdn_gating_op.register_kernel("cpu")
def _fused_gdn_gating_cpu(
    A_log: Tensor,
    a: Tensor,
    b: Tensor,
    dt_bias: Tensor,
    beta: float,
    threshold: float,
) -> tuple[Tensor, Tensor]:
    arrays = [np.ascontiguousarray(as_numpy(t.detach())) for t in (A_log, a, b, dt_bias)]
    g, beta_out = host_gating(*arrays, beta, threshold)
    return as_torch(np.ascontiguousarray(g)).clone(), as_torch(np.ascontiguousarray(beta_out)).clone()


forbid_backward(fused_gdn_gating_op, "gdn_nki.torch.fused_gdn_gating")


@fused_gdn_gating_op.register_fake
def _fused_gdn_gating_fake(
    A_log: Tensor,
    a: Tensor,
    b: Tensor,
    dt_bias: Tensor,
    beta: float,
    threshold: float,
) -> tuple[Tensor, Tensor]:
    check_shapes(A_log, a, b, dt_bias, beta, threshold)
    shape = (1, *a.shape)
    return a.new_empty(shape, dtype=torch.float32), b.new_empty(shape)


@rejects_at_trace_time(lambda rejected, argument: (rejected(argument("a")), argument("b")))
@names_entry_point("gdn_nki.torch.fused_gdn_gating")
def fused_gdn_gating(
    A_log: Tensor,
    a: Tensor,
    b: Tensor,
    dt_bias: Tensor,
    beta: float = 1.0,
    threshold: float = 20.0,
) -> tuple[Tensor, Tensor]:
    """vLLM's ``fused_gdn_gating``: a GatedDeltaNet layer's prefill gates from its a and b projections.

    Dimensions:
        T: tokens. H: the layer's value heads (on this tensor-parallel shard).

    Args:
        A_log (Tensor): [H] float32 or bfloat16: log of each head's decay rate.
        a (Tensor): [T, H] float32 or bfloat16: the raw gate projection.
        b (Tensor): [T, H] float32 or bfloat16: the β logit projection.
        dt_bias (Tensor): [H] float32 or bfloat16.
        beta (float): the softplus' beta (vLLM's keyword, 1.0 in every caller).
        threshold (float): vLLM's softplus switch-over; at least 20 (the exact softplus reproduces it in fp32).

    Returns:
        tuple: g [1, T, H] float32 (= −exp(A_log)·softplus(a + dt_bias)) and beta_output [1, T, H] in b's dtype
        (= sigmoid(b)), as vLLM returns them.

    Notes:
        One ``gdn_nki::fused_gdn_gating`` op: traceable (``torch.compile(fullgraph=True)``, fake tensors). Bad input
        raises ``ContractError`` naming the argument, the value, the rule and the fix (under ``torch.compile``, when
        the compiled graph first runs, before anything is computed).
    """
    for name, value in (("A_log", A_log), ("a", a), ("b", b), ("dt_bias", dt_bias)):
        if not isinstance(value, Tensor):
            raise rejection(name, type(value).__name__, f"{name} must be a torch tensor", f"pass {name} as a tensor")
    if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in (beta, threshold)):
        check_shapes(A_log, a, b, dt_bias, beta, threshold)  # names the option float() would otherwise accept
    return fused_gdn_gating_op(A_log, a, b, dt_bias, float(beta), float(threshold))
