"""The documented ``gdn_cte`` contract as data: one rule per sentence of the API reference.

Every implementation of this package family checks a call with :func:`enforce` before it reads or writes
anything, so a rejected call changes nothing. gdn-spec turns the same rules into conformance tests (it adds a
violation builder per rule); gdn-nki runs them at trace time. The checks only need ``.shape`` and ``.dtype``
of each tensor, so they work on numpy arrays and on NKI tensors alike.

A message names the argument, the value, the rule and the fix, e.g.::

    gdn_cte: `beta` dtype bfloat16 violates [beta.dtype] beta must be float32 (per-token update strength
    in (0, 1) in HBM, fp32). Fix: pass beta.astype(np.float32).
"""

from __future__ import annotations

import functools
import itertools
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, ParamSpec, TypeVar

import numpy as np

from .constants import (
    ALGORITHM_NEUMANN,
    ALGORITHM_SCHUR,
    ALGORITHMS,
    CHUNK_BY_ALGORITHM,
    CHUNK_SCHUR,
    COMPUTE_DTYPES,
    MAX_GROUP_SIZE,
    MAX_HEAD_DIM,
    MIN_GROUP_SIZE,
)
from .masks import N_MASKS, build_mask_pack

P = ParamSpec("P")
R = TypeVar("R")

ARGUMENTS = (
    "query",
    "key",
    "value",
    "g_log",
    "beta",
    "scale",
    "algorithm",
    "mask_pack",
    "group_size",
    "recurrent_state",
)
TENSOR_RANKS = {"query": 4, "key": 4, "value": 4, "g_log": 3, "beta": 3, "mask_pack": 3, "recurrent_state": 4}


class ContractError(ValueError):
    """A call broke the documented gdn_cte contract; ``violations`` lists every broken rule, and ``entry_point``
    (when set) is the function the caller called, which the message names (``names_entry_point``)."""

    def __init__(self, violations: list[Violation], entry_point: str | None = None):
        self.violations = violations
        self.entry_point = entry_point
        super().__init__(rejection_message(violations, entry_point))

    def naming(self, entry_point: str) -> ContractError:
        """The same rejection, naming ``entry_point`` as the function the caller called."""
        return ContractError(self.violations, entry_point)

    @property
    def sequences(self) -> list[int]:
        """The packed sequences (or decode requests) whose own values broke a rule, ascending: what a server drops
        from the batch before it launches the rest (empty when a violation concerns the whole call)."""
        return sorted({v.sequence for v in self.violations if v.sequence is not None})


def rejection_message(violations: list[Violation], entry_point: str | None = None) -> str:
    """The text of a rejected call: who rejected it, how many rules broke, then each violation (argument, value,
    rule, fix).

    Args:
        violations (list[Violation]): the broken rules.
        entry_point (str | None): the function the caller called (e.g. ``gdn_nki.prefill_varlen``), which then
            heads the message, and each line is its violation alone. None: the contract of the first violation
            (``Violation.api``: gdn_cte, gdn_tkg or gdn_step) heads it, and each line starts with its own contract.
    """
    lines = "\n".join(f"  - {v if entry_point is None else v.text}" for v in violations)
    who = entry_point or (violations[0].api if violations else "gdn_cte")
    return f"{who} rejected the call ({len(violations)} violation(s)); nothing was written:\n{lines}"


def names_entry_point(entry_point: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate a public entry point so that its rejections name it: a ``ContractError`` raised inside — by its own
    checks, or by an entry point or kernel check it calls — leaves it naming ``entry_point``, the function the
    caller called (the outermost decorated function wins), with the same violations and traceback.

    Args:
        entry_point (str): the name the caller knows, e.g. "gdn_nki.prefill_varlen".
    """

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def named(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return fn(*args, **kwargs)
            except ContractError as error:
                raise error.naming(entry_point).with_traceback(error.__traceback__) from None

        return named

    return decorate


@dataclass(frozen=True)
class Violation:
    """One broken rule: which argument, what it was, the rule, and how to fix the call."""

    rule_id: str
    argument: str
    value: str
    rule: str
    fix: str
    api: str = "gdn_cte"  # whose contract: gdn_cte, or the decode entry points gdn_tkg and gdn_step (below)
    sequence: int | None = None  # the packed sequence (decode request) whose values broke the rule, if one did

    def __str__(self) -> str:
        return f"{self.api}: {self.text}"

    @property
    def text(self) -> str:
        """The violation without its contract's name: argument, value, rule id, rule and fix."""
        return f"`{self.argument}` {self.value} violates [{self.rule_id}] {self.rule}. Fix: {self.fix}"


def is_integer(x: Any) -> bool:
    """``x`` is an int as a documented int argument takes one: Python's or numpy's (any ``numbers.Integral``), never
    a bool (``True`` is an int to Python, but a flag passed where a count belongs is a mistake)."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def plain_int(x: Any) -> Any:
    """``x`` as a Python int when it is an integer (``is_integer``: ``np.int64(128)`` -> ``128``), anything else
    unchanged, for the rules to report. What a host hands a kernel: trace-time arithmetic and a compile's key
    (torch-neuronx keys on non-tensor values) take Python ints, so a numpy integer must not reach them."""
    return int(x) if is_integer(x) else x


def dtype_name(dtype: Any) -> str:
    """Canonical dtype name ("float32", "bfloat16", ...) of a numpy / ml_dtypes dtype or an NKI dtype object.

    Read explicitly, in this order, because a traced kernel hands ``validate`` the real NKI's tensor handles, whose
    ``.dtype`` is an NKI dtype object (or a name string such as ``"bfloat16"`` or ``"nki.language.bfloat16"``), not
    a numpy dtype:

    1. a ``numpy.dtype``, or a numpy / ml_dtypes scalar type: ``numpy.dtype(x).name`` (nki-cpu's ``nl`` dtypes are
       numpy dtypes);
    2. a string: its last dotted component;
    3. any other object: its ``name`` attribute if it is a string, else ``str(x)``, last dotted component.
    """
    if isinstance(dtype, np.dtype):
        return dtype.name
    if isinstance(dtype, type) and issubclass(dtype, np.generic):
        return np.dtype(dtype).name
    name = dtype if isinstance(dtype, str) else getattr(dtype, "name", None)
    if not isinstance(name, str):
        name = str(dtype)
    return name.rsplit(".", 1)[-1]


def _shape(x: Any) -> tuple[int, ...] | None:
    shape = getattr(x, "shape", None)
    return None if shape is None else tuple(int(d) for d in shape)


@dataclass(frozen=True)
class Arguments:
    """One gdn_cte call's arguments exactly as passed (``ARGUMENTS``, in order): the one bundle the entry points
    hand each other instead of spelling the ten out."""

    query: Any
    key: Any
    value: Any
    g_log: Any
    beta: Any
    scale: Any
    algorithm: Any
    mask_pack: Any
    group_size: Any
    recurrent_state: Any

    def astuple(self) -> tuple[Any, ...]:
        """The arguments in ``ARGUMENTS`` order (positional form of ``gdn_cte``)."""
        return tuple(getattr(self, name) for name in ARGUMENTS)

    def as_kwargs(self) -> dict[str, Any]:
        """The arguments by name (keyword form of ``gdn_cte``)."""
        return {name: getattr(self, name) for name in ARGUMENTS}

    def replace(self, **changes: Any) -> Arguments:
        """A copy with some arguments replaced (e.g. padded tensors, a staged state)."""
        return replace(self, **changes)

    def violations(self, *, host: bool = True, values: bool = True) -> list[Violation]:
        """``validate`` of these arguments."""
        return validate(*self.astuple(), host=host, values=values)


class Call:
    """A gdn_cte call's arguments plus the dimensions they imply (None where they cannot be read)."""

    def __init__(self, args: dict[str, Any]):
        self.args = args
        q, v = _shape(args["query"]), _shape(args["value"])
        q_ok, v_ok = q is not None and len(q) == 4, v is not None and len(v) == 4
        self.B, self.Hk, self.S, self.Dk = q if q_ok else (None,) * 4
        self.Hv, self.Dv = (v[1], v[3]) if v_ok else (None, None)

    def shape(self, name: str) -> tuple[int, ...] | None:
        return _shape(self.args[name])

    def dtype(self, name: str) -> str | None:
        x = self.args[name]
        return None if getattr(x, "dtype", None) is None else dtype_name(x.dtype)

    def has_rank(self, name: str) -> bool:
        shape = self.shape(name)
        return shape is not None and len(shape) == TENSOR_RANKS[name]

    @property
    def algorithm(self) -> str | None:
        algo = self.args["algorithm"]
        return algo if isinstance(algo, str) and algo in ALGORITHMS else None


Check = Callable[[Call], "Violation | None"]


@dataclass(frozen=True)
class Rule:
    """A documented rule: id, the API-reference sentence it comes from, the arguments it constrains, a check."""

    id: str
    sentence: str
    arguments: tuple[str, ...]
    check: Check


def _violation(rule_id: str, argument: str, value: str, rule: str, fix: str) -> Violation:
    return Violation(rule_id, argument, value, rule, fix)


# --- rule checks: each returns a Violation or None, and stays silent when a prerequisite is already broken ---


def _rank_holds(call: Call, name: str) -> bool:
    """The tensor has its documented rank and no empty dimension (the ``{name}.rank`` rule holds)."""
    shape = call.shape(name)
    return shape is not None and len(shape) == TENSOR_RANKS[name] and all(d > 0 for d in shape)


def _rank_rule(name: str, layout: str) -> Check:
    def check(call: Call) -> Violation | None:
        x = call.args[name]
        if x is None and name in ("mask_pack", "recurrent_state"):
            return None
        if _rank_holds(call, name):
            return None
        shape = _shape(x)
        value = f"of type {type(x).__name__}" if shape is None else f"shape {shape}"
        return _violation(
            f"{name}.rank",
            name,
            value,
            f"{name} must be a non-empty {TENSOR_RANKS[name]}-D tensor {layout}",
            f"pass {name} laid out as {layout} with every dimension >= 1",
        )

    return check


def _query_dtype(call: Call) -> Violation | None:
    dt = call.dtype("query")
    if dt is None or dt in COMPUTE_DTYPES:
        return None
    return _violation(
        "query.dtype",
        "query",
        f"dtype {dt}",
        f"query's dtype sets the compute dtype and must be one of {COMPUTE_DTYPES}",
        "cast query, key and value to bfloat16 (or float32)",
    )


def _same_dtype_as_query(name: str) -> Check:
    def check(call: Call) -> Violation | None:
        dq, dx = call.dtype("query"), call.dtype(name)
        if dq is None or dx is None or dq == dx:
            return None
        return _violation(
            f"{name}.dtype",
            name,
            f"dtype {dx}",
            f"{name} must have query's dtype ({dq})",
            f"pass {name}.astype(query.dtype)",
        )

    return check


def _fp32_rule(name: str, what: str) -> Check:
    def check(call: Call) -> Violation | None:
        if call.args[name] is None:
            return None
        dt = call.dtype(name)
        if dt is None or dt == "float32":
            return None
        return _violation(
            f"{name}.dtype", name, f"dtype {dt}", f"{name} must be float32 ({what})", f"pass {name}.astype(np.float32)"
        )

    return check


def _key_shape(call: Call) -> Violation | None:
    if not (call.has_rank("query") and call.has_rank("key")):
        return None
    q, k = call.shape("query"), call.shape("key")
    if q[:3] == k[:3]:
        return None
    return _violation(
        "key.shape",
        "key",
        f"shape {k}",
        f"key must be [B, Hk, S, Dk] with query's B, Hk, S = {q[:3]}",
        "pass key and query for the same batch, key heads and tokens",
    )


def _dq_equals_dk(call: Call) -> Violation | None:
    if not (call.has_rank("query") and call.has_rank("key")):
        return None
    dq, dk = call.shape("query")[3], call.shape("key")[3]
    if dq == dk:
        return None
    return _violation(
        "head_dim.dq_eq_dk",
        "key",
        f"head dim Dk={dk} (query Dq={dq})",
        "Dq must equal Dk (they contract)",
        "project query and key to the same head dimension",
    )


def _head_dim_max(call: Call) -> Violation | None:
    for name, axis, label in (("key", 3, "Dk"), ("value", 3, "Dv")):
        if call.has_rank(name) and call.shape(name)[axis] > MAX_HEAD_DIM:
            d = call.shape(name)[axis]
            return _violation(
                "head_dim.max",
                name,
                f"head dim {label}={d}",
                f"Dk, Dv must be <= MAX_HEAD_DIM={MAX_HEAD_DIM}",
                f"split the head dimension into pieces of at most {MAX_HEAD_DIM}",
            )
    return None


def _value_shape(call: Call) -> Violation | None:
    if not (call.has_rank("query") and call.has_rank("value")):
        return None
    v = call.shape("value")
    if (v[0], v[2]) == (call.B, call.S):
        return None
    return _violation(
        "value.shape",
        "value",
        f"shape {v}",
        f"value must be [B, Hv, S, Dv] with query's B={call.B} and S={call.S}",
        "pass value for the same batch and tokens as query",
    )


def _gqa_divisible(call: Call) -> Violation | None:
    if not (_rank_holds(call, "query") and _rank_holds(call, "value")) or call.Hv % call.Hk == 0:
        return None
    return _violation(
        "heads.gqa_divisible",
        "value",
        f"Hv={call.Hv} with Hk={call.Hk}",
        "Hv must be divisible by Hk; value head h reads key/query head h // (Hv//Hk)",
        "use a value head count that is a multiple of the key head count",
    )


def _per_token_shape(name: str) -> Check:
    def check(call: Call) -> Violation | None:
        if call.Hv is None or call.B is None or not call.has_rank(name):
            return None
        expected = (call.B, call.Hv, call.S)
        if call.shape(name) == expected:
            return None
        return _violation(
            f"{name}.shape",
            name,
            f"shape {call.shape(name)}",
            f"{name} must be [B, Hv, S] = {expected} (one value per value head and token)",
            f"pass {name} per value head, shaped {expected}",
        )

    return check


def _seq_divisible(call: Call) -> Violation | None:
    algo = call.algorithm
    if algo is None or call.S is None:
        return None
    chunk = CHUNK_BY_ALGORITHM[algo]
    if call.S % chunk == 0:
        return None
    return _violation(
        "seq.divisible",
        "query",
        f"sequence length S={call.S}",
        f'S must be divisible by {chunk} for algorithm="{algo}"',
        f"pad S up to {-(-call.S // chunk) * chunk} with tokens of g_log = 0 and beta = 0 (exact: they neither "
        "decay nor write the state) and drop their outputs (gdn_nki.prefill does this for you)"
        + (' or use algorithm="neumann" (S % 64)' if algo == ALGORITHM_SCHUR and call.S % 64 == 0 else ""),
    )


def _algorithm_known(call: Call) -> Violation | None:
    algo = call.args["algorithm"]
    if isinstance(algo, str) and algo in ALGORITHMS:
        return None
    return _violation(
        "algorithm.known",
        "algorithm",
        f"value {algo!r}",
        f"algorithm must be one of {ALGORITHMS}",
        'pass algorithm="schur" (default) or algorithm="neumann"',
    )


def _mask_pack_required(call: Call) -> Violation | None:
    if call.algorithm != ALGORITHM_SCHUR or call.args["mask_pack"] is not None:
        return None
    return _violation(
        "mask_pack.required",
        "mask_pack",
        "None",
        'mask_pack is REQUIRED by algorithm="schur"',
        "pass mask_pack=build_mask_pack()",
    )


def _mask_pack_shape(call: Call) -> Violation | None:
    pack = call.args["mask_pack"]
    expected = (N_MASKS, CHUNK_SCHUR, CHUNK_SCHUR)
    if pack is None or _shape(pack) is None or _shape(pack) == expected:
        return None
    return _violation(
        "mask_pack.shape",
        "mask_pack",
        f"shape {_shape(pack)}",
        f"mask_pack must be [N_MASKS, CHUNK, CHUNK] = {expected}",
        "pass mask_pack=build_mask_pack()",
    )


def _mask_pack_contents(call: Call) -> Violation | None:
    pack = call.args["mask_pack"]
    if not isinstance(pack, np.ndarray) or pack.shape != (N_MASKS, CHUNK_SCHUR, CHUNK_SCHUR):
        return None
    bad = [p for p in range(N_MASKS) if not np.array_equal(pack[p], _expected_pack()[p])]
    if not bad:
        return None
    return _violation(
        "mask_pack.contents",
        "mask_pack",
        f"planes {bad} differing from build_mask_pack()",
        "mask_pack must hold exactly the planes build_mask_pack() builds",
        "rebuild it with mask_pack=build_mask_pack() and do not modify it",
    )


_PACK_CACHE: list[np.ndarray] = []


def _expected_pack() -> np.ndarray:
    if not _PACK_CACHE:
        _PACK_CACHE.append(build_mask_pack())
    return _PACK_CACHE[0]


def _group_size_range(call: Call) -> Violation | None:
    gs = call.args["group_size"]
    if is_integer(gs) and MIN_GROUP_SIZE <= gs <= MAX_GROUP_SIZE:
        return None
    return _violation(
        "group_size.range",
        "group_size",
        f"value {gs!r}",
        f"group_size must be an int in [{MIN_GROUP_SIZE}, {MAX_GROUP_SIZE}] (chunks per grouped inverse)",
        "pass group_size=8 (the default)",
    )


def _scale_number(call: Call) -> Violation | None:
    scale = call.args["scale"]
    if isinstance(scale, numbers.Real) and not isinstance(scale, bool) and np.isfinite(float(scale)):
        return None
    return _violation(
        "scale.number",
        "scale",
        f"value {scale!r}",
        "scale must be a finite real number, applied on device (typically 1/sqrt(Dk))",
        "pass scale=Dk ** -0.5",
    )


def _state_shape(call: Call) -> Violation | None:
    state = call.args["recurrent_state"]
    if state is None or call.B is None or call.Hv is None or _shape(state) is None:
        return None
    dk = call.shape("key")[3] if call.has_rank("key") else call.Dk
    expected = (call.B, call.Hv, dk, call.Dv)
    if _shape(state) == expected:
        return None
    return _violation(
        "recurrent_state.shape",
        "recurrent_state",
        f"shape {_shape(state)}",
        f"recurrent_state must be [B, Hv, Dk, Dv] = {expected}",
        f"allocate it as np.zeros({expected}, np.float32) or pass None",
    )


def _state_writable(call: Call) -> Violation | None:
    state = call.args["recurrent_state"]
    flags = getattr(state, "flags", None)
    if flags is None or flags.writeable:
        return None
    return _violation(
        "recurrent_state.writable",
        "recurrent_state",
        "a read-only array",
        "recurrent_state is updated IN PLACE, so it must be writable",
        "pass a writable array (e.g. a copy) or None",
    )


def _neumann_no_gqa(call: Call) -> Violation | None:
    if call.algorithm != ALGORITHM_NEUMANN or call.Hk is None or call.Hv is None or call.Hk == call.Hv:
        return None
    return _violation(
        "neumann.no_gqa",
        "value",
        f"Hv={call.Hv} with Hk={call.Hk}",
        '"neumann" requires Hk == Hv (no head sharing)',
        'repeat the key/query heads to Hv, or use algorithm="schur"',
    )


def _neumann_no_state(call: Call) -> Violation | None:
    if call.algorithm != ALGORITHM_NEUMANN or call.args["recurrent_state"] is None:
        return None
    return _violation(
        "neumann.no_state",
        "recurrent_state",
        "a supplied state",
        '"neumann" supports ONLY the omitted recurrent_state form',
        'pass recurrent_state=None, or use algorithm="schur" to resume from a state',
    )


# --- value rules: they read tensor contents, so only the host runs them (HOST_ONLY_RULES, VALUE_RULES) ---

# Elements scanned per step: the scan's temporaries stay ~4 MB however large the tensor.
SCAN_BLOCK = 1 << 20
# Exponent bits of the dtypes a valid call can carry: all set means ±Inf or NaN. Testing the bits of an integer
# view is ~5× faster than np.isfinite on ml_dtypes' bfloat16 and 1.5× on float32 (measured, README).
_EXPONENT_BITS = {"float32": (np.uint32, 0x7F800000), "bfloat16": (np.uint16, 0x7F80)}


def _nonfinite(block: np.ndarray) -> np.ndarray:
    bits = _EXPONENT_BITS.get(dtype_name(block.dtype))
    if bits is None:
        return ~np.isfinite(block)
    view, exponent = bits
    return (block.view(view) & exponent) == exponent


def _outside_log_decay(block: np.ndarray) -> np.ndarray:
    return ~(block <= 0)  # one comparison rejects both NaN and g > 0; −inf passes


def _outside_update_strength(block: np.ndarray) -> np.ndarray:
    # Finite values only: NaN and ±Inf are beta.finite's to report (one violation per bad element).
    with np.errstate(invalid="ignore"):
        return ((block < 0) | (block > 1)) & ~_nonfinite(block)


def first_bad_index(x: np.ndarray, bad: Callable[[np.ndarray], np.ndarray]) -> tuple[int, ...] | None:
    """Index of the first element (C order) where ``bad`` holds, scanned in blocks; None when there is none.

    Args:
        x (np.ndarray): the tensor to scan (any layout; a non-contiguous one is copied block by block).
        bad (Callable): elementwise predicate on a 1-D block of ``x``, returning a bool array.

    Returns:
        tuple[int, ...] | None: the multi-index into ``x`` of the first offending element.
    """
    flat = x.reshape(-1)
    for lo in range(0, flat.size, SCAN_BLOCK):
        hits = bad(np.ascontiguousarray(flat[lo : lo + SCAN_BLOCK]))
        if hits.any():
            return tuple(int(i) for i in np.unravel_index(lo + int(np.argmax(hits)), x.shape))
    return None


@dataclass(frozen=True)
class ValueScan:
    """A value rule's scan of one argument: the test of a bad element, and the rule's text and fix."""

    rule_id: str
    argument: str
    bad: Callable[[np.ndarray], np.ndarray]
    rule: str
    fix: str

    def first(self, x: np.ndarray, origin: Sequence[int] = (), sequence: int | None = None) -> Violation | None:
        """The violation naming ``x``'s first bad element (C order, in the caller's layout), or None.

        Args:
            x (np.ndarray): the tensor, or a window of it (a packed sequence's tokens).
            origin (Sequence[int]): where the window starts in the caller's tensor, added to the index so that it
                stays the caller's (e.g. ``(0, 0, start)`` for a sequence's tokens along axis 2); () for all of it.
            sequence (int | None): the packed sequence (or decode request) the window is, named in the value and
                kept on the violation (``ContractError.sequences``).
        """
        where = first_bad_index(x, self.bad)
        if where is None:
            return None
        at = [int(i) + int(o) for i, o in itertools.zip_longest(where, origin, fillvalue=0)]
        of = "" if sequence is None else f" (sequence {sequence})"
        return Violation(self.rule_id, self.argument, f"value {float(x[where])} at index {at}{of}", self.rule,
                         self.fix, sequence=sequence)  # fmt: skip


def _value_rule(scan: ValueScan) -> Check:
    """A check scanning ``scan.argument``'s contents; silent unless its rank, shape and dtype rules hold."""
    name = scan.argument

    def check(call: Call) -> Violation | None:
        x = call.args[name]
        if not isinstance(x, np.ndarray) or not _rank_holds(call, name):
            return None
        prerequisites = (f"{name}.shape", f"{name}.dtype", "query.dtype")
        if any(pid in RULES_BY_ID and RULES_BY_ID[pid].check(call) is not None for pid in prerequisites):
            return None
        return scan.first(x)

    return check


_FINITE_WHY = {
    "query": "L2-normalized query",
    "key": "L2-normalized key",
    "value": "value tensor",
    "beta": "per-token update strength",
    "recurrent_state": "initial state",
}


def _finite_scan(name: str) -> ValueScan:
    return ValueScan(
        f"{name}.finite",
        name,
        _nonfinite,
        f"{name} ({_FINITE_WHY[name]}) must hold finite numbers: NaN and ±Inf reach every later token through the "
        "state, and earlier tokens of the same chunk through the intra-chunk solve",
        f"find where the producer of {name} overflowed or divided by zero (the index above)",
    )


def _finite_rule(name: str) -> Rule:
    return Rule(
        f"{name}.finite",
        "Every input is a finite number (a NaN or Inf would spread through the chunk and the state)",
        (name,),
        _value_rule(VALUE_SCANS[f"{name}.finite"]),
    )


# The gate domains' rule and fix texts, shared by gdn_cte's rules and the decode step's gates (``_step_gates``).
_G_LOG_DOMAIN_TEXT = (
    "g_log must be a log-decay <= 0 and not NaN (-inf is allowed: decay exactly 0, a state reset)",
    "pass the log of the decay (e.g. -exp(A_log)*softplus(a + dt_bias)); check g_log and beta were not swapped",
)
_BETA_DOMAIN_TEXT = (
    "beta is a per-token update strength in [0, 1] (the spec's (0, 1), with the 0 and 1 an fp32 sigmoid "
    "rounds to); beta > 1 (negative-eigenvalue delta rules reach 2) is outside this kernel's contract",
    "pass sigmoid(b) of the layer's beta projection; check g_log and beta were not swapped",
)

# Every value rule's scan, in the rules' order: the rules below run them whole, and a packed launch per sequence
# (``gdn_ref.packed.sequence_value_violations``).
VALUE_SCANS: dict[str, ValueScan] = {
    scan.rule_id: scan
    for scan in (
        ValueScan("g_log.domain", "g_log", _outside_log_decay, *_G_LOG_DOMAIN_TEXT),
        ValueScan("beta.domain", "beta", _outside_update_strength, *_BETA_DOMAIN_TEXT),
        *(_finite_scan(name) for name in _FINITE_WHY),
    )
}

G_LOG_DOMAIN = Rule(
    "g_log.domain",
    "Per-token log-decay (negative) in HBM, fp32.",
    ("g_log",),
    _value_rule(VALUE_SCANS["g_log.domain"]),
)

# The spec's (0, 1) with its end points: an fp32 sigmoid rounds to exactly 1 from x ≈ 17 and to 0 far below
# (x ≲ −88 to −104, by formula), and a padding token (gdn_nki.cte.plan) carries β = 0, a token that writes nothing.
# β > 1 (FLA's allow_neg_eigval reaches 2) is outside the contract the kernels' precision is tested for.
BETA_DOMAIN = Rule(
    "beta.domain",
    "Per-token update strength in (0, 1) in HBM, fp32.",
    ("beta",),
    _value_rule(VALUE_SCANS["beta.domain"]),
)

LAYOUTS = {
    "query": "[B, Hk, S, Dk]",
    "key": "[B, Hk, S, Dk]",
    "value": "[B, Hv, S, Dv]",
    "g_log": "[B, Hv, S]",
    "beta": "[B, Hv, S]",
    "mask_pack": "[N_MASKS, CHUNK, CHUNK]",
    "recurrent_state": "[B, Hv, Dk, Dv]",
}

RULES: tuple[Rule, ...] = (
    *(
        Rule(f"{n}.rank", f":param {n}: {LAYOUTS[n]}", (n,), _rank_rule(n, LAYOUTS[n]))
        for n in ("query", "key", "value", "g_log", "beta", "mask_pack", "recurrent_state")
    ),
    Rule(
        "query.dtype",
        "ITS DTYPE SETS THE COMPUTE DTYPE -- matmul operands, q/k/v tiles and `out`.",
        ("query",),
        _query_dtype,
    ),
    Rule(
        "key.dtype",
        "Key tensor in HBM, TOKEN-major, L2-normalized, same dtype as `query`.",
        ("key",),
        _same_dtype_as_query("key"),
    ),
    Rule("value.dtype", "Value tensor in HBM, same dtype as `query`.", ("value",), _same_dtype_as_query("value")),
    Rule(
        "g_log.dtype",
        "Per-token log-decay (negative) in HBM, fp32.",
        ("g_log",),
        _fp32_rule("g_log", "per-token log-decay in HBM, fp32"),
    ),
    Rule(
        "beta.dtype",
        "Per-token update strength in (0, 1) in HBM, fp32.",
        ("beta",),
        _fp32_rule("beta", "per-token update strength in (0, 1) in HBM, fp32"),
    ),
    Rule("key.shape", ":param key: [B, Hk, S, Dk]", ("key",), _key_shape),
    Rule("head_dim.dq_eq_dk", "Dq must equal Dk (they contract)", ("key",), _dq_equals_dk),
    Rule("head_dim.max", "Dk, Dv <= MAX_HEAD_DIM=128.", ("key", "value"), _head_dim_max),
    Rule("value.shape", ":param value: [B, Hv, S, Dv]", ("value",), _value_shape),
    Rule(
        "heads.gqa_divisible",
        "Hv must be divisible by Hk; value head h reads key/query head h // (Hv//Hk).",
        ("value",),
        _gqa_divisible,
    ),
    Rule("g_log.shape", ":param g_log: [B, Hv, S]", ("g_log",), _per_token_shape("g_log")),
    Rule("beta.shape", ":param beta: [B, Hv, S]", ("beta",), _per_token_shape("beta")),
    Rule(
        "seq.divisible",
        'S must be divisible by 128 for "schur" and by 64 for "neumann". This dispatcher enforces only the selected algorithm\'s constraint.',
        ("query",),
        _seq_divisible,
    ),
    Rule(
        "algorithm.known",
        'Intra-chunk inverse to use, "schur" (default) or "neumann".',
        ("algorithm",),
        _algorithm_known,
    ),
    Rule(
        "mask_pack.required",
        'REQUIRED by "schur"; build it with build_mask_pack().',
        ("mask_pack",),
        _mask_pack_required,
    ),
    Rule(
        "mask_pack.shape",
        ":param mask_pack: [N_MASKS, CHUNK, CHUNK] fp32 mask pack in HBM.",
        ("mask_pack",),
        _mask_pack_shape,
    ),
    Rule(
        "mask_pack.dtype",
        ":param mask_pack: [N_MASKS, CHUNK, CHUNK] fp32 mask pack in HBM.",
        ("mask_pack",),
        _fp32_rule("mask_pack", "the mask pack is fp32"),
    ),
    Rule("mask_pack.contents", "build it with build_mask_pack().", ("mask_pack",), _mask_pack_contents),
    Rule(
        "group_size.range",
        ':param group_size: Chunks per grouped inverse for "schur".',
        ("group_size",),
        _group_size_range,
    ),
    Rule(
        "scale.number",
        ":param scale: Query scaling, typically 1/sqrt(Dk). Applied ON DEVICE.",
        ("scale",),
        _scale_number,
    ),
    Rule("recurrent_state.shape", ":param recurrent_state: [B, Hv, Dk, Dv] fp32", ("recurrent_state",), _state_shape),
    Rule(
        "recurrent_state.dtype",
        "The recurrent state is fp32 whatever the compute dtype",
        ("recurrent_state",),
        _fp32_rule("recurrent_state", "the recurrent state is always fp32"),
    ),
    Rule(
        "recurrent_state.writable",
        "Supplied, it is aliased to the second output, updated IN PLACE",
        ("recurrent_state",),
        _state_writable,
    ),
    Rule("neumann.no_gqa", '"neumann" additionally requires Hk == Hv (no head sharing).', ("value",), _neumann_no_gqa),
    Rule("neumann.no_state", '"neumann" supports ONLY the omitted form.', ("recurrent_state",), _neumann_no_state),
    G_LOG_DOMAIN,
    BETA_DOMAIN,
    *(_finite_rule(n) for n in ("query", "key", "value", "beta", "recurrent_state")),
)
RULES_BY_ID = {rule.id: rule for rule in RULES}
# Rules that need the tensor contents, not just shape and dtype; a traced kernel cannot run them.
# Rules that scan every element of an input: what ``values=False`` skips (the caller then guarantees its data).
VALUE_RULES = frozenset({"g_log.domain", "beta.domain", *(f"{n}.finite" for n in _FINITE_WHY)})
HOST_ONLY_RULES = frozenset({"mask_pack.contents", "recurrent_state.writable"}) | VALUE_RULES


def validate(
    query: Any,
    key: Any,
    value: Any,
    g_log: Any,
    beta: Any,
    scale: Any = 1.0,
    algorithm: Any = ALGORITHM_SCHUR,
    mask_pack: Any = None,
    group_size: Any = 8,
    recurrent_state: Any = None,
    *,
    host: bool = True,
    values: bool = True,
) -> list[Violation]:
    """Check a gdn_cte call against every documented rule; return all violations (empty list = valid).

    Args:
        query, key, value, g_log, beta, scale, algorithm, mask_pack, group_size, recurrent_state: the call,
            exactly as passed to ``gdn_cte``; tensors need only ``.shape`` and ``.dtype``.
        host (bool): also run the rules that read tensor contents (``HOST_ONLY_RULES``); False at trace time.
        values (bool): with ``host``, also scan every element (``VALUE_RULES``: g_log <= 0 and not NaN, every
            other input finite). The scan reads each input once (about 20 ms per 16M-element bf16/fp32
            tensor, README); pass False only when the caller guarantees its data.

    Returns:
        list[Violation]: every broken rule, in rule order. Rules whose prerequisites are already broken stay silent.
    """
    call = Call(
        dict(
            zip(
                ARGUMENTS,
                (query, key, value, g_log, beta, scale, algorithm, mask_pack, group_size, recurrent_state),
                strict=True,
            )
        )
    )
    skipped = (frozenset() if values else VALUE_RULES) if host else HOST_ONLY_RULES
    rules = tuple(r for r in RULES if r.id not in skipped)
    return [v for v in (rule.check(call) for rule in rules) if v is not None]


def enforce(*args: Any, **kwargs: Any) -> None:
    """Raise :class:`ContractError` listing every violation of :func:`validate`; return None if the call is valid."""
    violations = validate(*args, **kwargs)
    if violations:
        raise ContractError(violations)


def check_values(
    query: Any, key: Any, value: Any, g_log: Any, beta: Any, recurrent_state: Any = None
) -> list[Violation]:
    """Only the element scans (``VALUE_RULES``): the one place any entry point checks the inputs' values.

    Dimensions:
        As ``gdn_cte``: query/key [B, Hk, S, Dk], value [B, Hv, S, Dv], g_log/beta [B, Hv, S], state
        [B, Hv, Dk, Dv].

    Args:
        query, key, value, g_log, beta, recurrent_state: numpy arrays (bfloat16 through ml_dtypes); a tensor
            of another kind must be viewed as numpy first (e.g. ``t.cpu().view(torch.int16).numpy()``
            viewed back as ``ml_dtypes.bfloat16``).

    Returns:
        list[Violation]: g_log > 0 or NaN, and any NaN/±Inf in the other tensors, each with the argument and
        the index of its first offending element. g_log = -inf passes: it is a reset (decay exactly 0).

    Notes:
        Each tensor is read once, in blocks of ``SCAN_BLOCK`` elements; a tensor whose rank, shape or dtype is
        wrong is not scanned (its own rule reports it). Cost measured in the README.
    """
    call = Call(
        dict(
            zip(
                ARGUMENTS,
                (query, key, value, g_log, beta, 1.0, ALGORITHM_SCHUR, None, 8, recurrent_state),
                strict=True,
            )
        )
    )
    return [v for v in (RULES_BY_ID[rid].check(call) for rid in _VALUE_RULE_ORDER) if v is not None]


_VALUE_RULE_ORDER = tuple(r.id for r in RULES if r.id in VALUE_RULES)


# --- decode: ``gdn_tkg`` (AWS's fused single-token step) and ``gdn_step`` (the serving step on a state pool) ---
#
# Their tensors are described by layout specs: dimension symbols (a symbol names one size across the call) and a
# dtype class. One generic check turns a spec into the rank / shape / dtype rules, so every message names the
# argument, its value, the expected layout and the fix, exactly as gdn_cte's do.

TKG = "gdn_tkg"
STEP = "gdn_step"
INDEX_DTYPE = "int32"  # the dtype of index tensors a kernel reads with nki.isa.scalar_load (int32 or int64)
PADDING_INDEX = -1  # a request whose state row is -1 is padding: nothing of it is read or written


@dataclass(frozen=True)
class TensorSpec:
    """One tensor argument of a decode entry point: its layouts (dimension symbols; several = alternatives by
    rank), its dtype class ("compute" = float32/bfloat16 and the first compute tensor's, else a dtype name) and
    whether it may be omitted (None)."""

    layouts: tuple[tuple[str, ...], ...]
    dtype: str
    why: str
    optional: bool = False


def _spec(dims: str, dtype: str, why: str, optional: bool = False) -> TensorSpec:
    return TensorSpec(tuple(tuple(d.split()) for d in dims.split("|")), dtype, why, optional)


TKG_SPECS: dict[str, TensorSpec] = {
    "q": _spec("BH K", "compute", "RAW query, GQA-expanded, not l2-normed"),
    "k": _spec("BH K", "compute", "RAW key, GQA-expanded, not l2-normed"),
    "v": _spec("BH V", "compute", "value"),
    "b": _spec("BH", "float32", "RAW beta pre-sigmoid"),
    "a": _spec("BH", "float32", "RAW gate input (pre-softplus)"),
    "A_log": _spec("Hv", "float32", "per-v-head log decay coefficient"),
    "dt_bias": _spec("Hv", "float32", "per-v-head softplus bias"),
    "z": _spec("BH V", "compute", "output gate of the gated RMSNorm"),
    "norm_weight": _spec("V", "float32", "RMSNorm weight"),
    "state_in": _spec("BH K V", "float32", "recurrent state before the token, fp32"),
}

STEP_SPECS: dict[str, TensorSpec] = {
    "query": _spec("N T Hk Dk", "compute", "query, token-major"),
    "key": _spec("N T Hk Dk", "compute", "key, token-major"),
    "value": _spec("N T Hv Dv", "compute", "value, token-major"),
    "g_log": _spec("N T Hv", "float32", "precomputed log-decay", optional=True),
    "beta": _spec("N T Hv", "float32", "precomputed update strength", optional=True),
    "a": _spec("N T Hv", "float32", "RAW gate input (pre-softplus) for fused gating", optional=True),
    "b": _spec("N T Hv", "float32", "RAW beta pre-sigmoid for fused gating", optional=True),
    "A_log": _spec("Hv", "float32", "per-v-head log decay coefficient for fused gating", optional=True),
    "dt_bias": _spec("Hv", "float32", "per-v-head softplus bias for fused gating", optional=True),
    "state_pool": _spec("P Hv Dk Dv", "float32", "state pool, fp32, updated in place"),
    "state_indices": _spec("N|N T", INDEX_DTYPE, "pool row of each request ([N]) or of each token's state ([N, T])"),
    "num_accepted_tokens": _spec("N", INDEX_DTYPE, "accepted tokens of the previous step", optional=True),
}
PRECOMPUTED_GATES = ("g_log", "beta")
FUSED_GATES = ("a", "b", "A_log", "dt_bias")


def _layout_text(layouts: tuple[tuple[str, ...], ...]) -> str:
    return " or ".join(f"[{', '.join(dims)}]" for dims in layouts)


def spec_violations(api: str, specs: dict[str, TensorSpec], args: dict[str, Any]) -> tuple[list[Violation], dict]:
    """The rank, shape and dtype rules of every tensor in ``specs``, and the sizes its symbols take.

    Returns:
        tuple: the violations, in argument order, and ``{symbol: size}`` bound by the first tensor naming it.
    """
    found: list[Violation] = []
    sizes: dict[str, int] = {}
    compute: str | None = None
    for name, spec in specs.items():
        x = args.get(name)
        if x is None:
            if not spec.optional:
                found.append(Violation(f"{name}.required", name, "None", f"{name} ({spec.why}) is required",
                                       f"pass {name} laid out as {_layout_text(spec.layouts)}", api))  # fmt: skip
            continue
        shape = _shape(x)
        dims = next((d for d in spec.layouts if shape is not None and len(d) == len(shape)), None)
        if dims is None or any(s < 1 for s in shape):
            value = f"of type {type(x).__name__}" if shape is None else f"shape {shape}"
            found.append(Violation(f"{name}.rank", name, value,
                                   f"{name} ({spec.why}) must be a non-empty tensor {_layout_text(spec.layouts)}",
                                   f"pass {name} laid out as {_layout_text(spec.layouts)}", api))  # fmt: skip
            continue
        expected = tuple(sizes.setdefault(sym, size) for sym, size in zip(dims, shape, strict=True))
        if expected != shape:
            layout = ", ".join(f"{sym}={size}" for sym, size in zip(dims, expected, strict=True))
            found.append(Violation(f"{name}.shape", name, f"shape {shape}",
                                   f"{name} must be [{', '.join(dims)}] = [{layout}], the sizes the earlier "
                                   "arguments set", f"pass {name} shaped {expected}", api))  # fmt: skip
        dt = None if getattr(x, "dtype", None) is None else dtype_name(x.dtype)
        if spec.dtype == "compute":
            if compute is None and dt not in COMPUTE_DTYPES:
                found.append(Violation(f"{name}.dtype", name, f"dtype {dt}",
                                       f"{name}'s dtype sets the compute dtype and must be one of {COMPUTE_DTYPES}",
                                       f"cast {name} to bfloat16 (or float32)", api))  # fmt: skip
            elif compute is not None and dt != compute:
                found.append(Violation(f"{name}.dtype", name, f"dtype {dt}",
                                       f"{name} must have the compute dtype ({compute})",
                                       f"pass {name} in {compute}", api))  # fmt: skip
            compute = compute or dt
        elif dt != spec.dtype:
            found.append(Violation(f"{name}.dtype", name, f"dtype {dt}", f"{name} ({spec.why}) must be {spec.dtype}",
                                   f"pass {name}.astype(np.{spec.dtype})", api))  # fmt: skip
    return found, sizes


def _head_dim_violations(api: str, sizes: dict, dims: tuple[tuple[str, str], ...]) -> list[Violation]:
    fix = f"split the head dimension into pieces of at most {MAX_HEAD_DIM}"
    return [
        Violation("head_dim.max", arg, f"head dim {sym}={sizes[sym]}", f"{sym} must be <= {MAX_HEAD_DIM}", fix, api)
        for sym, arg in dims
        if sizes.get(sym, 0) > MAX_HEAD_DIM
    ]


def _finite_violations(
    api: str, args: dict[str, Any], names: tuple[str, ...], origin: Sequence[int] = (), request: int | None = None
) -> list[Violation]:
    """The decode entry points' finite rule on ``names`` (``ValueScan.first``'s ``origin`` and ``request``)."""
    found = []
    for name in names:
        x = args.get(name)
        if not isinstance(x, np.ndarray):
            continue
        scan = ValueScan(f"{name}.finite", name, _nonfinite, f"{name} must hold finite numbers: NaN and ±Inf reach "
                         "every later token through the state", f"find where the producer of {name} overflowed (the "
                         "index above)")  # fmt: skip
        violation = scan.first(x, origin, request)
        if violation is not None:
            found.append(replace(violation, api=api))
    return found


def fused_log_decay(a: np.ndarray, A_log: np.ndarray, dt_bias: np.ndarray) -> np.ndarray:
    """g = −exp(A_log)·softplus(a + dt_bias) in float32, as a kernel computes it (for the g.domain check)."""
    with np.errstate(over="ignore", invalid="ignore"):
        x = np.asarray(a, dtype=np.float32) + np.asarray(dt_bias, dtype=np.float32)
        return -np.exp(np.asarray(A_log, dtype=np.float32)) * np.logaddexp(np.float32(0), x)


def _fused_gate_violation(api: str, a: Any, A_log: Any, dt_bias: Any, request: int | None = None) -> list[Violation]:
    """The fused gate's domain; with ``request``, ``a`` is that request's [1, T, Hv] window of the step's a."""
    if not all(isinstance(x, np.ndarray) for x in (a, A_log, dt_bias)):
        return []
    # a's last axis runs over the value heads ([.., Hv]; gdn_tkg's [BH] rows are b·Hv + h).
    per_head = np.reshape(a, (-1, np.shape(A_log)[0]))
    where = first_bad_index(fused_log_decay(per_head, A_log, dt_bias), _outside_log_decay)
    if where is None:
        return []
    at = int(np.ravel_multi_index(where, per_head.shape)) + (request or 0) * per_head.size  # the flat index in a
    of = "" if request is None else f" (sequence {request})"
    return [Violation("g.domain", "A_log", f"fused g {float(fused_log_decay(per_head, A_log, dt_bias)[where])} at a index {at}{of}",
                      "g = -exp(A_log)*softplus(a + dt_bias) must be a log-decay <= 0 and not NaN (exp(A_log) "
                      "overflows past A_log ~ 88, and inf * softplus(...) = 0 is NaN)",
                      "keep A_log below 88 (A = exp(A_log) is the decay rate) and a + dt_bias finite", api,
                      request)]  # fmt: skip


def validate_tkg(*args: Any, host: bool = True, **kwargs: Any) -> list[Violation]:
    """Check a ``gdn_tkg`` call (q, k, v, b, a, A_log, dt_bias, z, norm_weight, state_in) against its rules.

    Args:
        args, kwargs: the call as passed to ``gdn_tkg``; tensors need only ``.shape`` and ``.dtype``.
        host (bool): also scan the values (finite inputs, fused g <= 0); False at trace time.

    Returns:
        list[Violation]: every broken rule (empty = valid), each naming argument, value, rule and fix.
    """
    call = dict(zip(TKG_SPECS, args, strict=False)) | kwargs
    found, sizes = spec_violations(TKG, TKG_SPECS, call)
    found += _head_dim_violations(TKG, sizes, (("K", "q"), ("V", "v")))
    if "BH" in sizes and "Hv" in sizes and sizes["BH"] % sizes["Hv"]:
        found.append(Violation("heads.bh_divisible", "A_log", f"Hv={sizes['Hv']} with BH={sizes['BH']}",
                               "BH must be a multiple of Hv = len(A_log): row r is batch r // Hv, value head r % Hv",
                               "pass A_log and dt_bias per value head and q/k/v/z with B*Hv rows", TKG))  # fmt: skip
    if host and not found:
        found += _finite_violations(TKG, call, tuple(TKG_SPECS))
        found += _fused_gate_violation(TKG, call["a"], call["A_log"], call["dt_bias"])
    return found


def validate_step(
    args: dict[str, Any], scale: Any = 1.0, use_qk_l2norm: Any = False, *, host: bool = True, values: bool = True
) -> list[Violation]:
    """Check a ``gdn_step`` call: the tensors' layouts, one gating form, the pool and (host) the index values.

    Args:
        args (dict): the step's tensors by name (``STEP_SPECS``; omitted ones absent or None).
        scale: the output scale, a finite real. use_qk_l2norm: a bool.
        host (bool): also read the index values (always, on the host: they address the pool) and, with
            ``values``, scan the inputs (finite, gates' domains); False at trace time.

    Returns:
        list[Violation]: every broken rule (empty = valid).
    """
    found, sizes = spec_violations(STEP, STEP_SPECS, args)
    found += _head_dim_violations(STEP, sizes, (("Dk", "key"), ("Dv", "value")))
    if "Hk" in sizes and "Hv" in sizes and sizes["Hv"] % sizes["Hk"]:
        found.append(Violation("heads.gqa_divisible", "value", f"Hv={sizes['Hv']} with Hk={sizes['Hk']}",
                               "Hv must be divisible by Hk; value head h reads key/query head h // (Hv//Hk)",
                               "use a value head count that is a multiple of the key head count", STEP))  # fmt: skip
    given = {name for name in (*PRECOMPUTED_GATES, *FUSED_GATES) if args.get(name) is not None}
    if given not in (set(PRECOMPUTED_GATES), set(FUSED_GATES)):
        found.append(Violation("gates.form", "g_log", f"gates given: {sorted(given) or 'none'}",
                               "pass exactly one gating form: precomputed (g_log, beta) or fused (a, b, A_log, "
                               "dt_bias)", "pass g_log and beta, or a, b, A_log and dt_bias, not a mix", STEP))  # fmt: skip
    indices, accepted = args.get("state_indices"), args.get("num_accepted_tokens")
    if accepted is not None and len(_shape(indices) or ()) != 2:
        found.append(Violation("num_accepted_tokens.form", "num_accepted_tokens", "given with [N] state_indices",
                               "num_accepted_tokens picks the row a request resumes from among its [N, T] "
                               "state_indices", "pass state_indices of shape [N, T], or no num_accepted_tokens",
                               STEP))  # fmt: skip
    if not (isinstance(scale, numbers.Real) and not isinstance(scale, bool) and np.isfinite(float(scale))):
        found.append(Violation("scale.number", "scale", f"value {scale!r}", "scale must be a finite real number",
                               "pass scale=Dk ** -0.5", STEP))  # fmt: skip
    if not isinstance(use_qk_l2norm, bool):
        found.append(Violation("use_qk_l2norm.bool", "use_qk_l2norm", f"value {use_qk_l2norm!r}",
                               "use_qk_l2norm must be a bool", "pass True or False", STEP))  # fmt: skip
    if host and not found:
        found += index_violations(indices, accepted, sizes["P"], sizes["T"])
    if host and values and not found:
        found += _step_value_violations(args)
    return found


# A step's tensors whose first axis is the request (N): a bad value in one is that request's alone.
_PER_REQUEST = ("query", "key", "value", "g_log", "beta", "a", "b")


def _step_value_violations(args: dict[str, Any]) -> list[Violation]:
    """The step's value rules, request by request when a request's own inputs broke one: every such request, and
    in it each argument's first bad element (``Violation.sequence``), so a server can drop them all. A non-finite
    A_log / dt_bias is every request's: reported once, for the call."""
    whole = _step_values(args)
    if not whole or any(v.rule_id in ("A_log.finite", "dt_bias.finite") for v in whole):
        return whole
    found = []
    for n in range(np.shape(args["query"])[0]):
        window = {name: x[n : n + 1] if name in _PER_REQUEST and x is not None else x for name, x in args.items()}
        found += _step_values(window, (n,), n)
    return found


def _step_values(args: dict[str, Any], origin: Sequence[int] = (), request: int | None = None) -> list[Violation]:
    """The step's value rules on ``args`` (a request's window of them at ``origin``, with ``request``)."""
    found = _finite_violations(STEP, args, ("query", "key", "value", "beta", "a", "b", "A_log", "dt_bias"), origin,
                               request)  # fmt: skip
    if args.get("g_log") is None:
        return found + _fused_gate_violation(STEP, args["a"], args["A_log"], args["dt_bias"], request)
    # gdn_cte's g_log / beta domain rules on the precomputed gates ([N, T, Hv], the step's own layout, so an index
    # names the caller's element)
    gates = (VALUE_SCANS[rule].first(args[name], origin, request) for rule, name in _GATE_DOMAINS)
    return found + [replace(v, api=STEP) for v in gates if v is not None]


_GATE_DOMAINS = (("g_log.domain", "g_log"), ("beta.domain", "beta"))


def index_violations(state_indices: Any, num_accepted_tokens: Any, pool_rows: int, tokens: int) -> list[Violation]:
    """The values of a step's indices: rows in [-1, P), a padding request (-1) all padding, a live one without
    -1, every row written by a live request distinct, and ``num_accepted_tokens`` in [1, T] for live requests.

    Args:
        state_indices (np.ndarray): [N] or [N, T] int32.
        num_accepted_tokens (np.ndarray | None): [N] int32.
        pool_rows (int): P. tokens (int): T.

    Returns:
        list[Violation]: the first broken rule of each kind.
    """
    rows = np.asarray(state_indices).astype(np.int64)
    rows = rows.reshape(rows.shape[0], -1)
    found = []
    outside = np.argwhere((rows < PADDING_INDEX) | (rows >= pool_rows))
    if outside.size:
        at = tuple(int(i) for i in outside[0])
        found.append(Violation("state_indices.range", "state_indices", f"value {int(rows[at])} at {list(at)}",
                               f"every index must name one of the pool's {pool_rows} rows, or be -1 (padding)",
                               f"use indices in [0, {pool_rows}) or -1", STEP))  # fmt: skip
        return found
    padding = rows[:, 0] == PADDING_INDEX
    mixed = np.flatnonzero((rows == PADDING_INDEX).any(axis=1) & ~(rows == PADDING_INDEX).all(axis=1))
    if mixed.size:
        found.append(Violation("state_indices.padding", "state_indices", f"row {int(mixed[0])}: "
                               f"{rows[mixed[0]].tolist()}", "a request is padding (every index -1) or live (no -1)",
                               "mark a padding request with -1 in every column, and give a live one a row per "
                               "token", STEP))  # fmt: skip
    live = rows[~padding].reshape(-1)
    values, counts = np.unique(live, return_counts=True)
    if (counts > 1).any():
        found.append(Violation("state_indices.distinct", "state_indices",
                               f"rows {values[counts > 1].tolist()} named more than once",
                               "every pool row a live request reads or writes must be its own: two writers of one "
                               "row would race", "give every request (and every kept token) its own row", STEP))  # fmt: skip
    if num_accepted_tokens is not None:
        accepted = np.asarray(num_accepted_tokens).astype(np.int64)
        bad = np.flatnonzero(~padding & ((accepted < 1) | (accepted > tokens)))
        if bad.size:
            found.append(Violation("num_accepted_tokens.range", "num_accepted_tokens",
                                   f"value {int(accepted[bad[0]])} for request {int(bad[0])}",
                                   f"a live request resumes from the state after one of its T={tokens} previous "
                                   "tokens: num_accepted_tokens in [1, T]", "pass the accepted count, at least 1",
                                   STEP))  # fmt: skip
    return found
