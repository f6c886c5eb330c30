"""Decode adapters: call a decode kernel of another convention through the decode family.

The family always calls ``decode_step``'s numpy signature (``gdn_spec.decode``). An adapter turns that call into
the kernel's own and the results back:

| adapter | the kernel is | pool addressed by | default profile |
|---|---|---|---|
| ``fla-decode`` | FLA's ``fused_recurrent_gated_delta_rule(q, k, v, g=, beta=, scale=, initial_state=, output_final_state=True)``, torch, seq-first | the adapter (gathers the live rows, scatters the final states into a new pool) | math |
| ``hf-decode`` | ``fla-decode:scale=internal``: HF's ``torch_recurrent_gated_delta_rule`` as a decode step | the adapter | math |
| ``vllm-decode`` | vLLM's ``fused_recurrent_gated_delta_rule(q, k, v, g, beta, scale, initial_state, inplace_final_state=True, cu_seqlens, ssm_state_indices, num_accepted_tokens, use_qk_l2norm_in_kernel)`` | the kernel (the pool is ``initial_state``, updated in place) | math |

``fla-decode`` and ``hf-decode`` take the seq-first options of ``fla-torch`` (``scale``, ``gqa``, ``state``;
``gdn_spec.adapters.seqfirst.Conventions``): the same glue carries the call. Their kernels never see a pool, so
the adapter declares what it does itself — no per-token states, no ``num_accepted_tokens``, no padding, no fused
gating, no in-kernel l2norm, no validation, a new pool returned — and those tests are skipped, never passed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..adapters import parse
from ..adapters.handoff import Handoff
from ..adapters.seqfirst import Conventions, kernel_names, wrap_seq_first
from ..core import Implementation, ImplementationError
from .capabilities import DecodeCapabilities

POOL_BY_ADAPTER = {
    "per_token_states": False,
    "num_accepted_tokens": False,
    "padding": False,
    "gating": ("precomputed",),
    "qk_l2norm": False,
    "validates_arguments": False,
    "state_in_place": False,
}

# What vLLM's fused_recurrent_gated_delta_rule defines (vllm/model_executor/layers/fla/ops/fused_recurrent.py):
# precomputed g only; [N] indices only with T = 1 (with T > 1 its state after token t goes to entry n + t of a
# 1-D index tensor, another request's); no meaning for an index of -1 (the kernel reads and writes row -1's
# address: serving code filters padding out before the call); no argument checks.
VLLM_BY_ADAPTER = {
    "gating": ("precomputed",),
    "final_state_only": False,
    "padding": False,
    "validates_arguments": False,
}


@dataclass(frozen=True)
class DecodeAdapter:
    doc: str
    preset: tuple[tuple[str, str], ...] = ()
    pool_native: bool = False


DECODE_ADAPTERS: dict[str, DecodeAdapter] = {
    "fla-decode": DecodeAdapter("FLA's fused_recurrent_gated_delta_rule signature, torch, seq-first"),
    "hf-decode": DecodeAdapter(
        "fla-decode:scale=internal, HF's torch_recurrent_gated_delta_rule", (("scale", "internal"),)
    ),
    "vllm-decode": DecodeAdapter(
        "vLLM's fused_recurrent_gated_delta_rule (ssm_state_indices, inplace_final_state, num_accepted_tokens), torch",
        pool_native=True,
    ),
}
DEFAULT_PROFILE = "math"


def is_decode_adapter(spec: str | None) -> bool:
    return bool(spec) and spec.partition(":")[0] in DECODE_ADAPTERS


def adapt_decode(impl: Implementation, spec: str, device: str | None = None) -> Implementation:
    """``impl`` (its ``capabilities`` a ``DecodeCapabilities``) called through the decode adapter ``spec``.

    Raises:
        ImplementationError: unknown adapter or option, or torch missing / the device unusable.
    """
    from ..adapters.torch_io import TorchIO

    name, options = parse(spec, {n: a.preset for n, a in DECODE_ADAPTERS.items()})
    kind = DECODE_ADAPTERS[name]
    io = TorchIO.create(device)
    caps: DecodeCapabilities = impl.capabilities
    if kind.pool_native:
        if options:
            raise ImplementationError(f"adapter {name!r} takes no options, got {sorted(options)}")
        fn = wrap_vllm(impl.fn, io)
        caps = replace(caps, **VLLM_BY_ADAPTER, set_by_adapter=tuple(VLLM_BY_ADAPTER))
        label = f"{name} adapter, {io.describe()}"
        names = {"state_pool": "initial_state", "state_indices": "ssm_state_indices", "g_log": "g"}
    else:
        conventions = Conventions.from_options(options)
        if conventions.takes_cu_seqlens:
            raise ImplementationError(f"adapter {name!r}: varlen=yes has no meaning for a decode step")
        fn = wrap_pool(wrap_seq_first(impl.fn, conventions, io))
        caps = replace(caps, **POOL_BY_ADAPTER, fixed_scale=conventions.scale == "internal",
                       set_by_adapter=(*POOL_BY_ADAPTER, "fixed_scale"))  # fmt: skip
        label = f"{name} adapter ({conventions.describe()}), {io.describe()}"
        names = {**kernel_names(impl.fn), "state_pool": "initial_state"}
    return replace(impl, fn=fn, capabilities=caps, via=label, default_profile=DEFAULT_PROFILE, argument_names=names)


def wrap_pool(prefill: Callable[..., Any]) -> Callable[..., Any]:
    """``decode_step``'s signature around a function with gdn_cte's head-major numpy signature (a seq-first kernel
    behind ``wrap_seq_first``): the live requests' rows gathered as the initial states, one call of T tokens,
    the final states scattered into a NEW pool (the caller's is only read)."""

    def decode_step(query: np.ndarray, key: np.ndarray, value: np.ndarray, state_pool: np.ndarray,
                    state_indices: np.ndarray, num_accepted_tokens: np.ndarray | None = None, *,
                    g_log: np.ndarray | None = None, beta: np.ndarray | None = None, scale: float | None = None,
                    use_qk_l2norm: bool = False, **fused: Any) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        if any(x is not None for x in fused.values()) or g_log is None:
            raise ValueError("g_log: this adapter passes precomputed gates only (its kernel has no fused gating)")
        if use_qk_l2norm:
            raise ValueError("use_qk_l2norm: this adapter does not pass it on (the suite normalizes q and k)")
        rows = np.asarray(state_indices)
        if rows.ndim != 1 or num_accepted_tokens is not None:
            raise ValueError("state_indices: the kernel keeps only the final state; pass [N] indices")
        live = np.flatnonzero(rows >= 0)
        if live.size != rows.size:
            raise ValueError("state_indices: padding (-1) is not passed on by this adapter")
        head_major = {name: np.ascontiguousarray(np.swapaxes(x, 1, 2))
                      for name, x in (("query", query), ("key", key), ("value", value), ("g_log", g_log),
                                      ("beta", beta))}  # fmt: skip
        scale = float(query.shape[-1] ** -0.5 if scale is None else scale)
        out, final = prefill(**head_major, scale=scale, recurrent_state=np.array(state_pool[rows]))
        pool = np.array(state_pool, copy=True)
        pool[rows] = final
        return np.ascontiguousarray(np.swapaxes(out, 1, 2)), pool

    return decode_step


def wrap_vllm(fn: Callable[..., Any], io: Any) -> Callable[..., Any]:
    """``decode_step``'s signature around vLLM's ``fused_recurrent_gated_delta_rule``: the N × T tokens packed as
    one sequence of N·T with ``cu_seqlens`` (every request T tokens), the pool passed as ``initial_state`` with
    ``inplace_final_state=True`` (a write reaches the caller's pool on any device: ``Handoff``), indices as int32
    tensors."""

    def decode_step(query: np.ndarray, key: np.ndarray, value: np.ndarray, state_pool: np.ndarray,
                    state_indices: np.ndarray, num_accepted_tokens: np.ndarray | None = None, *,
                    g_log: np.ndarray | None = None, beta: np.ndarray | None = None, scale: float | None = None,
                    use_qk_l2norm: bool = False, **fused: Any) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        if any(x is not None for x in fused.values()) or g_log is None:
            raise ValueError("g_log: vLLM's fused_recurrent_gated_delta_rule takes precomputed gates only")
        n, t = query.shape[:2]
        packed = lambda x: x.reshape(1, n * t, *x.shape[2:])  # noqa: E731
        with Handoff(io) as handoff:
            tokens = [handoff.to_kernel(x, packed(x)) for x in (query, key, value, g_log, beta)]
            kwargs = {
                "scale": float(query.shape[-1] ** -0.5 if scale is None else scale),
                "initial_state": handoff.to_kernel(state_pool),
                "inplace_final_state": True,
                "cu_seqlens": handoff.index(np.arange(0, n * t + 1, t)),
                "ssm_state_indices": handoff.to_kernel(state_indices),
                "use_qk_l2norm_in_kernel": bool(use_qk_l2norm),
            }
            if num_accepted_tokens is not None:
                kwargs["num_accepted_tokens"] = handoff.to_kernel(num_accepted_tokens)
            out, _ = fn(*tokens, **kwargs)
        return io.from_kernel(out).reshape(n, t, *value.shape[2:]), state_pool

    return decode_step


__all__ = ["DECODE_ADAPTERS", "adapt_decode", "is_decode_adapter", "wrap_pool", "wrap_vllm"]
