"""Decode drop-ins on torch, same names, signatures and semantics as the originals, one ``gdn_step`` launch per
(N, T) bucket:

- ``fused_recurrent_gated_delta_rule``: FLA's (``fla/ops/gated_delta_rule/fused_recurrent.py``);
- ``vllm_fused_recurrent_gated_delta_rule``: vLLM's variant of it (``vllm/model_executor/layers/fla/ops/
  fused_recurrent.py``: ``inplace_final_state``, ``ssm_state_indices`` [N] or [N, T], ``num_accepted_tokens``),
  exported under its own name here because it shares FLA's;
- ``fused_sigmoid_gating_delta_rule_update``: vLLM's / SGLang's fused-gating update (``A_log, a, dt_bias,
  softplus_beta, softplus_threshold, q, k, v, b, initial_state_source, initial_state_indices, scale,
  use_qk_l2norm_in_kernel, cu_seqlens``), which returns ``o`` and updates the pool rows in place.

Layouts are the originals': seq-first [B, T, H, D], B = 1 with ``cu_seqlens``, GQA by ``HV % H == 0``, state
[.., HV, K, V] fp32. What cannot be honoured is rejected by name (a ``ContractError`` naming the argument, the
value, the rule and the fix): per-key or per-value decays (``gk``, ``gv``), head-wise β, Eagle trees
(``retrieve_parent_token``), ``inplace_final_state=False``, softplus with β ≠ 1 or a threshold below 20, pools
not fp32, and, for the vLLM forms, packed sequences of different lengths (one program per (N, T) bucket; FLA's
form groups them by length instead).

Where the originals differ from this kernel (README, "Decode"): a padding request (index -1) gets zero outputs
(vLLM leaves them unspecified), and q/k are normalized as x·rsqrt(Σx² + 1e-6) (the older
``fused_sigmoid_gating_delta_rule_update`` divides by sqrt(Σx²) + 1e-6: the same to fp32 rounding for any q, k
not near zero).
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gdn_ref.contract import ContractError, names_entry_point

from ..host.decode import check_decode_step, decode_step
from ..host.torch_io import (
    SUPPORTED_DTYPES,
    as_numpy,
    as_torch,
    check_tensor,
    import_torch,
    in_torch_terms,
    pool_buffer,
    reject_strided_pool,
    rejection,
)
from . import chunk

INDEX_DTYPES = ("int32", "int64")
# decode_step's argument names (its errors') -> the drop-ins' (FLA's and vLLM's); the pool and its rows per form.
_CALLER_NAMES = {
    "query": "q",
    "key": "k",
    "value": "v",
    "g_log": "g",
    "use_qk_l2norm": "use_qk_l2norm_in_kernel",
    "state_pool": "initial_state",
}
VLLM_NAMES = _CALLER_NAMES | {"state_indices": "ssm_state_indices"}
SIGMOID_NAMES = _CALLER_NAMES | {"state_pool": "initial_state_source", "state_indices": "initial_state_indices"}
# A softplus threshold at or above this gives softplus(x) = x exactly in fp32 where the threshold applies
# (log1p(exp(-20)) = 2e-9 is below half an ulp of 20): every threshold from here up is the exact softplus.
MIN_SOFTPLUS_THRESHOLD = 20.0


@names_entry_point("gdn_nki.torch.fused_recurrent_gated_delta_rule")
def fused_recurrent_gated_delta_rule(
    q: Any,
    k: Any,
    v: Any,
    g: Any = None,
    gk: Any = None,
    gv: Any = None,
    beta: Any = None,
    scale: float | None = None,
    initial_state: Any = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: Any = None,
    *,
    check_values: bool = True,
    state_v_first: bool = False,
    **kwargs: Any,
) -> tuple[Any, Any]:
    """FLA's ``fused_recurrent_gated_delta_rule`` on gdn-nki's decode kernel.

    Dimensions:
        B, T: batch and tokens (B = 1 with ``cu_seqlens``, N sequences). H, HV: key and value heads. K, V.

    Args:
        q, k: [B, T, H, K]; v: [B, T, HV, V] (float32 or bfloat16).
        g: [B, T, HV] log-decay (None: no decay). gk, gv: must be None (not supported).
        beta: [B, T, HV] (None: ones). scale: default K**-0.5.
        initial_state: [N, HV, K, V] (only read). output_final_state: return the final states.
        use_qk_l2norm_in_kernel: L2-normalize q and k in the kernel. cu_seqlens: [N + 1] packed boundaries.
        check_values: scan the inputs and initial states first (finite; gates in their domains), as
            ``gdn_nki.decode_step``'s; default on, pass False only when the caller guarantees its data.
        state_v_first: FLA's V-major states: ``initial_state`` and the final states are [N, HV, V, K], read and
            written so by the kernel (``decode_step``'s ``state_v_first``).
        kwargs: HF transformers' attention keywords, which a Qwen3-Next layer passes through to the
            ``torch_recurrent_gated_delta_rule`` this replaces (``use_cache``, …: ``chunk.HF_PASS_THROUGH``),
            accepted and not used; any other keyword is rejected, naming the closest valid one or, for a pool's
            rows (``state_indices``, ``initial_state_indices``), the form that takes a pool.

    Returns:
        tuple: ``o`` [B, T, HV, V] in q's dtype, and the final states [N, HV, K, V] fp32 ([N, HV, V, K] with
        ``state_v_first``; None unless asked).
    """
    torch = import_torch()
    reject_unknown_keywords(kwargs, _FLA_PARAMETERS)
    reject_per_key_decays(gk, gv)
    inputs = _token_tensors(q, k, v)
    gates = _gates(q, v, g, beta)
    spans = _spans(q, cu_seqlens, allow_mixed=True)
    hv, dk, dv = v.shape[2], q.shape[3], v.shape[3]
    v_first = bool(state_v_first)
    pool = np.zeros((len(spans), hv, dv, dk) if v_first else (len(spans), hv, dk, dv), np.float32)
    if initial_state is not None:
        check_tensor("initial_state", initial_state, ("float32",))
        if tuple(initial_state.shape) != pool.shape:
            layout = "with state_v_first=True, [N, HV, V, K]" if v_first else "[N, HV, K, V]"
            raise rejection("initial_state", f"shape {tuple(initial_state.shape)}",
                            f"initial_state must be {layout} = {pool.shape}", "pass one state per sequence"
                            + (" (V-major), or state_v_first=False for K-major states" if v_first else ""),
                            rule_id="state_layout.v_first" if v_first else None)  # fmt: skip
        pool[...] = as_numpy(initial_state)
    out = np.empty((*v.shape[:3], dv), dtype=inputs["query"].dtype)
    step = _Step(scale, use_qk_l2norm_in_kernel, check_values, _CALLER_NAMES, v_first=v_first)
    groups = list(_by_length(spans).values())
    _check_groups(inputs, gates, spans, groups, pool, step)  # all of them before any launch: all or nothing
    for seqs in groups:
        _launch(inputs, gates, spans, seqs, pool, np.array(seqs, np.int32), None, out, step)
    final = torch.from_numpy(pool) if output_final_state else None
    return as_torch(out), final


_FLA_PARAMETERS = tuple(p for p in inspect.signature(fused_recurrent_gated_delta_rule).parameters if p != "kwargs")


@names_entry_point("gdn_nki.torch.vllm_fused_recurrent_gated_delta_rule")
def vllm_fused_recurrent_gated_delta_rule(
    q: Any,
    k: Any,
    v: Any,
    g: Any,
    beta: Any = None,
    scale: float | None = None,
    initial_state: Any = None,
    inplace_final_state: bool = True,
    cu_seqlens: Any = None,
    ssm_state_indices: Any = None,
    num_accepted_tokens: Any = None,
    retrieve_parent_token: Any = None,
    use_qk_l2norm_in_kernel: bool = False,
    *,
    check_values: bool = True,
    state_v_first: bool = False,
) -> tuple[Any, Any]:
    """vLLM's ``fused_recurrent_gated_delta_rule`` (continuous batching, speculative decoding) on ``gdn_step``.

    Args:
        q, k, v, g, beta, scale, use_qk_l2norm_in_kernel: as FLA's.
        initial_state: the state pool [P, HV, K, V] fp32, updated IN PLACE: contiguous, or rows at their own stride,
            each dense (vLLM's pages: the kernel addresses the view in place, ``common.pool_rows``).
        inplace_final_state: must be True (the pool form).
        cu_seqlens: [N + 1] with B = 1; every sequence the same length T (one program per (N, T) bucket).
        ssm_state_indices: [N] (T = 1: row read and written) or [N, T] (the state after token t to row [n, t],
            read from [n, num_accepted_tokens[n] - 1], or [n, 0]); -1 marks a padding request.
        num_accepted_tokens: optional [N]. Both tables may be longer (vLLM's graph padding to [B] / [B, T]): the
            torch drop-in reads their first N rows, N from cu_seqlens, as vLLM's kernel does (``graph_padding``).
        retrieve_parent_token: must be None (Eagle trees are not supported).
        check_values: scan the inputs and the pool rows read first, as ``gdn_nki.decode_step``'s (default on).
        state_v_first: gdn-nki's keyword (vLLM's function has none: its pool is K-major,
            vllm/model_executor/layers/fla/ops/fused_recurrent.py): the pool is V-major [P, HV, V, K].

    Returns:
        tuple: ``o`` [B, T, HV, V] in q's dtype and ``initial_state`` itself, updated.
    """
    if retrieve_parent_token is not None:
        raise rejection("retrieve_parent_token", "given", "tree-structured drafts (Eagle) are not supported",
                        "verify a linear draft, or pass retrieve_parent_token=None")  # fmt: skip
    if inplace_final_state is not True:
        raise rejection("inplace_final_state", f"= {inplace_final_state!r}",
                        "only the in-place pool form is supported (the per-token state tensor is not)",
                        "pass inplace_final_state=True with ssm_state_indices [N, T] to keep every token's state")  # fmt: skip
    reject_missing_pool(ssm_state_indices, initial_state)
    spans = _spans(q, cu_seqlens, allow_mixed=False)
    tokens = spans[0][1] - spans[0][0] if spans else q.shape[1]  # no request: decode_step names the empty batch
    indices = _indices("ssm_state_indices", ssm_state_indices)
    check_rows_per_token(indices.shape, tokens)
    accepted = None if num_accepted_tokens is None else _indices("num_accepted_tokens", num_accepted_tokens)
    reject_strided_pool("initial_state", initial_state)  # vLLM's pages
    pool = pool_buffer("initial_state", initial_state)  # the pool itself, never a staged copy
    step = _Step(scale, use_qk_l2norm_in_kernel, check_values, VLLM_NAMES, v_first=state_v_first)
    out = _run_pool(q, k, v, _gates(q, v, g, beta), spans, pool, indices, accepted, step)
    return out, initial_state


@names_entry_point("gdn_nki.torch.fused_sigmoid_gating_delta_rule_update")
def fused_sigmoid_gating_delta_rule_update(
    A_log: Any,
    a: Any,
    dt_bias: Any,
    softplus_beta: float,
    softplus_threshold: float,
    q: Any,
    k: Any,
    v: Any,
    b: Any,
    initial_state_source: Any,
    initial_state_indices: Any,
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: Any = None,
    *,
    num_accepted_tokens: Any = None,
    check_values: bool = True,
    state_v_first: bool = False,
) -> Any:
    """vLLM's / SGLang's ``fused_sigmoid_gating_delta_rule_update``: fused gating, state pool by index.

    Args:
        A_log, dt_bias: [HV]. a, b: [B·T, HV] or [B, T, HV] raw gate inputs.
        softplus_beta: must be 1.0. softplus_threshold: at least 20 (the exact softplus in fp32).
        q, k: [B, T, H, K]; v: [B, T, HV, V]. cu_seqlens: [N + 1] (B = 1), equal lengths.
        initial_state_source: the pool [P, HV, K, V] fp32, updated IN PLACE at ``initial_state_indices`` [N]
            (the state after each request's last token) or [N, T] (the state after token t to row [n, t], as
            ``vllm_fused_recurrent_gated_delta_rule``'s ``ssm_state_indices``); -1 marks a padding request.
        num_accepted_tokens: [N] int32 with [N, T] indices: request n resumes from row [n, a − 1] (speculative
            rollback, as ``vllm_fused_recurrent_gated_delta_rule``'s); None: from row [n, 0].
        scale, use_qk_l2norm_in_kernel: as FLA's.
        check_values: scan the inputs and the pool rows read first, as ``gdn_nki.decode_step``'s (default on).
        state_v_first: the pool is V-major [P, HV, V, K], read and written so by the kernel. SGLang's own kernel
            indexes its pool V-major with no flag (python/sglang/srt/layers/attention/fla/
            fused_sigmoid_gating_recurrent.py, sgl-project/sglang 06a27754: ``h0_source + idx·HV·K·V + i_hv·K·V +
            o_v·K + o_k``), and so does its chunk prefill (fla/chunk_delta_h.py, the same commit); SGLang's call
            cannot tell a layout, so K-major stays the default here (FLA's, and gdn-nki's serving example's) and
            a server sharing SGLang's pool passes ``state_v_first=True``.

    Returns:
        ``o`` [B, T, HV, V] in q's dtype.
    """
    check_softplus(softplus_beta, softplus_threshold)
    spans = _spans(q, cu_seqlens, allow_mixed=False)
    shape = (*v.shape[:2], v.shape[2])
    raw = {name: _per_token(name, x, shape) for name, x in (("a", a), ("b", b))}
    heads = {name: _fp32(name, x) for name, x in (("A_log", A_log), ("dt_bias", dt_bias))}
    indices = _indices("initial_state_indices", initial_state_indices)
    accepted = None if num_accepted_tokens is None else _indices("num_accepted_tokens", num_accepted_tokens)
    reject_strided_pool("initial_state_source", initial_state_source)  # vLLM's pages
    pool = pool_buffer("initial_state_source", initial_state_source)  # the pool itself, never a staged copy
    layouts = {name: tuple(x.shape) for name, x in (("a", a), ("b", b)) if x.dim() == 2}  # [B·T, HV]
    step = _Step(scale, use_qk_l2norm_in_kernel, check_values, SIGMOID_NAMES, layouts, state_v_first)
    out = _run_pool(q, k, v, {**raw, **heads}, spans, pool, indices, accepted, step)
    return out


def reject_per_key_decays(gk: Any, gv: Any) -> None:
    """FLA's per-key and per-value decays are not the kernel's (one g per token and value head)."""
    for name, value in (("gk", gk), ("gv", gv)):
        if value is None:
            continue
        if name == "gk" and getattr(value, "ndim", None) == 3:  # [B, T, HV]: a β passed fifth, HF's order
            raise rejection("gk", f"a tensor of shape {tuple(value.shape)}", "per-key decays (gk) are not supported "
                            "by gdn-nki's kernel; a [B, T, HV] tensor fifth by position is gk in FLA's order (q, k, "
                            "v, g, gk, gv, beta, ...), not beta as in HF's torch_recurrent_gated_delta_rule",
                            "pass beta=... (and every argument after g) by keyword")  # fmt: skip
        raise rejection(name, "given", f"per-{name[1]} decays ({name}) are not supported by gdn-nki's kernel",
                        f"pass {name}=None and a per-head g")  # fmt: skip


# A pool's rows under the names the prefill drop-in and SGLang take: FLA's decode reads one state per sequence.
_POOL_KEYWORD_FIX = (
    "FLA's fused_recurrent_gated_delta_rule takes no pool (initial_state is one state per sequence): for a pool "
    "updated in place, pass the pool as initial_state and its rows as ssm_state_indices= (vLLM's form, "
    "gdn_nki.torch.vllm_fused_recurrent_gated_delta_rule), or call "
    "gdn_nki.torch.fused_sigmoid_gating_delta_rule_update(..., initial_state_source=pool, initial_state_indices=rows)"
)
POOL_KEYWORD_HINTS = {"state_indices": _POOL_KEYWORD_FIX, "initial_state_indices": _POOL_KEYWORD_FIX}


def reject_unknown_keywords(kwargs: dict[str, Any], parameters: tuple[str, ...]) -> None:
    """FLA's decode drop-in's ``**kwargs``: HF's pass-through keywords only (``chunk.reject_unknown_keywords``),
    a pool's rows pointed to the pool forms."""
    chunk.reject_unknown_keywords(kwargs, "fused_recurrent_gated_delta_rule", parameters,
                                  "vLLM's pool keywords (ssm_state_indices, inplace_final_state, num_accepted_tokens)",
                                  POOL_KEYWORD_HINTS)  # fmt: skip


def reject_missing_pool(ssm_state_indices: Any, initial_state: Any) -> None:
    """vLLM's in-place form needs its pool and the pool's rows."""
    if ssm_state_indices is None or initial_state is None:
        raise rejection("ssm_state_indices", "None", "the in-place form addresses the pool initial_state by "
                        "ssm_state_indices", "pass the pool as initial_state and its rows as ssm_state_indices")  # fmt: skip


def check_softplus(softplus_beta: float, softplus_threshold: float) -> None:
    """The kernel's gate is the exact softplus with beta 1."""
    if float(softplus_beta) != 1.0:
        raise rejection("softplus_beta", f"= {softplus_beta!r}", "the kernel's gate is softplus with beta 1 "
                        "(Qwen3-Next's)", "pass softplus_beta=1.0")  # fmt: skip
    if float(softplus_threshold) < MIN_SOFTPLUS_THRESHOLD:
        raise rejection("softplus_threshold", f"= {softplus_threshold!r}",
                        f"the kernel computes the exact softplus, which a threshold >= {MIN_SOFTPLUS_THRESHOLD} "
                        "reproduces in fp32", "pass softplus_threshold=20.0 (the default)")  # fmt: skip


# --- shared conversions --------------------------------------------------------------------------------------------


def _token_tensors(q: Any, k: Any, v: Any) -> dict[str, np.ndarray]:
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, x, SUPPORTED_DTYPES)
    return {"query": as_numpy(q), "key": as_numpy(k), "value": as_numpy(v)}


def _fp32(name: str, x: Any) -> np.ndarray:
    """A gate tensor as fp32 (widening bf16 is exact)."""
    check_tensor(name, x, SUPPORTED_DTYPES)
    return np.asarray(as_numpy(x), dtype=np.float32)


def _per_token(name: str, x: Any, shape: tuple[int, ...]) -> np.ndarray:
    """A per-token, per-value-head tensor as fp32 [B, T, HV] from [B, T, HV] or the token-flattened [B·T, HV] the
    originals also take."""
    check_per_token(name, x, shape)
    return _fp32(name, x).reshape(shape)


def check_per_token(name: str, x: Any, shape: tuple[int, ...], any_device: bool = False) -> None:
    """``_per_token``'s rules, which read only the dtype and the shape (the custom ops check them at trace time).
    The shape is matched exactly: a time-major [T, B, HV] holds as many elements, and reshaping it would pair each
    token with another token's gate."""
    check_tensor(name, x, SUPPORTED_DTYPES, any_device=any_device)
    forms = (tuple(shape), (shape[0] * shape[1], shape[2]))
    if tuple(x.shape) not in forms:
        raise rejection(name, f"shape {tuple(x.shape)}", f"{name} must be [B, T, HV] = {forms[0]} or [B·T, HV] = "
                        f"{forms[1]}: one value per token and value head, tokens in q's order",
                        f"pass {name} laid out as q's tokens (a time-major [T, B, HV] tensor: {name}.transpose(0, 1))")  # fmt: skip


def _gates(q: Any, v: Any, g: Any, beta: Any) -> dict[str, np.ndarray]:
    check_gates(v, g, beta)
    shape = (*v.shape[:2], v.shape[2])
    log_decay = np.zeros(shape, np.float32) if g is None else _per_token("g", g, shape)
    strength = np.ones(shape, np.float32) if beta is None else _per_token("beta", beta, shape)
    return {"g_log": log_decay, "beta": strength}


def check_gates(v: Any, g: Any, beta: Any, any_device: bool = False) -> None:
    """The rules of ``g`` and ``beta`` that read only dtypes and shapes, in ``_gates``'s order."""
    shape = (*v.shape[:2], v.shape[2])
    if g is not None:
        check_per_token("g", g, shape, any_device)
    if beta is not None and beta.ndim == v.ndim:
        raise rejection("beta", f"shape {tuple(beta.shape)}", "head-wise beta ([B, T, HV, V]) is not supported",
                        "pass one beta per token and value head, [B, T, HV]")  # fmt: skip
    if beta is not None:
        check_per_token("beta", beta, shape, any_device)


def _indices(name: str, x: Any) -> np.ndarray:
    """An index tensor as int32 (values outside int32 are rejected here, not wrapped)."""
    check_tensor(name, x, INDEX_DTYPES)
    array = as_numpy(x)
    if array.size and (array.min() < np.iinfo(np.int32).min or array.max() > np.iinfo(np.int32).max):
        raise rejection(name, f"values up to {int(array.max())}", "indices must fit in int32",
                        "pass pool rows below 2**31")  # fmt: skip
    return np.array(array, dtype=np.int32, order="C")  # a copy; ascontiguousarray would make a 0-d tensor 1-D


def _spans(q: Any, cu_seqlens: Any, allow_mixed: bool) -> list[tuple[int, int, int]]:
    """(first token, end token, batch row) of every sequence: B rows of T tokens, or B = 1 cut by cu_seqlens."""
    batch, length = q.shape[0], q.shape[1]
    if cu_seqlens is None:
        return [(0, length, n) for n in range(batch)]
    check_packed_batch(batch)
    cu = [int(c) for c in _indices("cu_seqlens", cu_seqlens)]
    if len(cu) < 2 or cu[0] != 0 or cu[-1] != length or any(b <= a for a, b in itertools.pairwise(cu)):
        raise rejection("cu_seqlens", f"{cu}", f"cu_seqlens must rise strictly from 0 to T={length}",
                        "give the packed boundaries of exactly the tokens passed")  # fmt: skip
    lengths = {b - a for a, b in itertools.pairwise(cu)}
    if not allow_mixed and len(lengths) > 1:
        raise rejection("cu_seqlens", f"sequence lengths {sorted(lengths)}",
                        "every request of one step has the same number of new tokens (one compiled program per "
                        "(N, T) bucket)", "split the batch into calls of equal lengths")  # fmt: skip
    return [(a, b, 0) for a, b in itertools.pairwise(cu)]


def check_packed_batch(batch: int) -> None:
    """With ``cu_seqlens`` the sequences are packed in one row: B = 1."""
    if batch != 1:
        raise rejection("cu_seqlens", f"with batch B={batch}", "with cu_seqlens the sequences are packed in one "
                        "row, so B must be 1", "flatten the batch into [1, T_total, ...]")  # fmt: skip


def check_rows_per_token(shape: tuple[int, ...], tokens: int) -> None:
    """``ssm_state_indices`` is [N, T] when a request brings T > 1 tokens (one row per token's state)."""
    if len(shape) == 1 and tokens > 1:
        raise rejection("ssm_state_indices", f"shape {shape} with T={tokens}",
                        "with T > 1 tokens per request the indices are [N, T], one row per token's state",
                        "pass ssm_state_indices of shape [N, T]")  # fmt: skip


def _by_length(spans: list[tuple[int, int, int]]) -> dict[int, list[int]]:
    groups: dict[int, list[int]] = {}
    for i, (start, end, _) in enumerate(spans):
        groups.setdefault(end - start, []).append(i)
    return groups


def _gather(x: np.ndarray, spans: list[tuple[int, int, int]], seqs: list[int]) -> np.ndarray:
    """The tokens of sequences ``seqs`` of a seq-first [B, T, ...] tensor as [len(seqs), length, ...] (no sequence:
    the empty [0, T, ...] of a batch of none, which decode_step refuses by its rules)."""
    if not seqs:
        return x[:0]
    return np.stack([x[spans[i][2], spans[i][0] : spans[i][1]] for i in seqs])


@dataclass(frozen=True)
class _Step:
    """What every ``decode_step`` of one drop-in call shares: the options, and how its errors read to the caller.

    Attributes:
        scale, l2norm, check_values: ``decode_step``'s ``scale``, ``use_qk_l2norm`` and ``check_values``.
        names: decode_step's argument names -> the drop-in's.
        layouts: the caller's shape of a per-token tensor passed other than seq-first (the flattened [B·T, HV]),
            so that an element's index is given in it.
        v_first: the pool is V-major.
    """

    scale: Any
    l2norm: Any
    check_values: bool
    names: dict[str, str]
    layouts: dict[str, tuple[int, ...]] = field(default_factory=dict)
    v_first: Any = False  # the pool is V-major [P, HV, V, K]: decode_step's ``state_v_first``, which checks it


class _Group:
    """The sequences ``seqs`` (all of one length) of a drop-in call as one ``decode_step``'s arguments, and its
    rejections restated in the caller's names, element indices and sequence numbers (``_Step``)."""

    def __init__(self, inputs, gates, spans, seqs: list[int], step: _Step) -> None:
        self.tensors = {**inputs, **gates}
        self.per_token = {name: _gather(x, spans, seqs) for name, x in self.tensors.items() if x.ndim > 1}
        self.heads = {name: x for name, x in gates.items() if x.ndim == 1}
        self.spans, self.seqs, self.step = spans, seqs, step

    def arguments(self) -> tuple[tuple[np.ndarray, ...], dict[str, Any]]:
        """``decode_step``'s q, k, v, and its gate and option keywords."""
        gates = {name: x for name, x in self.per_token.items() if name not in ("query", "key", "value")}
        options = {"scale": self.step.scale, "use_qk_l2norm": bool(self.step.l2norm)}
        qkv = tuple(self.per_token[name] for name in ("query", "key", "value"))
        return qkv, {**gates, **self.heads, **options, "check_values": self.step.check_values,
                     "state_v_first": self.step.v_first}  # fmt: skip

    def caller_index(self, name: str, at: list[int]) -> list[int]:
        if name not in self.per_token or len(at) != self.per_token[name].ndim:
            return at  # the pool's rows are the caller's; heads' tensors are passed as they are
        request, token, *rest = at
        start, _, row = self.spans[self.seqs[request]]
        seq_first = self.tensors[name].shape
        flat = np.ravel_multi_index((row, start + token, *rest), seq_first)
        return [int(i) for i in np.unravel_index(flat, self.step.layouts.get(name, seq_first))]

    def restate(self, error: ContractError) -> ContractError:
        """``error`` in the caller's terms; a request of this group renumbered as the caller's sequence."""
        error = in_torch_terms(error, self.step.names, self.caller_index)
        return ContractError([self._renumber(v) for v in error.violations], error.entry_point)

    def _renumber(self, v: Any) -> Any:
        if v.sequence is None or list(self.seqs) == list(range(len(self.seqs))):
            return v
        value = _SEQUENCE.sub(lambda m: f"(sequence {self.seqs[int(m.group(1))]})", v.value)
        return dataclasses.replace(v, value=value, sequence=self.seqs[v.sequence])


_SEQUENCE = re.compile(r"\(sequence (\d+)\)")


def _check_groups(inputs, gates, spans, groups: list[list[int]], pool: np.ndarray, step: _Step) -> None:
    """Every rule of every length group's ``decode_step``, before any launches: a group's bad values and another's
    are refused in one ``ContractError`` naming every caller's sequence that holds one. A rule of the whole call
    (shapes, dtypes, options: the same for every group) is raised from the first group that breaks it."""
    violations = []
    for seqs in groups:
        group = _Group(inputs, gates, spans, seqs, step)
        (query, key, value), keywords = group.arguments()
        try:
            check_decode_step(query, key, value, pool, np.array(seqs, np.int32), None, **keywords)
        except ContractError as error:
            restated = group.restate(error)
            if any(v.sequence is None for v in restated.violations):
                raise restated from None
            violations += restated.violations
    if violations:
        raise ContractError(sorted(violations, key=lambda v: v.sequence))


def _launch(inputs, gates, spans, seqs, pool, indices, accepted, out, step: _Step) -> None:
    """One ``decode_step`` for the sequences ``seqs`` (all of one length), outputs scattered into ``out``; its
    rejection restated in the caller's names and indices (``_Group``)."""
    group = _Group(inputs, gates, spans, seqs, step)
    (query, key, value), keywords = group.arguments()
    try:
        result, _ = decode_step(query, key, value, pool, indices, accepted, **keywords)
    except ContractError as error:
        raise group.restate(error) from None
    for j, i in enumerate(seqs):
        start, end, row = spans[i]
        out[row, start:end] = result[j]


def _run_pool(q, k, v, gates, spans, pool, indices, accepted, step: _Step) -> Any:
    inputs = _token_tensors(q, k, v)
    out = np.empty((*v.shape[:3], v.shape[3]), dtype=inputs["query"].dtype)
    _launch(inputs, gates, spans, list(range(len(spans))), pool, indices, accepted, out, step)
    return as_torch(out)
