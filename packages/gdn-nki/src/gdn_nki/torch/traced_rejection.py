"""A drop-in's shape and dtype rejection under ``torch.compile``: the very ``ContractError`` eager raises, type and
message, raised by the compiled graph before any of the call runs.

Why this way. Dynamo (torch 2.13) lets no exception out of a ``fullgraph=True`` trace as itself: one raised in code
it traces becomes ``Unsupported`` ("Observed exception", ``symbolic_convert.exception_handler``), one raised by an
op's fake implementation ``TorchRuntimeError`` (``utils.get_fake_value``). Making ``ContractError`` constructible
by dynamo would only change which of the two the caller gets, and unwrapping needs a boundary gdn-nki does not own
(the caller's compiled function). What does reach the caller unchanged is an exception raised while the compiled
graph runs. So, under dynamo only:

1. ``_judge`` runs the drop-in itself on fake tensors of the arguments' shapes, strides, dtypes and devices
   (``torch.compiler.assume_constant_result``: dynamo calls it while tracing and keeps its result, an int, as a
   constant; it never traces into it). No value is read: a fake tensor has none. The rejection it finds is kept in
   ``REJECTIONS``;
2. a judged-valid call is traced as before (one ``gdn_nki`` op, no graph break); a rejected one compiles to
   ``gdn_nki::rejected_call`` instead of the drop-in's op: a node that raises the kept ``ContractError`` when the
   graph runs, which is the first call, before the drop-in's op would have run — nothing of the call is written,
   as in eager. Its outputs stand in for the drop-in's (their shapes a best guess: the graph never gets past it),
   so that the rest of the caller's function traces.

Strict ``torch.export`` (``strict=True``: dynamo traces) wants no program for a rejected call, and gets the
``ContractError`` itself, unwrapped: the judging function raises it, and dynamo, which calls that function itself
rather than tracing it, lets what it raises through as it is (torch 2.13). Calls whose arguments dynamo cannot hand
over as constants (a ``cp_context``, numpy arrays) are traced as before (a rejection then arrives wrapped, in
``TorchRuntimeError``). Outside dynamo — eager, ``FakeTensorMode``, non-strict ``torch.export`` — the drop-in runs as
it is and its op's fake implementation raises the ``ContractError`` itself.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from gdn_ref.contract import ContractError

from ..host.torch_io import import_torch
from .forward_only import forbid_backward

torch = import_torch()
Tensor = torch.Tensor
F = TypeVar("F", bound=Callable[..., Any])

# The rejections judged while tracing, by key (``gdn_nki::rejected_call``'s argument): one per distinct rejection,
# kept for the process's life (a compiled graph holding the key may run any time).
REJECTIONS: list[ContractError] = []
TENSOR = "gdn_nki.tensor"  # marks a tensor's description among the constants ``_judge`` receives
CONSTANT_TYPES = (bool, int, float, str, type(None), torch.dtype)


@torch.library.custom_op("gdn_nki::rejected_call", mutates_args=())
def rejected_call(rejection: int, like: Tensor) -> Tensor:
    """A drop-in call rejected at trace time: raises its ``ContractError`` (``REJECTIONS[rejection]``).

    Args:
        rejection (int): the key ``_judge`` returned.
        like (Tensor): the tensor whose shape and dtype the output takes while tracing.

    Returns:
        Tensor: never (the fake implementation gives an empty tensor like ``like``).
    """
    raise _kept(rejection)


def _kept(key: int) -> ContractError:
    """A fresh ``ContractError`` equal to the one kept under ``key`` (type, violations, entry point, message)."""
    error = REJECTIONS[key]
    return ContractError(error.violations, error.entry_point)


# In grad mode AOT autograd traces the backward too (it never runs: the forward raises first).
forbid_backward(rejected_call, "gdn_nki::rejected_call")


@rejected_call.register_fake
def _rejected_call_fake(rejection: int, like: Tensor) -> Tensor:
    return torch.empty_like(like)


# A rejection whose output nothing reads would otherwise be dropped from the graph as dead code.
torch.fx.node.has_side_effect(torch.ops.gdn_nki.rejected_call.default)


def _described(x: Any) -> Any:
    """``x`` as constants dynamo hands to ``_judge``: a tensor as (TENSOR, shape, stride, dtype, device, index),
    tuples and lists element by element, anything else as itself (None when dynamo could not pass it on)."""
    if isinstance(x, Tensor):
        return (TENSOR, tuple(int(s) for s in x.shape), tuple(int(s) for s in x.stride()), x.dtype, x.device.type,
                x.device.index)  # fmt: skip
    if isinstance(x, (tuple, list)):
        items = tuple(_described(item) for item in x)
        lost = any(item is None and given is not None for item, given in zip(items, x, strict=True))
        return None if lost else (type(x).__name__, items)
    return x if isinstance(x, CONSTANT_TYPES) else None


def _rebuilt(x: Any) -> Any:
    """The value ``_described`` described: a tensor as a fake tensor of its shape, stride, dtype and device."""
    if isinstance(x, tuple) and x and x[0] == TENSOR:
        _, shape, stride, dtype, device_type, index = x
        device = torch.device(device_type) if index is None else torch.device(device_type, index)
        return torch.empty_strided(shape, stride, dtype=dtype, device=device)
    if isinstance(x, tuple) and len(x) == 2 and x[0] in ("tuple", "list"):
        items = [_rebuilt(item) for item in x[1]]
        return items if x[0] == "list" else tuple(items)
    return x


def _judge(drop_in: Callable[..., Any], args: tuple[Any, ...], kwargs: tuple[tuple[str, Any], ...]) -> int:
    """Run ``drop_in`` on fake tensors of the described arguments: the key of its ``ContractError`` in
    ``REJECTIONS``, or −1 (it passed, or failed otherwise: the trace then meets the failure itself)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    try:
        with FakeTensorMode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the traced call gives its warnings itself
            drop_in(*(_rebuilt(x) for x in args), **{name: _rebuilt(x) for name, x in kwargs})
    except ContractError as error:
        for key, kept in enumerate(REJECTIONS):
            if str(kept) == str(error):
                return key
        REJECTIONS.append(error)
        return len(REJECTIONS) - 1
    except Exception:  # not a rejection: the traced call meets it as before
        return -1
    return -1


def rejects_at_trace_time(stand_in: Callable[..., Any]) -> Callable[[F], F]:
    """Decorate a drop-in so that, under dynamo, a call it rejects compiles to ``gdn_nki::rejected_call`` (module
    docstring); eager and other tracing run the drop-in unchanged.

    Args:
        stand_in (Callable): ``stand_in(rejected, arguments)`` returns what the drop-in returns, built from
            ``rejected(like)`` (the rejection's node, an empty tensor like ``like`` while tracing) and
            ``arguments(name)`` (the argument passed by that name or position, else its default).

    Returns:
        Callable: the decorator; the drop-in it returns has the drop-in's name, docstring and signature.

    Notes:
        Judging costs one run of the drop-in on fake tensors per trace (none per call of the compiled graph); an
        eager call pays two flag reads (``is_dynamo_compiling``, ``is_exporting``).
    """

    def decorate(drop_in: F) -> F:
        signature = inspect.signature(drop_in)
        names = list(signature.parameters)
        defaults = {name: p.default for name, p in signature.parameters.items() if p.default is not p.empty}

        @torch.compiler.assume_constant_result
        def judged(args: tuple[Any, ...], kwargs: tuple[tuple[str, Any], ...]) -> int:
            return _judge(drop_in, args, kwargs)

        @torch.compiler.assume_constant_result
        def judged_for_export(args: tuple[Any, ...], kwargs: tuple[tuple[str, Any], ...]) -> int:
            # dynamo calls this function itself while tracing: what it raises reaches the caller unwrapped
            key = _judge(drop_in, args, kwargs)
            if key >= 0:
                raise _kept(key)
            return key

        @functools.wraps(drop_in)
        def traced(*args: Any, **kwargs: Any) -> Any:
            if not torch.compiler.is_dynamo_compiling():
                return drop_in(*args, **kwargs)
            described_args = tuple(_described(x) for x in args)
            described_kwargs = tuple((name, _described(x)) for name, x in kwargs.items())
            passed = (*args, *kwargs.values())
            described = (*described_args, *(x for _, x in described_kwargs))
            if any(d is None and x is not None for d, x in zip(described, passed, strict=True)):
                return drop_in(*args, **kwargs)  # an argument dynamo cannot pass as a constant
            if torch.compiler.is_exporting():  # strict export: the rejection raised now, no program made
                judged_for_export(described_args, described_kwargs)
                return drop_in(*args, **kwargs)
            key = judged(described_args, described_kwargs)
            if key < 0:
                return drop_in(*args, **kwargs)

            def argument(name: str) -> Any:
                if name in kwargs:
                    return kwargs[name]
                at = names.index(name)
                return args[at] if at < len(args) else defaults.get(name)

            return stand_in(lambda like: rejected_call(key, like), argument)

        return traced  # type: ignore[return-value]

    return decorate
