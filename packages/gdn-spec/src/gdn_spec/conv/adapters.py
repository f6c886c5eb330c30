"""Conv kernels of other conventions as conv-family kernels (``checks.py``'s signature).

- ``hf_update(fn)``: Hugging Face's ``causal_conv1d_update`` / ``torch_causal_conv1d_update`` (hidden_states
  [B, C, T], conv_state [B, C, L] updated in place, weight [C, W], bias, activation): the named rows of the pool are
  gathered into a conv_state batch, the function runs once on the live requests, and their states are written
  back; −1 requests are left out (their outputs zeros). HF keeps one state per request, so [N, T] rows are not
  offered (``per_token_rows`` False), and it checks nothing (the math profile: ``rejections`` False).
- ``hf_conv_fn(fn)``: HF's prefill conv ``causal_conv1d_fn`` through its layer's cache glue (a prefill-family
  kernel: ``prefill.py``).
- ``vllm_update(fn)``: vLLM's ``causal_conv1d_update`` (x [N, C, T], the pool [P, C, L] updated in place at
  ``conv_state_indices`` [N], −1: padding): the pool crosses as a tensor and comes back only when the call returns,
  so a rejected call leaves it as it was; [N] rows, with ``num_accepted_tokens`` vLLM's in-row speculative form
  (``in_row``), with ``query_start_loc`` its varlen form (``varlen``: x [tokens, C] passed as it is, vLLM's packed
  layout), rejections by ``ContractError`` (the api profile).
- ``reference()``: the fp64 oracle as a kernel (in-place pool, the oracle's rejections by ``gdn_ref.conv_rules``),
  the family's own yardstick and the base of its power tests.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

from gdn_ref.contract import ContractError
from gdn_ref.conv import causal_conv1d_decode_pool, causal_conv1d_prefill_pool, causal_conv1d_update_varlen
from gdn_ref.conv_rules import conv_index_violations, conv_step_violations, conv_varlen_violations

from ..adapters.torch_io import TorchIO
from .checks import CAPABILITIES_ATTR, ConvCapabilities
from .prefill import PREFILL_CAPABILITIES_ATTR


def hf_update(fn: Callable[..., Any], device: str | None = None) -> Callable[..., tuple[np.ndarray, np.ndarray]]:
    """HF's decode conv update through pool glue (module docstring)."""
    io = TorchIO.create(device)

    def kernel(x: np.ndarray, conv_pool: np.ndarray, weight: np.ndarray, bias: np.ndarray | None,
               state_indices: np.ndarray, num_accepted_tokens: np.ndarray | None = None, *,
               activation: str | None = "silu") -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        rows = np.asarray(state_indices)
        if rows.ndim != 1 or num_accepted_tokens is not None:
            raise ValueError("HF's update keeps one state per request: [N] rows only")
        out = np.zeros(np.shape(x), np.asarray(x).dtype)
        live = np.flatnonzero(rows >= 0)
        if live.size:
            states = io.to_kernel(np.ascontiguousarray(conv_pool[rows[live]]))
            hidden = io.to_kernel(np.ascontiguousarray(np.swapaxes(np.asarray(x)[live], 1, 2)))
            w = io.to_kernel(np.ascontiguousarray(weight))
            b = None if bias is None else io.to_kernel(np.ascontiguousarray(bias))
            result = fn(hidden, states, w, b, activation=activation)
            out[live] = np.swapaxes(io.from_kernel(result), 1, 2)
            conv_pool[rows[live]] = io.from_kernel(states)
        return out, conv_pool

    setattr(kernel, CAPABILITIES_ATTR, {"name": f"HF {getattr(fn, '__name__', 'conv update')} (pool glue)",
                                        "per_token_rows": False, "rejections": False})  # fmt: skip
    return kernel


def vllm_update(fn: Callable[..., Any], device: str | None = None) -> Callable[..., tuple[np.ndarray, np.ndarray]]:
    """vLLM's pool-native decode conv (module docstring)."""
    io = TorchIO.create(device)

    def kernel(x: np.ndarray, conv_pool: np.ndarray, weight: np.ndarray, bias: np.ndarray | None,
               state_indices: np.ndarray, num_accepted_tokens: np.ndarray | None = None, *,
               activation: str | None = "silu", query_start_loc: np.ndarray | None = None,
               max_query_len: int = -1) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        if np.ndim(state_indices) != 1:
            raise ValueError("vLLM's update takes [N] rows here")
        pool = io.to_kernel(np.ascontiguousarray(conv_pool))
        packed = query_start_loc is not None  # vLLM's varlen x [tokens, C] is the family's layout already
        hidden = io.to_kernel(np.ascontiguousarray(np.asarray(x) if packed else np.swapaxes(np.asarray(x), 1, 2)))
        varlen = {} if not packed else dict(
            query_start_loc=io.to_kernel(np.ascontiguousarray(np.asarray(query_start_loc).astype(np.int32))),
            max_query_len=max_query_len)  # fmt: skip
        b = None if bias is None else io.to_kernel(np.ascontiguousarray(bias))
        rows = io.to_kernel(np.ascontiguousarray(np.asarray(state_indices).astype(np.int32)))
        accepted = (None if num_accepted_tokens is None
                    else io.to_kernel(np.ascontiguousarray(np.asarray(num_accepted_tokens).astype(np.int32))))  # fmt: skip
        result = fn(hidden, pool, io.to_kernel(np.ascontiguousarray(weight)), b, activation, rows,
                    num_accepted_tokens=accepted, **varlen)  # fmt: skip
        conv_pool[...] = io.from_kernel(pool)
        out = io.from_kernel(result)
        return (out if packed else np.swapaxes(out, 1, 2)), conv_pool

    setattr(kernel, CAPABILITIES_ATTR, {"name": f"vLLM-form {getattr(fn, '__module__', '')}."
                                                f"{getattr(fn, '__name__', 'causal_conv1d_update')}",
                                        "per_token_rows": False, "in_row": True, "varlen": True,
                                        "rejections": True})  # fmt: skip
    return kernel


def reference() -> Callable[..., tuple[np.ndarray, np.ndarray]]:
    """The fp64 oracle as an in-place conv kernel that rejects what ``gdn_ref.conv_rules`` rejects."""

    def kernel(x: np.ndarray, conv_pool: np.ndarray, weight: np.ndarray, bias: np.ndarray | None,
               state_indices: np.ndarray, num_accepted_tokens: np.ndarray | None = None, *,
               activation: str | None = "silu", query_start_loc: np.ndarray | None = None,
               max_query_len: int = -1) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        if query_start_loc is not None:
            return _reference_varlen(x, conv_pool, weight, bias, state_indices, num_accepted_tokens, activation,
                                     query_start_loc, max_query_len)  # fmt: skip
        found = conv_step_violations(x, conv_pool, weight, bias, state_indices, num_accepted_tokens, activation)
        found = found or conv_index_violations(state_indices, num_accepted_tokens, conv_pool.shape[0], x.shape[1])
        if found:
            raise ContractError(found)
        out, after = causal_conv1d_decode_pool(x, weight, bias, conv_pool, state_indices, num_accepted_tokens,
                                               activation)  # fmt: skip
        conv_pool[...] = after.astype(conv_pool.dtype)
        return out.astype(np.asarray(x).dtype), conv_pool

    setattr(kernel, CAPABILITIES_ATTR, {"name": "gdn-ref conv oracle", "per_token_rows": True, "in_row": True,
                                        "varlen": True, "rejections": True})  # fmt: skip
    return kernel


def _reference_varlen(x: np.ndarray, conv_pool: np.ndarray, weight: np.ndarray, bias: np.ndarray | None,
                      rows: np.ndarray, accepted: np.ndarray | None, activation: str | None,
                      query_start_loc: np.ndarray, max_query_len: int) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The oracle's varlen form, with ``gdn_ref.conv_rules``' varlen and index rules."""
    found = conv_varlen_violations(x, conv_pool, weight, query_start_loc, rows, accepted, max_query_len, values=True)
    found = found or conv_index_violations(rows, accepted, conv_pool.shape[0], max_query_len)
    if found:
        raise ContractError(found)
    out, after = causal_conv1d_update_varlen(x, weight, bias, conv_pool, query_start_loc, rows, accepted,
                                             max_query_len, activation)  # fmt: skip
    conv_pool[...] = after.astype(conv_pool.dtype)
    return out.astype(np.asarray(x).dtype), conv_pool


def hf_conv_fn(fn: Callable[..., Any], device: str | None = None) -> Callable[..., tuple[np.ndarray, np.ndarray]]:
    """HF's prefill conv (``causal_conv1d_fn(hidden_states [B, C, T], weight, bias, activation)``, from an empty
    window) as a prefill-family kernel, through the cache glue HF's layer uses (``causal_conv1d_forward``): a
    sequence with a window runs on window ++ tokens and drops the window's outputs; its final window is the last L
    inputs. −1 rows: an empty window, nothing stored; read rows honoured by the glue; no checkpoints."""
    io = TorchIO.create(device)

    def kernel(x: np.ndarray, conv_pool: np.ndarray, weight: np.ndarray, bias: np.ndarray | None,
               cu_seqlens: np.ndarray, state_indices: np.ndarray, *, activation: str | None = "silu",
               checkpoint_every: int | None = None, checkpoint_indices: np.ndarray | None = None,
               read_indices: np.ndarray | None = None, **_: Any) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        if checkpoint_every:
            raise ValueError("HF's conv takes no checkpoints")
        bounds = np.asarray(cu_seqlens).reshape(-1)
        rows = np.asarray(state_indices).reshape(-1)
        reads = rows if read_indices is None else np.asarray(read_indices).reshape(-1)
        out = np.zeros(np.shape(x), np.asarray(x).dtype)
        state_len = conv_pool.shape[2]
        w = io.to_kernel(np.ascontiguousarray(weight))
        b = None if bias is None else io.to_kernel(np.ascontiguousarray(bias))
        finals = {}
        for i, (start, end) in enumerate(itertools.pairwise(bounds)):
            if end == start:
                continue
            tokens = np.swapaxes(np.asarray(x)[start:end], 0, 1)
            window = conv_pool[reads[i]] if reads[i] >= 0 else np.zeros((x.shape[1], state_len), np.asarray(x).dtype)
            series = np.ascontiguousarray(np.concatenate([window, tokens], axis=1))
            result = io.from_kernel(fn(io.to_kernel(series[None]), w, b, activation=activation))[0]
            out[start:end] = np.swapaxes(result[:, state_len:], 0, 1)
            finals[i] = series[:, -state_len:]
        for i, window in finals.items():  # every row read before any is written
            if rows[i] >= 0:
                conv_pool[rows[i]] = window
        return out, conv_pool

    setattr(kernel, PREFILL_CAPABILITIES_ATTR, {"name": f"HF {getattr(fn, '__name__', 'conv')} (cache glue)",
                                                "checkpoints": False, "read_rows": True})  # fmt: skip
    return kernel


def reference_prefill() -> Callable[..., tuple[np.ndarray, np.ndarray]]:
    """The fp64 prefill oracle as an in-place prefill-family kernel (no rejections: the values are the point)."""

    def kernel(x: np.ndarray, conv_pool: np.ndarray, weight: np.ndarray, bias: np.ndarray | None,
               cu_seqlens: np.ndarray, state_indices: np.ndarray, *, activation: str | None = "silu",
               checkpoint_every: int | None = None, checkpoint_indices: np.ndarray | None = None,
               read_indices: np.ndarray | None = None, **_: Any) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        out, after = causal_conv1d_prefill_pool(x, weight, bias, cu_seqlens, conv_pool, state_indices, activation,
                                                checkpoint_every, checkpoint_indices, read_indices)  # fmt: skip
        conv_pool[...] = after.astype(conv_pool.dtype)
        return out.astype(np.asarray(x).dtype), conv_pool

    setattr(kernel, PREFILL_CAPABILITIES_ATTR, {"name": "gdn-ref conv prefill oracle", "checkpoints": True,
                                                "read_rows": True})  # fmt: skip
    return kernel


ADAPTERS = {"hf-conv": hf_update, "hf-conv-fn": hf_conv_fn, "vllm-conv": vllm_update}

__all__ = ["ADAPTERS", "ConvCapabilities", "hf_conv_fn", "hf_update", "reference", "reference_prefill", "vllm_update"]
