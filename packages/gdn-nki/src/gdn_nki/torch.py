"""gdn-nki for PyTorch model code: a drop-in for FLA's ``chunk_gated_delta_rule``, with state pools.

Models (HF transformers' Qwen3-Next, vLLM, SGLang) call flash-linear-attention's
``chunk_gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
cu_seqlens)`` with seq-first ``[B, T, H, D]`` tensors. This module takes the same call on CPU torch tensors and
runs it as ONE launch of the NKI kernel (``gdn_cte_varlen``, simulated on the CPU): every sequence — a batch row,
or a ``cu_seqlens`` range — is a set of lanes with its own token range and state. Changing the import is enough::

    from gdn_nki.torch import chunk_gated_delta_rule   # was: from fla.ops.gated_delta_rule import ...

Needs the optional extra ``gdn-nki[torch]``.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from gdn_ref.constants import DEFAULT_ALGORITHM, DEFAULT_GROUP_SIZE
from gdn_ref.contract import ContractError

from .host import prefill_varlen
from .torch_io import (
    SUPPORTED_DTYPES,
    as_numpy,
    as_torch,
    check_tensor,
    forward_only,
    import_torch,
    in_place_recorder,
    in_torch_terms,
    reject_unwritable_state,
    rejection,
)

torch = import_torch()

# FLA and HF normalize q and k as x / sqrt(sum(x^2) + eps) in fp32 with this eps.
L2NORM_EPS = 1e-6
_SEQ_FIRST = {"q": "[B, T, Hk, K]", "k": "[B, T, Hk, K]", "v": "[B, T, Hv, V]", "g": "[B, T, Hv]", "beta": "[B, T, Hv]"}
# The kernel's argument names (the contract's, in its errors) -> this entry point's.
_CALLER_NAMES = {
    "query": "q",
    "key": "k",
    "value": "v",
    "g_log": "g",
    "beta": "beta",
    "recurrent_state": "initial_state",
}


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    *,
    state_indices: torch.Tensor | None = None,
    algorithm: str = DEFAULT_ALGORITHM,
    group_size: int = DEFAULT_GROUP_SIZE,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunked gated delta rule with FLA's signature and semantics, on the NKI kernel.

    Dimensions:
        B: batch (1 with ``cu_seqlens``). T: tokens per row. Hk: key/query heads. Hv: value heads, a multiple of
        Hk (value head j reads key head j // (Hv // Hk)). K, V: head dims (<= 128). N: sequences (B, or
        len(cu_seqlens) - 1). P: rows of a state pool.

    Args:
        q, k (torch.Tensor): [B, T, Hk, K] CPU, bfloat16 or float32 (q's dtype is the compute dtype; k and v
            share it). L2-normalized, unless ``use_qk_l2norm_in_kernel``.
        v (torch.Tensor): [B, T, Hv, V].
        g (torch.Tensor): [B, T, Hv] log-decay (<= 0), float32 or bfloat16 (widened to fp32 exactly).
        beta (torch.Tensor): [B, T, Hv] update strength in (0, 1), float32 or bfloat16.
        scale (float | None): query scaling; None = K ** -0.5.
        initial_state (torch.Tensor | None): [N, Hv, K, V] float32 (or bfloat16, widened exactly) initial states,
            read, not written. With ``state_indices``: a [P, Hv, K, V] float32 pool, contiguous, updated IN PLACE
            at the named rows only.
        output_final_state (bool): return the final states.
        use_qk_l2norm_in_kernel (bool): L2-normalize q and k first (fp32, eps 1e-6, as FLA and HF).
        cu_seqlens (torch.Tensor | None): [N + 1] integer boundaries of packed sequences in the one row (B == 1).
        state_indices (torch.Tensor | None): [N] distinct pool rows, one per sequence (SGLang / TensorRT-LLM's
            in-place pools). Not in FLA's signature.
        algorithm (str), group_size (int): the kernel's options (gdn_cte's defaults).
        kwargs: accepted and ignored, as FLA does (HF passes its attention kwargs through) — except FLA's options
            that change what the tensors mean, rejected when set: ``head_first=True`` (deprecated in FLA),
            ``state_v_first=True`` / ``transpose_state_layout=True`` ([N, H, V, K] states) and ``cp_context``.

    Returns:
        tuple: ``o`` [B, T, Hv, V] in q's dtype, and the final states [N, Hv, K, V] float32 when
        ``output_final_state`` (with ``state_indices``: the pool itself), else None.

    Notes:
        All sequences run in ONE kernel launch, each padded exactly (g = 0, β = 0) to its own chunk multiple. Every
        argument is checked before anything runs; a rejected or failed call writes nothing, the pool included.
        Forward only: with inputs that require grad, the outputs stay on the autograd graph and backward raises
        NotImplementedError (FLA's kernel has a backward; silently detached outputs would train nothing); a pool
        updated in place is recorded on the graph the same way. A UserWarning, as FLA's, when T < Hk without
        ``cu_seqlens``: head-first [B, H, T, D] tensors passed as seq-first look like that and would run as
        garbage. Errors name this function's arguments and index their elements as the caller laid them out.
        The kernel runs simulated on the CPU (nki-cpu, or ``nki.simulate`` with the Neuron SDK).
    """
    _reject_layout_options(kwargs)
    tensors = {"q": q, "k": k, "v": v, "g": g, "beta": beta}
    _check_layout(tensors, cu_seqlens)
    if cu_seqlens is None and q.shape[1] < q.shape[2]:
        warnings.warn(
            f"gdn_nki.torch.chunk_gated_delta_rule: q has fewer tokens (T={q.shape[1]}) than heads "
            f"(Hk={q.shape[2]}); the layout is seq-first [B, T, H, D], so check these are not head-first "
            "[B, H, T, D] tensors (transpose(1, 2) them)",
            UserWarning,
            stacklevel=2,
        )
    batch, seq_len, _, dk = q.shape
    value_heads, dv = v.shape[2], v.shape[3]
    cu = _boundaries(cu_seqlens, batch, seq_len)
    n_seqs = len(cu) - 1
    state, slots = _states(initial_state, state_indices, n_seqs, (value_heads, dk, dv))
    if use_qk_l2norm_in_kernel:
        q, k = _l2norm(q), _l2norm(k)
    query, key, value = (_head_major(x, x.dtype) for x in (q, k, v))
    g_log, gate = (_head_major(x, torch.float32) for x in (g, beta))
    inputs = (*tensors.values(), initial_state)
    # The pool, written by the kernel, is recorded on the graph right before its rows are written.
    record = in_place_recorder("initial_state", initial_state, inputs) if slots is not None else None
    try:
        out, final = prefill_varlen(
            query, key, value, g_log, gate, cu_seqlens=cu, scale=dk**-0.5 if scale is None else scale,
            algorithm=algorithm, group_size=group_size, recurrent_state=state, state_indices=slots, on_commit=record,
        )  # fmt: skip
    except ContractError as error:
        raise in_torch_terms(error, _CALLER_NAMES, lambda name, at: _seq_first_index(name, at, seq_len)) from None
    o = forward_only(as_torch(out).transpose(1, 2).reshape(batch, seq_len, value_heads, dv).contiguous(), inputs)
    if not output_final_state:
        return o, None
    return o, (initial_state if slots is not None else forward_only(as_torch(final), inputs))


# FLA options that change what the tensors mean, and why this entry point refuses them when set; any other keyword
# is ignored, as FLA's ``**kwargs`` ignores it. Unset means what FLA's own truthiness test means: None or a false
# scalar (FLA: ``if head_first:``); anything else is rejected, never ignored (ignoring one runs a valid-looking call
# on misread data).
_TRANSPOSED_STATE = (
    "gdn-nki takes states as [N, H, K, V] only (FLA's default layout)",
    "pass initial_state.transpose(-1, -2).contiguous() and transpose the returned state back",
)
_LAYOUT_OPTIONS = {
    "head_first": ("gdn-nki takes FLA's seq-first layout only (head_first is deprecated in FLA)",
                   "pass x.transpose(1, 2) for q, k, v, g and beta, without head_first"),
    "state_v_first": _TRANSPOSED_STATE,
    "transpose_state_layout": _TRANSPOSED_STATE,  # FLA's name for state_v_first before 0.5.1
    "cp_context": ("gdn-nki runs a whole sequence in one launch (no context parallelism)",
                   "call it on the whole sequence, without cp_context"),
}  # fmt: skip


def _reject_layout_options(kwargs: dict[str, Any]) -> None:
    """Reject an FLA option this entry point does not implement when it is set (not None or a false scalar)."""
    for name, (rule, fix) in _LAYOUT_OPTIONS.items():
        value = kwargs.get(name)
        if value is None or (np.ndim(value) == 0 and not _truthy(value)):
            continue
        raise rejection(name, f"= {value!r}", rule, fix)


def _truthy(value: Any) -> bool:
    """``bool(value)`` for a scalar option value; a value that has no truth value counts as set."""
    try:
        return bool(value)
    except (TypeError, ValueError, RuntimeError):
        return True


def _seq_first_index(name: str, at: list[int], seq_len: int) -> list[int]:
    """The caller's index of an element the kernel's contract found at ``at`` in its head-major ``[1, H, B·T(,
    D)]`` view of a seq-first ``[B, T, H(, D)]`` argument (states keep their layout)."""
    if name not in ("query", "key", "value", "g_log", "beta"):
        return at
    _, head, token, *rest = at
    return [token // seq_len, token % seq_len, head, *rest]


def _check_layout(tensors: dict[str, Any], cu_seqlens: Any) -> None:
    """Device, dtype and FLA's seq-first shapes, each failure naming its argument."""
    for name, x in tensors.items():
        if not isinstance(x, torch.Tensor):
            raise rejection(name, f"of type {type(x).__name__}", f"{name} must be a torch tensor", "pass a tensor")
        check_tensor(name, x)
    q, v = tensors["q"], tensors["v"]
    for name in ("k", "v"):
        if tensors[name].dtype != q.dtype:
            raise rejection(name, f"dtype {tensors[name].dtype}", f"{name} must have q's dtype ({q.dtype})",
                            f"pass {name}.to(q.dtype)")  # fmt: skip
    rows = q.shape[:2] if q.dim() == 4 else None
    expected = {"q": 4, "k": 4, "v": 4, "g": 3, "beta": 3}
    for name, x in tensors.items():
        if 0 in x.shape:
            raise rejection(name, f"shape {tuple(x.shape)}", f"{name} must not be empty (every dimension, T "
                            "included, at least 1)", "skip the call for an empty batch or prompt")  # fmt: skip
        ok = x.dim() == expected[name] and tuple(x.shape[:2]) == tuple(rows or ())
        if name == "k":
            ok = ok and x.shape == q.shape
        if name in ("g", "beta"):
            ok = ok and v.dim() == 4 and x.shape[2] == v.shape[2]
        if name == "v":
            ok = ok and x.shape[2] % q.shape[2] == 0
        if not ok:
            raise rejection(
                name,
                f"shape {tuple(x.shape)}",
                f"{name} must be seq-first {_SEQ_FIRST[name]} (q {tuple(q.shape)}; Hv a multiple of Hk)",
                f"pass {name} laid out as {_SEQ_FIRST[name]}",
            )
    if cu_seqlens is not None and isinstance(cu_seqlens, torch.Tensor):
        check_tensor("cu_seqlens", cu_seqlens, ("int32", "int64"))


def _boundaries(cu_seqlens: Any, batch: int, seq_len: int) -> np.ndarray:
    """The packed row's sequence boundaries: ``cu_seqlens`` as given, or one sequence per batch row."""
    if cu_seqlens is None:
        return np.arange(batch + 1, dtype=np.int64) * seq_len
    values = as_numpy(cu_seqlens) if isinstance(cu_seqlens, torch.Tensor) else np.asarray(cu_seqlens)
    if batch != 1:  # prefill_varlen checks the rest (start, increase, end) on the flattened row
        raise rejection("cu_seqlens", f"with batch B={batch}", "with cu_seqlens the sequences are packed into one "
                        "row, so B must be 1", "flatten the batch into [1, T_total, ...]")  # fmt: skip
    return values.copy()


def _states(initial_state: Any, state_indices: Any, n_seqs: int, tail: tuple[int, int, int]) -> tuple[Any, Any]:
    """The kernel's state buffer and slots: the caller's pool itself (in place) with ``state_indices``, else a
    private fp32 copy of ``initial_state`` (FLA never writes it) or None."""
    if initial_state is None:
        if state_indices is not None:
            raise rejection("state_indices", "without initial_state", "state_indices name rows of a state pool "
                            "passed as initial_state", "pass the pool as initial_state")  # fmt: skip
        return None, None
    if not isinstance(initial_state, torch.Tensor):
        raise rejection("initial_state", f"of type {type(initial_state).__name__}", "initial_state must be a torch "
                        "tensor", "pass torch.from_numpy(initial_state)")  # fmt: skip
    # A state read once may be bf16 (FLA's own example passes one; it widens exactly); a pool written in place
    # holds the fp32 final states, so it must be fp32.
    check_tensor("initial_state", initial_state, ("float32",) if state_indices is not None else SUPPORTED_DTYPES)
    rows = n_seqs if state_indices is None else None
    shape = tuple(initial_state.shape)
    if initial_state.dim() != 4 or shape[1:] != tail or (rows is not None and shape[0] != rows):
        want = f"[{'P' if rows is None else rows}, {', '.join(map(str, tail))}]"
        raise rejection("initial_state", f"shape {shape}", f"initial_state must be [N, Hv, K, V] = {want}",
                        "pass one fp32 state per sequence (or a pool with state_indices)")  # fmt: skip
    if state_indices is None:
        return np.array(as_numpy(initial_state.float()), dtype=np.float32, order="C"), None
    reject_unwritable_state("initial_state", initial_state)
    if not initial_state.is_contiguous():
        raise rejection("initial_state", f"strides {tuple(initial_state.stride())}", "a state pool updated in place "
                        "must be contiguous", "keep the pool contiguous (e.g. pool = pool.contiguous())")  # fmt: skip
    if isinstance(state_indices, torch.Tensor):
        check_tensor("state_indices", state_indices, ("int32", "int64"))
        state_indices = as_numpy(state_indices)
    return as_numpy(initial_state), np.asarray(state_indices)


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(sum(x²) + eps) over the head dim in fp32, rounded back to x's dtype (the kernel's operands)."""
    wide = x.float()
    return (wide * torch.rsqrt((wide * wide).sum(dim=-1, keepdim=True) + L2NORM_EPS)).to(x.dtype)


def _head_major(x: torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    """[B, T, H(, D)] seq-first -> [1, H, B·T(, D)] head-major numpy in ``dtype``: the batch rows become
    consecutive sequences of the one packed row."""
    flat = x.reshape(1, x.shape[0] * x.shape[1], *x.shape[2:])
    return as_numpy(flat.transpose(1, 2).to(dtype).contiguous())
