"""Conv kernels of other conventions as conv-family kernels (``checks.py``'s signature).

- ``hf_update(fn)``: Hugging Face's ``causal_conv1d_update`` / ``torch_causal_conv1d_update`` (hidden_states
  [B, C, T], conv_state [B, C, L] updated in place, weight [C, W], bias, activation): the named rows of the pool are
  gathered into a conv_state batch, the function runs once on the live requests, and their states are written
  back; −1 requests are left out (their outputs zeros). HF keeps one state per request, so [N, T] rows are not
  offered (``per_token_rows`` False), and it checks nothing (the math profile: ``rejections`` False).
- ``reference()``: the fp64 oracle as a kernel (in-place pool, the oracle's rejections by ``gdn_ref.conv_rules``),
  the family's own yardstick and the base of its power tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from gdn_ref.contract import ContractError
from gdn_ref.conv import causal_conv1d_decode_pool
from gdn_ref.conv_rules import conv_index_violations, conv_step_violations

from ..adapters.torch_io import TorchIO
from .checks import CAPABILITIES_ATTR, ConvCapabilities


def hf_update(fn: Callable[..., Any], device: str | None = None) -> Callable[..., tuple[np.ndarray, np.ndarray]]:
    """HF's decode conv update through pool glue (module docstring)."""
    io = TorchIO.create(device)

    def kernel(x, conv_pool, weight, bias, state_indices, num_accepted_tokens=None, *, activation="silu"):
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


def reference() -> Callable[..., tuple[np.ndarray, np.ndarray]]:
    """The fp64 oracle as an in-place conv kernel that rejects what ``gdn_ref.conv_rules`` rejects."""

    def kernel(x, conv_pool, weight, bias, state_indices, num_accepted_tokens=None, *, activation="silu"):
        found = conv_step_violations(x, conv_pool, weight, bias, state_indices, num_accepted_tokens, activation)
        found = found or conv_index_violations(state_indices, num_accepted_tokens, conv_pool.shape[0], x.shape[1])
        if found:
            raise ContractError(found)
        out, after = causal_conv1d_decode_pool(x, weight, bias, conv_pool, state_indices, num_accepted_tokens,
                                               activation)  # fmt: skip
        conv_pool[...] = after.astype(conv_pool.dtype)
        return out.astype(np.asarray(x).dtype), conv_pool

    setattr(kernel, CAPABILITIES_ATTR, {"name": "gdn-ref conv oracle", "per_token_rows": True, "rejections": True})
    return kernel


ADAPTERS = {"hf-conv": hf_update}

__all__ = ["ADAPTERS", "ConvCapabilities", "hf_update", "reference"]
