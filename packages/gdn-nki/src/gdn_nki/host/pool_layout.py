"""The host's side of a V-major state pool (``state_v_first``): the layout rule, and the K-major view the rules read.

A V-major pool ([P, Hv, Dv, Dk]: SGLang's, vLLM's newer fused-gating kernel's, FLA's ``state_v_first``) is handed
to the kernels as it is, with ``state_v_first=True``: their state DMAs read and write it in place
(``common.state_layout``). The host checks the call against the pool's K-major view (``np.swapaxes``: a view, no
copy), so every contract rule and value scan reads the states the math sees; only the shape rule below is the
layout's own: with K != V a pool in the other layout is refused by its shape, naming the flag. With K = V no
shape can tell the layouts apart: the flag is the caller's word, never guessed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gdn_ref.contract import ContractError, Violation


def v_first_flag(value: Any, argument: str, api: str) -> bool:
    """``value`` as the layout flag: a Python or numpy bool (a tensor or a string is refused: no single truth)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ContractError([Violation("state_layout.flag", argument, f"= {value!r}", "the state layout flag is a bool",
                                   f"pass {argument}=True for V-major [.., Hv, V, K] states, False (default) for "
                                   "K-major [.., Hv, K, V]", api)])  # fmt: skip


def layout_violations(state: Any, v_first: bool, dk: int, dv: int, argument: str, api: str) -> list[Violation]:
    """With ``v_first``: ``state`` must end in [.., Dv, Dk]. K-major states are judged by the contract's own rules."""
    shape = tuple(getattr(state, "shape", ()))
    if state is None or not v_first or len(shape) < 2 or shape[-2:] == (dv, dk):
        return []
    return [Violation("state_layout.v_first", argument, f"shape {list(shape)}",
                      f"with state_v_first=True states are V-major [.., Hv, V, K]: the last two dims must be "
                      f"(V, K) = ({dv}, {dk})",
                      f"pass the V-major pool [.., Hv, {dv}, {dk}], or state_v_first=False for a K-major "
                      f"[.., Hv, {dk}, {dv}] pool", api)]  # fmt: skip


def checked_layout(query: Any, value: Any, state: Any, state_v_first: Any, argument: str = "recurrent_state") -> bool:
    """The prefill entry points' layout flag, checked with the state's shape (``ContractError`` naming ``argument``)."""
    v_first = v_first_flag(state_v_first, "state_v_first", "gdn_cte")
    dk, dv = (np.shape(x)[-1] if np.ndim(x) == 4 else None for x in (query, value))
    violations = layout_violations(state, v_first, dk, dv, argument, "gdn_cte")
    if violations:
        raise ContractError(violations)
    return v_first


def kmajor(state: Any, v_first: bool) -> Any:
    """The K-major view of a state array (itself when K-major or None): the rules and scans read this one."""
    if state is None or not v_first:
        return state
    return np.swapaxes(state, -1, -2)
