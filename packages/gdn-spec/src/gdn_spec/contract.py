"""The documented gdn_cte contract as data, for anyone wrapping or testing a GDN kernel.

The rules themselves (id, API sentence, check) live in :mod:`gdn_ref.contract`, the single source. This module
pairs every rule with a *violation builder*: a function ``(valid_call) -> call`` returning a call that breaks
that rule — and, unless ``also`` says otherwise, no other rule — so a conformance suite can demand that an
implementation rejects it. ``check_inputs(**call)`` reports every violation of a call at once.

A call is a dict of ``gdn_cte`` keyword arguments: query, key, value, g_log, beta, scale, algorithm,
mask_pack, group_size, recurrent_state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gdn_ref.constants import ALGORITHM_NEUMANN, ALGORITHM_SCHUR, ALGORITHMS, CHUNK_BY_ALGORITHM
from gdn_ref.contract import HOST_ONLY_RULES, RULES, ContractError, Rule, Violation, validate
from gdn_ref.masks import build_mask_pack

from .regimes import Geometry, make_case

__all__ = [
    "HOST_ONLY_RULES",
    "RULES",
    "RULE_CASES",
    "ContractError",
    "RuleCase",
    "Violation",
    "check_inputs",
    "geometry_of",
    "valid_call",
]

Call = dict[str, Any]
Builder = Callable[[Call], Call]

# Smallest sizes that still exercise every rule: GQA (Hv = 2·Hk) where the algorithm allows it, Dk ≠ Dv so a
# transposed state is caught, one chunk of the algorithm.
BASE_GEOMETRY = {
    ALGORITHM_SCHUR: Geometry(B=1, Hk=1, Hv=2, S=CHUNK_BY_ALGORITHM[ALGORITHM_SCHUR], Dk=32, Dv=16),
    ALGORITHM_NEUMANN: Geometry(B=1, Hk=2, Hv=2, S=CHUNK_BY_ALGORITHM[ALGORITHM_NEUMANN], Dk=32, Dv=16),
}


def check_inputs(**call: Any) -> list[Violation]:
    """Every documented rule the call breaks (empty list = valid), in rule order.

    Args:
        **call: gdn_cte's arguments by name; tensors need only ``.shape`` and ``.dtype`` (plus contents for
            the host-only rules: mask_pack contents, a writable state, and the value scans).

    Returns:
        list[Violation]: each names the argument, the offending value, the rule and the fix.
    """
    return validate(**call)


def geometry_of(call: Call) -> Geometry:
    """The sizes a (valid-shaped) call implies."""
    B, Hk, S, Dk = call["query"].shape
    return Geometry(B=B, Hk=Hk, Hv=call["value"].shape[1], S=S, Dk=Dk, Dv=call["value"].shape[3])


def valid_call(
    algorithm: str = ALGORITHM_SCHUR,
    dtype: str = "float32",
    geometry: Geometry | None = None,
    *,
    supply_state: bool | None = None,
    seed: int = 0,
) -> Call:
    """A call every rule accepts, with normalized random inputs.

    Args:
        algorithm (str): "schur" (mask pack included) or "neumann" (no mask pack).
        dtype (str): compute dtype of query, key and value.
        geometry (Geometry | None): sizes; None means ``BASE_GEOMETRY[algorithm]``.
        supply_state (bool | None): pass a random fp32 ``recurrent_state``; None means "schur only"
            (neumann supports only the omitted form).
        seed (int): data seed.

    Returns:
        dict: gdn_cte keyword arguments.
    """
    geometry = geometry or BASE_GEOMETRY[algorithm]
    supply = algorithm == ALGORITHM_SCHUR if supply_state is None else supply_state
    case = make_case("initial_state" if supply else "random", geometry, dtype, seed)
    return {
        **case.kernel,
        "scale": case.scale,
        "algorithm": algorithm,
        "mask_pack": build_mask_pack() if algorithm == ALGORITHM_SCHUR else None,
        "group_size": 8,
    }


def _redim(call: Call, **sizes: int) -> Call:
    """The same kind of call (algorithm, dtype, state presence) rebuilt at other sizes."""
    geometry = Geometry(**{**geometry_of(call).__dict__, **sizes})
    fresh = valid_call(
        call["algorithm"], call["query"].dtype.name, geometry, supply_state=call["recurrent_state"] is not None
    )
    return {**fresh, "mask_pack": call["mask_pack"], "group_size": call["group_size"], "scale": call["scale"]}


def _with(call: Call, **changes: Any) -> Call:
    return {**call, **changes}


def _drop_axis(name: str) -> Builder:
    return lambda call: _with(call, **{name: call[name][0]})


def _astype(name: str, dtype: Any) -> Builder:
    return lambda call: _with(call, **{name: call[name].astype(dtype)})


def _half_tokens(name: str) -> Builder:
    return lambda call: _with(call, **{name: np.ascontiguousarray(call[name][:, :, : call[name].shape[2] // 2])})


def _compute_dtype_float16(call: Call) -> Call:
    return _with(call, **{n: call[n].astype(np.float16) for n in ("query", "key", "value")})


def _other_compute_dtype(name: str) -> Builder:
    def build(call: Call) -> Call:
        import ml_dtypes  # local: only this builder needs the bf16 type object

        other = np.float32 if call[name].dtype == ml_dtypes.bfloat16 else ml_dtypes.bfloat16
        return _with(call, **{name: call[name].astype(other)})

    return build


def _query_head_dim_differs(call: Call) -> Call:
    q = call["query"]
    return _with(call, query=np.ascontiguousarray(q[..., : q.shape[3] // 2]))


def _head_dim_too_large(call: Call) -> Call:
    return _redim(call, Dv=160)


def _gqa_not_divisible(call: Call) -> Call:
    return _redim(call, Hk=2, Hv=3)


def _seq_not_divisible(call: Call) -> Call:
    # Half a chunk past the base length: for schur that is S = 192, a multiple of 64 that neumann would accept.
    chunk = CHUNK_BY_ALGORITHM[call["algorithm"]]
    return _redim(call, S=geometry_of(call).S + chunk // 2)


def _mask_pack_contents(call: Call) -> Call:
    pack = build_mask_pack()
    pack[1] = pack[1].T  # tril_strict transposed: a plausible off-by-orientation mistake
    return _with(call, mask_pack=pack)


def _state_shape(call: Call) -> Call:
    state = call["recurrent_state"]
    return _with(call, recurrent_state=np.ascontiguousarray(np.swapaxes(state, 2, 3)))  # [B, Hv, Dv, Dk]


def _state_read_only(call: Call) -> Call:
    state = call["recurrent_state"].copy()
    state.setflags(write=False)
    return _with(call, recurrent_state=state)


def _neumann_with_gqa(call: Call) -> Call:
    return _redim(call, Hk=1, Hv=2)


def _neumann_with_state(call: Call) -> Call:
    g = geometry_of(call)
    return _with(call, recurrent_state=np.zeros((g.B, g.Hv, g.Dk, g.Dv), np.float32))


def _poke(name: str, value: float) -> Builder:
    """One element of ``name`` set to ``value`` (mid-tensor, in a later head and token: a scan must reach it)."""

    def build(call: Call) -> Call:
        x = call[name].copy()
        index = tuple(d - 1 if axis == 1 else d // 2 for axis, d in enumerate(x.shape))
        x[index] = value
        return _with(call, **{name: x})

    return build


@dataclass(frozen=True)
class RuleCase:
    """A rule paired with a builder of a call breaking it.

    Attributes:
        rule (Rule): the gdn_ref rule (id, API sentence, arguments, check).
        builder (Builder): valid call -> violating call; never mutates its input.
        doc (str): what the builder changes.
        algorithms (tuple[str, ...]): base algorithms the builder applies to (e.g. state rules need schur,
            since a supplied state under neumann already breaks ``neumann.no_state``).
        also (frozenset[str]): other rules the violating call necessarily breaks too (e.g. a wrong rank is
            also a wrong shape).
        needs_unequal_head_dims (bool): the builder breaks the rule only from a valid call with Dk ≠ Dv (a state
            transposed to [B, Hv, Dv, Dk] has the right shape when Dk == Dv).
    """

    rule: Rule
    builder: Builder
    doc: str
    algorithms: tuple[str, ...] = ALGORITHMS
    also: frozenset[str] = frozenset()
    needs_unequal_head_dims: bool = False

    @property
    def id(self) -> str:
        return self.rule.id

    def violation(self, bad_call: Call) -> Violation:
        """This rule's violation of ``bad_call``: it names the argument a rejection message must mention."""
        found = [v for v in check_inputs(**bad_call) if v.rule_id == self.rule.id]
        if not found:
            raise ValueError(f"builder of {self.rule.id} produced a call that rule accepts")
        return found[0]

    @property
    def host_only(self) -> bool:
        """The rule reads tensor contents, which a traced kernel cannot do."""
        return self.rule.id in HOST_ONLY_RULES

    def build(self, call: Call) -> Call:
        """The violating call built from ``call`` (a valid call of one of ``algorithms``)."""
        return self.builder(call)


SCHUR_ONLY = (ALGORITHM_SCHUR,)
NEUMANN_ONLY = (ALGORITHM_NEUMANN,)

_CASES: dict[str, tuple[Builder, str, tuple[str, ...], frozenset[str]]] = {
    "query.rank": (_drop_axis("query"), "query without its batch axis (3-D)", ALGORITHMS, frozenset()),
    "key.rank": (_drop_axis("key"), "key without its batch axis (3-D)", ALGORITHMS, frozenset()),
    "value.rank": (_drop_axis("value"), "value without its batch axis (3-D)", ALGORITHMS, frozenset()),
    "g_log.rank": (_drop_axis("g_log"), "g_log without its batch axis (2-D)", ALGORITHMS, frozenset()),
    "beta.rank": (_drop_axis("beta"), "beta without its batch axis (2-D)", ALGORITHMS, frozenset()),
    "mask_pack.rank": (
        _drop_axis("mask_pack"),
        "a single mask plane (2-D)",
        SCHUR_ONLY,
        frozenset({"mask_pack.shape"}),
    ),
    "recurrent_state.rank": (
        _drop_axis("recurrent_state"),
        "state without its batch axis (3-D)",
        SCHUR_ONLY,
        frozenset({"recurrent_state.shape"}),
    ),
    "query.dtype": (_compute_dtype_float16, "query, key and value all float16", ALGORITHMS, frozenset()),
    "key.dtype": (_other_compute_dtype("key"), "key in the other compute dtype", ALGORITHMS, frozenset()),
    "value.dtype": (_other_compute_dtype("value"), "value in the other compute dtype", ALGORITHMS, frozenset()),
    "g_log.dtype": (_astype("g_log", np.float64), "g_log float64 (numpy's default)", ALGORITHMS, frozenset()),
    "beta.dtype": (_astype("beta", np.float16), "beta float16", ALGORITHMS, frozenset()),
    "key.shape": (_half_tokens("key"), "key with half the tokens", ALGORITHMS, frozenset()),
    "head_dim.dq_eq_dk": (_query_head_dim_differs, "query head dim Dk/2", ALGORITHMS, frozenset()),
    "head_dim.max": (_head_dim_too_large, "Dv = 160 > 128", ALGORITHMS, frozenset()),
    "value.shape": (_half_tokens("value"), "value with half the tokens", ALGORITHMS, frozenset()),
    "heads.gqa_divisible": (_gqa_not_divisible, "Hk = 2, Hv = 3", SCHUR_ONLY, frozenset()),
    "g_log.shape": (_half_tokens("g_log"), "g_log with half the tokens", ALGORITHMS, frozenset()),
    "beta.shape": (_half_tokens("beta"), "beta with half the tokens", ALGORITHMS, frozenset()),
    "seq.divisible": (_seq_not_divisible, "S half a chunk past a multiple (schur: 192)", ALGORITHMS, frozenset()),
    "algorithm.known": (
        lambda c: _with(c, algorithm="Schur"),
        'algorithm="Schur" (case matters)',
        ALGORITHMS,
        frozenset(),
    ),
    "mask_pack.required": (lambda c: _with(c, mask_pack=None), "schur without a mask pack", SCHUR_ONLY, frozenset()),
    "mask_pack.shape": (lambda c: _with(c, mask_pack=build_mask_pack(64)), "a 64-token pack", SCHUR_ONLY, frozenset()),
    "mask_pack.dtype": (_astype("mask_pack", np.float64), "the pack as float64 (same values)", SCHUR_ONLY, frozenset()),
    "mask_pack.contents": (_mask_pack_contents, "tril_strict plane transposed", SCHUR_ONLY, frozenset()),
    "group_size.range": (lambda c: _with(c, group_size=0), "group_size = 0", ALGORITHMS, frozenset()),
    "scale.number": (lambda c: _with(c, scale=float("nan")), "scale = NaN", ALGORITHMS, frozenset()),
    "recurrent_state.shape": (_state_shape, "state transposed to [B, Hv, Dv, Dk]", SCHUR_ONLY, frozenset()),
    "recurrent_state.dtype": (_astype("recurrent_state", np.float16), "state float16", SCHUR_ONLY, frozenset()),
    "recurrent_state.writable": (_state_read_only, "a read-only state array", SCHUR_ONLY, frozenset()),
    "neumann.no_gqa": (_neumann_with_gqa, "neumann with Hk = 1, Hv = 2", NEUMANN_ONLY, frozenset()),
    "neumann.no_state": (_neumann_with_state, "neumann with a supplied zero state", NEUMANN_ONLY, frozenset()),
    # The value scans (host only): the contract requires a host entry point to reject these; a traced kernel
    # (content_checks=False) cannot read values, and what it computes from them is undefined.
    "g_log.domain": (_poke("g_log", 0.05), "one g_log = +0.05 (a decay above 1)", ALGORITHMS, frozenset()),
    "query.finite": (_poke("query", float("nan")), "one NaN in query", ALGORITHMS, frozenset()),
    "key.finite": (_poke("key", float("inf")), "one +Inf in key", ALGORITHMS, frozenset()),
    "value.finite": (_poke("value", float("-inf")), "one -Inf in value", ALGORITHMS, frozenset()),
    "beta.domain": (_poke("beta", 1.5), "one beta = 1.5 (an update strength above 1)", ALGORITHMS, frozenset()),
    "beta.finite": (_poke("beta", float("nan")), "one NaN in beta", ALGORITHMS, frozenset()),
    "recurrent_state.finite": (
        _poke("recurrent_state", float("nan")),
        "one NaN in the initial state",
        SCHUR_ONLY,
        frozenset(),
    ),
}

# Rules whose builder needs a valid call with Dk ≠ Dv (see RuleCase.needs_unequal_head_dims).
_NEEDS_UNEQUAL_HEAD_DIMS = frozenset({"recurrent_state.shape"})

RULE_CASES: tuple[RuleCase, ...] = tuple(
    RuleCase(rule, *_CASES[rule.id], needs_unequal_head_dims=rule.id in _NEEDS_UNEQUAL_HEAD_DIMS)
    for rule in RULES
    if rule.id in _CASES
)
"""One RuleCase per rule of ``gdn_ref.contract.RULES``, in rule order."""

MISSING_BUILDERS = tuple(rule.id for rule in RULES if rule.id not in _CASES)
"""Rules without a builder; the self-tests require this to be empty."""
