"""Layout glue for seq-first (FLA / HF style) GDN functions, declared conventions and all.

The suite's call is head-major: q, k ``[B, Hk, S, Dk]``, v ``[B, Hv, S, Dv]``, g_log and beta ``[B, Hv, S]``, state
``[B, Hv, Dk, Dv]``. A seq-first function takes ``[B, T, H, D]`` and ``[B, T, H]``, an ``initial_state`` plus
``output_final_state=True``, and returns ``(o [B, T, Hv, Dv], final_state)``. What differs between such
functions is declared, never guessed (``Conventions``); the adapter owns the transposes, the head repetition and
the scale, which is where the bugs that matter hide.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import numpy as np

from gdn_ref.constants import DEFAULT_ALGORITHM, DEFAULT_GROUP_SIZE

from ..core import ImplementationError
from ..failures import returned_kind
from .handoff import ArrayIO, Handoff

# gdn_cte's argument -> the seq-first kernel's name for it (FLA's signature: q, k, v positionally, then keywords).
# The glue passes the keywords under these names; the suite's messages use ``kernel_names``, which reads the
# positional ones from the kernel's own signature (HF calls them query, key, value) and falls back to these.
KERNEL_NAMES = {
    "query": "q",
    "key": "k",
    "value": "v",
    "g_log": "g",
    "beta": "beta",
    "scale": "scale",
    "recurrent_state": "initial_state",
    "cu_seqlens": "cu_seqlens",
}

# gdn_cte's arguments a seq-first kernel takes as its first five positional parameters, in order (the glue passes
# the first three positionally; FLA's and HF's kernels both take g and beta fourth and fifth).
POSITIONAL_ARGUMENTS = ("query", "key", "value", "g_log", "beta")

# Relative slack when checking that the suite's scale is the K**-0.5 an "internal"-scale kernel applies itself.
_SCALE_RTOL = 1e-12


class NumpyIO:
    """The kernel takes numpy arrays: contiguous copies in, arrays out."""

    def to_kernel(self, x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x)

    def index(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x, dtype=np.int64)

    def from_kernel(self, x: Any) -> np.ndarray:
        return np.asarray(x)


@dataclass(frozen=True)
class Conventions:
    """What a seq-first kernel does itself, declared as adapter options (``fla-torch:scale=internal,...``).

    Attributes:
        scale (str): "argument" — the kernel takes ``scale=`` and applies it (FLA); "internal" — it multiplies q by
            K**-0.5 itself and takes no scale (HF), so only the suite's default scale can be passed; "caller" — it
            applies none, the adapter multiplies q by the scale (one rounding into the compute dtype).
        gqa (str): "native" — value head h reads key head h // (Hv // Hk) inside the kernel (FLA's GVA, HF >= 5);
            "repeat" — the kernel needs Hk == Hv, so the adapter repeats each key/query head Hv // Hk times.
        state (str): "kv" — states are ``[N, H, K, V]``; "vk" — ``[N, H, V, K]`` (FLA's ``state_v_first``).
        varlen (str): "yes" — the kernel takes ``cu_seqlens`` (packed sequences, B = 1); "no" — it does not.
    """

    scale: str = "argument"
    gqa: str = "native"
    state: str = "kv"
    varlen: str = "no"

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {
        "scale": ("argument", "internal", "caller"),
        "gqa": ("native", "repeat"),
        "state": ("kv", "vk"),
        "varlen": ("no", "yes"),
    }

    @classmethod
    def from_options(cls, options: dict[str, str]) -> Conventions:
        """Validated conventions; an unknown key or value is an error naming the choices."""
        known = {f.name for f in fields(cls)}
        for key, value in options.items():
            if key not in known:
                raise ImplementationError(f"unknown seq-first adapter option {key!r}; options: {sorted(known)}")
            if value not in cls.CHOICES[key]:
                raise ImplementationError(f"adapter option {key}={value!r}: choose one of {cls.CHOICES[key]}")
        return cls(**options)

    @property
    def takes_cu_seqlens(self) -> bool:
        return self.varlen == "yes"

    def describe(self) -> str:
        return ", ".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))


def kernel_names(fn: Callable[..., Any]) -> dict[str, str]:
    """gdn_cte's argument -> the seq-first kernel's own name for it, for messages the kernel's author reads.

    Args:
        fn (Callable): the seq-first kernel (a function, or a torch module called through its ``forward``).

    Returns:
        dict[str, str]: ``KERNEL_NAMES`` with query, key, value, g_log and beta renamed to the kernel's first five
        positional parameters, as many as it has (``POSITIONAL_ARGUMENTS``): ``query`` for HF's
        ``torch_chunk_gated_delta_rule``, ``q`` for FLA's. The keywords the glue passes (``initial_state``,
        ``scale``, ``cu_seqlens``) keep their names: the kernel receives them under those.

    Notes:
        One FLA table named every seq-first kernel's arguments, so an HF kernel writing its query was told it
        changed `q`. Without a readable signature (a builtin, ``*args`` only) the table's names are kept. A torch
        module's own signature is ``(*args, **kwargs)`` (``nn.Module.__call__``): its ``forward`` names the
        arguments — transformers wraps HF's kernels in such a module (the ``kernels`` package's ``Func``).
    """
    names = dict(KERNEL_NAMES)
    for candidate in (fn, getattr(fn, "forward", None)):
        positional = _positional_parameters(candidate)
        if positional:
            names.update(zip(POSITIONAL_ARGUMENTS, positional, strict=False))  # its first five, or fewer
            break
    return names


def _positional_parameters(fn: Any) -> list[str]:
    """The names of ``fn``'s leading positional parameters (up to ``*args``), or [] when it has no readable
    signature."""
    if not callable(fn):
        return []
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # builtins and some C extensions have none
        return []
    names = []
    for parameter in parameters:
        if parameter.kind not in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            break
        names.append(parameter.name)
    return names


def seq_first(x: np.ndarray) -> np.ndarray:
    """[B, H, S, ...] <-> [B, S, H, ...] (its own inverse)."""
    return np.swapaxes(x, 1, 2)


class Glue:
    """The steps between the suite's head-major call and a seq-first kernel, each following the conventions.

    One method per step, so a self-test can break exactly one (``tests/adapter_kernels.py``): the suite must fail
    an adapter that applies the scale twice, repeats heads wrongly or transposes the state.
    """

    def __init__(self, conventions: Conventions) -> None:
        self.conventions = conventions

    def heads(self, x: np.ndarray, ratio: int) -> np.ndarray:
        """Key/query heads [B, Hk, ...] for the kernel: repeated so value head h reads key head h // ratio."""
        if self.conventions.gqa == "repeat" and ratio > 1:
            return np.repeat(x, ratio, axis=1)
        return x

    def query(self, query: np.ndarray, scale: float) -> tuple[np.ndarray, dict[str, float]]:
        """The query and the scale keyword for the kernel."""
        dk = query.shape[-1]
        if self.conventions.scale == "argument":
            return query, {KERNEL_NAMES["scale"]: float(scale)}
        if self.conventions.scale == "caller":  # one rounding of q·scale into the compute dtype
            return (query.astype(np.float64) * scale).astype(query.dtype), {}
        if not math.isclose(scale, dk**-0.5, rel_tol=_SCALE_RTOL):
            raise ValueError(
                f"scale={scale!r}: the kernel applies K**-0.5 = {dk**-0.5!r} itself (adapter option scale=internal) "
                "and takes no scale; call it with scale=Dk**-0.5"
            )
        return query, {}

    def state_in(self, state: np.ndarray) -> np.ndarray:
        """gdn_cte's [N, H, Dk, Dv] state in the kernel's layout."""
        return state if self.conventions.state == "kv" else np.swapaxes(state, -1, -2)

    def state_out(self, state: np.ndarray) -> np.ndarray:
        """The kernel's final state in gdn_cte's [N, H, Dk, Dv] layout."""
        return np.ascontiguousarray(state if self.conventions.state == "kv" else np.swapaxes(state, -1, -2))


def wrap_seq_first(
    fn: Callable[..., Any], conventions: Conventions, io: ArrayIO | None = None, glue: Glue | None = None
) -> Callable[..., Any]:
    """gdn_cte's numpy signature around a seq-first kernel (see the module docstring and ``Conventions``).

    Args:
        fn (Callable): ``fn(q, k, v, g=, beta=, [scale=], initial_state=, output_final_state=True,
            [cu_seqlens=]) -> (o, final_state)``.
        conventions (Conventions): what the kernel does itself.
        io (ArrayIO | None): the kernel's array type (None: numpy).
        glue (Glue | None): the layout steps (None: ``Glue(conventions)``).

    Returns:
        Callable: gdn_cte(query, key, value, g_log, beta, scale, algorithm, mask_pack, group_size,
        recurrent_state, cu_seqlens=None) -> (out [B, Hv, S, Dv], a NEW final state [B, Hv, Dk, Dv]).

    Notes:
        ``algorithm``, ``mask_pack`` and ``group_size`` are gdn_cte's own and are not passed on. The state comes
        back as a new array (such kernels return a new state): ``state_in_place`` is declared False. A write the
        kernel makes to any array it was handed changes the caller's array (``handoff.Handoff``), so the suite's
        read-only checks see it at every shape.
    """
    io = io or NumpyIO()
    glue = glue or Glue(conventions)

    def gdn_cte(
        query: np.ndarray,
        key: np.ndarray,
        value: np.ndarray,
        g_log: np.ndarray,
        beta: np.ndarray,
        scale: float = 1.0,
        algorithm: str = DEFAULT_ALGORITHM,
        mask_pack: np.ndarray | None = None,
        group_size: int = DEFAULT_GROUP_SIZE,
        recurrent_state: np.ndarray | None = None,
        cu_seqlens: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        del algorithm, mask_pack, group_size  # gdn_cte's own knobs: a seq-first kernel has its own chunking
        if cu_seqlens is not None and not conventions.takes_cu_seqlens:
            raise ValueError("cu_seqlens given, but the kernel is declared without it (adapter option varlen=no)")
        ratio = value.shape[1] // max(1, query.shape[1])
        glued_query, kwargs = glue.query(glue.heads(query, ratio), scale)
        positional = ((query, glued_query), (key, glue.heads(key, ratio)), (value, value))
        with Handoff(io) as handoff:  # a write to any array handed over reaches the caller's, returned or raised
            for name, caller in (("g_log", g_log), ("beta", beta)):
                kwargs[KERNEL_NAMES[name]] = handoff.to_kernel(caller, seq_first(caller))
            kwargs[KERNEL_NAMES["recurrent_state"]] = None
            if recurrent_state is not None:
                state = handoff.to_kernel(recurrent_state, glue.state_in(recurrent_state))
                kwargs[KERNEL_NAMES["recurrent_state"]] = state
            if cu_seqlens is not None:
                kwargs[KERNEL_NAMES["cu_seqlens"]] = handoff.index(cu_seqlens)
            kwargs["output_final_state"] = True
            result = fn(*(handoff.to_kernel(caller, seq_first(x)) for caller, x in positional), **kwargs)
        if not isinstance(result, tuple) or len(result) != 2:
            raise TypeError(f"a seq-first kernel returns (o, final_state); got {returned_kind(result)}")
        out, final = result
        if final is None:
            raise TypeError("the kernel returned final_state=None although output_final_state=True was passed")
        return np.ascontiguousarray(seq_first(io.from_kernel(out))), glue.state_out(io.from_kernel(final))

    return gdn_cte


__all__ = [
    "KERNEL_NAMES",
    "POSITIONAL_ARGUMENTS",
    "ArrayIO",
    "Conventions",
    "Glue",
    "NumpyIO",
    "kernel_names",
    "seq_first",
    "wrap_seq_first",
]
