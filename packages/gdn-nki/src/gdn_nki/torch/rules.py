"""The trace-time rules of the torch drop-ins' ops: every rule that reads only types, shapes, dtypes, strides and
non-tensor values, raising the very ``ContractError`` the CPU path raises for it (the ops' fake implementations and
their device path run these; the CPU path runs its own, values included).

Where a rule lives in gdn-ref's contract and is written for numpy arrays, it is run on stand-ins: zero-stride numpy
arrays with the shape and dtype of the array the host path would build (no memory, no data read). The layouts the
host path builds — head-major packed rows for the prefill, [N, T, ...] requests for decode — are reproduced from
shapes alone.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import ml_dtypes
import numpy as np

from gdn_ref.bucketed import bucket_violations
from gdn_ref.constants import CHUNK_BY_ALGORITHM
from gdn_ref.contract import STEP, Arguments, ContractError, Violation, validate_step, validate_tkg
from gdn_ref.conv_rules import (
    BUCKET_QUANTUM,
    CONV_PREFILL,
    CONV_STEP,
    IO_DTYPES,
    conv_prefill_violations,
    conv_step_violations,
    conv_varlen_violations,
)
from gdn_ref.masks import default_mask_pack
from gdn_ref.packed import cu_seqlens_violations, state_indices_violations, tensor_violations

from ..common.state_layout import kmajor_shape
from ..conv.step import step_sbuf_violations
from ..host.buckets import _pool_violations, configured_buckets, folded_norm_violations
from ..host.pool_layout import layout_violations
from ..host.pool_span import span_violations
from ..host.torch_io import (
    SUPPORTED_DTYPES,
    check_pool_dtype,
    check_states,
    check_tensor,
    in_torch_terms,
    reject_broadcast_state,
    reject_strided_pool,
    reject_unwritable_state,
    rejection,
)
from . import chunk, fused_recurrent

# Bucket rules that read no value of the layout tensors (the rest — lengths, rows, clashes — are values: checked on
# the CPU, trusted on a device, run on demand by ``check_values``).
BUCKET_SHAPE_RULES = frozenset(
    {
        "bucket.cu_seqlens",
        "bucket.form",
        "bucket.tokens",
        "bucket.holds_sequences",
        "bucket.checkpoint_every",
        "bucket.checkpoint_indices",
        "bucket.state_indices",
        "bucket.read_indices",
    }
)


def stand_in(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """A writable numpy array of ``shape`` and the numpy form of the torch ``dtype`` whose elements all share one
    zero: what a contract rule reading shape and dtype needs, without memory or data."""
    name = str(dtype).removeprefix("torch.")
    base = np.zeros(1, ml_dtypes.bfloat16 if name == "bfloat16" else np.dtype(name))
    # int(): a symbolic size (torch.compile's dynamic shapes) is specialized, as the kernel's compile is per shape
    sizes = tuple(int(size) for size in shape)
    return np.lib.stride_tricks.as_strided(base, sizes, (0,) * len(sizes), writeable=True)


def like(x: Any) -> np.ndarray | None:
    """``stand_in`` of a tensor (None kept)."""
    return None if x is None else stand_in(tuple(x.shape), x.dtype)


def worst_case_tokens(tokens: int, seqs: int, chunk_tokens: int) -> int:
    """The most padded tokens ``seqs`` sequences of ``tokens`` tokens in all can take, each padded to its chunk
    multiple: every sequence adds at most ``chunk_tokens - 1`` padding tokens (and a sequence no more than
    ``chunk_tokens - 1`` per token it holds)."""
    return chunk_tokens * min(tokens, (tokens + seqs * (chunk_tokens - 1)) // chunk_tokens)


def bucket_for(q: Any, cu_seqlens: Any, algorithm: Any) -> tuple[int, int] | None:
    """The smallest configured bucket holding any batch of these shapes (``worst_case_tokens`` of q's B·T tokens,
    N = B or len(cu_seqlens) − 1 sequences), or None: no bucket configured, none holds the worst case (the CPU then
    chooses from the lengths, as before; a device runs the worst case's own size, a program of its own), or shapes
    the rules will reject."""
    configured = configured_buckets()
    if not configured or algorithm not in CHUNK_BY_ALGORITHM or q.dim() != 4:
        return None
    if cu_seqlens is not None and cu_seqlens.dim() != 1:
        return None
    chunk_tokens = CHUNK_BY_ALGORITHM[algorithm]
    tokens = q.shape[0] * q.shape[1]
    seqs = q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    need = worst_case_tokens(tokens, seqs, chunk_tokens)
    for bucket_tokens, slots in configured:
        if bucket_tokens >= need and slots >= seqs and bucket_tokens % chunk_tokens == 0:
            return bucket_tokens, slots
    return None


def folded_norm(q: Any, v: Any, z: Any, weight: Any, eps: Any, activation: Any) -> None:
    """The rules of the gated RMSNorm ``chunk_gated_delta_rule`` folds into its output stage (``z`` given, or an
    option of it set), on stand-ins of the host path's arrays: z as its packed [1, B·T, Hv, V] row, q and v as their
    head-major packed rows (after ``prefill``, which holds their own rules)."""
    if z is None and weight is None and eps == 1e-6 and activation == "silu":
        return
    for name, x in (("z", z), ("norm_weight", weight)):
        if x is not None:
            check_tensor(name, x, any_device=True)
    batch, seq_len = q.shape[:2]
    tokens = batch * seq_len
    query = stand_in((1, q.shape[2], tokens, q.shape[3]), q.dtype)
    value = stand_in((1, v.shape[2], tokens, v.shape[3]), v.dtype)
    gate = like(z)
    if z is not None and z.dim() == 4 and tuple(z.shape[:2]) == (batch, seq_len):
        gate = stand_in((1, tokens, *z.shape[2:]), z.dtype)
    found = folded_norm_violations(query, value, gate, like(weight), eps, activation)
    if found:
        raise ContractError(found)


def prefill(
    q: Any,
    k: Any,
    v: Any,
    g: Any,
    beta: Any,
    initial_state: Any,
    state_indices: Any,
    A_log: Any,
    dt_bias: Any,
    cu_seqlens: Any,
    use_gate: bool,
    scale: float | None,
    algorithm: str,
    group_size: int,
    bucket: list[int] | None,
    checkpoint_every: int | None = None,
    checkpoint_indices: Any = None,
    read_indices: Any = None,
    v_first: bool = False,
) -> int:
    """``chunk_gated_delta_rule``'s trace-time rules, in the host path's order (its layout, its states, the fused
    gate's parameters, the kernel's contract on the head-major rows, the bucket's layout); ``v_first``: the states
    are V-major (the layout's shape rule, then the rules on their K-major shape).

    Returns:
        int: N, the sequences (B, or len(cu_seqlens) − 1).
    """
    chunk._check_layout({"q": q, "k": k, "v": v, "g": g, "beta": beta}, cu_seqlens, any_device=True)
    batch, seq_len, key_heads, dk = q.shape
    value_heads, dv = v.shape[2], v.shape[3]
    tokens = batch * seq_len
    n_seqs, cu_found, cu = batch, [], None
    if cu_seqlens is not None:
        cu = stand_in(tuple(cu_seqlens.shape), cu_seqlens.dtype)
        if batch != 1:
            kept = ("cu_seqlens.form", "cu_seqlens.batch")
            raise ContractError([f for f in cu_seqlens_violations(cu, batch, 0) if f.rule_id in kept])
        cu_found = [f for f in cu_seqlens_violations(cu, 1, tokens) if f.rule_id == "cu_seqlens.form"]
        n_seqs = cu_seqlens.shape[0] - 1 if cu_seqlens.dim() else 0
    pooled = state_indices is not None
    check_states(initial_state, state_indices, n_seqs, (value_heads, dk, dv), any_device=True, v_first=v_first)
    if use_gate:
        chunk.check_gate_parameters(A_log, dt_bias, value_heads, any_device=True)
    state = None if initial_state is None else stand_in(kmajor_shape(tuple(initial_state.shape), v_first), "float32")
    call = Arguments(
        stand_in((1, key_heads, tokens, dk), q.dtype), stand_in((1, key_heads, tokens, dk), k.dtype),
        stand_in((1, value_heads, tokens, dv), v.dtype), stand_in((1, value_heads, tokens), "float32"),
        stand_in((1, value_heads, tokens), "float32"), dk**-0.5 if scale is None else scale, algorithm,
        default_mask_pack(None, algorithm), group_size, state,
    )  # fmt: skip
    found = tensor_violations(call, host=False, padded=False, values=False)
    serving = bucket is not None or checkpoint_every is not None or read_indices is not None or configured_buckets()
    if not serving:
        found += cu_found + state_indices_violations(like(state_indices))
    elif not found and algorithm in CHUNK_BY_ALGORITHM:
        found = _bucket_shape_violations(call, cu, tokens, n_seqs, state, state_indices, bucket, checkpoint_every,
                                         checkpoint_indices, read_indices, pooled)  # fmt: skip
    if found:
        raise in_torch_terms(ContractError(found), chunk._CALLER_NAMES,
                             lambda name, at: chunk._seq_first_index(name, at, seq_len))  # fmt: skip
    return n_seqs


def _bucket_shape_violations(call: Arguments, cu: Any, tokens: int, n_seqs: int, state: Any, state_indices: Any,
                             bucket: Any, checkpoint_every: Any, checkpoint_indices: Any, read_indices: Any,
                             pooled: bool) -> list[Any]:  # fmt: skip
    """The bucket rules that read no value, on stand-ins of the layout tensors (every row −1, every sequence but
    the last empty: values no shape rule reads)."""
    if cu is None:
        cu = np.arange(n_seqs + 1) * (tokens // max(n_seqs, 1))
    else:
        cu = np.zeros(cu.shape, np.int64)
        if cu.ndim == 1 and cu.size:
            cu[-1] = tokens
    rows = np.full(n_seqs, -1) if state_indices is None else np.full(tuple(state_indices.shape), -1)
    checkpoints = None if checkpoint_indices is None else np.full(tuple(checkpoint_indices.shape), -1)
    reads = None if read_indices is None else np.full(tuple(read_indices.shape), -1)
    pool_rows = state.shape[0] if pooled else n_seqs
    chunk_tokens = CHUNK_BY_ALGORITHM[call.algorithm]
    found = bucket_violations(cu, tokens, chunk_tokens, None if bucket is None else tuple(bucket), pool_rows, rows,
                              checkpoint_every, checkpoints, reads)  # fmt: skip
    found = [f for f in found if f.rule_id in BUCKET_SHAPE_RULES]
    return found or (_pool_violations(state, call) if pooled else [])


def fla_decode(q: Any, k: Any, v: Any, g: Any, beta: Any, initial_state: Any, cu_seqlens: Any) -> tuple[int, int]:
    """FLA's ``fused_recurrent_gated_delta_rule``'s trace-time rules, in the host path's order.

    Returns:
        tuple: (N sequences, T tokens each; 0 when ``cu_seqlens`` cannot share the tokens equally: the CPU groups
        them by length, a device path refuses them).
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, x, SUPPORTED_DTYPES, any_device=True)
    fused_recurrent.check_gates(v, g, beta, any_device=True)
    n_seqs, tokens = _requests(q, cu_seqlens)
    want = (n_seqs, v.shape[2], q.shape[3], v.shape[3])
    if initial_state is not None:
        check_tensor("initial_state", initial_state, ("float32",), any_device=True)
        if tuple(initial_state.shape) != want:
            raise rejection("initial_state", f"shape {tuple(initial_state.shape)}",
                            f"initial_state must be [N, HV, K, V] = {want}", "pass one state per sequence")  # fmt: skip
    if tokens:
        gates = {"g_log": stand_in((n_seqs, tokens, v.shape[2]), "float32"), "beta": None}
        gates["beta"] = gates["g_log"]
        rows = stand_in((n_seqs,), "int32")
        _step_rules(q, k, v, stand_in(want, "float32"), rows, None, gates, n_seqs, tokens, None, False)
    return n_seqs, tokens


def pool_decode(
    q: Any,
    k: Any,
    v: Any,
    pool: Any,
    indices: Any,
    cu_seqlens: Any,
    accepted: Any,
    scale: float | None,
    use_qk_l2norm: bool,
    gates: dict[str, Any],
    name: str = "ssm_state_indices",
    v_first: bool = False,
) -> tuple[int, int]:
    """The pool drop-ins' trace-time rules (vLLM's variant: gates ``g``, ``beta``; the fused-gating update: ``a``,
    ``b``, ``A_log``, ``dt_bias`` and ``name`` = "initial_state_indices"), in the host paths' order; ``v_first``:
    the pool is V-major (``decode_step``'s layout rule, then the rules on its K-major shape).

    Returns:
        tuple: (N requests, T tokens each).
    """
    batch, length = q.shape[0], q.shape[1]
    n_seqs, tokens = _requests(q, cu_seqlens)
    if cu_seqlens is not None and not tokens:
        raise rejection("cu_seqlens", f"{n_seqs} requests sharing {length} tokens",
                        "every request of one step has the same number of new tokens (one compiled program per "
                        "(N, T) bucket)", "split the batch into calls of equal lengths")  # fmt: skip
    shape = (batch, length, v.shape[2])
    fused = "a" in gates
    pool_name = "initial_state_source" if fused else "initial_state"
    if fused:
        for gate in ("a", "b"):
            fused_recurrent.check_per_token(gate, gates[gate], shape, any_device=True)
        for gate in ("A_log", "dt_bias"):
            check_tensor(gate, gates[gate], SUPPORTED_DTYPES, any_device=True)
    check_tensor(name, indices, fused_recurrent.INDEX_DTYPES, any_device=True)
    if not fused:
        fused_recurrent.check_rows_per_token(tuple(indices.shape), tokens)
        if accepted is not None:
            check_tensor("num_accepted_tokens", accepted, fused_recurrent.INDEX_DTYPES, any_device=True)
    check_pool_dtype(pool_name, pool, any_device=True)
    reject_unwritable_state(pool_name, pool)
    reject_broadcast_state(pool_name, pool)
    reject_strided_pool(pool_name, pool)
    reject_long_span(pool_name, pool, STEP)
    if not fused:
        fused_recurrent.check_gates(v, gates["g"], gates["beta"], any_device=True)
    for arg, x in (("q", q), ("k", k), ("v", v)):
        check_tensor(arg, x, SUPPORTED_DTYPES, any_device=True)
    per_token = (n_seqs, tokens, v.shape[2])
    if fused:
        step_gates = {"a": stand_in(per_token, "float32"), "b": stand_in(per_token, "float32"),
                      "A_log": stand_in(tuple(gates["A_log"].shape), "float32"),
                      "dt_bias": stand_in(tuple(gates["dt_bias"].shape), "float32")}  # fmt: skip
    else:
        step_gates = {"g_log": stand_in(per_token, "float32"), "beta": stand_in(per_token, "float32")}
    rows = stand_in(tuple(indices.shape), "int32")
    counts = None if accepted is None else stand_in(tuple(accepted.shape), "int32")
    try:
        found = layout_violations(pool, v_first, int(k.shape[-1]), int(v.shape[-1]), "state_pool", STEP)
        if found:
            raise ContractError(found)
        pool_rows = stand_in(kmajor_shape(tuple(pool.shape), v_first), pool.dtype)
        _step_rules(q, k, v, pool_rows, rows, counts, step_gates, n_seqs, tokens, scale, use_qk_l2norm)
    except ContractError as error:  # in the caller's names, as the host path restates them
        names = fused_recurrent.SIGMOID_NAMES if fused else fused_recurrent.VLLM_NAMES
        raise in_torch_terms(error, names) from None
    return n_seqs, tokens


def _requests(q: Any, cu_seqlens: Any) -> tuple[int, int]:
    """(N, T): B rows of T tokens, or B = 1 cut by ``cu_seqlens`` into N requests sharing its tokens (T = 0 when
    they cannot share them equally)."""
    batch, length = q.shape[0], q.shape[1]
    if cu_seqlens is None:
        return batch, length
    fused_recurrent.check_packed_batch(batch)
    check_tensor("cu_seqlens", cu_seqlens, fused_recurrent.INDEX_DTYPES, any_device=True)
    n_seqs = cu_seqlens.shape[0] - 1 if cu_seqlens.dim() == 1 else 0
    return n_seqs, (length // n_seqs if n_seqs > 0 and length % n_seqs == 0 else 0)


def _step_rules(q: Any, k: Any, v: Any, pool: Any, rows: Any, counts: Any, gates: dict[str, Any], n_seqs: int,
                tokens: int, scale: float | None, use_qk_l2norm: bool) -> None:  # fmt: skip
    """``gdn_nki.decode_step``'s trace-time rules on the [N, T, ...] requests the host path gathers."""
    tensors = dict(
        query=stand_in((n_seqs, tokens, *q.shape[2:]), q.dtype), key=stand_in((n_seqs, tokens, *k.shape[2:]), k.dtype),
        value=stand_in((n_seqs, tokens, *v.shape[2:]), v.dtype), state_pool=pool, state_indices=rows,
        num_accepted_tokens=counts, **gates,
    )  # fmt: skip
    if scale is None:
        scale = float(q.shape[-1]) ** -0.5
    found = validate_step(tensors, scale, bool(use_qk_l2norm), host=False)
    if found:
        raise ContractError(found)


def check_tkg_tensor(name: str, x: Any, any_device: bool = False) -> None:
    """A ``gdn_tkg`` argument is a torch tensor of a supported dtype (index-free: every argument is float)."""
    if x is None or not hasattr(x, "dtype"):
        raise rejection(name, f"of type {type(x).__name__}", f"{name} must be a torch tensor", "pass a tensor")
    check_tensor(name, x, SUPPORTED_DTYPES, any_device=any_device)


def tkg(*tensors: Any) -> None:
    """``gdn_tkg``'s trace-time rules (``gdn_ref.contract.validate_tkg`` with ``host=False``)."""
    names = ("q", "k", "v", "b", "a", "A_log", "dt_bias", "z", "norm_weight", "state_in")
    for name, x in zip(names, tensors, strict=True):
        check_tkg_tensor(name, x, any_device=True)
    found = validate_tkg(*(like(x) for x in tensors), host=False)
    if found:
        raise ContractError(found)


def reject_long_span(name: str, pool: Any, api: str) -> None:
    """A row-strided pool whose row offsets would overflow the kernels' int32 (``host.pool_span``)."""
    spanned = [] if pool.is_contiguous() else span_violations(pool.shape[0], pool.stride(0), name, api)
    if spanned:
        raise ContractError(spanned)


def conv_step(x: Any, conv_state: Any, weight: Any, bias: Any, rows: Any, activation: str | None,
              accepted: Any = None) -> None:  # fmt: skip
    """``gdn_nki::causal_conv1d_update``'s trace-time rules: ``conv_decode_step``'s shape and dtype rules on
    stand-ins of the op's operands (x [N, T, C], rows [N] or [N, T] int32, accepted None or [N]; the row and
    accepted-count values are trusted); the pool's rows dense, at their own stride (``reject_strided_pool``)."""
    if conv_state.dim() == 3:
        reject_strided_pool("conv_state", conv_state)
        reject_long_span("conv_state", conv_state, CONV_STEP)
    found = conv_step_violations(like(x), like(conv_state), like(weight), like(bias), like(rows), like(accepted),
                                 activation)  # fmt: skip
    found = found or step_sbuf_violations(like(x), like(conv_state), like(weight), like(bias), like(rows))
    if found:
        raise ContractError(found)


def conv_varlen_step(x: Any, conv_state: Any, weight: Any, bias: Any, query_start_loc: Any, rows: Any,
                     accepted: Any, max_query_len: int, activation: str | None) -> None:  # fmt: skip
    """``gdn_nki::causal_conv1d_update_varlen``'s trace-time rules: the varlen form's shape rules
    (``conv_varlen_violations``, the bounds' values trusted), then ``conv_step``'s on a stand-in of the padded x
    [N, max_query_len, C]."""
    found = conv_varlen_violations(like(x), like(conv_state), like(weight), like(query_start_loc), like(rows),
                                   like(accepted), max_query_len)  # fmt: skip
    if found:
        raise ContractError(found)
    padded = stand_in((rows.shape[0], max_query_len, x.shape[1]), x.dtype)
    conv_step(padded, conv_state, weight, bias, rows, activation, accepted)


def conv_prefill(x: Any, conv_states: Any, weight: Any, bias: Any, cu_seqlens: Any, rows: Any, read_rows: Any,
                 activation: str | None, checkpoint_every: int = 0, checkpoint_indices: Any = None,
                 bucket: Any = None) -> None:  # fmt: skip
    """``gdn_nki::causal_conv1d_fn``'s trace-time rules, in ``conv_prefill_bucket``'s order: x [tokens, C], the
    bucket layout's shape rules, then the launch's rules on stand-ins of the padded bucket (``bucket``'s tokens,
    else its smallest: the tokens rounded up to 128), one slot per sequence, with the checkpoint options."""
    if x.dim() != 2 or str(x.dtype).removeprefix("torch.") not in IO_DTYPES:
        found = [Violation("conv.x", "x", f"shape {tuple(x.shape)} dtype {str(x.dtype).removeprefix('torch.')}",
                           "x must be [tokens, C] float32 or bfloat16", "pass the packed q|k|v projections as "
                           "[tokens, C]", CONV_PREFILL)]  # fmt: skip
        raise ContractError(found)
    tokens, channels = int(x.shape[0]), int(x.shape[1])
    seqs = max(1, int(cu_seqlens.shape[0]) - 1) if cu_seqlens.dim() == 1 else 1
    if conv_states.dim() == 3:
        reject_strided_pool("conv_states", conv_states)
        reject_long_span("conv_states", conv_states, CONV_PREFILL)
    pool_rows = int(conv_states.shape[0]) if conv_states.dim() == 3 else 0
    bounds = np.zeros(tuple(cu_seqlens.shape), np.int64)
    if bounds.ndim == 1 and bounds.size:
        bounds[-1] = tokens
    layout = bucket_violations(bounds, tokens, CHUNK_BY_ALGORITHM["schur"], None, pool_rows,
                               np.full(tuple(rows.shape), -1), None, None, np.full(tuple(read_rows.shape), -1))  # fmt: skip
    found = [replace(v, api=CONV_PREFILL) for v in layout if v.rule_id in BUCKET_SHAPE_RULES]
    if found:
        raise ContractError(found)
    padded = max(BUCKET_QUANTUM, -(-tokens // BUCKET_QUANTUM) * BUCKET_QUANTUM) if bucket is None else int(bucket[0])
    found = conv_prefill_violations(stand_in((padded, channels), x.dtype), like(conv_states), like(weight), like(bias),
                                    stand_in((seqs + 1,), "int32"), stand_in((seqs,), "int32"), activation,
                                    checkpoint_every or 0, like(checkpoint_indices), stand_in((seqs,), "int32"))  # fmt: skip
    if found:
        raise ContractError(found)
