"""The rule each ``gdn_spec_capabilities`` key follows, and the check that applies them all.

A declaration is written once by a kernel's author and trusted by every test, so a wrong one fails when the
implementation is loaded — with an error naming the key, the value, the rule and the fix — never later as a
TypeError inside a test, and never as a silently different claim: the string ``"no"`` is true, the string
``"float32"`` is a sequence of seven letters, and a misspelt key would drop a limit.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Collection, Mapping
from collections.abc import Set as AbstractSet
from numbers import Integral, Real
from typing import Any, NoReturn

import numpy as np

from gdn_ref.constants import ALGORITHMS, COMPUTE_DTYPES, MAX_HEAD_DIM
from gdn_ref.contract import RULES

# Words a declaration may use for a flag as a string, and the bool it meant (for the fix only: never accepted).
_TRUE_WORDS = frozenset({"true", "yes", "y", "on", "1"})
_FALSE_WORDS = frozenset({"false", "no", "n", "off", "0", "none", ""})


class CapabilityError(ValueError):
    """A ``gdn_spec_capabilities`` mapping breaks a key's rule (impl re-raises it as ImplementationError)."""


def _fail(key: str, value: Any, rule: str, fix: str) -> NoReturn:
    raise CapabilityError(f"capability {key}={value!r} {rule}; {fix}")


def _unquoted(key: str, value: Any, parse: Callable[[str], Any], check: Callable[[str, Any], Any]) -> str | None:
    """``value`` written without quotes, when it is a string that parses as the expected kind and the parsed value
    passes the key's own ``check`` (``"1024"``, never ``"-3"``: suggesting -3 would trade one error for another)."""
    if not isinstance(value, str):
        return None
    try:
        parsed = parse(value.strip())
        check(key, parsed)
    except ValueError:  # it does not parse, or breaks the rule unquoted too (CapabilityError is a ValueError)
        return None
    return repr(parsed)


def _positive_int(what: str, example: str) -> Callable[[str, Any], int | None]:
    """An optional integer > 0 (``None`` = no limit); a bool, a float or a string is refused."""

    def check(key: str, value: Any) -> int | None:
        if value is None:
            return None
        if isinstance(value, Integral) and not isinstance(value, bool) and int(value) > 0:
            return int(value)
        kind = type(value).__name__
        written = _unquoted(key, value, int, check)
        if written is not None:
            fix = f"write {written} without quotes"
        elif isinstance(value, float) and value.is_integer() and value > 0:
            fix = f"write {int(value)} (an int, not a float)"
        else:
            fix = f"give {what} as an int, e.g. {example}, or leave the key out (no limit)"
        shown = "" if isinstance(value, Integral) and not isinstance(value, bool) else f", not a {kind}"
        _fail(key, value, f"must be a positive integer{shown}", fix)

    return check


def _flag(meaning: str) -> Callable[[str, Any], bool]:
    """A bool (numpy's included, normalized to Python's); a string is refused (any non-empty string, "no" and
    "False" included, is true), and so is an int (1 is no claim of True)."""

    def check(key: str, value: Any) -> bool:
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        words = value.strip().lower() if isinstance(value, str) else None
        if words in _TRUE_WORDS or words in _FALSE_WORDS:
            fix = f"write {words in _TRUE_WORDS} without quotes ({meaning})"
        else:
            fix = f"write True or False ({meaning})"
        rule = "must be a bool" + (" (a string is not: any non-empty string is true)" if words is not None else "")
        _fail(key, value, rule, fix)

    return check


def _collection(key: str, value: Any, members: str, single: Callable[[Any], bool], example: str, default: str) -> list:
    """The members of a collection-valued key, in the collection's order (a set's is arbitrary: callers order them).

    Args:
        key (str): the capability key, for the message.
        value (Any): the declared value.
        members (str): what the members must be, for the rule ("names from 'schur', 'neumann'").
        single (Callable[[Any], bool]): whether ``value`` is one valid member given bare (the fix then wraps it).
        example (str): a valid value, for the fix, e.g. "('schur',)".
        default (str): what leaving the key out means, for the fix.

    Returns:
        list: the members of any non-empty collection — a sized iterable: list, tuple, set, frozenset, range,
        a 1-D numpy array — for the caller to check one by one.

    Raises:
        CapabilityError: a bare string or bytes (a sequence of characters), a mapping (its keys are no claim), a
        numpy array of other than one dimension, anything else that is not a collection, or an empty one.
    """
    rule = f"must be a non-empty collection of {members} (a list, tuple, set or 1-D array)"
    fix = f"write ({value!r},)" if single(value) else f"e.g. {example}, or leave the key out ({default})"
    if isinstance(value, (str, bytes)):
        _fail(key, value, f"{rule}, not a bare string (a sequence of characters)", fix)
    if isinstance(value, Mapping):
        _fail(key, value, f"{rule}, not a mapping", fix)
    ndim = getattr(value, "ndim", 1)
    if ndim != 1:  # a 2-D array iterates over rows, a 0-D one not at all
        _fail(key, value, f"{rule}; this array is {ndim}-D", f"give a 1-D array or a tuple, e.g. {example}")
    if not isinstance(value, Collection) or len(value) == 0:
        _fail(key, value, rule, fix)
    return list(value)


def _names(allowed: tuple[str, ...], example: str, default: str) -> Callable[[str, Any], tuple[str, ...]]:
    """A non-empty collection of distinct names from ``allowed`` (``_collection``: a bare string is refused, it is a
    sequence of letters); normalized to a tuple of str in the declared order, or in ``allowed``'s order for a set."""

    def check(key: str, value: Any) -> tuple[str, ...]:
        options = ", ".join(repr(a) for a in allowed)
        names = _collection(key, value, f"names from {options}", lambda v: v in allowed, example, default)
        for name in names:
            if name not in allowed:
                close = difflib.get_close_matches(str(name), allowed, n=1)
                fix = f"did you mean {close[0]!r}?" if close else f"use only those names, e.g. {example}"
                _fail(key, value, f"names {name!r}, which is not one of {options}", fix)
        if isinstance(value, AbstractSet):  # no order of its own: a deterministic one
            return tuple(a for a in allowed if a in names)
        return tuple(dict.fromkeys(str(name) for name in names))

    return check


def _name(key: str, value: Any) -> str:
    if isinstance(value, str) and value.strip():
        return value
    fix = "give the kernel's display name as a string, e.g. 'my-kernel', or leave the key out (the spec)"
    _fail(key, value, "must be a non-empty string", fix)


def _example_scale(key: str, value: Any) -> float:
    if isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value) and 0 < value <= 1:
        return float(value)
    written = _unquoted(key, value, float, _example_scale)
    if written is not None:
        fix = f"write {written} without quotes"
    else:
        fix = "give the fraction of the profile's Hypothesis examples, e.g. 0.25, or leave the key out (1)"
    kind = "" if isinstance(value, Real) and not isinstance(value, bool) else f", not a {type(value).__name__}"
    _fail(key, value, f"must be a number in (0, 1]{kind}", fix)


def _is_head_size(d: object) -> bool:
    return isinstance(d, Integral) and not isinstance(d, bool) and 1 <= int(d) <= MAX_HEAD_DIM


def _max_head_dim(key: str, value: Any) -> int | None:
    if value is None or _is_head_size(value):
        return None if value is None else int(value)
    rule = f"must be an integer in [1, {MAX_HEAD_DIM}] (the contract's MAX_HEAD_DIM)"
    _fail(key, value, rule, "give the largest Dk and Dv the kernel accepts, or leave the key out")


def _head_dims(key: str, value: Any) -> tuple[int, ...] | None:
    """None (any size), or a non-empty collection (``_collection``) of head sizes: sorted distinct ints."""
    if value is None:
        return None
    members = f"integers in [1, {MAX_HEAD_DIM}]"
    sizes = _collection(key, value, members, _is_head_size, "(64, 128)", "any head size up to max_head_dim")
    for size in sizes:
        if not _is_head_size(size):
            rule = (
                f"lists {size!r}, which is not an integer in [1, {MAX_HEAD_DIM}] (a bool, a float or a string is not)"
            )
            _fail(key, value, rule, "list the head sizes the kernel accepts as ints, e.g. (64, 128)")
    return tuple(sorted({int(d) for d in sizes}))


_RULE_IDS = tuple(rule.id for rule in RULES)

# key -> check(key, value) returning the normalized value or raising CapabilityError. The keys are the fields of
# core.Capabilities (a self-test holds the two equal).
CHECKS: dict[str, Callable[[str, Any], Any]] = {
    "name": _name,
    "algorithms": _names(ALGORITHMS, "('schur',)", "both"),
    "dtypes": _names(COMPUTE_DTYPES, "('bfloat16',)", "both"),
    "max_seq_len": _positive_int("the largest S (tokens per call) the kernel accepts", "1024"),
    "max_lanes": _positive_int("the largest B·Hv per call", "16"),
    "max_head_dim": _max_head_dim,
    "head_dims": _head_dims,
    "equal_head_dims": _flag("True when the kernel needs Dk == Dv, else leave the key out"),
    "max_work": _positive_int("the largest B·Hv·S·Dk·Dv per call", "1 << 24"),
    "example_scale": _example_scale,
    "content_checks": _flag("False for a traced kernel that cannot read tensor contents, else leave the key out"),
    "validates_arguments": _flag("False when the kernel does not reject invalid calls, else leave the key out"),
    "state_in_place": _flag(
        "False when the kernel returns a new state instead of updating recurrent_state, else leave the key out"
    ),
    "inexpressible_rules": _names(_RULE_IDS, "('recurrent_state.writable',)", "none"),
    "varlen": _flag("True when the kernel accepts cu_seqlens, else leave the key out"),
    "state_pool": _flag("True when the kernel takes state_indices (pool rows, -1 = none) with cu_seqlens"),
    "bucket": _flag("True when the kernel takes bucket=(T, N) with cu_seqlens (empty sequences allowed)"),
    "checkpoints": _flag("True when the kernel takes checkpoint_every and checkpoint_indices (pool rows)"),
    "read_rows": _flag("True when the kernel takes read_indices (pool rows to start from, -1 = zero)"),
    "any_seq_len": _flag("True when a dense call takes any S, not only a chunk multiple, else leave the key out"),
    "fixed_scale": _flag("True when the kernel applies Dk**-0.5 itself and takes no scale, else leave the key out"),
}


def validate(raw: Any) -> dict[str, Any]:
    """Check a ``gdn_spec_capabilities`` declaration key by key and return it normalized.

    Args:
        raw (Any): the declaration: a mapping of capability keys (``None`` = nothing declared).

    Returns:
        dict[str, Any]: the declared keys only, with normalized values (tuples of str for names, in the allowed
        order when given as a set; sorted distinct head_dims; Python ints, floats and bools for numpy scalars).

    Raises:
        CapabilityError: not a mapping; an unknown key (with the valid keys and the closest one); a value of the
            wrong type or out of range; or keys contradicting each other (head_dims above max_head_dim, a serving
            keyword without what it needs: ``NEEDS``). The message names the key, the value, the rule and the fix.
    """
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise CapabilityError(
            f"gdn_spec_capabilities={raw!r} must be a dict of capability keys, not a {type(raw).__name__}; "
            "write e.g. {'dtypes': ('bfloat16',)}, or leave the attribute out"
        )
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in CHECKS:
            raise _unknown_key(key)
        values[key] = CHECKS[key](key, value)
    _check_needs(values)
    head_dims, max_head_dim = values.get("head_dims"), values.get("max_head_dim")
    above = [d for d in head_dims or () if max_head_dim is not None and d > max_head_dim]
    if above:
        raise CapabilityError(
            f"capability head_dims={head_dims!r} lists {above} above max_head_dim={max_head_dim}: the two contradict "
            "each other; drop those sizes or raise max_head_dim"
        )
    return values


# A serving keyword only has a meaning inside a call its prerequisite enables: key -> (prerequisite, its default,
# why). A declaration claiming one without the other cannot be tested as claimed.
NEEDS: dict[str, tuple[str, bool, str]] = {
    "state_pool": ("varlen", False, "state_indices name a pool row per packed sequence of cu_seqlens"),
    "bucket": ("varlen", False, "a bucket holds packed sequences given by cu_seqlens"),
    "checkpoints": ("state_pool", False, "checkpoint_indices name pool rows"),
    "read_rows": ("state_pool", False, "read_indices name pool rows"),
}
NEEDS_IN_PLACE = "state_pool"  # a pool's rows are written in place: a kernel returning a new state has no pool


def _check_needs(values: dict[str, Any]) -> None:
    """Keys contradicting each other: a serving keyword declared without the capability it works inside."""
    for key, (needed, default, why) in NEEDS.items():
        if values.get(key) and not values.get(needed, default):
            raise CapabilityError(
                f"capability {key}=True needs {needed}=True ({why}); declare {needed}=True too, or leave {key} out"
            )
    if values.get(NEEDS_IN_PLACE) and not values.get("state_in_place", True):
        raise CapabilityError(
            f"capability {NEEDS_IN_PLACE}=True needs state_in_place (the pool's rows are updated in place), but "
            "state_in_place=False is declared; drop state_in_place=False, or leave state_pool out"
        )


def _unknown_key(key: Any) -> CapabilityError:
    valid = ", ".join(CHECKS)
    close = difflib.get_close_matches(key, CHECKS, n=1) if isinstance(key, str) else []
    fix = f"did you mean {close[0]!r}?" if close else "remove it, or use one of the valid keys"
    return CapabilityError(
        f"unknown capability key {key!r} (valid keys: {valid}): an unknown key is an error so a typo cannot silently "
        f"widen what is claimed; {fix}"
    )
