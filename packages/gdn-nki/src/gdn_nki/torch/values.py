"""``check_values``: the value rules a device path trusts, run on demand (a server's debug mode).

On a device the ops read no value on the host (``device.py``, ``conv_device.py``, ``norm_device.py``): NaN / Inf,
g ≤ 0, β in [0, 1], the index values (range, −1 padding, distinct live rows, ``num_accepted_tokens`` in [1, T]),
the packed layout (``cu_seqlens`` rising, equal decode lengths, a bucket holding the padded lengths) and the pool
rows a call reads are trusted, as vLLM's and FlashInfer's kernels trust them. ``check_values(drop_in, *args, **kwargs)`` copies the call's tensors to
the host — one explicit sync, the cost a debug mode accepts — and runs the drop-in's CPU path on the copies up to its
launch: every rule the CPU checks before launching, with the CPU's ``ContractError``, and no kernel run, no write.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from ..common import backend
from ..host.torch_io import import_torch, is_torch_tensor
from . import chunk, conv, fused_recurrent, norm, ops
from .ops import gdn_tkg_host

torch = import_torch()


class _LaunchedError(Exception):
    """Raised in place of a launch: every rule the host path checks before its launch has passed."""


def _refuse_launch(kernel: Any) -> Callable[..., Any]:
    def launch(*args: Any, **kwargs: Any) -> Any:
        raise _LaunchedError

    return launch


@contextlib.contextmanager
def _no_launch() -> Iterator[None]:
    """``backend.simulate`` (the host paths' one launch) replaced by a refusal for the context's duration (not
    thread-safe, as ``gdn_nki.traces.recording_launches``)."""
    launch = backend.simulate
    backend.simulate = _refuse_launch
    try:
        yield
    finally:
        backend.simulate = launch


# Each drop-in's CPU path, by the drop-in's name.
HOST_PATHS: dict[str, Callable[..., Any]] = {
    "chunk_gated_delta_rule": chunk.chunk_gated_delta_rule,
    "fused_recurrent_gated_delta_rule": lambda *args, **kwargs: ops.fused_recurrent_gated_delta_rule(
        *args, **{**kwargs, "check_values": True}
    ),  # the drop-in's own argument handling first: FLA's fused gates, vLLM's keywords
    "vllm_fused_recurrent_gated_delta_rule": fused_recurrent.vllm_fused_recurrent_gated_delta_rule,
    "fused_sigmoid_gating_delta_rule_update": fused_recurrent.fused_sigmoid_gating_delta_rule_update,
    "gdn_tkg": gdn_tkg_host,
    # the conv and norm drop-ins on host copies: their ops' CPU paths scan the values and the index rows
    "causal_conv1d_update": conv.causal_conv1d_update,
    "causal_conv1d_fn": conv.causal_conv1d_fn,
    "causal_conv1d": conv.causal_conv1d,
    "rms_norm_gated": norm.rms_norm_gated,
}


TKG_ARGUMENTS = ("q", "k", "v", "b", "a", "A_log", "dt_bias", "z", "norm_weight", "state_in")


def _name(drop_in: Callable[..., Any]) -> str:
    """A drop-in's name."""
    return drop_in.__name__


def check_values(drop_in: Callable[..., Any] | str, *args: Any, **kwargs: Any) -> None:
    """Check a drop-in call's values on the host, as its CPU path does before launching, without running it.

    Args:
        drop_in (Callable | str): a ``gdn_nki.torch`` drop-in, or its name.
        args, kwargs: the call, exactly as the model makes it (device tensors included).

    Returns:
        None: the call passes every rule; else ``ContractError`` (the CPU path's, naming argument, value, rule, fix).

    Notes:
        Reads every tensor of the call on the host (``.cpu()`` copies: a sync per call), so it belongs in a
        server's debug mode, not on its hot path. The caller's tensors, the pool included, are never written.
        FLA's ``fused_recurrent_gated_delta_rule`` with packed sequences of several lengths is checked whole: the
        CPU launches once per length, and checks every length's rules before its first launch.
    """
    name = drop_in if isinstance(drop_in, str) else _name(drop_in)
    host = HOST_PATHS[name]
    if name == "gdn_tkg":  # its host path takes the tensors in order
        args, kwargs = (*args, *(kwargs[key] for key in TKG_ARGUMENTS[len(args) :])), {}

    def on_host(x: Any) -> Any:
        return x.detach().to("cpu", copy=True) if is_torch_tensor(x) else x

    with _no_launch(), torch.no_grad(), contextlib.suppress(_LaunchedError):
        host(*(on_host(x) for x in args), **{key: on_host(x) for key, x in kwargs.items()})
