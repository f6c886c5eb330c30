"""The drop-ins in grad mode: forward-only ops that autograd and ``torch.compile`` can carry, whose backward raises
``ForwardOnlyError`` naming the drop-in.

Why this way. A custom op called on inputs that require grad goes through its autograd registration; without one,
eager works until ``.backward()`` ("no autograd formula"), but ``torch.compile`` fails at compile time: AOT
autograd traces the backward with the forward (torch 2.13, ``torch._library.autograd``). So:

- each functional op (``gdn_nki::chunk_gated_delta_rule``, ``fused_recurrent_gated_delta_rule``, ``gdn_tkg``,
  ``rms_norm_gated``, ``rejected_call``) gets ``torch.library.register_autograd`` (``forbid_backward``). Its
  backward must trace, so it does not raise itself: it calls ``gdn_nki::backward_refused``, whose fake
  implementation gives a placeholder and whose real one raises — when the backward runs, not when it compiles;
- an op that updates a pool in place cannot have an autograd formula (``register_autograd`` refuses a
  non-functional schema), so its drop-in hands it the inputs detached and puts its output on the inputs' graph
  through ``gdn_nki::forward_only`` (``attached``): a functional op returning a copy of the output, with the same
  refusing backward. The pool's update itself is not recorded on the graph (a pool is serving state; the host
  entry points, which record it, remain for eager code that needs that).

Outside grad mode, or with no input requiring grad, none of this runs (no copy, no graph).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..host.torch_io import ForwardOnlyError, import_torch

torch = import_torch()
Tensor = torch.Tensor


@torch.library.custom_op("gdn_nki::backward_refused", mutates_args=())
def backward_refused(entry: str, grads: list[Tensor]) -> Tensor:
    """The backward of a forward-only op: raises ``ForwardOnlyError(entry)`` when run.

    Args:
        entry (str): the drop-in's public name.
        grads (list[Tensor]): the gradients reaching the op's outputs (they make the node depend on the backward).

    Returns:
        Tensor: never (the fake implementation gives a 0-d placeholder the input gradients are expanded from).
    """
    raise ForwardOnlyError(entry)


@backward_refused.register_fake
def _backward_refused_fake(entry: str, grads: list[Tensor]) -> Tensor:
    return grads[0].new_empty(())


# A refusal whose result no gradient reads would otherwise be dropped from the backward graph as dead code.
torch.fx.node.has_side_effect(torch.ops.gdn_nki.backward_refused.default)


def forbid_backward(op: Any, entry: str | None) -> None:
    """Register ``op``'s autograd formula: forward as registered, backward raising ``ForwardOnlyError(entry)``.

    Args:
        op: a functional ``torch.library.custom_op``.
        entry (str | None): the public name a backward through it names; None: the op's first argument.
    """

    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        del output
        ctx.entry = inputs[0] if entry is None else entry
        ctx.inputs = [_metadata(x) for x in inputs]

    def backward(ctx: Any, *grads: Any) -> tuple[Any, ...]:
        given = [grad for grad in grads if isinstance(grad, Tensor)]
        refused = backward_refused(ctx.entry, given) if given and any(ctx.needs_input_grad) else None
        # A compiled call that omits an op's trailing defaulted arguments (the folded norm's) has them among the
        # inputs here but not in needs_input_grad: one gradient per argument passed
        given_inputs = ctx.inputs[: len(ctx.needs_input_grad)]
        return tuple(
            _expanded(refused, meta) if refused is not None and needed else None
            for meta, needed in zip(given_inputs, ctx.needs_input_grad, strict=True)
        )

    op.register_autograd(backward, setup_context=setup_context)


def _metadata(x: Any) -> Any:
    """What an input's gradient is shaped by: (shape, dtype) of a tensor, a list of those for a tensor list."""
    if isinstance(x, Tensor):
        return x.shape, x.dtype
    if isinstance(x, (list, tuple)) and x and all(isinstance(item, Tensor) for item in x):
        return [(item.shape, item.dtype) for item in x]
    return None


def _expanded(refused: Tensor, meta: Any) -> Any:
    """The refusal as an input's gradient (shaped as ``_metadata`` recorded): the backward graph's node of it."""
    if meta is None:
        return None
    if isinstance(meta, list):
        return [refused.to(dtype).expand(shape) for shape, dtype in meta]
    return refused.to(meta[1]).expand(meta[0])


@torch.library.custom_op("gdn_nki::forward_only", mutates_args=())
def forward_only_op(entry: str, result: Tensor, inputs: list[Tensor]) -> Tensor:
    """``result`` (a copy) on the autograd graph of ``inputs``, by a node whose backward raises
    ``ForwardOnlyError(entry)``: the output of an op that updates a pool in place (module docstring)."""
    del entry, inputs
    return result.clone()


@forward_only_op.register_fake
def _forward_only_fake(entry: str, result: Tensor, inputs: list[Tensor]) -> Tensor:
    return torch.empty_like(result)


forbid_backward(forward_only_op, None)


def on_graph(tensors: Iterable[Any]) -> list[Tensor]:
    """The tensors among ``tensors`` that would put a result on the autograd graph (grad mode on, requires grad)."""
    if not torch.is_grad_enabled():
        return []
    return [x for x in tensors if isinstance(x, Tensor) and x.requires_grad]


def detached(x: Any) -> Any:
    """``x.detach()`` for a tensor (same memory, off the graph), anything else as it is."""
    return x.detach() if isinstance(x, Tensor) else x


def attached(entry: str, result: Any, inputs: Iterable[Any]) -> Any:
    """``result`` put on the graph of those ``inputs`` that require grad (``gdn_nki::forward_only``: a copy, whose
    backward raises ``ForwardOnlyError(entry)``); ``result`` itself when none does or grad mode is off."""
    grads = on_graph(inputs)
    if not grads or not isinstance(result, Tensor):
        return result
    return forward_only_op(entry, result, grads)
