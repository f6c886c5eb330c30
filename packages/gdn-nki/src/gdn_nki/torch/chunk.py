"""gdn-nki for PyTorch model code: a drop-in for FLA's ``chunk_gated_delta_rule``, with state pools.

Models (HF transformers' Qwen3-Next, vLLM, SGLang) call flash-linear-attention's
``chunk_gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, ...,
cu_seqlens=...)`` with seq-first ``[B, T, H, D]`` tensors. This module takes the same call on CPU torch tensors and
runs it as ONE launch of the NKI kernel (``gdn_cte_varlen``, simulated on the CPU): every sequence — a batch row,
or a ``cu_seqlens`` range — is a set of lanes with its own token range and state. Changing the import is enough::

    from gdn_nki.torch import chunk_gated_delta_rule   # was: from fla.ops.gated_delta_rule import ...

Needs the optional extra ``gdn-nki[torch]``.
"""

from __future__ import annotations

import difflib
import inspect
import sys
import warnings
from typing import Any

import numpy as np

from gdn_ref.activations import beta_from_logit, log_decay_from_gate
from gdn_ref.constants import DEFAULT_ALGORITHM, DEFAULT_GROUP_SIZE
from gdn_ref.contract import ContractError, first_bad_index, is_integer, names_entry_point
from gdn_ref.packed import cu_seqlens_violations

from ..host.buckets import prefill_bucket
from ..host.prefill import prefill_varlen
from ..host.torch_io import (
    INTEGER_DTYPES,
    as_numpy,
    as_torch,
    check_states,
    check_tensor,
    forward_only,
    import_torch,
    in_place_recorder,
    in_torch_terms,
    is_torch_tensor,
    reject_empty,
    rejection,
)
from .context_parallel import ContextParallel, context_parallel_prefill, on_device

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


@names_entry_point("gdn_nki.torch.chunk_gated_delta_rule")
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
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    cu_seqlens_cpu: torch.Tensor | None = None,
    chunk_indices: torch.Tensor | None = None,
    cp_context: Any = None,
    *,
    use_gate_in_kernel: bool = False,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    chunk_size: int = 64,
    head_first: bool | None = None,
    transpose_state_layout: bool | None = None,
    state_indices: torch.Tensor | None = None,
    initial_state_indices: torch.Tensor | None = None,
    algorithm: str = DEFAULT_ALGORITHM,
    group_size: int = DEFAULT_GROUP_SIZE,
    bucket: tuple[int, int] | None = None,
    checkpoint_every: int | None = None,
    checkpoint_indices: torch.Tensor | None = None,
    read_indices: torch.Tensor | None = None,
    check_values: bool = True,
    z: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
    norm_activation: str = "silu",
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
        g (torch.Tensor): [B, T, Hv] log-decay (<= 0), float32 or bfloat16 (widened to fp32 exactly); the raw
            gate with ``use_gate_in_kernel``.
        beta (torch.Tensor): [B, T, Hv] update strength in [0, 1], float32 or bfloat16; the logit with
            ``use_beta_sigmoid_in_kernel``.
        scale (float | None): query scaling; None = K ** -0.5.
        initial_state (torch.Tensor | None): [N, Hv, K, V] float32 (or bfloat16, widened exactly) initial states,
            read, not written. With ``state_indices``: a [P, Hv, K, V] float32 pool, updated IN PLACE at the named
            rows only: contiguous, or rows at their own stride, each dense (vLLM's pages, ``common.pool_rows``).
            [.., Hv, V, K] with ``state_v_first``.
        output_final_state (bool): return the final states.
        use_qk_l2norm_in_kernel (bool): L2-normalize q and k first (fp32, eps 1e-6, as FLA and HF).
        use_beta_sigmoid_in_kernel (bool): ``beta`` is a logit: β = sigmoid(beta) (``gdn_ref.activations``).
        allow_neg_eigval (bool): FLA's β = 2·sigmoid(beta) in [0, 2): rejected when set (β must be in [0, 1]).
        state_v_first (bool): FLA's V-major states: ``initial_state``, the pool and the final states are
            [.., Hv, V, K] (SGLang's pool layout), read and written so by the kernel's state DMAs, no transposed
            copy (``gdn_nki.common.state_layout``). ``transpose_state_layout`` (its name before FLA 0.5.1) is the
            same flag; both set is refused, as FLA refuses it.
        cu_seqlens (torch.Tensor | None): [N + 1] integer boundaries of packed sequences in the one row (B == 1).
        cu_seqlens_cpu, chunk_indices: FLA's caches of what it derives from ``cu_seqlens`` on the GPU (a host copy,
            its 64-token chunk list): accepted and not read (gdn-nki derives its own chunks from ``cu_seqlens``).
        cp_context: FLA's context parallelism: a ``gdn_nki.torch.build_cp_context`` (FLA's call) of the global
            ``cu_seqlens`` on a process group; q, k, v, g and beta are then this rank's slice, ``cu_seqlens`` (if
            given) ``cp_context.cu_seqlens``, and the call is ``context_parallel_chunk_gated_delta_rule``'s (initial
            and final states and pool rows work, unlike FLA's; no bucket or checkpoints).
        use_gate_in_kernel (bool): ``g`` is the raw gate: the log-decay is −exp(A_log)·softplus(g + dt_bias)
            (``gdn_ref.activations.log_decay_from_gate``), computed on the host before the launch.
        A_log, dt_bias (torch.Tensor | None): [Hv] (any shape of Hv elements, as FLA), float32 or bfloat16: the
            gate's parameters, A_log required with ``use_gate_in_kernel``; unused without it, as in FLA.
        chunk_size (int): FLA's chunk (16, 32 or 64): accepted, not used (the kernel's chunk is the algorithm's;
            the result is the same recurrence).
        head_first (bool | None): rejected when set (removed from FLA; the layout is seq-first).
        state_indices (torch.Tensor | None): [N] distinct pool rows, one per sequence (SGLang / TensorRT-LLM's
            in-place pools). Not in FLA's signature. ``initial_state_indices`` (SGLang's and FlashInfer's name)
            is the same argument.
        algorithm (str), group_size (int): the kernel's options (gdn_cte's defaults).
        bucket (tuple[int, int] | None): with ``cu_seqlens``, (T, N): run the bucket's one compiled program
            (``gdn_nki.prefill_varlen``'s ``bucket``: empty sequences and -1 pool rows allowed; T counts each
            sequence padded to its chunk multiple, ``gdn_nki.padded_tokens``); omitted: the configured default
            (``gdn_nki.configure_buckets``), else the trace-time form.
        checkpoint_every (int | None), checkpoint_indices (torch.Tensor | None): prefix-cache checkpoints into
            the pool (``state_indices``): the state after every ``checkpoint_every`` tokens (a multiple of the
            algorithm's chunk) of sequence i goes to row ``checkpoint_indices[i, k]`` (-1: none).
        read_indices (torch.Tensor | None): [N] pool rows sequence i starts from when it is not the row it ends in
            (``state_indices``): a prefix-cache hit resumes from the cache's row without overwriting it, on
            device (-1: zero state). Bucketed form (``gdn_nki.prefill_varlen``'s ``read_indices``). Not SGLang's
            ``initial_state_indices``, which names the rows read and written alike.
        check_values (bool): scan every input and the initial states read first, as ``gdn_nki.prefill_varlen``'s
            (default on): a NaN/±Inf (or g > 0) is refused naming every sequence holding one
            (``ContractError.sequences``), so a server can drop them; False only when the caller guarantees its data.
        z (torch.Tensor | None): [B, T, Hv, V] in q's dtype, the layer's z projection: the layer's gated RMSNorm
            (FLA's ``FusedRMSNormGated``, HF's ``Qwen3NextRMSNormGated``) is folded into the kernel's output stage
            and ``o`` is y = rmsnorm(o) · norm_weight · act(z) per token and value head, in ONE launch of the
            bucketed form (``gdn_cte_bucket_normed``; ``bucket`` as above, else the batch's own size), bit for bit
            this call without ``z`` then ``rms_norm_gated(o, z, norm_weight)``. Not in FLA's signature.
        norm_weight (torch.Tensor | None): with ``z``, the norm's weight [V] float32 or bfloat16; None: no scale.
        norm_eps (float), norm_activation (str): with ``z``, the norm's eps (HF's ``rms_norm_eps``) and gate
            ("silu" / "swish" or "sigmoid").
        kwargs: HF transformers' attention keywords, which its GDN layers pass through (``use_cache``,
            ``cu_seq_lens_k``, ``position_ids``, …: ``HF_PASS_THROUGH``), accepted and not used; any other keyword
            is rejected, naming the closest valid one (a misspelt option must not vanish).

    Returns:
        tuple: ``o`` [B, T, Hv, V] in q's dtype (y with ``z``), and the final states [N, Hv, K, V] float32 ([N, Hv, V, K] with
        ``state_v_first``) when ``output_final_state`` (with ``state_indices``: the pool itself), else None.

    Notes:
        The positional order is current FLA's (since 0.5.1: ``cu_seqlens`` is thirteenth); a tensor in one of the
        boolean slots — an older order's ``cu_seqlens`` — is rejected by name, as is every option whose meaning
        this kernel does not implement (README, "FLA's options"). All sequences run in ONE kernel launch, each
        padded exactly (g = 0, β = 0) to its own chunk multiple. Every argument is checked before anything runs;
        a rejected or failed call writes nothing, the pool included. Forward only: with inputs that require grad,
        the outputs stay on the autograd graph and backward raises NotImplementedError (FLA's kernel has a
        backward; silently detached outputs would train nothing); a pool updated in place is recorded on the
        graph the same way. A UserWarning, as FLA's, when T < Hk without ``cu_seqlens``: head-first [B, H, T, D]
        tensors passed as seq-first look like that and would run as garbage. Errors name this function's
        arguments and index their elements as the caller laid them out. The kernel runs simulated on the CPU
        (nki-cpu, or ``nki.simulate`` with the Neuron SDK).
    """
    if _truthy(cp_context):  # FLA's context parallelism (its truthiness test): this rank's slice of a split batch
        return context_parallel_call(
            CP_PREFILL or chunk_gated_delta_rule, (q, k, v, g, beta), cp_context, scale, initial_state, output_final_state, cu_seqlens,
            (state_indices, initial_state_indices, kwargs),
            dict(use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                 use_gate_in_kernel=use_gate_in_kernel, A_log=A_log, dt_bias=dt_bias, algorithm=algorithm,
                 group_size=group_size),
            dict(bucket=bucket, checkpoint_every=checkpoint_every, checkpoint_indices=checkpoint_indices,
                 read_indices=read_indices, head_first=head_first, state_v_first=state_v_first, z=z,
                 transpose_state_layout=transpose_state_layout, allow_neg_eigval=allow_neg_eigval),
        )  # fmt: skip
    flags = {
        "output_final_state": output_final_state,
        "use_qk_l2norm_in_kernel": use_qk_l2norm_in_kernel,
        "use_beta_sigmoid_in_kernel": use_beta_sigmoid_in_kernel,
        "allow_neg_eigval": allow_neg_eigval,
        "state_v_first": state_v_first,
        "transpose_state_layout": transpose_state_layout,
        "use_gate_in_kernel": use_gate_in_kernel,
    }
    _reject_tensor_flags(flags)
    _reject_unknown_keywords(kwargs)
    _reject_unsupported_options(dict(head_first=head_first, allow_neg_eigval=allow_neg_eigval))
    v_first = state_layout(state_v_first, transpose_state_layout)
    _check_chunk_size(chunk_size)
    state_indices = _state_indices(state_indices, initial_state_indices)
    tensors = {"q": q, "k": k, "v": v, "g": g, "beta": beta}
    _check_layout(tensors, cu_seqlens)
    _reject_lost_packing(kwargs, cu_seqlens)
    warn_if_head_first(q, cu_seqlens)
    batch, seq_len, _, dk = q.shape
    value_heads, dv = v.shape[2], v.shape[3]
    cu = _boundaries(cu_seqlens, batch, seq_len)
    n_seqs = len(cu) - 1
    state, slots = _states(initial_state, state_indices, n_seqs, (value_heads, dk, dv), v_first)
    gate_parameters = (A_log, dt_bias) if _truthy(use_gate_in_kernel) else ()
    if gate_parameters:
        g = _log_decay(g, A_log, dt_bias, value_heads)
    if _truthy(use_beta_sigmoid_in_kernel):
        beta = torch.from_numpy(beta_from_logit(as_numpy(beta)))
    if _truthy(use_qk_l2norm_in_kernel):
        q, k = _l2norm(q), _l2norm(k)
    query, key, value = (_head_major(x, x.dtype) for x in (q, k, v))
    g_log, gate = (_head_major(x, torch.float32) for x in (g, beta))
    inputs = (*tensors.values(), initial_state, *gate_parameters, *(x for x in (z, norm_weight) if x is not None))
    # The pool, written by the kernel, is recorded on the graph right before its rows are written.
    record = in_place_recorder("initial_state", initial_state, inputs) if slots is not None else None
    norm = _folded_norm(z, norm_weight, norm_eps, norm_activation, batch, seq_len)
    try:
        out, final = (prefill_bucket if norm else prefill_varlen)(
            query, key, value, g_log, gate, cu_seqlens=cu, scale=dk**-0.5 if scale is None else scale,
            algorithm=algorithm, group_size=group_size, recurrent_state=state, state_indices=slots, on_commit=record,
            bucket=bucket, checkpoint_every=checkpoint_every,
            checkpoint_indices=_index_array(checkpoint_indices), read_indices=_index_array(read_indices),
            check_values=check_values, state_v_first=v_first, **norm,
        )  # fmt: skip
    except ContractError as error:
        raise in_torch_terms(error, _CALLER_NAMES, lambda name, at: _seq_first_index(name, at, seq_len)) from None
    o = forward_only(as_torch(out).transpose(1, 2).reshape(batch, seq_len, value_heads, dv).contiguous(), inputs)
    if not _truthy(output_final_state):
        return o, None
    return o, (initial_state if slots is not None else forward_only(as_torch(final), inputs))


# The drop-in making a ``cp_context`` call's passes: ``ops.chunk_gated_delta_rule`` (its op; set by ``ops``), else this
# host path.
CP_PREFILL: Any = None


def context_parallel_call(
    prefill: Any,
    tensors: tuple,
    context: Any,
    scale: Any,
    initial_state: Any,
    output_final_state: Any,
    cu_seqlens: Any,
    rows_and_keywords: tuple[Any, Any, dict[str, Any]],
    options: dict[str, Any],
    refused: dict[str, Any],
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The ``cp_context`` call: checked against the context, then ``context_parallel_prefill`` with ``prefill`` (the
    drop-in making each pass: this host path, or the op's, ``ops.chunk_gated_delta_rule``). What is wrong with this
    rank's own arguments is handed on, not raised here, so that every rank raises it (a rank raising alone would
    leave the others waiting out the group's timeout). On the device path (``context_parallel.on_device``) a
    rank-local ``cu_seqlens`` is checked by its shape alone (its values would need a host read; the passes run on
    ``cp_context.cu_seqlens``)."""
    if not isinstance(context, ContextParallel):  # no group to tell: every rank passing it raises alone
        raise rejection("cp_context", f"of type {type(context).__name__}", "cp_context must be built by "
                        "gdn_nki.torch.build_cp_context (FLA's build_cp_context arguments)",
                        "build it with gdn_nki.torch.build_cp_context(cu_seqlens, group)")  # fmt: skip
    state_indices, initial_state_indices, kwargs = rows_and_keywords
    problem = None
    try:
        _reject_unknown_keywords(kwargs)
        state_indices = _state_indices(state_indices, initial_state_indices)
        given = [name for name, value in refused.items() if _truthy(value) and value is not None]
        if given:
            raise rejection(given[0], "given with cp_context", "context parallelism runs the trace-time form only "
                            "(no bucket, checkpoints, read rows or transposed layouts)", f"drop {given[0]}")  # fmt: skip
        if cu_seqlens is not None and not _same_pieces(cu_seqlens, context, on_device(*tensors, cu_seqlens)):
            raise rejection("cu_seqlens", "unlike cp_context.cu_seqlens", "with cp_context, cu_seqlens is this "
                            "rank's (FLA's rank-local boundaries)", "pass cu_seqlens=cp_context.cu_seqlens, or omit "
                            "it")  # fmt: skip
    except ContractError as error:
        problem, state_indices = error.violations[0], None
    forwarded = {name: value for name, value in options.items() if value is not None and value is not False}
    forwarded.update(algorithm=options["algorithm"], group_size=options["group_size"])
    return context_parallel_prefill(
        prefill, *tensors, context, scale=scale, initial_state=initial_state, output_final_state=_truthy(output_final_state),
        state_indices=state_indices, caller_problem=problem, **forwarded,
    )  # fmt: skip


def _same_pieces(cu_seqlens: Any, context: ContextParallel, traced: bool) -> bool:
    """Whether ``cu_seqlens`` is the context's rank-local boundaries: by its values on the host path, by its
    length on the device path."""
    if traced:
        return tuple(cu_seqlens.shape) == (context.num_seqs + 1,)
    return torch.equal(cu_seqlens.detach().cpu().long(), context.cu_seqlens_cpu)


# HF transformers' keyword arguments that its models pass through their layers to the GDN call (``**kwargs`` of a
# Qwen3-Next / Qwen3.5 / OLMo-hybrid layer): ``TransformersKwargs`` and ``FlashAttentionKwargs``
# (transformers 5: utils/generic.py, modeling_flash_attention_utils.py) and ``use_cache``, which the decoder layer
# forwards. Accepted and not used; with transformers imported, the installed version's TypedDicts are read too.
HF_PASS_THROUGH = frozenset(
    {
        "num_items_in_batch", "output_hidden_states", "output_attentions", "output_router_logits", "cu_seq_lens_q",
        "cu_seq_lens_k", "max_length_q", "max_length_k", "position_ids", "is_causal", "seq_idx", "use_cache",
        "cache_position",
    }
)  # fmt: skip
# Of those, the ones that say the row holds packed sequences: ignoring them without ``cu_seqlens`` would run the
# sequences as one (HF itself refuses them on its torch fallback).
_PACKING_KEYWORDS = ("cu_seq_lens_q", "seq_idx")


def _hf_pass_through() -> frozenset[str]:
    """``HF_PASS_THROUGH``, plus the keys of the installed transformers' TypedDicts when a caller imported it."""
    names = set(HF_PASS_THROUGH)
    for module, typed in (("transformers.utils.generic", "TransformersKwargs"),
                          ("transformers.modeling_flash_attention_utils", "FlashAttentionKwargs")):  # fmt: skip
        names |= set(getattr(getattr(sys.modules.get(module), typed, None), "__annotations__", {}))
    return frozenset(names)


def _reject_unknown_keywords(kwargs: dict[str, Any]) -> None:
    """Reject a keyword that is neither this function's (FLA's and ours) nor an HF pass-through one, naming the
    closest valid name: a misspelt ``state_indice=`` would otherwise vanish and the pool would not be written."""
    reject_unknown_keywords(kwargs, "chunk_gated_delta_rule", _PARAMETERS,
                            "gdn-nki's own (state_indices, algorithm, group_size)")  # fmt: skip


def reject_unknown_keywords(
    kwargs: dict[str, Any],
    function: str,
    parameters: tuple[str, ...],
    own: str,
    hints: dict[str, str] | None = None,
) -> None:
    """Reject a keyword of a drop-in's ``**kwargs`` that is not an HF pass-through one.

    Args:
        kwargs (dict): the drop-in's ``**kwargs`` (its named parameters already taken out).
        function (str): the drop-in's name, for the rule.
        parameters (tuple[str, ...]): the drop-in's valid keywords, for the "did you mean".
        own (str): the keywords beside FLA's it takes, for the rule.
        hints (dict[str, str] | None): a keyword that means something the drop-in does not take -> the fix to give
            instead of the closest name (a pool keyword on a form without pools, say).

    Notes:
        The HF pass-through keywords (``HF_PASS_THROUGH`` and the installed transformers' TypedDicts) are accepted
        and not used; an unknown one is an error, never ignored (a misspelt option must not vanish).
    """
    known = _hf_pass_through()
    unknown = sorted(name for name in kwargs if name not in known)
    if not unknown:
        return
    name = unknown[0]
    fix = (hints or {}).get(name)
    if fix is None:
        close = difflib.get_close_matches(name, sorted({*parameters, *known}), n=1, cutoff=0.6)
        fix = (
            "did you mean " + close[0] + "=? " if close else ""
        ) + "Pass only those (the README's table of FLA's options lists each)"
    raise rejection(
        name,
        f"= {_describe(kwargs[name])}",
        f"{function} takes FLA's arguments, HF transformers' pass-through attention keywords and {own}; an unknown "
        "keyword is an error, never ignored",
        fix,
        rule_id="keyword.unknown",
    )


def _reject_lost_packing(kwargs: dict[str, Any], cu_seqlens: Any) -> None:
    """Reject HF's packing keywords without ``cu_seqlens``: the packed sequences would run as one."""
    for name in _PACKING_KEYWORDS:
        if kwargs.get(name) is not None and cu_seqlens is None:
            raise rejection(
                name,
                "given without cu_seqlens",
                f"{name} says the row holds packed sequences; gdn-nki keeps them apart only by cu_seqlens",
                "pass cu_seqlens=cu_seq_lens_q (the boundaries of the packed sequences)",
                rule_id="keyword.packing",
            )


def _reject_tensor_flags(flags: dict[str, Any]) -> None:
    """A tensor in a boolean slot is an older positional order's ``cu_seqlens`` (ninth in FLA <= 0.2 and the
    vLLM / SGLang copies, tenth in FLA 0.3-0.5.0; thirteenth since 0.5.1): rejected by name, never read as a flag
    (``bool`` of a one-element tensor would pass silently). A 0-d tensor is a truth value, as FLA reads it."""
    for name, value in flags.items():
        if (is_torch_tensor(value) or isinstance(value, np.ndarray)) and value.ndim >= 1:  # 0-d: a truth value
            raise rejection(
                name,
                f"a tensor of shape {tuple(value.shape)}",
                f"{name} is a boolean flag; a tensor there is most likely cu_seqlens passed by position in an older "
                "FLA order (ninth in FLA <= 0.2 and vLLM's / SGLang's copies, tenth in FLA 0.3-0.5.0)",
                "pass cu_seqlens=... (and every argument after output_final_state) by keyword",
                rule_id="flag.tensor",
            )


# FLA options that change what the tensors mean and that this entry point does not implement, and why, with the
# fix; rejected when set. Unset means what FLA's own truthiness test means: None or a false scalar (FLA:
# ``if head_first:``); anything else is rejected, never ignored (ignoring one runs a valid-looking call on misread
# data).
_UNSUPPORTED_OPTIONS = {
    "head_first": ("gdn-nki takes FLA's seq-first layout only (head_first was removed from FLA)",
                   "pass x.transpose(1, 2) for q, k, v, g and beta, without head_first"),
    "allow_neg_eigval": ("β = 2·sigmoid(beta) reaches 2, outside the kernel's contract (β in [0, 1]), where its "
                         "accuracy is not established", "train and serve with allow_neg_eigval=False models, or "
                         "run this layer with FLA"),
}  # fmt: skip


def _reject_unsupported_options(options: dict[str, Any]) -> None:
    """Reject an FLA option this entry point does not implement when it is set (not None or a false scalar)."""
    for name, value in options.items():
        # plain Python values first: the compiled drop-ins trace this, and dynamo breaks the graph at np.ndim
        if value is None or (type(value) in (bool, int, float) and not value):
            continue
        if np.ndim(value) == 0 and not _truthy(value):
            continue
        rule, fix = _UNSUPPORTED_OPTIONS[name]
        raise rejection(name, f"= {_describe(value)}", rule, fix, rule_id="option.unsupported")


def state_layout(state_v_first: Any, transpose_state_layout: Any = None) -> bool:
    """Whether the states are V-major: FLA's ``state_v_first``, or ``transpose_state_layout``, its name before FLA
    0.5.1 (fla/ops/gated_delta_rule/chunk.py and fused_recurrent.py, fla-org/flash-linear-attention v0.5.2: both
    set is refused). "Set" is FLA's truthiness (None or a false scalar is unset); a tensor flag is refused before
    (``_reject_tensor_flags``)."""
    new, old = (_truthy(value) for value in (state_v_first, transpose_state_layout))
    if new and old:
        raise rejection("transpose_state_layout", "given with state_v_first", "transpose_state_layout is FLA's "
                        "deprecated name for state_v_first; FLA refuses both", "pass state_v_first=True only",
                        rule_id="option.state_layout_both")  # fmt: skip
    return new or old


def _check_chunk_size(chunk_size: Any) -> None:
    """FLA's ``chunk_size`` (16, 32 or 64, as FLA checks it); not used: the chunking changes no result."""
    if not is_integer(chunk_size) or chunk_size not in FLA_CHUNKS:
        raise rejection("chunk_size", f"= {chunk_size!r}", f"FLA's chunk_size is one of {FLA_CHUNKS}",
                        "omit chunk_size (gdn-nki chunks by its algorithm; the result is the same recurrence)",
                        rule_id="option.chunk_size")  # fmt: skip


FLA_CHUNKS = (16, 32, 64)


def _state_indices(state_indices: Any, initial_state_indices: Any) -> Any:
    """``state_indices``, given under its name or SGLang's / FlashInfer's ``initial_state_indices`` (the same
    meaning: the pool rows, read and written in place), not both."""
    if initial_state_indices is None:
        return state_indices
    if state_indices is not None:
        raise rejection("initial_state_indices", "given with state_indices", "initial_state_indices is another "
                        "name for state_indices", "pass one of them", rule_id="keyword.alias")  # fmt: skip
    return initial_state_indices


def _index_array(rows: Any) -> np.ndarray | None:
    """Pool-row indices (a tensor or a sequence of ints) as a numpy array, None kept."""
    return None if rows is None else as_numpy(torch.as_tensor(rows))


def check_gate_parameters(a_log: Any, dt_bias: Any, value_heads: int, any_device: bool = False) -> None:
    """The rules of FLA's ``use_gate_in_kernel`` parameters that read no value: given, tensors, dtypes, one per
    value head (the custom ops check them at trace time)."""
    if a_log is None:
        raise rejection("A_log", "= None with use_gate_in_kernel=True", "the fused gate -exp(A_log)·softplus(g + "
                        "dt_bias) needs the layer's A_log", "pass A_log=layer.A_log", rule_id="A_log.required")  # fmt: skip
    parameters = {"A_log": a_log} if dt_bias is None else {"A_log": a_log, "dt_bias": dt_bias}
    for name, x in parameters.items():
        if not is_torch_tensor(x):
            raise rejection(name, f"of type {type(x).__name__}", f"{name} must be a torch tensor", "pass a tensor")
        check_tensor(name, x, any_device=any_device)
        if x.numel() != value_heads:
            raise rejection(name, f"shape {tuple(x.shape)}", f"{name} holds one value per value head (Hv="
                            f"{value_heads})", f"pass the layer's {name} [Hv]", rule_id=f"{name}.shape")  # fmt: skip


def _log_decay(g: torch.Tensor, a_log: Any, dt_bias: Any, value_heads: int) -> torch.Tensor:
    """FLA's ``use_gate_in_kernel``: the log-decay from the raw gate ``g`` (checked, with its parameters)."""
    check_gate_parameters(a_log, dt_bias, value_heads)
    parameters = {"A_log": a_log} if dt_bias is None else {"A_log": a_log, "dt_bias": dt_bias}
    for name, x in parameters.items():
        found = first_bad_index(as_numpy(x).reshape(-1), lambda a: ~np.isfinite(a))
        if found is not None:
            raise rejection(name, f"value {as_numpy(x).reshape(-1)[found]} at index {list(found)}", f"{name} must "
                            "be finite", f"pass the layer's trained {name}", rule_id=f"{name}.finite")  # fmt: skip
    raw = as_numpy(g)
    found = first_bad_index(raw, np.isnan)
    if found is not None:
        raise rejection("g", f"value nan at index {list(found)}", "with use_gate_in_kernel, g is the raw gate; NaN "
                        "has no decay", "find where the NaN comes from (the gate projection)", rule_id="g.finite")  # fmt: skip
    bias = None if dt_bias is None else as_numpy(dt_bias).reshape(-1)
    return torch.from_numpy(log_decay_from_gate(raw, as_numpy(a_log).reshape(-1), bias))


def _describe(value: Any) -> str:
    """A short description of an argument's value for an error (a tensor by its shape, not its elements)."""
    if is_torch_tensor(value) or isinstance(value, np.ndarray):
        return f"a tensor of shape {tuple(value.shape)}"
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _truthy(value: Any) -> bool:
    """``bool(value)`` for a scalar option value; a value that has no truth value counts as set."""
    try:
        return bool(value)
    except (TypeError, ValueError, RuntimeError):
        return True


_PARAMETERS = tuple(p for p in inspect.signature(chunk_gated_delta_rule).parameters if p != "kwargs")


def _folded_norm(z: Any, weight: Any, eps: Any, activation: Any, batch: int, seq_len: int) -> dict[str, Any]:
    """The folded norm's keywords for ``prefill_bucket`` (z as its packed [1, B·T, Hv, V] row), or nothing when
    no norm option is set (the call runs as FLA's)."""
    if z is None and weight is None and eps == 1e-6 and activation == "silu":
        return {}
    for name, x in (("z", z), ("norm_weight", weight)):
        if x is not None:
            if not isinstance(x, torch.Tensor):
                raise rejection(name, f"of type {type(x).__name__}", f"{name} must be a torch tensor", "pass a tensor")
            check_tensor(name, x)
    if z is not None and z.dim() == 4 and tuple(z.shape[:2]) == (batch, seq_len):
        z = z.reshape(1, batch * seq_len, *z.shape[2:])  # the batch rows as consecutive sequences, as q's
    return {"z": None if z is None else as_numpy(z.contiguous()), "norm_weight": None if weight is None else
            as_numpy(weight.contiguous()), "norm_eps": eps, "norm_activation": activation}  # fmt: skip


def _seq_first_index(name: str, at: list[int], seq_len: int) -> list[int]:
    """The caller's index of an element the kernel's contract found at ``at`` in its head-major ``[1, H, B·T(,
    D)]`` view of a seq-first ``[B, T, H(, D)]`` argument, or in z's packed ``[1, B·T, Hv, V]`` row (states keep
    their layout)."""
    if name == "z":
        _, token, *rest = at
        return [token // seq_len, token % seq_len, *rest]
    if name not in ("query", "key", "value", "g_log", "beta"):
        return at
    _, head, token, *rest = at
    return [token // seq_len, token % seq_len, head, *rest]


def warn_if_head_first(q: Any, cu_seqlens: Any) -> None:
    """FLA's warning when T < Hk without ``cu_seqlens``: head-first [B, H, T, D] tensors passed as seq-first look
    like that and would run as garbage (attributed to the drop-in's caller)."""
    if cu_seqlens is None and q.shape[1] < q.shape[2]:
        warnings.warn(
            f"gdn_nki.torch.chunk_gated_delta_rule: q has fewer tokens (T={q.shape[1]}) than heads "
            f"(Hk={q.shape[2]}); the layout is seq-first [B, T, H, D], so check these are not head-first "
            "[B, H, T, D] tensors (transpose(1, 2) them)",
            UserWarning,
            stacklevel=3,
        )


def _check_layout(tensors: dict[str, Any], cu_seqlens: Any, any_device: bool = False) -> None:
    """Device (the CPU unless ``any_device``), dtype and FLA's seq-first shapes, each failure naming its argument."""
    for name, x in tensors.items():
        if not isinstance(x, torch.Tensor):
            raise rejection(name, f"of type {type(x).__name__}", f"{name} must be a torch tensor", "pass a tensor")
        check_tensor(name, x, any_device=any_device)
    q, v = tensors["q"], tensors["v"]
    for name in ("k", "v"):
        if tensors[name].dtype != q.dtype:
            raise rejection(name, f"dtype {tensors[name].dtype}", f"{name} must have q's dtype ({q.dtype})",
                            f"pass {name}.to(q.dtype)")  # fmt: skip
    rows = q.shape[:2] if q.dim() == 4 else None
    expected = {"q": 4, "k": 4, "v": 4, "g": 3, "beta": 3}
    for name, x in tensors.items():
        reject_empty(name, x)
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
        check_tensor("cu_seqlens", cu_seqlens, INTEGER_DTYPES, any_device=any_device)


def _boundaries(cu_seqlens: Any, batch: int, seq_len: int) -> np.ndarray:
    """The packed row's sequence boundaries: ``cu_seqlens`` as given, or one sequence per batch row."""
    if cu_seqlens is None:
        return np.arange(batch + 1, dtype=np.int64) * seq_len
    values = as_numpy(cu_seqlens) if isinstance(cu_seqlens, torch.Tensor) else np.asarray(cu_seqlens)
    if batch != 1:  # prefill_varlen checks the rest (start, increase, end) on the flattened row
        raise ContractError(
            [v for v in cu_seqlens_violations(values, batch, 0) if v.rule_id in ("cu_seqlens.form", "cu_seqlens.batch")]
        )
    return values.copy()


def _states(
    initial_state: Any, state_indices: Any, n_seqs: int, tail: tuple[int, int, int], v_first: bool = False
) -> tuple[Any, Any]:
    """The kernel's state buffer and slots: the caller's pool itself (in place) with ``state_indices``, else a
    private fp32 copy of ``initial_state`` (FLA never writes it) or None; in the caller's layout (``v_first``)."""
    check_states(initial_state, state_indices, n_seqs, tail, v_first=v_first)
    if initial_state is None:
        return None, None
    if state_indices is None:
        return np.array(as_numpy(initial_state.float()), dtype=np.float32, order="C"), None
    if isinstance(state_indices, torch.Tensor):
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
