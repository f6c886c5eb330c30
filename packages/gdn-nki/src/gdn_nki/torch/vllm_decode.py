"""vLLM's newer decode calls on a V-major state pool [P, HV, V, K], as drop-ins:

- ``vllm_fused_sigmoid_gating_delta_rule_update``: vLLM's ``fused_sigmoid_gating_delta_rule_update``
  (``vllm/model_executor/layers/fla/ops/fused_sigmoid_gating.py``, vllm-project/vllm 2baf56c3). It shares SGLang's
  name but not its signature (``A_log, a, b, dt_bias, q, k, v, beta, threshold, scale, initial_state,
  inplace_final_state, cu_seqlens, ssm_state_indices, num_accepted_tokens, use_qk_l2norm_in_kernel, is_kda``) and
  returns ``(o, final_state)``; ``gdn_nki.torch.fused_sigmoid_gating_delta_rule_update`` called with one of vLLM's
  own keywords (``VLLM_SIGMOID_KEYWORDS``) is this call.
- ``fused_recurrent_gated_delta_rule_packed_decode``: vLLM's and SGLang's one-token decode of the packed
  projection (``mixed_qkv`` [B, 2·H·K + HV·V], ``a``, ``b`` [B, HV], ``out`` [B, 1, HV, V] written in place), one
  pool row per request (``ssm_state_indices`` [B]), returning ``(out, initial_state)``.

Both keep their pools V-major, always (the kernels index ``h0 + idx·stride + i_hv·V·K + o_v·K + o_k``; nothing in
a call says so), so both run ``gdn_nki::fused_sigmoid_gating_delta_rule_update`` — SGLang's op, the gates computed
in the kernel — with ``state_v_first=True``: the kernel reads and writes the caller's pool in place, no transposed
copy. A row of −1 (vLLM's ``PAD_SLOT_ID``) leaves its pool rows untouched and its output rows zero. Rejections
name vLLM's arguments (``initial_state``, ``ssm_state_indices``, ``beta``, ``threshold``), whichever of SGLang's
names the op's rules use.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
from collections.abc import Callable
from typing import Any

from gdn_ref.contract import ContractError, names_entry_point

from ..host.torch_io import import_torch, rejection
from . import ops
from .forward_only import attached, detached
from .fused_recurrent import MIN_SOFTPLUS_THRESHOLD
from .graph_padding import gates_of_tokens, trimmed_to_requests
from .traced_rejection import rejects_at_trace_time

torch = import_torch()
Tensor = torch.Tensor

VLLM_SIGMOID_ENTRY = "gdn_nki.torch.vllm_fused_sigmoid_gating_delta_rule_update"
PACKED_DECODE_ENTRY = "gdn_nki.torch.fused_recurrent_gated_delta_rule_packed_decode"
# vLLM's keywords of its ``fused_sigmoid_gating_delta_rule_update`` that SGLang's function of that name does not
# take: one of them makes a call under the shared name vLLM's.
VLLM_SIGMOID_KEYWORDS = ("initial_state", "inplace_final_state", "ssm_state_indices", "beta", "threshold", "is_kda")
# SGLang's keywords that vLLM's function does not take (gdn-nki's check_values and state_v_first excepted: SGLang's
# drop-in's own, refused beside vLLM's keywords too, as vLLM's pool is V-major whatever they say).
SGLANG_SIGMOID_KEYWORDS = ("softplus_beta", "softplus_threshold", "initial_state_source", "initial_state_indices",
                           "check_values", "state_v_first")  # fmt: skip
# SGLang's argument names, which the op's rules use, and vLLM's for the same arguments.
_VLLM_NAMES = {"initial_state_source": "initial_state", "initial_state_indices": "ssm_state_indices",
               "softplus_beta": "beta", "softplus_threshold": "threshold"}  # fmt: skip


def reject_sglang_keywords(vllm_keyword: str, kwargs: dict[str, Any]) -> None:
    """A call of the shared name with one of vLLM's keywords is vLLM's; SGLang's keywords beside it make it neither."""
    for name in SGLANG_SIGMOID_KEYWORDS:
        if name in kwargs:
            raise rejection(name, f"given with vLLM's {vllm_keyword}=", f"{vllm_keyword} makes the call vLLM's "
                            f"fused_sigmoid_gating_delta_rule_update (V-major pool, A_log, a, b, dt_bias, q, k, v "
                            f"order), which has no {name}", f"drop {name} or call SGLang's form with its own "
                            "keywords only", rule_id="keyword.mixed_forms")  # fmt: skip


def _in_vllms_names(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``'s rejections with SGLang's argument names (the op's rules) replaced by vLLM's."""

    def rename(text: str) -> str:
        for sglang, vllm in _VLLM_NAMES.items():
            text = text.replace(sglang, vllm)
        return text

    @functools.wraps(fn)
    def renamed(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ContractError as error:
            fields = ("rule_id", "argument", "value", "rule", "fix")
            violations = [
                dataclasses.replace(v, **{name: rename(getattr(v, name)) for name in fields}) for v in error.violations
            ]
            raise ContractError(violations, error.entry_point).with_traceback(error.__traceback__) from None

    return renamed


def _check_gate_options(beta: Any, threshold: Any) -> None:
    """vLLM's softplus options under its names: the kernel's gate is the exact softplus with beta 1."""
    if not isinstance(beta, numbers.Real) or isinstance(beta, bool) or float(beta) != 1.0:
        raise rejection("beta", f"= {beta!r}", "the kernel's gate is softplus with beta 1 (Qwen3-Next's; vLLM's "
                        "layer passes the default)", "pass beta=1.0")  # fmt: skip
    if not isinstance(threshold, numbers.Real) or isinstance(threshold, bool) or threshold < MIN_SOFTPLUS_THRESHOLD:
        raise rejection("threshold", f"= {threshold!r}", "the kernel computes the exact softplus, which a threshold "
                        f">= {MIN_SOFTPLUS_THRESHOLD} reproduces in fp32", "pass threshold=20.0 (the default)")  # fmt: skip


def _stand_in(rejected: Any, argument: Any) -> tuple[Any, Any]:
    """A rejected call's two results while tracing (``traced_rejection``): o shaped like v, the pool."""
    return rejected(argument("v")), argument("initial_state")


@rejects_at_trace_time(_stand_in)
@names_entry_point(VLLM_SIGMOID_ENTRY)
@_in_vllms_names
def vllm_fused_sigmoid_gating_delta_rule_update(
    A_log: Tensor,
    a: Tensor,
    b: Tensor,
    dt_bias: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: float = 1.0,
    threshold: float = 20.0,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    inplace_final_state: bool = True,
    cu_seqlens: Tensor | None = None,
    ssm_state_indices: Tensor | None = None,
    num_accepted_tokens: Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    is_kda: bool = False,
) -> tuple[Tensor, Tensor]:
    """vLLM's ``fused_sigmoid_gating_delta_rule_update``: the gates computed in the kernel, the V-major pool updated
    in place at the rows.

    Dimensions:
        B: batch (1 with ``cu_seqlens``). T: tokens. H, HV: key and value heads. K, V: head dims. N: requests.
        P: pool rows.

    Args:
        A_log, dt_bias (Tensor): [HV] the layer's gate parameters. a, b (Tensor): [B, T, HV] (or [B·T, HV]) the raw
            gate and β logits: g = −exp(A_log)·softplus(a + dt_bias), β = sigmoid(b); [B·T, HV] may be longer (a
            mixed batch's whole-step gates): its first B·T rows are read, as vLLM's kernel reads them.
        q, k (Tensor): [B, T, H, K]. v (Tensor): [B, T, HV, V].
        beta (float): softplus's beta: 1.0 only. threshold (float): softplus's threshold, >= 20.
        scale (float | None): None: K ** −0.5.
        initial_state (Tensor): the pool [P, HV, V, K] fp32, V-major (vLLM's layout), read and written in place.
        inplace_final_state (bool): True only (vLLM's per-token state tensor is not produced; rejected by name).
        cu_seqlens (Tensor | None): [N + 1], every request the same length T.
        ssm_state_indices (Tensor): [N] or [N, T] pool rows; −1 pads a request (nothing written, zero output).
            [N, T]: the state after token t goes to row [n, t]. Longer (vLLM's graph padding, to [B] / [B, T]):
            the first N rows are read, as with ``num_accepted_tokens`` (``graph_padding``).
        num_accepted_tokens (Tensor | None): [N] with [N, T] rows: request n starts from row [n, accepted − 1].
        use_qk_l2norm_in_kernel (bool): L2-normalize q and k first.
        is_kda (bool): False only (KDA's per-key gates are not this kernel's; rejected by name).

    Returns:
        tuple: (o [B, T, HV, V] in q's dtype, ``initial_state`` itself, updated).

    Notes:
        The op ``gdn_nki::fused_sigmoid_gating_delta_rule_update`` with ``state_v_first=True`` (the pool declared
        mutated; one node under ``torch.compile``). Bad input raises ``ContractError`` naming vLLM's argument;
        nothing is written. In grad mode o is on the graph and a backward raises ``ForwardOnlyError``.
    """
    if is_kda is not False:
        raise rejection("is_kda", f"= {is_kda!r}", "KDA's per-key gates (a [.., HV, K]) are not gdn-nki's kernel's",
                        "call the GDN form (is_kda=False)")  # fmt: skip
    if inplace_final_state is not True:
        raise rejection("inplace_final_state", f"= {inplace_final_state!r}", "gdn-nki updates the pool in place; "
                        "vLLM's per-token state tensor [T, HV, V, K] is not produced",
                        "pass inplace_final_state=True with ssm_state_indices")  # fmt: skip
    for name, value in (("initial_state", initial_state), ("ssm_state_indices", ssm_state_indices)):
        if value is None:
            raise rejection(name, "None", "vLLM's call reads and writes a pool at the requests' rows",
                            "pass the pool [P, HV, V, K] as initial_state and its rows as ssm_state_indices")  # fmt: skip
    _check_gate_options(beta, threshold)
    # vLLM's graph-padded tables: the first N rows, N from cu_seqlens, as its kernel reads them (graph_padding.py)
    ssm_state_indices, num_accepted_tokens = trimmed_to_requests(cu_seqlens, ssm_state_indices, num_accepted_tokens)
    a, b = gates_of_tokens(q, a, b)  # a mixed batch's whole-step gates: the spec tokens' first
    gates = {"A_log": A_log, "a": a, "b": b, "dt_bias": dt_bias, "q": q, "k": k, "v": v}
    o = _on_v_major_pool(VLLM_SIGMOID_ENTRY, gates, initial_state, ssm_state_indices, scale, use_qk_l2norm_in_kernel,
                         cu_seqlens, num_accepted_tokens, threshold)  # fmt: skip
    return o, initial_state


def _on_v_major_pool(entry: str, gates: dict[str, Tensor], pool: Tensor, rows: Tensor, scale: Any, l2norm: Any,
                     cu_seqlens: Tensor | None = None, accepted: Tensor | None = None,
                     threshold: float = MIN_SOFTPLUS_THRESHOLD) -> Tensor:  # fmt: skip
    """SGLang's fused-gating op on the V-major ``pool`` at ``rows``: o, on the graph under ``entry``'s name."""
    read = {name: detached(x) for name, x in gates.items()}  # attached below under entry (forward_only.py)
    o = ops.fused_sigmoid_gating_delta_rule_update(
        read["A_log"], read["a"], read["dt_bias"], 1.0, float(threshold), read["q"], read["k"], read["v"], read["b"],
        pool, rows, scale, l2norm, cu_seqlens, num_accepted_tokens=accepted, state_v_first=True,
    )  # fmt: skip
    return attached(entry, o, gates.values())


def _packed_shapes(mixed_qkv: Tensor, initial_state: Tensor) -> tuple[int, int, int, int]:
    """(H, HV, V, K) of a packed call: HV, V, K from the V-major pool, H from mixed_qkv's width 2·H·K + HV·V."""
    if not isinstance(initial_state, Tensor) or initial_state.dim() != 4:
        raise rejection("initial_state", f"of shape {tuple(getattr(initial_state, 'shape', ()))}", "the pool is "
                        "[P, HV, V, K] (V-major, vLLM's and SGLang's layout)", "pass the layer's SSM state pool")  # fmt: skip
    hv, dv, dk = (int(n) for n in initial_state.shape[1:])
    if not isinstance(mixed_qkv, Tensor) or mixed_qkv.dim() != 2:
        raise rejection("mixed_qkv", f"of shape {tuple(getattr(mixed_qkv, 'shape', ()))}", "the packed projection is "
                        "[B, 2·H·K + HV·V] (q, k, then v, one token per request)", "pass the conv's output, 2-D")  # fmt: skip
    qk = int(mixed_qkv.shape[1]) - hv * dv
    if qk <= 0 or qk % (2 * dk) or hv % (qk // (2 * dk)):
        raise rejection("mixed_qkv", f"of width {mixed_qkv.shape[1]}", f"the width is 2·H·K + HV·V with K = {dk}, "
                        f"HV = {hv}, V = {dv} (initial_state [P, HV, V, K]) and HV a multiple of H",
                        "pass the pool and the projection of one layer")  # fmt: skip
    return qk // (2 * dk), hv, dv, dk


def _packed_stand_in(rejected: Any, argument: Any) -> tuple[Any, Any]:
    return rejected(argument("out")), argument("initial_state")


@rejects_at_trace_time(_packed_stand_in)
@names_entry_point(PACKED_DECODE_ENTRY)
@_in_vllms_names
def fused_recurrent_gated_delta_rule_packed_decode(
    mixed_qkv: Tensor,
    a: Tensor,
    b: Tensor,
    A_log: Tensor,
    dt_bias: Tensor,
    scale: float,
    initial_state: Tensor,
    out: Tensor,
    ssm_state_indices: Tensor,
    use_qk_l2norm_in_kernel: bool = False,
) -> tuple[Tensor, Tensor]:
    """vLLM's and SGLang's ``fused_recurrent_gated_delta_rule_packed_decode``: one token per request from the
    packed projection, the gates computed in the kernel, the V-major pool updated in place.

    Dimensions:
        B: requests (one token each). H, HV: key and value heads. K, V: head dims. P: pool rows.

    Args:
        mixed_qkv (Tensor): [B, 2·H·K + HV·V]: q [H·K], k [H·K], then v [HV·V] per row.
        a, b (Tensor): [B, HV] the raw gate and β logits. A_log, dt_bias (Tensor): [HV].
        scale (float): multiplies q·state (vLLM's layer passes K ** −0.5).
        initial_state (Tensor): the pool [P, HV, V, K] fp32, V-major, read and written in place.
        out (Tensor): [B, 1, HV, V], written in place (any float dtype).
        ssm_state_indices (Tensor): [B] pool rows; −1 pads a request (its rows untouched, its out rows zero).
        use_qk_l2norm_in_kernel (bool): L2-normalize q and k first.

    Returns:
        tuple: (``out`` itself, ``initial_state`` itself), both written.

    Notes:
        q, k and v are views of ``mixed_qkv`` handed to the op ``gdn_nki::fused_sigmoid_gating_delta_rule_update``
        with ``state_v_first=True``; ``out`` receives its result. Every rule is checked before either buffer is
        written.
    """
    h, hv, dv, dk = _packed_shapes(mixed_qkv, initial_state)
    rows = int(mixed_qkv.shape[0])
    if not isinstance(ssm_state_indices, Tensor) or tuple(ssm_state_indices.shape) != (rows,):
        raise rejection("ssm_state_indices", f"of shape {tuple(getattr(ssm_state_indices, 'shape', ()))}",
                        f"the packed decode takes one pool row per request: [B] = [{rows}]",
                        "pass one row per request (-1 pads one)")  # fmt: skip
    if not isinstance(out, Tensor) or tuple(out.shape) != (rows, 1, hv, dv) or not out.is_floating_point():
        raise rejection("out", f"of shape {tuple(getattr(out, 'shape', ()))}, dtype {getattr(out, 'dtype', None)}",
                        f"out is [B, 1, HV, V] = {(rows, 1, hv, dv)}, a float tensor", "pass the output buffer "
                        "of the batch")  # fmt: skip
    if out.device != mixed_qkv.device:
        raise rejection("out", f"on {out.device}", f"out is on mixed_qkv's device ({mixed_qkv.device})",
                        "pass the output buffer on the batch's device")  # fmt: skip
    if scale is None:  # vLLM's signature wants a float; None keeps the kernels' default, K ** −0.5
        scale = dk**-0.5
    qk = h * dk
    q, k, v = (mixed_qkv[:, None, start : start + width].unflatten(-1, (heads, dim))
               for start, width, heads, dim in ((0, qk, h, dk), (qk, qk, h, dk), (2 * qk, hv * dv, hv, dv)))  # fmt: skip
    gates = {"A_log": A_log, "a": a, "b": b, "dt_bias": dt_bias, "q": q, "k": k, "v": v}
    out.copy_(_on_v_major_pool(PACKED_DECODE_ENTRY, gates, initial_state, ssm_state_indices, scale,
                               use_qk_l2norm_in_kernel))  # fmt: skip
    return out, initial_state
