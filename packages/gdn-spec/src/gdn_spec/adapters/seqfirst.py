"""Layout glue for seq-first (FLA / HF style) GDN functions, declared conventions and all.

The suite's call is head-major: q, k ``[B, Hk, S, Dk]``, v ``[B, Hv, S, Dv]``, g_log and beta ``[B, Hv, S]``, state
``[B, Hv, Dk, Dv]``. A seq-first function takes ``[B, T, H, D]`` and ``[B, T, H]``, an ``initial_state`` plus
``output_final_state=True``, and returns ``(o [B, T, Hv, Dv], final_state)``. What differs between such
functions is declared, never guessed (``Conventions``); the adapter owns the transposes, the head repetition and
the scale, which is where the bugs that matter hide.
"""

from __future__ import annotations

import difflib
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

# The options every adapter label shows (``Conventions.describe``); the pool and serving ones show when set.
CONVENTIONS = ("scale", "gqa", "state", "varlen")
# The serving keywords (gdn_spec.serving) a pool kernel gets under gdn-spec's own names when its adapter declares
# them (``Conventions.bucket`` / ``checkpoints`` / ``read_rows``); its pool rows go under ``Conventions.pool``.
SERVING_KEYWORDS = {
    "bucket": ("bucket",),
    "checkpoints": ("checkpoint_every", "checkpoint_indices"),
    "read_rows": ("read_indices",),
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
        pool (str): "no" — ``initial_state`` holds one state per sequence, read only; otherwise the kernel's keyword
            for pool rows: with it, ``initial_state`` is a pool ``[P, H, K, V]`` (``[P, H, V, K]`` under
            ``state=vk``) that the kernel reads and writes in place at the named rows, −1 = no row (SGLang's
            ``initial_state_indices``; ``state_indices``, gdn-nki's name; ``ssm_state_indices``, vLLM's). Needs
            varlen=yes.
        bucket (str): "yes" — the kernel takes ``bucket=(T, N)`` with a pool call. Needs a pool.
        checkpoints (str): "yes" — it takes ``checkpoint_every`` and ``checkpoint_indices`` (pool rows). Needs a pool.
        read_rows (str): "yes" — it takes ``read_indices`` (the pool row each sequence starts from). Needs a pool.
    """

    scale: str = "argument"
    gqa: str = "native"
    state: str = "kv"
    varlen: str = "no"
    pool: str = "no"
    bucket: str = "no"
    checkpoints: str = "no"
    read_rows: str = "no"

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {
        "scale": ("argument", "internal", "caller"),
        "gqa": ("native", "repeat"),
        "state": ("kv", "vk"),
        "varlen": ("no", "yes"),
        "pool": ("no", "state_indices", "initial_state_indices", "ssm_state_indices"),
        "bucket": ("no", "yes"),
        "checkpoints": ("no", "yes"),
        "read_rows": ("no", "yes"),
    }

    @classmethod
    def from_options(cls, options: dict[str, str]) -> Conventions:
        """Validated conventions.

        Raises:
            ImplementationError: an unknown key or value (naming the closest valid one and every choice), or an
                option whose prerequisite is missing (a pool without varlen=yes; bucket, checkpoints or read_rows
                without a pool), naming the option to add.
        """
        for key, value in options.items():
            if key not in cls.CHOICES:
                raise ImplementationError(
                    f"unknown seq-first adapter option {key!r}{_closest(key, cls.CHOICES)}; options: "
                    f"{sorted(cls.CHOICES)}"
                )
            if value not in cls.CHOICES[key]:
                raise ImplementationError(
                    f"adapter option {key}={value!r}{_closest(value, cls.CHOICES[key])}: choose one of "
                    f"{cls.CHOICES[key]}"
                )
        conventions = cls(**options)
        if conventions.takes_pool and not conventions.takes_cu_seqlens:
            raise ImplementationError(
                f"adapter option pool={conventions.pool} needs varlen=yes: pool rows name packed sequences of "
                "cu_seqlens; add varlen=yes"
            )
        for key in SERVING_KEYWORDS:
            if getattr(conventions, key) == "yes" and not conventions.takes_pool:
                raise ImplementationError(
                    f"adapter option {key}=yes needs a pool: the serving checks read every state from the pool the "
                    "kernel updates in place; add pool=<the kernel's keyword for pool rows> "
                    f"(one of {cls.CHOICES['pool'][1:]})"
                )
        return conventions

    @property
    def takes_cu_seqlens(self) -> bool:
        return self.varlen == "yes"

    @property
    def takes_pool(self) -> bool:
        return self.pool != "no"

    def serving_keywords(self) -> tuple[str, ...]:
        """gdn-spec's serving keywords the kernel takes (besides its pool rows), as declared."""
        return tuple(name for key, names in SERVING_KEYWORDS.items() if getattr(self, key) == "yes" for name in names)

    def describe(self) -> str:
        """The options that say what the kernel is: the four conventions always, the serving ones when set."""
        shown = [f.name for f in fields(self) if f.name in CONVENTIONS or getattr(self, f.name) != "no"]
        return ", ".join(f"{name}={getattr(self, name)}" for name in shown)


def _closest(given: str, valid: Any) -> str:
    """The hint " (did you mean 'x'?)" for the valid name nearest a misspelt one, or "" when none is near."""
    close = difflib.get_close_matches(given, list(valid), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


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

    def pool_in(self, pool: np.ndarray) -> tuple[np.ndarray, Callable[[np.ndarray], np.ndarray] | None]:
        """The whole pool [P, H, Dk, Dv] in the kernel's layout, contiguous (a pool kernel addresses its rows by
        offset), and the exact way back for what the kernel wrote to it (None: it is the caller's pool itself).

        Every row goes over and every row comes back, the ones the call does not name included: a kernel writing
        a row it was not given changes the caller's row, and the suite sees it."""
        if self.conventions.state == "kv":
            return pool, None
        return np.ascontiguousarray(np.swapaxes(pool, -1, -2)), lambda written: np.swapaxes(written, -1, -2)


def wrap_seq_first(
    fn: Callable[..., Any], conventions: Conventions, io: ArrayIO | None = None, glue: Glue | None = None
) -> Callable[..., Any]:
    """gdn_cte's numpy signature around a seq-first kernel (see the module docstring and ``Conventions``).

    Args:
        fn (Callable): ``fn(q, k, v, g=, beta=, [scale=], initial_state=, output_final_state=True,
            [cu_seqlens=]) -> (o, final_state)``; with a pool (``conventions.pool``): ``fn(q, k, v, g=, beta=,
            [scale=], initial_state=pool, cu_seqlens=, <pool>=rows, [bucket=], [checkpoint_every=,
            checkpoint_indices=], [read_indices=])`` updating the pool in place and returning ``o`` or a tuple
            whose first item is ``o``.
        conventions (Conventions): what the kernel does itself.
        io (ArrayIO | None): the kernel's array type (None: numpy).
        glue (Glue | None): the layout steps (None: ``Glue(conventions)``).

    Returns:
        Callable: gdn_cte(query, key, value, g_log, beta, scale, algorithm, mask_pack, group_size,
        recurrent_state, cu_seqlens=None, state_indices=None, **serving) -> (out [B, Hv, S, Dv], state): a NEW final
        state [B, Hv, Dk, Dv], or, for a call with ``state_indices``, the caller's pool ``recurrent_state`` itself,
        holding what the kernel wrote.

    Notes:
        ``algorithm``, ``mask_pack`` and ``group_size`` are gdn_cte's own and are not passed on. Without
        ``state_indices`` the state comes back as a new array (such kernels return a new state:
        ``state_in_place`` is declared False). With them (``state_pool``, the varlen area's serving checks) the
        kernel gets the whole pool and the rows, never a gather of the rows it names, so whatever it does to any
        row is what the suite judges; it gets no ``output_final_state`` (the pool is its output: SGLang's
        pool-native ``chunk_gated_delta_rule`` has no such argument, gdn-nki's updates the pool either way), and
        what it returns after ``o`` is not read. A write the kernel makes to any array it was handed changes the
        caller's array (``handoff.Handoff``), so the suite's read-only checks see it at every shape.
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
        state_indices: np.ndarray | None = None,
        **serving: Any,
    ) -> tuple[np.ndarray, np.ndarray]:
        del algorithm, mask_pack, group_size  # gdn_cte's own knobs: a seq-first kernel has its own chunking
        if cu_seqlens is not None and not conventions.takes_cu_seqlens:
            raise ValueError("cu_seqlens given, but the kernel is declared without it (adapter option varlen=no)")
        pooled = state_indices is not None
        _check_serving_keywords(conventions, pooled, recurrent_state, serving)
        ratio = value.shape[1] // max(1, query.shape[1])
        glued_query, kwargs = glue.query(glue.heads(query, ratio), scale)
        positional = ((query, glued_query), (key, glue.heads(key, ratio)), (value, value))
        with Handoff(io) as handoff:  # a write to any array handed over reaches the caller's, returned or raised
            for name, caller in (("g_log", g_log), ("beta", beta)):
                kwargs[KERNEL_NAMES[name]] = handoff.to_kernel(caller, seq_first(caller))
            kwargs[KERNEL_NAMES["recurrent_state"]] = None
            if pooled:
                pool, back = glue.pool_in(recurrent_state)
                kwargs[KERNEL_NAMES["recurrent_state"]] = handoff.to_kernel(recurrent_state, pool, back=back)
                kwargs[conventions.pool] = handoff.to_kernel(state_indices)
                for name, x in serving.items():
                    kwargs[name] = handoff.to_kernel(x) if isinstance(x, np.ndarray) else x
            elif recurrent_state is not None:
                state = handoff.to_kernel(recurrent_state, glue.state_in(recurrent_state))
                kwargs[KERNEL_NAMES["recurrent_state"]] = state
            if cu_seqlens is not None:
                kwargs[KERNEL_NAMES["cu_seqlens"]] = handoff.index(cu_seqlens)
            if not pooled:
                kwargs["output_final_state"] = True
            result = fn(*(handoff.to_kernel(caller, seq_first(x)) for caller, x in positional), **kwargs)
        if pooled:
            out = result[0] if isinstance(result, (tuple, list)) and result else result
            return np.ascontiguousarray(seq_first(io.from_kernel(out))), recurrent_state
        if not isinstance(result, tuple) or len(result) != 2:
            raise TypeError(f"a seq-first kernel returns (o, final_state); got {returned_kind(result)}")
        out, final = result
        if final is None:
            raise TypeError("the kernel returned final_state=None although output_final_state=True was passed")
        return np.ascontiguousarray(seq_first(io.from_kernel(out))), glue.state_out(io.from_kernel(final))

    return gdn_cte


def _check_serving_keywords(
    conventions: Conventions, pooled: bool, recurrent_state: np.ndarray | None, serving: dict[str, Any]
) -> None:
    """Refuse a pool call or a serving keyword the adapter is not declared to pass on (a call the suite makes only
    where the adapter declared it; anything else is a wrong call, never silently dropped)."""
    if pooled and not conventions.takes_pool:
        raise ValueError("state_indices given, but the kernel is declared without a pool (adapter option pool=no)")
    if pooled and recurrent_state is None:
        raise ValueError("state_indices given without recurrent_state: pool rows name rows of a pool")
    declared = conventions.serving_keywords()
    for name in serving:
        if name not in declared or not pooled:
            option = next((key for key, names in SERVING_KEYWORDS.items() if name in names), None)
            if option is None:
                raise TypeError(f"gdn_cte() got an unexpected keyword argument {name!r}")
            raise ValueError(
                f"{name} given, but the adapter passes it only with pool rows (state_indices) and option "
                f"{option}=yes (declared: {option}={getattr(conventions, option)})"
            )


__all__ = [
    "KERNEL_NAMES",
    "POSITIONAL_ARGUMENTS",
    "SERVING_KEYWORDS",
    "ArrayIO",
    "Conventions",
    "Glue",
    "NumpyIO",
    "kernel_names",
    "seq_first",
    "wrap_seq_first",
]
