"""The torch drop-ins as ``torch.library`` custom ops (namespace ``gdn_nki``): one graph node per GDN call, under
``torch.compile``, ``torch.export`` and fake tensors alike.

Each drop-in (the public functions here, under the originals' names and signatures) is split in two:

- its argument handling, in the drop-in itself: reads only types, shapes, dtypes and non-tensor values (no
  ``.item()``, ``.tolist()``, ``.cpu()`` or numpy on a tensor), rejects by name what it cannot honour, picks the
  bucket from shapes alone, and calls one op;
- the op, with three implementations:

  ==============  ================================================================================================
  CPU             today's host path, unchanged (``chunk.py``, ``fused_recurrent.py``, ``host.decode``): every
                  rule, the value checks, the all-or-nothing commits, the same ``ContractError``\\ s
  fake (meta)     the trace-time rules (``rules.py``: every rule that reads only shapes and dtypes, the very
                  ``ContractError`` the CPU raises) and empty outputs of the results' shapes
  other devices   ``device.py``: the same trace-time rules, then the ``@nki.jit`` kernel launched on the device
                  tensors; the value rules are trusted (``check_values`` runs them on demand)
  ==============  ================================================================================================

Under ``torch.compile`` a call its rules reject compiles to ``gdn_nki::rejected_call``, which raises the very
``ContractError`` eager raises (dynamo would rewrap one raised while it traces: ``traced_rejection.py``).

A state pool written in place is declared in the op's ``mutates_args``; an op cannot return a tensor it mutates,
so the drop-in returns the pool itself. Calls the op schema cannot carry run today's host path directly, in eager
mode: index arguments given as Python lists or numpy arrays (host data), tensors on several devices, options of a
type the rules reject or breaking a non-tensor rule (the host path raises its ``ContractError``, today's), and calls
whose pool (the state written in place) is itself on the autograd graph. FLA's context parallelism (``cp_context``,
``context_parallel.py``) is no op of its own: its two passes are this drop-in's op, its pool rows tensor ops and its
exchanges functional collectives, so on device tensors (or traced) it too reads no value on the host.

Grad mode: the kernels are forward-only. A call with inputs requiring grad runs the op all the same (eager and
compiled, so ``torch.compile`` traces it); the functional ops' autograd formula and the pool ops' attached output
put the results on the graph, and a backward raises ``ForwardOnlyError`` naming the drop-in (``forward_only.py``).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import numbers
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from gdn_ref.constants import DEFAULT_ALGORITHM, DEFAULT_GROUP_SIZE
from gdn_ref.contract import names_entry_point

from ..host.decode import tkg_simulate
from ..host.torch_io import as_numpy, as_torch, import_torch, is_torch_tensor, reject_empty, rejection
from . import chunk, device, fused_recurrent, rules
from .context_parallel import ContextParallel, context_parallel_prefill
from .forward_only import attached, detached, forbid_backward, on_graph
from .graph_padding import trimmed_to_requests
from .traced_rejection import rejects_at_trace_time

torch = import_torch()
Tensor = torch.Tensor

# The drop-ins' public names: what a rejection and a refused backward (``forward_only.py``) name.
CHUNK_ENTRY = "gdn_nki.torch.chunk_gated_delta_rule"
FLA_DECODE_ENTRY = "gdn_nki.torch.fused_recurrent_gated_delta_rule"
VLLM_ENTRY = "gdn_nki.torch.vllm_fused_recurrent_gated_delta_rule"
SIGMOID_GATING_ENTRY = "gdn_nki.torch.fused_sigmoid_gating_delta_rule_update"
TKG_ENTRY = "gdn_nki.torch.gdn_tkg"


# --- prefill: FLA's chunk_gated_delta_rule ------------------------------------------------------------------------


@torch.library.custom_op("gdn_nki::chunk_gated_delta_rule", mutates_args=())
def chunk_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    initial_state: Tensor | None,
    A_log: Tensor | None,
    dt_bias: Tensor | None,
    cu_seqlens: Tensor | None,
    scale: float | None,
    use_qk_l2norm: bool,
    use_beta_sigmoid: bool,
    use_gate: bool,
    algorithm: str,
    group_size: int,
    bucket: list[int] | None,
    z: Tensor | None = None,
    norm_weight: Tensor | None = None,
    norm_eps: float = 1e-6,
    norm_activation: str = "silu",
) -> tuple[Tensor, Tensor]:
    """The prefill without a pool: (o [B, T, Hv, V], final states [N, Hv, K, V] fp32); ``initial_state`` is read.
    With ``z``: o is the gated RMSNorm's y, folded into the bucketed launch (``gdn_cte_bucket_normed``)."""
    return device.chunk(**locals())


@chunk_op.register_kernel("cpu")
def _chunk_cpu(q, k, v, g, beta, initial_state, A_log, dt_bias, cu_seqlens, scale, use_qk_l2norm, use_beta_sigmoid,
               use_gate, algorithm, group_size, bucket, z=None, norm_weight=None, norm_eps=1e-6,
               norm_activation="silu") -> tuple[Tensor, Tensor]:  # fmt: skip
    with _drop_in_warned():
        return chunk.chunk_gated_delta_rule(
            q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=True,
            use_qk_l2norm_in_kernel=use_qk_l2norm, use_beta_sigmoid_in_kernel=use_beta_sigmoid,
            cu_seqlens=cu_seqlens, use_gate_in_kernel=use_gate, A_log=A_log, dt_bias=dt_bias, algorithm=algorithm,
            group_size=group_size, bucket=None if bucket is None else tuple(bucket), z=z, norm_weight=norm_weight,
            norm_eps=norm_eps, norm_activation=norm_activation,
        )  # fmt: skip


@contextlib.contextmanager
def _drop_in_warned() -> Iterator[None]:
    """The host path's head-first warning silenced: the drop-in, which called the op, has given it already."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=HEAD_FIRST_WARNING, category=UserWarning)
        yield


HEAD_FIRST_WARNING = "gdn_nki.torch.chunk_gated_delta_rule: q has fewer tokens"


forbid_backward(chunk_op, CHUNK_ENTRY)


@chunk_op.register_fake
def _chunk_fake(q, k, v, g, beta, initial_state, A_log, dt_bias, cu_seqlens, scale, use_qk_l2norm, use_beta_sigmoid,
                use_gate, algorithm, group_size, bucket, z=None, norm_weight=None, norm_eps=1e-6,
                norm_activation="silu") -> tuple[Tensor, Tensor]:  # fmt: skip
    n_seqs = rules.prefill(q, k, v, g, beta, initial_state, None, A_log, dt_bias, cu_seqlens, use_gate, scale,
                           algorithm, group_size, bucket)  # fmt: skip
    rules.folded_norm(q, v, z, norm_weight, norm_eps, norm_activation)
    return _prefill_out(q, v), q.new_empty((n_seqs, v.shape[2], q.shape[3], v.shape[3]), dtype=torch.float32)


@torch.library.custom_op("gdn_nki::chunk_gated_delta_rule_pool", mutates_args=("pool",))
def chunk_pool_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    pool: Tensor,
    state_indices: Tensor,
    A_log: Tensor | None,
    dt_bias: Tensor | None,
    cu_seqlens: Tensor | None,
    checkpoint_indices: Tensor | None,
    read_indices: Tensor | None,
    scale: float | None,
    use_qk_l2norm: bool,
    use_beta_sigmoid: bool,
    use_gate: bool,
    algorithm: str,
    group_size: int,
    bucket: list[int] | None,
    checkpoint_every: int | None,
    state_v_first: bool = False,
    z: Tensor | None = None,
    norm_weight: Tensor | None = None,
    norm_eps: float = 1e-6,
    norm_activation: str = "silu",
) -> Tensor:
    """The prefill on a state pool [P, Hv, K, V] fp32 ([P, Hv, V, K] with ``state_v_first``), updated in place at
    the named rows: o [B, T, Hv, V] (with ``z``: the gated RMSNorm's y, ``gdn_cte_bucket_normed``)."""
    return device.chunk_pool(**locals())


@chunk_pool_op.register_kernel("cpu")
def _chunk_pool_cpu(q, k, v, g, beta, pool, state_indices, A_log, dt_bias, cu_seqlens, checkpoint_indices,
                    read_indices, scale, use_qk_l2norm, use_beta_sigmoid, use_gate, algorithm, group_size, bucket,
                    checkpoint_every, state_v_first=False, z=None, norm_weight=None, norm_eps=1e-6,
                    norm_activation="silu") -> Tensor:  # fmt: skip
    with _drop_in_warned():
        o, _ = chunk.chunk_gated_delta_rule(
            q, k, v, g, beta, scale=scale, initial_state=pool, use_qk_l2norm_in_kernel=use_qk_l2norm,
            use_beta_sigmoid_in_kernel=use_beta_sigmoid, cu_seqlens=cu_seqlens, use_gate_in_kernel=use_gate,
            A_log=A_log, dt_bias=dt_bias, state_indices=state_indices, algorithm=algorithm, group_size=group_size,
            bucket=None if bucket is None else tuple(bucket), checkpoint_every=checkpoint_every,
            checkpoint_indices=checkpoint_indices, read_indices=read_indices, state_v_first=state_v_first, z=z,
            norm_weight=norm_weight, norm_eps=norm_eps, norm_activation=norm_activation,
        )  # fmt: skip
    return o


@chunk_pool_op.register_fake
def _chunk_pool_fake(q, k, v, g, beta, pool, state_indices, A_log, dt_bias, cu_seqlens, checkpoint_indices,
                     read_indices, scale, use_qk_l2norm, use_beta_sigmoid, use_gate, algorithm, group_size, bucket,
                     checkpoint_every, state_v_first=False, z=None, norm_weight=None, norm_eps=1e-6,
                     norm_activation="silu") -> Tensor:  # fmt: skip
    rules.prefill(q, k, v, g, beta, pool, state_indices, A_log, dt_bias, cu_seqlens, use_gate, scale, algorithm,
                  group_size, bucket, checkpoint_every, checkpoint_indices, read_indices, v_first=state_v_first)  # fmt: skip
    rules.folded_norm(q, v, z, norm_weight, norm_eps, norm_activation)
    return _prefill_out(q, v)


def _prefill_out(q: Tensor, v: Tensor) -> Tensor:
    return q.new_empty((*v.shape[:3], v.shape[3]))


def _output_and_state(
    rejected: Callable[[Tensor], Tensor],
    argument: Callable[[str], Any],
    like: str = "v",
    state: str = "initial_state",
    returned: str | None = "output_final_state",
) -> Any:
    """A rejected call's stand-in result (``traced_rejection``): (the rejection's node shaped like ``like`` — the
    output's shape, as far as the arguments say it — and the ``state`` argument when the call returns a state)."""
    shaped = argument(like)
    out = rejected(shaped if isinstance(shaped, Tensor) else _first_tensor(argument))
    return out, (argument(state) if returned is None or argument(returned) else None)


def _first_tensor(argument: Callable[[str], Any]) -> Tensor:
    """A tensor of the call for the rejection's node to be shaped like, when the output's model is not one."""
    for name in ("q", "k", "x"):
        if isinstance(argument(name), Tensor):
            return argument(name)
    return torch.empty(0)


@rejects_at_trace_time(_output_and_state)
@names_entry_point(CHUNK_ENTRY)
def chunk_gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    cu_seqlens: Tensor | None = None,
    cu_seqlens_cpu: Tensor | None = None,
    chunk_indices: Tensor | None = None,
    cp_context: Any = None,
    *,
    use_gate_in_kernel: bool = False,
    A_log: Tensor | None = None,
    dt_bias: Tensor | None = None,
    chunk_size: int = 64,
    head_first: bool | None = None,
    transpose_state_layout: bool | None = None,
    state_indices: Tensor | None = None,
    initial_state_indices: Tensor | None = None,
    algorithm: str = DEFAULT_ALGORITHM,
    group_size: int = DEFAULT_GROUP_SIZE,
    bucket: tuple[int, int] | None = None,
    checkpoint_every: int | None = None,
    checkpoint_indices: Tensor | None = None,
    read_indices: Tensor | None = None,
    check_values: bool = True,
    z: Tensor | None = None,
    norm_weight: Tensor | None = None,
    norm_eps: float = 1e-6,
    norm_activation: str = "silu",
    **kwargs: Any,
) -> tuple[Tensor, Tensor | None]:
    """Chunked gated delta rule with FLA's signature and semantics, as one ``gdn_nki`` op.

    Dimensions, Args and Returns:
        As ``gdn_nki.torch.chunk.chunk_gated_delta_rule`` (FLA's arguments, gdn-nki's pools, buckets, checkpoints
        and read rows, the gated RMSNorm folded in with ``z``; every option honoured, accepted for a stated reason
        or rejected by name).

    Notes:
        One op per call: ``gdn_nki::chunk_gated_delta_rule_pool`` with ``state_indices`` (the pool declared
        mutated, returned as the final state), else ``gdn_nki::chunk_gated_delta_rule``. Without ``bucket=`` and
        with buckets configured (``gdn_nki.configure_buckets``) the bucket is the smallest holding the batch's
        worst case, read from shapes alone (``rules.bucket_for``): T tokens of N sequences, each padded to its
        chunk multiple. On the CPU the op runs the host path as before; on a device it launches
        ``gdn_cte_bucket`` (module docstring).
    """
    flags = (output_final_state, use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel, use_gate_in_kernel)
    options = (head_first, cp_context, allow_neg_eigval)
    layout = (state_v_first, transpose_state_layout)  # plain bools, not both set: carried (a pool's op takes it)
    v_first = any(flag is True for flag in layout)
    tensors = (q, k, v, g, beta, initial_state, A_log, dt_bias, z, norm_weight)
    indices = (cu_seqlens, state_indices, initial_state_indices, checkpoint_indices, read_indices)
    pool = state_indices if initial_state_indices is None else initial_state_indices
    written = initial_state if pool is not None else None
    carried = _op_can_carry(tensors, indices, flags, scale, algorithm, group_size, bucket, checkpoint_every, written)
    # The host path's non-tensor rules (unknown keywords, options set, FLA's chunk_size, aliases, packing keywords,
    # rows without a pool) are the host path's to raise: a call breaking one runs it. Checked here only as far as
    # telling a plainly valid call, which every compiled one is (those rules use numpy and difflib, which
    # torch.compile does not trace).
    plainly_valid = (
        all(name in chunk.HF_PASS_THROUGH for name in kwargs)
        and all(kwargs.get(name) is None for name in chunk._PACKING_KEYWORDS if cu_seqlens is None)
        and all(value is None or (isinstance(value, (bool, int, float)) and not value) for value in options)
        and all(flag is None or type(flag) is bool for flag in layout)
        and not all(flag is True for flag in layout)
        and (not v_first or pool is not None or _v_major_shaped(initial_state, q, v))
        and type(chunk_size) is int
        and chunk_size in chunk.FLA_CHUNKS
        and (state_indices is None or initial_state_indices is None)
        and (initial_state is not None or pool is None)
        and (pool is not None or (checkpoint_indices is None and read_indices is None))
        and _norm_carried(z, norm_weight, norm_eps, norm_activation)
    )
    # check_values=False on the CPU is the host path's (the op's CPU kernel scans; a device path never does)
    if not (carried and plainly_valid) or (check_values is not True and q.device.type == "cpu"):
        return chunk.chunk_gated_delta_rule(
            q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
            use_beta_sigmoid_in_kernel, allow_neg_eigval, state_v_first, cu_seqlens, cu_seqlens_cpu, chunk_indices,
            cp_context, use_gate_in_kernel=use_gate_in_kernel, A_log=A_log, dt_bias=dt_bias, chunk_size=chunk_size,
            head_first=head_first, transpose_state_layout=transpose_state_layout, state_indices=state_indices,
            initial_state_indices=initial_state_indices, algorithm=algorithm, group_size=group_size, bucket=bucket,
            checkpoint_every=checkpoint_every, checkpoint_indices=checkpoint_indices, read_indices=read_indices,
            check_values=check_values, z=z, norm_weight=norm_weight, norm_eps=norm_eps,
            norm_activation=norm_activation, **kwargs,
        )  # fmt: skip
    if q.dim() == 4:
        chunk.warn_if_head_first(q, cu_seqlens)
    if bucket is None:
        bucket = rules.bucket_for(q, cu_seqlens, algorithm)
    common = dict(
        scale=None if scale is None else float(scale), use_qk_l2norm=bool(use_qk_l2norm_in_kernel),
        use_beta_sigmoid=bool(use_beta_sigmoid_in_kernel), use_gate=bool(use_gate_in_kernel), algorithm=algorithm,
        group_size=int(group_size), bucket=None if bucket is None else [int(x) for x in bucket],
    )  # fmt: skip
    # the folded norm's keywords only with z: a call without it keeps the op's keywords as they were
    norm = {} if z is None else dict(z=z, norm_weight=norm_weight, norm_eps=float(norm_eps),
                                     norm_activation=norm_activation)  # fmt: skip
    gate = (A_log, dt_bias) if use_gate_in_kernel else (None, None)
    if pool is not None:  # an op updating a pool has no autograd formula: its output goes on the graph after it
        read = [detached(x) for x in (q, k, v, g, beta, *gate)]
        o = chunk_pool_op(*read[:5], initial_state, pool, *read[5:], cu_seqlens, checkpoint_indices, read_indices,
                          **common, checkpoint_every=checkpoint_every, state_v_first=v_first,
                          **{name: detached(x) for name, x in norm.items()})  # fmt: skip
        o = attached(CHUNK_ENTRY, o, (q, k, v, g, beta, *gate, *(x for x in (z, norm_weight) if x is not None)))
        return o, initial_state if output_final_state else None
    o, final = chunk_op(q, k, v, g, beta, _swap_state_axes(initial_state, v_first), *gate, cu_seqlens, **common,
                        **norm)  # fmt: skip
    return o, _swap_state_axes(final, v_first) if output_final_state else None


@names_entry_point("gdn_nki.torch.context_parallel_chunk_gated_delta_rule")
def context_parallel_chunk_gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    cp_context: ContextParallel,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    state_indices: Tensor | None = None,
    **options: Any,
) -> tuple[Tensor, Tensor | None]:
    """This rank's share of a context-parallel prefill (``context_parallel.context_parallel_prefill``, its Args and
    Returns) on ``chunk_gated_delta_rule``'s op: the call for code without FLA's ``cp_context`` keyword."""
    return context_parallel_prefill(
        chunk_gated_delta_rule, q, k, v, g, beta, cp_context, scale, initial_state, output_final_state, state_indices,
        **options,
    )  # fmt: skip


# A ``cp_context`` call runs the host path's argument handling (``chunk.context_parallel_call``) with this drop-in
# making its passes: its op, so the kernel on a device (ops imports chunk, so chunk is told rather than importing).
chunk.CP_PREFILL = chunk_gated_delta_rule


def _norm_carried(z: Any, weight: Any, eps: Any, activation: Any) -> bool:
    """Whether the op carries the folded norm's options as the host path reads them: unset, or z given with a real
    eps and a str gate (a norm option without z is the host path's to refuse)."""
    if z is None:
        return weight is None and type(eps) is float and eps == 1e-6 and activation == "silu"
    return isinstance(eps, numbers.Real) and not isinstance(eps, bool) and isinstance(activation, str)


def _v_major_shaped(state: Tensor | None, q: Tensor, v: Tensor) -> bool:
    """Whether a V-major call's per-sequence ``state`` (no pool) has the V-major shape [.., V, K] (or is absent): the
    K-major op then carries it, transposed in the graph (``_swap_state_axes``); else the host path names the flag."""
    return state is None or (state.dim() >= 2 and tuple(state.shape[-2:]) == (v.shape[-1], q.shape[-1]))


def _swap_state_axes(state: Tensor | None, v_first: bool) -> Tensor | None:
    """States without a pool in the op's K-major layout and back: a transposing copy in the graph of the N
    per-sequence states (N·Hv·K·V fp32 each way; exact). A pool is never copied: its op reads it V-major in place."""
    return state.transpose(-1, -2).contiguous() if v_first and state is not None else state


def _op_can_carry(
    tensors: tuple[Any, ...],
    indices: tuple[Any, ...],
    flags: tuple[Any, ...],
    scale: Any,
    algorithm: Any,
    group_size: Any,
    bucket: Any,
    checkpoint_every: Any,
    written: Any,
) -> bool:
    """Whether the op schema carries this call as the host path reads it (module docstring): tensors where
    tensors go (indices included), plain bools, a real scale, a str algorithm, int sizes, a bucket of two ints,
    and no pool (``written``) on the autograd graph. A pool call with inputs on the graph runs the host path in eager
    mode, which records the pool's update on the graph too (a backward through the pool raises); a compiled one
    runs the op, whose output alone goes on the graph (``forward_only.py``: a graph cannot record it)."""
    if not _one_device(tensors, indices):
        return False
    if not all(isinstance(x, bool) for x in flags):
        return False
    if on_graph([written]) or (written is not None and on_graph(tensors) and not torch.compiler.is_compiling()):
        return False
    scale_ok = scale is None or (isinstance(scale, numbers.Real) and not isinstance(scale, bool))
    ints_ok = all(
        isinstance(x, int) and not isinstance(x, bool)
        for x in (group_size, *(() if checkpoint_every is None else (checkpoint_every,)))
    )
    bucket_ok = bucket is None or (
        isinstance(bucket, (tuple, list))
        and len(bucket) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) for x in bucket)
    )
    return scale_ok and isinstance(algorithm, str) and ints_ok and bucket_ok


# --- decode: FLA's fused_recurrent_gated_delta_rule ----------------------------------------------------------------


@torch.library.custom_op("gdn_nki::fused_recurrent_gated_delta_rule", mutates_args=())
def fused_recurrent_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor | None,
    beta: Tensor | None,
    initial_state: Tensor | None,
    cu_seqlens: Tensor | None,
    scale: float | None,
    use_qk_l2norm: bool,
) -> tuple[Tensor, Tensor]:
    """FLA's decode: (o [B, T, HV, V], final states [N, HV, K, V] fp32); ``initial_state`` is read."""
    return device.fused_recurrent(**locals())


@fused_recurrent_op.register_kernel("cpu")
def _fused_recurrent_cpu(q, k, v, g, beta, initial_state, cu_seqlens, scale, use_qk_l2norm) -> tuple[Tensor, Tensor]:
    return fused_recurrent.fused_recurrent_gated_delta_rule(
        q, k, v, g, beta=beta, scale=scale, initial_state=initial_state, output_final_state=True,
        use_qk_l2norm_in_kernel=use_qk_l2norm, cu_seqlens=cu_seqlens,
    )  # fmt: skip


forbid_backward(fused_recurrent_op, FLA_DECODE_ENTRY)


@fused_recurrent_op.register_fake
def _fused_recurrent_fake(q, k, v, g, beta, initial_state, cu_seqlens, scale, use_qk_l2norm) -> tuple[Tensor, Tensor]:
    n_seqs, _ = rules.fla_decode(q, k, v, g, beta, initial_state, cu_seqlens)
    return _prefill_out(q, v), q.new_empty((n_seqs, v.shape[2], q.shape[3], v.shape[3]), dtype=torch.float32)


def _or_vllms_form(fla: Callable[..., Any]) -> Callable[..., Any]:
    """FLA's decode drop-in that is vLLM's when called with one of vLLM's keywords (``VLLM_KEYWORDS``): that call,
    positional arguments in vLLM's order included, goes to ``vllm_fused_recurrent_gated_delta_rule`` as made."""

    @functools.wraps(fla)
    def dispatch(*args: Any, **kwargs: Any) -> Any:
        vllm_keywords = [name for name in VLLM_KEYWORDS if name in kwargs]
        if not vllm_keywords:
            return fla(*args, **kwargs)
        _reject_mixed_forms(vllm_keywords[0], kwargs)
        return vllm_fused_recurrent_gated_delta_rule(*args, **kwargs)

    return dispatch


@rejects_at_trace_time(_output_and_state)
@names_entry_point(FLA_DECODE_ENTRY)
@_or_vllms_form
def fused_recurrent_gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor | None = None,
    gk: Tensor | None = None,
    gv: Tensor | None = None,
    beta: Tensor | None = None,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    A_log: Tensor | None = None,
    dt_bias: Tensor | None = None,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    cu_seqlens: Tensor | None = None,
    *,
    check_values: bool = True,
    **kwargs: Any,
) -> tuple[Tensor, Tensor | None]:
    """FLA's ``fused_recurrent_gated_delta_rule`` (its signature and positional order since FLA's fused gate,
    2026-04) as the op ``gdn_nki::fused_recurrent_gated_delta_rule``; called with vLLM's pool keywords, vLLM's
    function of the same name.

    Dimensions:
        As ``gdn_nki.torch.fused_recurrent.fused_recurrent_gated_delta_rule``.

    Args:
        q, k, v, g, gk, gv, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, cu_seqlens:
            as ``gdn_nki.torch.fused_recurrent.fused_recurrent_gated_delta_rule``.
        use_gate_in_kernel (bool): ``g`` is the raw gate: g = −exp(A_log)·softplus(g + dt_bias), in fp32 torch
            ops before the op (as FLA's kernel and HF's layer compute it). A_log, dt_bias (Tensor | None): [HV].
        use_beta_sigmoid_in_kernel (bool): ``beta`` holds logits: β = sigmoid(beta), in fp32 before the op.
        allow_neg_eigval (bool): rejected when set (β would reach 2), as by ``chunk_gated_delta_rule``.
        state_v_first (bool), and FLA's older ``transpose_state_layout=``: V-major states [N, HV, V, K]
            (``initial_state`` and the final states), as ``chunk_gated_delta_rule``'s; the op carries them
            transposed in the graph (``_swap_state_axes``).
        check_values (bool): as ``chunk_gated_delta_rule``'s (the CPU's value scans; a device never scans).
        kwargs: vLLM's ``inplace_final_state``, ``ssm_state_indices``, ``num_accepted_tokens`` and
            ``retrieve_parent_token`` make the call vLLM's, positional arguments in vLLM's order
            (``vllm_fused_recurrent_gated_delta_rule``: the pool ``initial_state`` updated in place, returned as
            the state; FLA's own keywords beside them rejected by name); FLA's older ``transpose_state_layout``
            (rejected when set); HF transformers' attention keywords, which a Qwen3-Next layer passes through to
            the ``torch_recurrent_gated_delta_rule`` this replaces, accepted and not used; any other keyword is
            rejected, naming the closest valid one or, for a pool's rows (``state_indices``,
            ``initial_state_indices``), vLLM's form (``fused_recurrent.reject_unknown_keywords``).

    Returns:
        tuple: ``o`` [B, T, HV, V] in q's dtype, and the final states [N, HV, K, V] fp32 (None unless asked); in
        vLLM's form vLLM's (``o``, the pool).

    Notes:
        On a device the packed sequences (``cu_seqlens``) must share one length (the CPU groups them by length,
        reading ``cu_seqlens``; a device trace cannot): trusted there, checked by ``check_values``. An empty q
        (B = 0 or T = 0) is refused, as by every drop-in (FLA's kernel would launch no block and return empties).
    """
    if any(name not in chunk.HF_PASS_THROUGH and name != "transpose_state_layout" for name in kwargs):
        # numpy / difflib, which torch.compile does not trace: only for a call with a keyword to reject
        fused_recurrent.reject_unknown_keywords(
            {name: value for name, value in kwargs.items() if name != "transpose_state_layout"}, _FLA_PARAMETERS
        )
    # FLA's kernel launches no block for B = 0 and returns empty outputs; gdn-nki refuses an empty batch here as
    # every drop-in does (vLLM's form, the chunk), in the caller's words: an empty batch is the caller's to skip.
    reject_empty("q", q)
    fla_only = dict(output_final_state=output_final_state, use_gate_in_kernel=use_gate_in_kernel,
                    use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel)  # fmt: skip
    chunk._reject_tensor_flags(fla_only | dict(state_v_first=state_v_first,
                                                transpose_state_layout=kwargs.get("transpose_state_layout")))  # fmt: skip
    chunk._reject_unsupported_options(dict(allow_neg_eigval=allow_neg_eigval))
    v_first = chunk.state_layout(state_v_first, kwargs.get("transpose_state_layout"))
    g, beta = _fla_gates(v, g, beta, use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel)
    carried = _decode_op_can_carry((q, k, v, g, beta, initial_state), (cu_seqlens,), scale, None)
    v_major_host = v_first and not _v_major_shaped(initial_state, q, v)  # a wrong V-major shape: the host names it
    if not carried or v_major_host or (check_values is not True and q.device.type == "cpu"):
        return fused_recurrent.fused_recurrent_gated_delta_rule(
            q, k, v, g, gk, gv, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, cu_seqlens,
            check_values=check_values, state_v_first=v_first,
        )  # fmt: skip
    fused_recurrent.reject_per_key_decays(gk, gv)
    o, final = fused_recurrent_op(q, k, v, g, beta, _swap_state_axes(initial_state, v_first), cu_seqlens,
                                  _scale(scale), bool(use_qk_l2norm_in_kernel))  # fmt: skip
    return o, _swap_state_axes(final, v_first) if output_final_state else None


_FLA_PARAMETERS = (*(p for p in inspect.signature(fused_recurrent_gated_delta_rule).parameters if p != "kwargs"),
                   "transpose_state_layout")  # fmt: skip

# vLLM's keywords of its ``fused_recurrent_gated_delta_rule`` (the pool form) that FLA's function of the same name
# does not have: one of them makes a call vLLM's.
VLLM_KEYWORDS = ("inplace_final_state", "ssm_state_indices", "num_accepted_tokens", "retrieve_parent_token")


def _reject_mixed_forms(vllm_keyword: str, kwargs: dict[str, Any]) -> None:
    """A call with one of vLLM's pool keywords is vLLM's; FLA's own keywords beside it make it neither."""
    for name in FLA_ONLY_KEYWORDS:
        if name in kwargs:
            raise rejection(name, f"given with vLLM's {vllm_keyword}=", f"{vllm_keyword} makes the call vLLM's "
                            f"fused_recurrent_gated_delta_rule, which has no {name}", f"drop {name} (vLLM's form "
                            "updates the pool in place and returns it) or drop vLLM's keywords",
                            rule_id="keyword.mixed_forms")  # fmt: skip


# FLA's keywords that vLLM's function of the same name does not take.
FLA_ONLY_KEYWORDS = ("gk", "gv", "output_final_state", "use_gate_in_kernel", "A_log", "dt_bias",
                     "use_beta_sigmoid_in_kernel", "allow_neg_eigval", "state_v_first")  # fmt: skip


def _fla_gates(v: Tensor, g: Tensor | None, beta: Tensor | None, use_gate_in_kernel: Any, A_log: Tensor | None,
               dt_bias: Tensor | None, use_beta_sigmoid_in_kernel: Any) -> tuple[Tensor | None, Tensor | None]:  # fmt: skip
    """FLA's fused activations as the op's inputs: the log-decay from the raw gate and β from its logits, by the
    device path's torch ops (``device.fused_gates``); the gates as given when neither option is set."""
    use_gate, use_sigmoid = chunk._truthy(use_gate_in_kernel), chunk._truthy(use_beta_sigmoid_in_kernel)
    for name, value, flag in (("g", g, use_gate), ("beta", beta, use_sigmoid)):
        if flag and not isinstance(value, Tensor):
            option = "use_gate_in_kernel" if name == "g" else "use_beta_sigmoid_in_kernel"
            raise rejection(name, f"= {value!r} with {option}=True", f"{option} computes the gate from the raw "
                            f"{name} the layer projects", f"pass the raw {name} or {option}=False")  # fmt: skip
    if use_gate:
        chunk.check_gate_parameters(A_log, dt_bias, v.shape[2], any_device=True)
    if not (use_gate or use_sigmoid):
        return g, beta
    return device.fused_gates(g, beta, A_log, dt_bias, use_sigmoid, use_gate)


# --- decode on a pool: vLLM's variant and vLLM / SGLang's fused-gating update --------------------------------------


@torch.library.custom_op("gdn_nki::vllm_fused_recurrent_gated_delta_rule", mutates_args=("pool",))
def vllm_fused_recurrent_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor | None,
    pool: Tensor,
    ssm_state_indices: Tensor,
    cu_seqlens: Tensor | None,
    num_accepted_tokens: Tensor | None,
    scale: float | None,
    use_qk_l2norm: bool,
    state_v_first: bool = False,
) -> Tensor:
    """vLLM's decode / verify on a pool [P, HV, K, V] fp32 ([P, HV, V, K] with ``state_v_first``) updated in place:
    o [B, T, HV, V]."""
    return device.vllm_fused_recurrent(**locals())


@vllm_fused_recurrent_op.register_kernel("cpu")
def _vllm_fused_recurrent_cpu(q, k, v, g, beta, pool, ssm_state_indices, cu_seqlens, num_accepted_tokens, scale,
                              use_qk_l2norm, state_v_first=False) -> Tensor:  # fmt: skip
    o, _ = fused_recurrent.vllm_fused_recurrent_gated_delta_rule(
        q, k, v, g, beta, scale, pool, True, cu_seqlens, ssm_state_indices, num_accepted_tokens, None, use_qk_l2norm,
        state_v_first=state_v_first,
    )  # fmt: skip
    return o


@vllm_fused_recurrent_op.register_fake
def _vllm_fused_recurrent_fake(q, k, v, g, beta, pool, ssm_state_indices, cu_seqlens, num_accepted_tokens, scale,
                               use_qk_l2norm, state_v_first=False) -> Tensor:  # fmt: skip
    rules.pool_decode(q, k, v, pool, ssm_state_indices, cu_seqlens, num_accepted_tokens, scale, use_qk_l2norm,
                      {"g": g, "beta": beta}, v_first=state_v_first)  # fmt: skip
    return _prefill_out(q, v)


@rejects_at_trace_time(lambda rejected, argument: _output_and_state(rejected, argument, returned=None))
@names_entry_point(VLLM_ENTRY)
def vllm_fused_recurrent_gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor | None = None,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    inplace_final_state: bool = True,
    cu_seqlens: Tensor | None = None,
    ssm_state_indices: Tensor | None = None,
    num_accepted_tokens: Tensor | None = None,
    retrieve_parent_token: Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    check_values: bool = True,
    state_v_first: bool = False,
) -> tuple[Tensor, Tensor]:
    """vLLM's ``fused_recurrent_gated_delta_rule`` as the op ``gdn_nki::vllm_fused_recurrent_gated_delta_rule``
    (the pool declared mutated).

    Dimensions, Args and Returns:
        As ``gdn_nki.torch.fused_recurrent.vllm_fused_recurrent_gated_delta_rule``: ``o`` and ``initial_state``
        itself, updated.

    Notes:
        On a device the requests' lengths (``cu_seqlens``), the index values and the inputs' values are trusted
        (``check_values``). A V-major pool (``state_v_first``, gdn-nki's keyword) is carried by the op.
    """
    reject_empty("q", q)  # before the [N, T, ...] layout, whose rules would name the kernel's shapes
    # vLLM's graph-padded tables: the first N rows, N from cu_seqlens, as its kernel reads them (graph_padding.py)
    ssm_state_indices, num_accepted_tokens = trimmed_to_requests(cu_seqlens, ssm_state_indices, num_accepted_tokens)
    carried = _decode_op_can_carry(
        (q, k, v, g, beta, initial_state), (cu_seqlens, ssm_state_indices, num_accepted_tokens), scale, initial_state
    )
    host = check_values is not True and q.device.type == "cpu"
    if (
        not carried
        or host
        or retrieve_parent_token is not None
        or inplace_final_state is not True
        or type(state_v_first) is not bool
    ):
        return fused_recurrent.vllm_fused_recurrent_gated_delta_rule(
            q, k, v, g, beta, scale, initial_state, inplace_final_state, cu_seqlens, ssm_state_indices,
            num_accepted_tokens, retrieve_parent_token, use_qk_l2norm_in_kernel, check_values=check_values,
            state_v_first=state_v_first,
        )  # fmt: skip
    fused_recurrent.reject_missing_pool(ssm_state_indices, initial_state)
    read = [detached(x) for x in (q, k, v, g, beta)]  # the pool's op has no autograd formula (forward_only.py)
    o = vllm_fused_recurrent_op(*read, initial_state, ssm_state_indices, cu_seqlens, num_accepted_tokens,
                                _scale(scale), bool(use_qk_l2norm_in_kernel), state_v_first)  # fmt: skip
    return attached(VLLM_ENTRY, o, (q, k, v, g, beta)), initial_state


@torch.library.custom_op("gdn_nki::fused_sigmoid_gating_delta_rule_update", mutates_args=("pool",))
def fused_sigmoid_gating_op(
    A_log: Tensor,
    a: Tensor,
    dt_bias: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    b: Tensor,
    pool: Tensor,
    initial_state_indices: Tensor,
    cu_seqlens: Tensor | None,
    softplus_beta: float,
    softplus_threshold: float,
    scale: float | None,
    use_qk_l2norm: bool,
    num_accepted_tokens: Tensor | None = None,
    state_v_first: bool = False,
) -> Tensor:
    """vLLM's / SGLang's fused-gating update on a pool [P, HV, K, V] fp32 ([P, HV, V, K] with ``state_v_first``)
    updated in place: o [B, T, HV, V]."""
    return device.fused_sigmoid_gating(**locals())


@fused_sigmoid_gating_op.register_kernel("cpu")
def _fused_sigmoid_gating_cpu(A_log, a, dt_bias, q, k, v, b, pool, initial_state_indices, cu_seqlens, softplus_beta,
                              softplus_threshold, scale, use_qk_l2norm, num_accepted_tokens=None,
                              state_v_first=False) -> Tensor:  # fmt: skip
    return fused_recurrent.fused_sigmoid_gating_delta_rule_update(
        A_log, a, dt_bias, softplus_beta, softplus_threshold, q, k, v, b, pool, initial_state_indices, scale,
        use_qk_l2norm, cu_seqlens, num_accepted_tokens=num_accepted_tokens, state_v_first=state_v_first,
    )  # fmt: skip


@fused_sigmoid_gating_op.register_fake
def _fused_sigmoid_gating_fake(A_log, a, dt_bias, q, k, v, b, pool, initial_state_indices, cu_seqlens, softplus_beta,
                               softplus_threshold, scale, use_qk_l2norm, num_accepted_tokens=None,
                               state_v_first=False) -> Tensor:  # fmt: skip
    rules.pool_decode(q, k, v, pool, initial_state_indices, cu_seqlens, num_accepted_tokens, scale, use_qk_l2norm,
                      {"a": a, "b": b, "A_log": A_log, "dt_bias": dt_bias}, name="initial_state_indices",
                      v_first=state_v_first)  # fmt: skip
    return _prefill_out(q, v)


@rejects_at_trace_time(lambda rejected, argument: rejected(argument("v")))
@names_entry_point(SIGMOID_GATING_ENTRY)
def fused_sigmoid_gating_delta_rule_update(
    A_log: Tensor,
    a: Tensor,
    dt_bias: Tensor,
    softplus_beta: float,
    softplus_threshold: float,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    b: Tensor,
    initial_state_source: Tensor,
    initial_state_indices: Tensor,
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: Tensor | None = None,
    check_values: bool = True,
    num_accepted_tokens: Tensor | None = None,
    state_v_first: bool = False,
) -> Tensor:
    """vLLM's / SGLang's ``fused_sigmoid_gating_delta_rule_update`` as the op
    ``gdn_nki::fused_sigmoid_gating_delta_rule_update`` (the pool declared mutated).

    Dimensions, Args and Returns:
        As ``gdn_nki.torch.fused_recurrent.fused_sigmoid_gating_delta_rule_update``: ``o``. With [N, T]
        ``initial_state_indices``, ``num_accepted_tokens`` [N] rolls a speculative step back as
        ``vllm_fused_recurrent_gated_delta_rule``'s does.
    """
    reject_empty("q", q)  # before the [N, T, ...] layout, whose rules would name the kernel's shapes
    tensors = (A_log, a, dt_bias, q, k, v, b, initial_state_source)
    host = check_values is not True and q.device.type == "cpu"
    if (
        host
        or not _decode_op_can_carry(
            tensors, (cu_seqlens, initial_state_indices, num_accepted_tokens), scale, initial_state_source
        )
        or not all(isinstance(x, numbers.Real) for x in (softplus_beta, softplus_threshold))
        or type(state_v_first) is not bool
    ):
        return fused_recurrent.fused_sigmoid_gating_delta_rule_update(
            A_log, a, dt_bias, softplus_beta, softplus_threshold, q, k, v, b, initial_state_source,
            initial_state_indices, scale, use_qk_l2norm_in_kernel, cu_seqlens, check_values=check_values,
            num_accepted_tokens=num_accepted_tokens, state_v_first=state_v_first,
        )  # fmt: skip
    fused_recurrent.check_softplus(softplus_beta, softplus_threshold)
    read = [detached(x) for x in tensors[:-1]]  # the pool's op has no autograd formula (forward_only.py)
    o = fused_sigmoid_gating_op(*read, initial_state_source, initial_state_indices, cu_seqlens, float(softplus_beta),
                                float(softplus_threshold), _scale(scale), bool(use_qk_l2norm_in_kernel),
                                num_accepted_tokens, state_v_first)  # fmt: skip
    return attached(SIGMOID_GATING_ENTRY, o, tensors[:-1])


def _decode_op_can_carry(tensors: tuple[Any, ...], indices: tuple[Any, ...], scale: Any, written: Any) -> bool:
    """As ``_op_can_carry``, for the decode drop-ins."""
    if not _one_device(tensors, indices) or on_graph([written]):
        return False
    return scale is None or (isinstance(scale, numbers.Real) and not isinstance(scale, bool))


def _one_device(tensors: tuple[Any, ...], indices: tuple[Any, ...]) -> bool:
    """Every tensor argument a torch tensor (or None), all on one device: a call mixing devices (a CPU call with
    one stray tensor, say) is the host path's to reject, naming the tensor."""
    given = [x for x in (*tensors, *indices) if x is not None]
    return all(is_torch_tensor(x) for x in given) and len({x.device.type for x in given}) <= 1


def _scale(scale: Any) -> float | None:
    return None if scale is None else float(scale)


# --- AWS's gdn_tkg ----------------------------------------------------------------------------------------------------


@torch.library.custom_op("gdn_nki::gdn_tkg", mutates_args=())
def gdn_tkg_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    b: Tensor,
    a: Tensor,
    A_log: Tensor,
    dt_bias: Tensor,
    z: Tensor,
    norm_weight: Tensor,
    state_in: Tensor,
) -> tuple[Tensor, Tensor]:
    """AWS's ``gdn_tkg`` (SDK 2.33, nkilib.experimental.gdn) on torch tensors, as the op ``gdn_nki::gdn_tkg``.

    Dimensions:
        BH: batch × value heads (row r: batch r // Hv, value head r % Hv). K, V: head dims. Hv: value heads.

    Args:
        q, k (Tensor): [BH, K], raw (the kernel L2-normalizes them), GQA-expanded; bfloat16 or float32.
        v (Tensor): [BH, V]. b, a (Tensor): [BH] logits of β and the raw gate. A_log, dt_bias (Tensor): [Hv].
        z (Tensor): [BH, V] the output gate. norm_weight (Tensor): [V]. state_in (Tensor): [BH, K, V] fp32, read.

    Returns:
        tuple: (out [BH, V] in q's dtype, state [BH, K, V] fp32, a new tensor).

    Notes:
        The rules are ``gdn_nki.gdn_tkg``'s (``gdn_ref.contract.validate_tkg``); the CPU also scans the values
        (``gdn_nki.tkg_simulate``), a device trusts them.
    """
    return device.gdn_tkg(**locals())


@gdn_tkg_op.register_kernel("cpu")
def _gdn_tkg_cpu(q, k, v, b, a, A_log, dt_bias, z, norm_weight, state_in) -> tuple[Tensor, Tensor]:
    return gdn_tkg_host(q, k, v, b, a, A_log, dt_bias, z, norm_weight, state_in)


def gdn_tkg_host(*tensors: Tensor) -> tuple[Tensor, Tensor]:
    """``gdn_tkg``'s CPU path: CPU tensors checked, viewed as numpy, run by ``gdn_nki.tkg_simulate`` (every rule,
    the values included)."""
    names = ("q", "k", "v", "b", "a", "A_log", "dt_bias", "z", "norm_weight", "state_in")
    for name, x in zip(names, tensors, strict=True):
        rules.check_tkg_tensor(name, x)
    # tkg_simulate's rules without its entry-point name: the traced path's rules (rules.tkg) raise gdn_tkg's
    out, state = tkg_simulate.__wrapped__(*(as_numpy(x.contiguous()) for x in tensors))
    return as_torch(out), as_torch(state)


forbid_backward(gdn_tkg_op, TKG_ENTRY)


@gdn_tkg_op.register_fake
def _gdn_tkg_fake(q, k, v, b, a, A_log, dt_bias, z, norm_weight, state_in) -> tuple[Tensor, Tensor]:
    rules.tkg(q, k, v, b, a, A_log, dt_bias, z, norm_weight, state_in)
    return q.new_empty((q.shape[0], v.shape[1])), q.new_empty(tuple(state_in.shape), dtype=torch.float32)


@rejects_at_trace_time(
    lambda rejected, argument: _output_and_state(rejected, argument, state="state_in", returned=None)
)
def gdn_tkg(q: Tensor, k: Tensor, v: Tensor, b: Tensor, a: Tensor, A_log: Tensor, dt_bias: Tensor, z: Tensor,
            norm_weight: Tensor, state_in: Tensor) -> tuple[Tensor, Tensor]:  # fmt: skip
    """AWS's ``gdn_tkg`` on torch tensors: the op ``gdn_nki::gdn_tkg`` (its docstring: dimensions, arguments,
    results), whose shape and dtype rejections a compiled graph raises as eager does (``traced_rejection``)."""
    return gdn_tkg_op(q, k, v, b, a, A_log, dt_bias, z, norm_weight, state_in)
