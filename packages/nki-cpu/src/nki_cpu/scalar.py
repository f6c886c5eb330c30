"""``nki.isa.NkiScalar``: an integer computed on device, as a compiled loop's body and dynamic addressing see it.

In NKI 0.7 (SDK 2.33) a kernel is specialized by tracing it once with Python, so a value that exists only at run
time — a ``fori_loop`` iteration value, a ``scalar_load`` from a tile — is a scalar whose arithmetic is *recorded*,
not evaluated ("NKI Scalar Values" deep dive and the ``nki.isa.NkiScalar`` page, SDK 2.33):

- ``+``, ``-`` (binary and unary) and ``*`` with a Python int or a scalar of the same width give a new scalar;
  32-bit arithmetic wraps, it never widens;
- comparisons are traced, but their result cannot be used — so no Python ``if`` can branch on a scalar;
- a scalar is the ``start`` of ``nl.ds`` and the ``scalar_offset`` of ``.ap``, and (32-bit only) a bound of
  ``nl.fori_loop``.

nki-cpu runs eagerly, so a scalar here carries its value (``.value``) for the interpreter's own use, but refuses
everything the tracer cannot do with it: ``int()``, ``bool()``, use as a Python index, and branching on a
comparison. A kernel that passes here therefore does not depend on run-time values in its Python.
"""

from __future__ import annotations

from typing import Any

_WIDTH = {"int32": 32, "int64": 64}


def _wrap(value: int, dtype: str) -> int:
    bits = _WIDTH[dtype]
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >= 1 << (bits - 1) else value


class NkiScalar:
    """One run-time integer (``nl.int32`` or ``nl.int64``); see the module docstring for what it allows."""

    __slots__ = ("dtype", "value")

    def __init__(self, value: int, dtype: str = "int32") -> None:
        if dtype not in _WIDTH:
            raise TypeError(f"NkiScalar dtype must be int32 or int64, got {dtype!r}")
        self.dtype = dtype
        self.value = _wrap(int(value), dtype)

    def _other(self, other: Any, op: str) -> int:
        if isinstance(other, NkiScalar):
            if other.dtype != self.dtype:
                raise TypeError(f"NkiScalar {op}: operands of different widths ({self.dtype}, {other.dtype})")
            return other.value
        if isinstance(other, bool) or not isinstance(other, int):
            raise TypeError(f"NkiScalar {op}: the other operand must be a Python int or an NkiScalar, got {other!r}")
        return other

    def __add__(self, other: Any) -> NkiScalar:
        return NkiScalar(self.value + self._other(other, "+"), self.dtype)

    __radd__ = __add__

    def __sub__(self, other: Any) -> NkiScalar:
        return NkiScalar(self.value - self._other(other, "-"), self.dtype)

    def __rsub__(self, other: Any) -> NkiScalar:
        return NkiScalar(self._other(other, "-") - self.value, self.dtype)

    def __mul__(self, other: Any) -> NkiScalar:
        return NkiScalar(self.value * self._other(other, "*"), self.dtype)

    __rmul__ = __mul__

    def __neg__(self) -> NkiScalar:
        return NkiScalar(-self.value, self.dtype)

    def _compare(self, other: Any, op: str) -> TracedComparison:
        if self.dtype == "int64":
            raise TypeError(f"NkiScalar {op}: comparisons of 64-bit scalars are rejected (NkiScalar page, SDK 2.33)")
        self._other(other, op)
        return TracedComparison(op)

    def __lt__(self, other: Any) -> TracedComparison:
        return self._compare(other, "<")

    def __le__(self, other: Any) -> TracedComparison:
        return self._compare(other, "<=")

    def __gt__(self, other: Any) -> TracedComparison:
        return self._compare(other, ">")

    def __ge__(self, other: Any) -> TracedComparison:
        return self._compare(other, ">=")

    def __eq__(self, other: object) -> TracedComparison:  # type: ignore[override]
        return self._compare(other, "==")

    def __ne__(self, other: object) -> TracedComparison:  # type: ignore[override]
        return self._compare(other, "!=")

    __hash__ = object.__hash__

    def _not_a_python_value(self, use: str) -> TypeError:
        return TypeError(
            f"nki-cpu: {use} of an NkiScalar. Its value exists only at run time (the kernel is traced once, SDK "
            "2.33 'NKI Scalar Values'), so Python cannot read it. Fix: use it as an offset (nl.ds(i, size), "
            ".ap(scalar_offset=i)) or a loop bound, and do the arithmetic with +, - and *"
        )

    def __index__(self) -> int:
        raise self._not_a_python_value("use as a Python index")

    def __int__(self) -> int:
        raise self._not_a_python_value("int()")

    def __bool__(self) -> bool:
        raise self._not_a_python_value("a truth test")

    def __repr__(self) -> str:
        return f"NkiScalar({self.dtype})"


class TracedComparison:
    """The result of comparing scalars: traced by NKI, but no Python decision can be made from it."""

    def __init__(self, op: str) -> None:
        self.op = op

    def __bool__(self) -> bool:
        raise TypeError(
            f"nki-cpu: branching on an NkiScalar comparison ({self.op}): comparisons are 'traced, but the result "
            "cannot be used' (nki.isa.NkiScalar, SDK 2.33). A kernel cannot branch on a run-time value"
        )


def runtime_value(value: Any) -> int:
    """The interpreter's value of an int, ``NkiScalar`` or ``VirtualRegister`` (nki-cpu internal)."""
    if isinstance(value, int):
        return value
    if hasattr(value, "value"):
        return int(value.value)
    return int(value)
