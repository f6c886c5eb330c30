"""FLA's gated RMSNorm (``fla.modules.fused_norm_gate``: ``rms_norm_gated`` and ``FusedRMSNormGated``) on gdn-nki's
NKI kernel, as the ``torch.library`` custom op ``gdn_nki::rms_norm_gated``.

The op has three implementations, as the other drop-ins' (``ops.py``): on the CPU the host entry point
``gdn_nki.host.norm.gated_rms_norm`` (every rule, the value scan); under fake tensors the shape and dtype rules
(``gdn_nki.norm.rules``, the CPU's very ``ContractError``) and an empty output; on another device the
``@nki.jit`` kernel launched on the device tensors (``device.launch``). The drop-ins read only types, shapes, dtypes
and non-tensor options, honour or reject every option by name, and call the op once.

FLA's semantics, which the drop-ins keep: x (+ residual) normalized in fp32 over the last axis, times the weight
(read as fp32), times ``swish(g)`` or ``sigmoid(g)``, rounded once to x's dtype; ``prenorm`` also returns x +
residual (in the residual's dtype, fp32 with ``residual_in_fp32``). HF's ``Qwen3NextRMSNormGated`` rounds the
normalized value to x's dtype before the weight: the same in fp32, one bf16 rounding apart in bf16.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from gdn_ref.contract import ContractError, names_entry_point
from gdn_ref.norm import check_norm_options

from ..host.norm import gated_rms_norm
from ..host.torch_io import _INDEX, as_numpy, as_torch, import_torch, rejection
from ..norm.rules import IO_DTYPES
from . import norm_device
from .forward_only import forbid_backward
from .traced_rejection import rejects_at_trace_time

torch = import_torch()
Tensor = torch.Tensor
nn = torch.nn

ACTIVATIONS = ("swish", "silu", "sigmoid")  # FLA's FusedRMSNormGated accepts these three


@torch.library.custom_op("gdn_nki::rms_norm_gated", mutates_args=())
def rms_norm_gated_op(x: Tensor, g: Tensor | None, weight: Tensor | None, eps: float, activation: str) -> Tensor:
    """y = x · rsqrt(mean(x²) + eps) · weight · act(g) over the last axis, in x's dtype (a device: the kernel)."""
    return norm_device.rms_norm_gated(x, g, weight, eps, activation)


@rms_norm_gated_op.register_kernel("cpu")
def _rms_norm_gated_cpu(x: Tensor, g: Tensor | None, weight: Tensor | None, eps: float, activation: str) -> Tensor:
    arrays = [None if t is None else np.ascontiguousarray(as_numpy(t.detach())) for t in (x, g, weight)]
    y = gated_rms_norm(*arrays, eps=eps, activation=activation)
    return as_torch(np.ascontiguousarray(y)).clone()


forbid_backward(rms_norm_gated_op, "gdn_nki.torch.rms_norm_gated")


@rms_norm_gated_op.register_fake
def _rms_norm_gated_fake(x: Tensor, g: Tensor | None, weight: Tensor | None, eps: float, activation: str) -> Tensor:
    norm_device.check_shapes(x, g, weight, eps, activation)
    return torch.empty_like(x)


@rejects_at_trace_time(
    lambda rejected, argument: (
        (rejected(argument("x")), argument("x")) if argument("prenorm") else rejected(argument("x"))
    )
)
@names_entry_point("gdn_nki.torch.rms_norm_gated")
def rms_norm_gated(
    x: Tensor,
    g: Tensor | None,
    weight: Tensor | None,
    bias: Tensor | None,
    activation: str = "swish",
    residual: Tensor | None = None,
    prenorm: bool = False,
    residual_in_fp32: bool = False,
    eps: float = 1e-6,
    **kwargs: Any,
) -> Tensor | tuple[Tensor, Tensor]:
    """FLA's ``rms_norm_gated``: the gated RMSNorm of a GatedDeltaNet layer's output stage, forward only.

    Dimensions:
        D: the normalized (last) axis (head_v_dim, 128 at Qwen3-Next's shapes); any leading axes.

    Args:
        x (Tensor): [..., D] float32 or bfloat16.
        g (Tensor | None): x's shape, float32 or bfloat16: the gate (Qwen3-Next's ``z``); None: no gate.
        weight (Tensor | None): [D] (read as fp32, as FLA reads it); None: no scale.
        bias (Tensor | None): must be None (FusedRMSNormGated has none; no Qwen3-Next layer uses one): rejected
            by name otherwise.
        activation (str): "swish" / "silu" (g · sigmoid(g)) or "sigmoid".
        residual (Tensor | None): x's shape: added to x in fp32 before the norm (the kernel then runs in fp32).
        prenorm (bool): also return x + residual.
        residual_in_fp32 (bool): the prenorm output in fp32 (else the residual's dtype, or x itself).
        eps (float): added to mean(x²).
        **kwargs: vLLM's / Mamba's ``norm_before_gate`` (only True) and ``group_size`` (only None or D) are
            honoured at those values and rejected by name otherwise; any other name is rejected.

    Returns:
        Tensor | tuple[Tensor, Tensor]: y (x's shape and dtype), and with ``prenorm`` (y, x + residual).

    Notes:
        One ``gdn_nki::rms_norm_gated`` op: traceable (``torch.compile(fullgraph=True)``, fake tensors). Bad input
        raises ``ContractError`` naming the argument, the value, the rule and the fix. When g's dtype differs
        from x's, or with a residual, the kernel runs in fp32 and y is rounded once to x's dtype (FLA's single
        rounding).
    """
    norm_before_gate = kwargs.pop("norm_before_gate", True)
    group_size = kwargs.pop("group_size", None)
    if kwargs:
        name = sorted(kwargs)[0]
        raise rejection(name, repr(kwargs[name]), f"gdn-nki's rms_norm_gated has no option {name}", f"drop {name}")
    if bias is not None:
        raise rejection("bias", "a tensor", "gdn-nki's gated RMSNorm has no bias (FLA's FusedRMSNormGated and "
                        "Qwen3-Next's layer have none)", "pass bias=None")  # fmt: skip
    for name, value in (("x", x), ("g", g), ("weight", weight), ("residual", residual)):
        if value is not None and not isinstance(value, Tensor):
            raise rejection(name, type(value).__name__, f"{name} must be a torch tensor", f"pass {name} as a tensor")
    if x is None:
        raise rejection("x", "None", "x must be a torch tensor", "pass x as a tensor")
    # Plain Python only before the op (dynamo traces this function; numpy's checks would break its graph): the
    # options the op does not carry, in check_norm_options' words; the op's rules (norm_violations) do the rest.
    if norm_before_gate is not True or group_size not in (None, x.shape[-1]):
        _reject_option(x.shape, norm_before_gate, group_size)
    dtype = str(x.dtype).removeprefix("torch.")
    if dtype not in IO_DTYPES:
        raise rejection("x", f"dtype {dtype}", f"x must be one of {IO_DTYPES}", "pass x.float()", "norm.x")
    if residual is not None and residual.shape != x.shape:
        raise rejection("residual", f"shape {tuple(residual.shape)}", f"residual has x's shape {tuple(x.shape)}",
                        "pass the residual stream shaped like x")  # fmt: skip
    h = x if residual is None else x.float() + residual.float()
    wide = residual is not None or (g is not None and g.dtype != x.dtype)
    try:
        y = rms_norm_gated_op(h.float() if wide else h, None if g is None else (g.float() if wide else g),
                              None if weight is None else weight.float(), float(eps), str(activation))  # fmt: skip
    except ContractError as error:
        raise (error if residual is None else _blame_residual(error, x, residual)) from None
    y = y.to(x.dtype)
    if not prenorm:
        return y
    if residual is not None:
        return y, h.to(torch.float32 if residual_in_fp32 else residual.dtype)
    return y, (x.float() if residual_in_fp32 else x)


def _blame_residual(error: ContractError, x: Tensor, residual: Tensor) -> ContractError:
    """``error`` with a non-finite value of the kernel's x (the caller's x + residual) blamed on what the caller
    passed: ``residual`` where x is finite and the residual is not, ``x + residual`` where both are finite (the sum
    overflowed), x itself otherwise."""
    blamed = []
    for v in error.violations:
        found = _INDEX.search(v.value) if (v.argument, v.rule_id) == ("x", "norm.finite") else None
        at = None if found is None else tuple(int(i) for i in found.group(1).split(","))
        if at is not None and bool(torch.isfinite(x[at])):
            name = "residual" if not bool(torch.isfinite(residual[at])) else "x + residual"
            source = residual if name == "residual" else x.float() + residual.float()
            v = dataclasses.replace(v, argument=name, value=f"value {float(source[at])} at index {list(at)}",
                                    rule=f"{name} must hold finite numbers", fix=f"find where {name} overflowed")  # fmt: skip
        blamed.append(v)
    return ContractError(blamed, error.entry_point)


def _reject_option(shape: Any, norm_before_gate: Any, group_size: Any) -> None:
    """Raise check_norm_options' ``ContractError`` for the unsupported ``norm_before_gate`` or ``group_size``."""
    check_norm_options(tuple(shape), None, None, eps=1.0, activation="silu", norm_before_gate=bool(norm_before_gate),
                       group_size=group_size)  # fmt: skip
    raise rejection("norm_before_gate", repr(norm_before_gate), "norm_before_gate is True or False",
                    "pass norm_before_gate=True")  # fmt: skip


class FusedRMSNormGated(nn.Module):
    """FLA's ``FusedRMSNormGated`` on gdn-nki's kernel: y = rmsnorm(x) · weight · act(g) over the last axis.

    Dimensions:
        D (hidden_size): the normalized axis (a GatedDeltaNet layer's head_v_dim).

    Args:
        hidden_size (int): D.
        elementwise_affine (bool): a learnable weight [D] (initialized to ones); False: none.
        eps (float): added to mean(x²). The default is FLA's, 1e-5; HF's ``Qwen3NextRMSNormGated`` defaults to
            1e-6 and a Qwen3-Next layer builds it with ``eps=layer.layer_norm_epsilon`` (its config's
            ``rms_norm_eps``, 1e-6): replacing ``layer.norm``, pass ``eps=layer.norm.variance_epsilon``, else every
            output differs by the eps.
        activation (str): "swish" / "silu" or "sigmoid"; anything else is rejected by name (FLA raises too).
        device, dtype: of the weight.

    Notes:
        ``forward(x, g, residual=None, prenorm=False, residual_in_fp32=False)`` is ``rms_norm_gated`` with the
        module's weight, eps and activation. Forward only (the kernel has no backward).
    """

    def __init__(
        self,
        hidden_size: int,
        elementwise_affine: bool = True,
        eps: float = 1e-5,
        activation: str = "swish",
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise rejection("activation", repr(activation), f"activation is one of {ACTIVATIONS}",
                            "pass activation='silu' (Qwen3-Next) or 'sigmoid'")  # fmt: skip
        self.hidden_size = hidden_size
        self.elementwise_affine = elementwise_affine
        self.eps = eps
        self.activation = activation
        if elementwise_affine:
            self.weight = nn.Parameter(torch.empty(hidden_size, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The weight to ones, as FLA initializes it."""
        if self.elementwise_affine:
            nn.init.ones_(self.weight)

    def extra_repr(self) -> str:
        affine = "" if self.elementwise_affine else ", elementwise_affine=False"
        return f"{self.hidden_size}{affine}, eps={self.eps}, activation={self.activation}"

    def forward(
        self,
        x: Tensor,
        g: Tensor | None,
        residual: Tensor | None = None,
        prenorm: bool = False,
        residual_in_fp32: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        return rms_norm_gated(x, g, self.weight, self.bias, self.activation, residual=residual, prenorm=prenorm,
                              residual_in_fp32=residual_in_fp32, eps=self.eps)  # fmt: skip
