"""What a decode kernel declares it supports: ``fn.gdn_spec_decode_capabilities``, every key checked on load.

A decode kernel has ``gdn_nki.decode_step``'s numpy signature (``gdn_spec.decode``). The attribute makes a callable
a decode kernel for ``gdn-spec check`` (the family is detected from it); whatever it leaves out defaults to
"supported", whatever it excludes is reported as SKIPPED with the reason, never passed.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from numbers import Integral
from typing import Any

import numpy as np

from gdn_ref.constants import COMPUTE_DTYPES

from ..core import ImplementationError

CAPABILITIES_ATTR = "gdn_spec_decode_capabilities"
GATING_FORMS = ("precomputed", "fused")


@dataclass(frozen=True)
class DecodeCapabilities:
    """What a decode kernel supports.

    Attributes:
        name (str): display name (default: the spec string).
        dtypes (tuple[str, ...]): subset of ("float32", "bfloat16") for query, key and value; default both.
        max_tokens (int | None): largest T per request and call (1 = single-token decode only; None = any T, the
            speculative-verification / multi-token form).
        final_state_only (bool): accepts [N] indices with T > 1 (the state after the last token written back to
            the row read); False: T > 1 only in the per-token form (vLLM's kernel).
        per_token_states (bool): accepts ``state_indices`` of shape [N, T], the state after token t written to
            row ``state_indices[n, t]`` (vLLM's form, for rolling back rejected drafts).
        num_accepted_tokens (bool): with [N, T] indices, resumes request n from row
            ``state_indices[n, num_accepted_tokens[n] - 1]``.
        gating (tuple[str, ...]): subset of ("precomputed", "fused"): g_log and beta, or a, b, A_log, dt_bias
            with g = −exp(A_log)·softplus(a + dt_bias), β = sigmoid(b).
        padding (bool): a request whose index is -1 reads and writes nothing of the pool.
        gqa (bool): Hv may be a multiple of Hk (value head h reads key head h // (Hv/Hk)); False: Hk == Hv only.
        qk_l2norm (bool): honours ``use_qk_l2norm=True`` (q and k L2-normalized inside, eps 1e-6).
        validates_arguments (bool): rejects invalid calls naming the argument, changing no buffer.
        state_in_place (bool): updates ``state_pool`` in place (only the rows live requests name) and returns it;
            False when the pool is addressed by an adapter rather than the kernel (the pool tests then test
            nothing of the kernel and are skipped).
        fixed_scale (bool): applies Dk**-0.5 itself (HF); the test of a caller's scale is skipped.
        max_requests (int | None): largest N per call.
        example_scale (float): multiplies the Hypothesis example count of the numerics tests.
        set_by_adapter (tuple[str, ...]): the capabilities an adapter set, whatever the kernel declared.
    """

    name: str
    dtypes: tuple[str, ...] = COMPUTE_DTYPES
    max_tokens: int | None = None
    final_state_only: bool = True
    per_token_states: bool = True
    num_accepted_tokens: bool = True
    gating: tuple[str, ...] = GATING_FORMS
    padding: bool = True
    gqa: bool = True
    qk_l2norm: bool = True
    validates_arguments: bool = True
    state_in_place: bool = True
    fixed_scale: bool = False
    max_requests: int | None = None
    example_scale: float = 1.0
    set_by_adapter: tuple[str, ...] = ()

    def declaring(self, capability: str) -> str:
        """ "<name> declares <capability>=<value>", or "<name>'s adapter sets ..." when the adapter set it."""
        verb = "'s adapter sets" if capability in self.set_by_adapter else " declares"
        return f"{self.name}{verb} {capability}={getattr(self, capability)!r}"

    def unsupported(self, algorithm: str | None = None, dtype: str | None = None) -> str | None:
        """Why a compute dtype is not supported, or None (decode has no algorithm: the plugin's hook asks)."""
        if dtype is not None and dtype not in self.dtypes:
            return f"{self.name} does not support dtype {dtype} (supports {self.dtypes})"
        return None

    def lacks(self, capability: str, needed: Any = True) -> str | None:
        """The skip reason when ``capability`` is not ``needed`` (a flag) or does not contain it (a tuple)."""
        value = getattr(self, capability)
        held = needed in value if isinstance(value, tuple) else value == needed
        return None if held else self.declaring(capability)

    def allows_tokens(self, tokens: int) -> bool:
        return self.max_tokens is None or tokens <= self.max_tokens

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any] | None, default_name: str) -> DecodeCapabilities:
        """The capabilities a declaration states; an unknown key or a bad value is an ``ImplementationError``
        naming the key, the value, the rule and the fix (a typo must not widen what is claimed)."""
        if raw is None:
            return cls(name=default_name)
        if not isinstance(raw, Mapping):
            raise ImplementationError(f"{CAPABILITIES_ATTR} must be a dict, not a {type(raw).__name__}")
        known = {f.name for f in fields(cls)} - {"set_by_adapter"}
        values: dict[str, Any] = {"name": default_name}
        for key, value in raw.items():
            if key not in known:
                close = difflib.get_close_matches(str(key), sorted(known), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ImplementationError(f"unknown decode capability {key!r}{hint}; valid keys: {sorted(known)}")
            values[key] = _checked(key, value)
        return cls(**values)


def _checked(key: str, value: Any) -> Any:
    """One declared value, normalized, or an ImplementationError naming the key, the value, the rule and the fix."""
    default = DecodeCapabilities.__dataclass_fields__[key].default
    if key == "name":
        if isinstance(value, str) and value:
            return value
        return _fail(key, value, "must be a non-empty string", "give the kernel's display name")
    if key in ("dtypes", "gating"):
        allowed = COMPUTE_DTYPES if key == "dtypes" else GATING_FORMS
        items = (value,) if isinstance(value, str) else value
        try:
            chosen = set(items)
        except TypeError:
            chosen = None
        if not chosen or not chosen <= set(allowed):
            return _fail(key, value, f"must be a non-empty collection of names from {allowed}",
                         f"e.g. {allowed[:1]!r}")  # fmt: skip
        return tuple(name for name in allowed if name in chosen)
    if key in ("max_tokens", "max_requests"):
        if value is None or (isinstance(value, Integral) and not isinstance(value, bool) and int(value) > 0):
            return None if value is None else int(value)
        return _fail(key, value, "must be a positive int or None", "e.g. 1 (or leave the key out: no limit)")
    if key == "example_scale":
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < float(value) <= 1:
            return float(value)
        return _fail(key, value, "must be a number in (0, 1]", "e.g. 0.5")
    if isinstance(default, bool):
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        return _fail(key, value, "must be a bool", "write True or False without quotes")
    raise AssertionError(f"no rule for decode capability {key!r}")  # every field has a branch above


def _fail(key: str, value: Any, rule: str, fix: str) -> Any:
    raise ImplementationError(f"decode capability {key}={value!r} {rule}; {fix}")


__all__ = ["CAPABILITIES_ATTR", "GATING_FORMS", "DecodeCapabilities"]
