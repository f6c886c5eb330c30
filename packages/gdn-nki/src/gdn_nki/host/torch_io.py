"""CPU torch tensors at the host entry points: checked, viewed as numpy without a copy where possible, and the
results handed back as torch.

torch is imported lazily (only when a caller passes a torch tensor or calls a torch entry point), so gdn-nki works
without it; ``pip install gdn-nki[torch]`` adds it. bfloat16 crosses between torch and ml_dtypes as its bits (a
16-bit integer view), never through a float conversion. A CPU tensor's numpy view shares its memory, so a state
updated in place through the view is updated in the caller's tensor.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from gdn_ref.contract import ContractError, Violation

from ..common.backend import numpy_to_torch, torch_to_numpy
from .pool_span import span_violations, strided_rows

# torch dtypes the host entry points take, by name: the compute dtypes and fp32 (gates, states, masks).
SUPPORTED_DTYPES = ("float32", "bfloat16")
# Integer dtypes of index arguments (cu_seqlens, state_indices): every torch integer dtype, as numpy's any
# integer array is taken; their values are checked (range, order) whatever the width.
INTEGER_DTYPES = ("int64", "int32", "int16", "int8", "uint8", "uint16", "uint32", "uint64")
INSTALL_HINT = 'install the optional extra: pip install "gdn-nki[torch]"'


def import_torch() -> Any:
    """``torch``, or an ImportError that says how to install it."""
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - exercised where torch is absent
        raise ImportError(f"gdn-nki's torch entry points need PyTorch: {INSTALL_HINT}") from exc
    return torch


def is_torch_tensor(x: Any) -> bool:
    """True for a torch tensor, without importing torch (a caller that has one has imported it)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def rejection(argument: str, value: str, rule: str, fix: str, rule_id: str | None = None) -> ContractError:
    """A ContractError with one violation of a host rule about a torch argument (rule id ``<argument>.torch``
    unless the rule has an id of its own)."""
    return ContractError([Violation(rule_id or f"{argument}.torch", argument, value, rule, fix)])


def check_tensor(name: str, x: Any, dtypes: tuple[str, ...] = SUPPORTED_DTYPES, *, any_device: bool = False) -> None:
    """Reject a torch tensor the host cannot read: not on the CPU (unless ``any_device``: the custom ops' trace-time
    checks, whose device implementation takes device tensors), or of a dtype outside ``dtypes``."""
    if x.device.type != "cpu" and not any_device:
        raise rejection(
            name,
            f"on device {x.device}",
            "the host entry points run the kernel on the CPU and take CPU tensors",
            f"pass {name}.cpu(); on a Neuron device call gdn_nki.gdn_cte with XLA tensors (README, 'torch')",
        )
    dtype = str(x.dtype).removeprefix("torch.")
    if dtype not in dtypes:
        raise rejection(name, f"dtype {dtype}", f"{name} must be one of {dtypes}", _dtype_fix(name, dtype, dtypes))


def check_pool_dtype(name: str, pool: Any, *, any_device: bool = False) -> None:
    """Reject a pool updated in place that is not float32, naming the fix that keeps it in place: a converted copy
    (``.to(torch.float32)``) would be the tensor updated, the caller's pool left stale. vLLM allocates its SSM state
    in the model's dtype unless told otherwise (``MambaStateDtypeCalculator``, ``mamba_ssm_cache_dtype="auto"``)."""
    if pool.device.type != "cpu" and not any_device:
        check_tensor(name, pool, ("float32",))  # the device's rejection first, as check_tensor orders them
    dtype = str(pool.dtype).removeprefix("torch.")
    if dtype != "float32":
        raise rejection(name, f"dtype {dtype}", f"{name} is a state pool updated in place: float32 only (the kernels "
                        "keep the recurrent state in fp32)", f"allocate {name} in float32 (vLLM: "
                        f"--mamba-ssm-cache-dtype float32); {name}.to(torch.float32) is a copy: it would be updated, "
                        f"not {name}")  # fmt: skip


def _dtype_fix(name: str, dtype: str, dtypes: tuple[str, ...]) -> str:
    """How to convert an unsupported dtype: to float32 when it is lossless (float16 widens exactly) or closest
    (float64), naming bfloat16 beside it where that is also taken (it halves the traffic, but rounds)."""
    if dtype not in ("float16", "float64") or "float32" not in dtypes:
        return f"pass {name}.to(torch.{dtypes[0]})"
    exact = "lossless" if dtype == "float16" else "the closest"
    narrow = "; torch.bfloat16 is also taken, but rounds" if "bfloat16" in dtypes else ""
    return f"pass {name}.to(torch.float32) ({exact}{narrow})"


def as_numpy(x: Any) -> np.ndarray:
    """The numpy view of a CPU torch tensor (same memory, same strides); bfloat16 as ml_dtypes.bfloat16 bits."""
    return torch_to_numpy("tensor", x)


def as_torch(a: np.ndarray) -> Any:
    """A torch tensor over a numpy array's memory (bfloat16 by its bits)."""
    import_torch()
    return numpy_to_torch(a)


TRAINING_ADVICE = (
    "For training use a differentiable implementation (FLA's chunk_gated_delta_rule / "
    "fused_recurrent_gated_delta_rule, HF transformers' torch_chunk_gated_delta_rule); for inference run under "
    "torch.no_grad() or torch.inference_mode()"
)


class ForwardOnlyError(NotImplementedError):
    """A backward through a gdn-nki kernel: the kernels are forward-only (inference), they have no backward.

    Args:
        entry (str): what the backward went through (a drop-in's public name), named by the message.
    """

    def __init__(self, entry: str) -> None:
        self.entry = entry
        super().__init__(
            f"{entry} is forward-only (an inference kernel): it has no backward pass, so no gradient flows to its "
            f"inputs. {TRAINING_ADVICE}"
        )


@functools.cache
def _forward_only_function() -> Any:
    """The autograd node of a forward-only result (built on first use: torch is imported lazily)."""
    torch = import_torch()

    class ForwardOnly(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, result: Any, *inputs: Any) -> Any:
            del ctx, inputs
            return result.view_as(result)

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> Any:
            raise ForwardOnlyError("gdn-nki's GDN kernel")

    return ForwardOnly


def forward_only(result: Any, inputs: Any) -> Any:
    """``result`` (a fresh tensor), put on the autograd graph of ``inputs`` when grad mode is on and any input
    requires grad, by a node whose backward raises ``NotImplementedError`` saying the kernel is forward-only.

    The kernel runs on numpy, which detaches: without this a training step through a model using it would run
    with no gradient through its GDN layers and no error. Inference, no_grad or not, is unaffected (same values,
    same memory).
    """
    grads = _grads(inputs)
    if result is None or not grads:
        return result
    return _forward_only_function().apply(result, *grads)


def _grads(inputs: Any) -> list[Any]:
    """The torch inputs that require grad, when grad mode is on (else none: nothing goes on a graph)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.is_grad_enabled():
        return []
    return [x for x in inputs if is_torch_tensor(x) and x.requires_grad]


def reject_empty(name: str, x: Any) -> None:
    """Reject an empty token tensor (a dimension of 0: no request, no token, no head) in the caller's own words,
    before a drop-in lays it out otherwise: an empty batch is the caller's to skip."""
    if is_torch_tensor(x) and 0 in tuple(x.shape):
        raise rejection(name, f"shape {tuple(x.shape)}", f"{name} must not be empty (every dimension, T included, "
                        "at least 1)", "skip the call for an empty batch or prompt")  # fmt: skip


def reject_unwritable_state(name: str, state: Any) -> None:
    """Reject, before anything runs, the states torch is known to refuse an in-place write to: in grad mode a
    leaf that requires grad, or a view of one (a slice of a parameter, say), and outside inference mode an
    inference tensor. The kernel writes the state through numpy, which torch cannot stop; refused here, the call
    names the argument and no launch is wasted. Rarer refusals (views returned by unbind or split, views made
    under no_grad) are caught where the write is recorded, still before it (``in_place_recorder``). A state
    already on a graph, written by an earlier call, is fine."""
    torch = sys.modules["torch"]
    base = state._base if state._base is not None else state
    if torch.is_grad_enabled() and state.requires_grad and base.is_leaf and base.requires_grad:
        what = "a leaf" if base is state else "a view of a leaf"
        raise rejection(
            name,
            f"{what} with requires_grad=True",
            f"a state updated in place cannot be {what} that requires grad (torch refuses in-place writes to one "
            "in grad mode; gdn-nki is forward-only)",
            f"pass {name}.detach() (then read the returned state), or run under torch.no_grad() (train with a "
            "differentiable implementation)",
        )
    # dynamo cannot trace is_inference() (a compiled graph's inputs are not inference tensors outside the mode)
    if not torch.compiler.is_compiling() and state.is_inference() and not torch.is_inference_mode_enabled():
        raise rejection(
            name,
            "an inference tensor (made under torch.inference_mode())",
            "a state updated in place cannot be an inference tensor outside inference mode (torch refuses in-place "
            "writes to one there)",
            "make the call under torch.inference_mode() too, or pass a clone made outside it",
        )


def in_place_recorder(name: str, state: Any, inputs: Any) -> Callable[[], None]:
    """The host entry points' ``on_commit`` for a torch ``state`` the kernel updates in place: right before the
    state is written, record the write on the autograd graph of ``inputs`` as torch records an in-place one
    (``state.copy_`` of its own values through the forward-only node, so a backward through it raises instead of
    finding no gradient), when grad mode is on and an input requires grad; otherwise nothing (a serving stack's
    pool can be gigabytes: no copy).

    Recording before the values are written is what keeps a refused record all or nothing: torch refuses some
    in-place writes (``reject_unwritable_state``; also views returned by unbind or split, views made under
    no_grad), and the refusal is raised as a rejection naming ``name`` with the state as it was.
    """

    def record() -> None:
        if not _grads(inputs):
            return
        try:
            state.copy_(forward_only(state.detach().clone(), inputs))
        except RuntimeError as error:
            raise rejection(
                name,
                "a tensor torch will not write in place in grad mode",
                f"torch refuses the in-place update of {name} ({str(error).splitlines()[0]})",
                f"pass {name}.detach() or a clone (then read the returned state), or run under torch.no_grad()",
            ) from None

    return record


def state_buffer(name: str, state: Any) -> tuple[np.ndarray, Callable[[], None]]:
    """A numpy buffer the kernel may update in place for a torch state, and how to publish it on success.

    A contiguous fp32 CPU tensor is its own buffer (its numpy view); any other strided layout gets a contiguous
    copy that is written back only when the call succeeds, so a failed call leaves the caller's tensor as it was.
    """
    check_tensor(name, state, ("float32",))
    reject_unwritable_state(name, state)
    view = as_numpy(state)
    if view.flags.c_contiguous:
        return view, lambda: None
    reject_broadcast_state(name, state)
    staged = np.ascontiguousarray(view)
    return staged, lambda: view.__setitem__(Ellipsis, staged)


def reject_broadcast_state(name: str, state: Any) -> None:
    """Reject a state written in place that is a broadcast (stride-0) view: its rows would alias."""
    if any(stride == 0 for stride, size in zip(state.stride(), state.shape, strict=True) if size > 1):
        raise rejection(
            name,
            f"strides {tuple(state.stride())}",
            "a state updated in place cannot be a broadcast (stride-0) view: its rows would alias",
            f"pass {name}.contiguous() and read the returned state",
        )


def reject_strided_pool(name: str, pool: Any) -> None:
    """Every drop-in's one rule for a pool updated in place (the recurrent pools of the chunk, vLLM and SGLang
    decode drop-ins, the conv pools). On a device no staged copy of a pool is made (``torch/device.py``: the pool is
    the kernel's own argument), so the CPU refuses what a device could not address, rather than accept it.

    The kernels address a pool whose rows lie at their own stride, each row dense (vLLM's hybrid cache,
    ``common.pool_rows``, ``host.pool_span``), so only other layouts are refused: a row not dense inside, rows
    overlapping, zero or negative strides."""
    if pool.is_contiguous() or strided_rows(tuple(pool.shape), tuple(pool.stride())) is not None:
        return
    raise rejection(name, f"shape {tuple(pool.shape)} strides {tuple(pool.stride())}",
                    "a pool updated in place must hold each row dense (its inner strides row-major) with rows at a "
                    "positive stride no smaller than a row (the kernels address its rows by that stride; no staged "
                    "copy of a pool is made)", f"allocate {name} with rows laid out as [P, ...] dense rows (vLLM's "
                    f"per-layer pages are), or pass {name}.contiguous() and copy its rows back after the call")  # fmt: skip


def pool_buffer(name: str, pool: Any) -> np.ndarray:
    """The numpy view of a pool updated in place (same memory, same strides: ``host.decode`` hands a row-strided
    one to the kernel as its span), after the rules of a state written in place."""
    check_pool_dtype(name, pool)
    reject_unwritable_state(name, pool)
    reject_broadcast_state(name, pool)
    return as_numpy(pool)


# The host rules' fixes are numpy idioms (gdn-ref's contract speaks numpy); a torch caller reads torch ones.
_TORCH_IDIOMS = (
    (re.compile(r"\.astype\(np\.(\w+)\)"), r".to(torch.\1)"),
    (re.compile(r"\.astype\((\w+)\.dtype\)"), r".to(\1.dtype)"),
    (re.compile(r"np\.zeros\((\([^)]*\)), np\.(\w+)\)"), r"torch.zeros(\1, dtype=torch.\2)"),
)
_INDEX = re.compile(r"index \[([0-9, ]+)\]")


def in_torch_terms(
    error: ContractError,
    names: dict[str, str] | None = None,
    index: Callable[[str, list[int]], list[int]] | None = None,
) -> ContractError:
    """``error`` restated for a torch caller: torch idioms in the fixes and, for an entry point that re-lays out
    its arguments before the contract sees them, the caller's argument ``names`` (kernel name -> caller's) and
    element indices (``index(kernel name, kernel index)`` -> the caller's index; the kernel's stays in brackets).
    """
    restated = []
    renames = [(_mention(kernel), caller) for kernel, caller in (names or {}).items() if kernel != caller]
    for v in error.violations:
        fix, rule = v.fix, v.rule
        for pattern, idiom in _TORCH_IDIOMS:
            fix = pattern.sub(idiom, fix)
        for mention, caller in renames:  # "pass recurrent_state=None" -> "pass initial_state=None"
            fix, rule = mention.sub(caller, fix), mention.sub(caller, rule)
        argument, value = (names or {}).get(v.argument, v.argument), v.value
        found = _INDEX.search(value) if index is not None else None
        if found is not None:
            kernel_at = [int(i) for i in found.group(1).split(",")]
            at = index(v.argument, kernel_at)
            if at != kernel_at:  # the kernel's index right after the caller's, before what follows (a sequence)
                kernel = f"(the kernel's `{v.argument}` {found.group(0)})"
                value = f"{value[: found.start()]}index {at} {kernel}{value[found.end() :]}"
        restated.append(dataclasses.replace(v, argument=argument, value=value, rule=rule, fix=fix))
    return ContractError(restated, error.entry_point)


def _mention(kernel_name: str) -> re.Pattern[str]:
    """Where a rule's or fix's text names the kernel's argument: anywhere for a name no English word spells
    (``recurrent_state``, ``g_log``), else only as code — followed by ``=``, ``[`` or a method's ``.name`` — so
    that "value heads" or "the key dim" keep their words."""
    if "_" in kernel_name:
        return re.compile(rf"\b{kernel_name}\b")
    return re.compile(rf"\b{kernel_name}(?==|\[|\.[a-z_])")


def accepts_torch(fn: Callable[..., tuple[np.ndarray, np.ndarray]]) -> Callable[..., Any]:
    """Let a numpy host entry point (``simulate``, ``prefill``) take CPU torch tensors and return torch.

    Tensors are checked (CPU, float32 / bfloat16) and viewed as numpy; the numpy call then applies the whole
    contract. The outputs come back as torch when any tensor argument was torch, and a supplied torch
    ``recurrent_state`` is the returned state, updated in place.
    """
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        if not any(is_torch_tensor(v) for v in bound.arguments.values()):
            return fn(*args, **kwargs)
        publish = None
        state = bound.arguments.get("recurrent_state")
        inputs = args + tuple(kwargs.values())
        for name, value in bound.arguments.items():
            if not is_torch_tensor(value):
                continue
            if name == "recurrent_state":
                bound.arguments[name], publish = state_buffer(name, value)
            else:
                check_tensor(name, value)
                bound.arguments[name] = as_numpy(value)
        if publish is not None:  # the caller's own on_commit, if any, still runs after the record
            record, theirs = in_place_recorder("recurrent_state", state, inputs), bound.arguments.get("on_commit")
            bound.arguments["on_commit"] = record if theirs is None else lambda: (record(), theirs())
        try:
            out, final_state = fn(*bound.args, **bound.kwargs)
        except ContractError as error:
            raise in_torch_terms(error) from None
        if publish is not None:
            publish()
            return forward_only(as_torch(out), inputs), state
        return forward_only(as_torch(out), inputs), forward_only(as_torch(final_state), inputs)

    return wrapper


def check_states(
    initial_state: Any,
    state_indices: Any,
    n_seqs: int,
    tail: tuple[int, int, int],
    any_device: bool = False,
    v_first: bool = False,
) -> None:
    """The rules of ``initial_state`` and ``state_indices`` that read only types, shapes, dtypes and strides (the
    custom ops check them at trace time; the FLA drop-in and the context-parallel call share them). ``tail`` is
    (Hv, K, V); ``v_first``: the states are V-major [.., Hv, V, K] (FLA's ``state_v_first``), so the shape rule
    names the flag (with K != V a state of the other layout is caught by its shape; with K = V nothing can tell)."""
    if initial_state is None:
        if state_indices is not None:
            raise rejection("state_indices", "without initial_state", "state_indices name rows of a state pool "
                            "passed as initial_state", "pass the pool as initial_state")  # fmt: skip
        return None, None
    if not is_torch_tensor(initial_state):
        raise rejection("initial_state", f"of type {type(initial_state).__name__}", "initial_state must be a torch "
                        "tensor", "pass torch.from_numpy(initial_state)")  # fmt: skip
    # A state read once may be bf16 (FLA's own example passes one; it widens exactly); a pool written in place
    # holds the fp32 final states, so it must be fp32.
    dtypes = ("float32",) if state_indices is not None else SUPPORTED_DTYPES
    check_tensor("initial_state", initial_state, dtypes, any_device=any_device)
    rows = n_seqs if state_indices is None else None
    shape = tuple(initial_state.shape)
    if v_first:
        tail = (tail[0], tail[2], tail[1])
    if initial_state.dim() != 4 or shape[1:] != tail or (rows is not None and shape[0] != rows):
        want = f"[{'P' if rows is None else rows}, {', '.join(map(str, tail))}]"
        if v_first:
            raise rejection("initial_state", f"shape {shape}", "with state_v_first=True states are V-major: "
                            f"initial_state must be [N, Hv, V, K] = {want}", "pass the V-major states (SGLang's "
                            "pool layout), or state_v_first=False for K-major [N, Hv, K, V] states",
                            rule_id="state_layout.v_first")  # fmt: skip
        raise rejection("initial_state", f"shape {shape}", f"initial_state must be [N, Hv, K, V] = {want}",
                        "pass one fp32 state per sequence (or a pool with state_indices)")  # fmt: skip
    if state_indices is None:
        return
    reject_unwritable_state("initial_state", initial_state)
    reject_strided_pool("initial_state", initial_state)
    if not initial_state.is_contiguous():  # a row-strided pool: its row offsets must fit the kernels' int32
        found = span_violations(initial_state.shape[0], initial_state.stride(0), "initial_state", "gdn_cte")
        if found:
            raise ContractError(found)
    if is_torch_tensor(state_indices):
        check_tensor("state_indices", state_indices, INTEGER_DTYPES, any_device=any_device)
