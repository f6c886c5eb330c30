"""``nki.isa.NkiScalar``: an integer computed on device, as a compiled loop's body and dynamic addressing see it.

In NKI 0.7 (SDK 2.33) a kernel is specialized by tracing it once with Python, so a value that exists only at run
time — a ``fori_loop`` iteration value, a ``scalar_load`` from a tile — is a scalar whose arithmetic is *recorded*,
not evaluated ("NKI Scalar Values" deep dive and the ``nki.isa.NkiScalar`` page, SDK 2.33):

- ``+``, ``-`` (binary and unary) and ``*`` with a Python int or a scalar of the same width give a new scalar;
  32-bit arithmetic wraps, it never widens;
- comparisons are traced, but their result cannot be used — so no Python ``if`` can branch on a scalar;
- a scalar is the ``start`` of ``nl.ds`` and the ``scalar_offset`` of ``.ap``, and (32-bit only) a bound of
  ``nl.fori_loop``.

nki-cpu runs eagerly, so a scalar here carries its value for the interpreter's own use, but refuses everything
the tracer cannot do with it (rule ``runtime_scalars``): ``int()``, ``bool()``, use as a Python index, branching
on a comparison, and reading ``.value`` inside a kernel. A ``VirtualRegister`` (``nisa.register_alloc``) is the
same kind of value for the register instructions and loop bounds. A kernel that passes here therefore does not
depend on run-time values in its Python.
"""

from __future__ import annotations

from typing import Any

from nki_cpu import checks, state
from nki_cpu.cost.record import Region

_WIDTH = {"int32": 32, "int64": 64}
_FIX = (
    "use it as an offset (nl.ds(i, size), .ap(scalar_offset=i)) or a loop bound (nl.fori_loop, nl.while_loop), "
    "do the arithmetic with +, - and *, and move values through tiles (nisa.scalar_store, nisa.register_store)"
)


def _wrap(value: int, dtype: str) -> int:
    bits = _WIDTH[dtype]
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >= 1 << (bits - 1) else value


def _refuse(kind: str, use: str, value: int) -> int:
    """A Python use of a run-time value (rule ``runtime_scalars``): raise, or return ``value`` when relaxed."""
    checks.rule(
        "runtime_scalars",
        f"{use} of {kind}: its value exists only at run time (the kernel is traced once: nki.isa.NkiScalar, "
        f"nki.isa.VirtualRegister, 'NKI Scalar Values', SDK 2.32-2.33), so the kernel's Python cannot read it. "
        f"Fix: {_FIX}",
        state.current().relaxed,
        checks.SealedValueError,
    )
    return value


class NkiScalar:
    """One run-time integer (``nl.int32`` or ``nl.int64``); see the module docstring for what it allows."""

    __slots__ = ("_value", "dtype", "sources")

    def __init__(self, value: int, dtype: str = "int32", sources: tuple[Region, ...] = ()) -> None:
        if dtype not in _WIDTH:
            raise TypeError(f"NkiScalar dtype must be int32 or int64, got {dtype!r}")
        self.dtype = dtype
        self._value = _wrap(int(value), dtype)
        # The registers the value was computed from (``scalar_load`` results): an instruction addressed by it
        # reads them, so the cost model orders it after the loads (``isa.registers``).
        self.sources = sources

    @property
    def value(self) -> int:
        """The value (host code and nki-cpu only: inside a kernel it is sealed, rule ``runtime_scalars``)."""
        state.seal("runtime_scalars", "NkiScalar.value", _FIX)
        return self._value

    def _other(self, other: Any, op: str) -> int:
        if isinstance(other, NkiScalar):
            if other.dtype != self.dtype:
                checks.fail(
                    f"NkiScalar {op} operands must have one width, got {self.dtype} and {other.dtype}",
                    checks.KernelTypeError,
                )
            return other._value
        if isinstance(other, bool) or not isinstance(other, int):
            checks.fail(
                f"NkiScalar {op} operand must be a Python int or an NkiScalar, got {other!r}", checks.KernelTypeError
            )
        return other

    def _result(self, value: int, other: Any) -> NkiScalar:
        sources = self.sources + other.sources if isinstance(other, NkiScalar) else self.sources
        return NkiScalar(value, self.dtype, sources)

    def __add__(self, other: Any) -> NkiScalar:
        return self._result(self._value + self._other(other, "+"), other)

    __radd__ = __add__

    def __sub__(self, other: Any) -> NkiScalar:
        return self._result(self._value - self._other(other, "-"), other)

    def __rsub__(self, other: Any) -> NkiScalar:
        return self._result(self._other(other, "-") - self._value, other)

    def __mul__(self, other: Any) -> NkiScalar:
        return self._result(self._value * self._other(other, "*"), other)

    __rmul__ = __mul__

    def __neg__(self) -> NkiScalar:
        return NkiScalar(-self._value, self.dtype, self.sources)

    def _compare(self, other: Any, op: str) -> TracedComparison:
        if self.dtype == "int64":
            checks.fail(
                f"NkiScalar {op} operands must be 32-bit (64-bit comparisons are rejected: nki.isa.NkiScalar, SDK 2.33), "
                "got int64",
                checks.KernelTypeError,
            )
        value = self._other(other, op)
        return TracedComparison(op, _COMPARE[op](self._value, value))

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

    def __index__(self) -> int:
        return _refuse("an NkiScalar", "use as a Python index", self._value)

    def __int__(self) -> int:
        return _refuse("an NkiScalar", "int()", self._value)

    def __bool__(self) -> bool:
        return bool(_refuse("an NkiScalar", "a truth test", self._value))

    def __repr__(self) -> str:
        return f"NkiScalar({self.dtype})"


_COMPARE = {
    "<": int.__lt__,
    "<=": int.__le__,
    ">": int.__gt__,
    ">=": int.__ge__,
    "==": int.__eq__,
    "!=": int.__ne__,
}


class TracedComparison:
    """The result of comparing scalars: traced by NKI, but no Python decision can be made from it."""

    def __init__(self, op: str, result: bool) -> None:
        self.op = op
        self._result = result

    def __bool__(self) -> bool:
        return bool(
            _refuse(
                f"an NkiScalar comparison ({self.op}; 'traced, but the result cannot be used')",
                "a branch",
                self._result,
            )
        )


class VirtualRegister:
    """A run-time 32-bit register (``nisa.register_alloc``; ``nki.isa.VirtualRegister``, v2.32.0).

    Set and read only by the register instructions (``register_move`` / ``register_load`` / ``register_store``),
    used as a loop bound or ``nl.ds`` start; Python ``int()``, ``range()``, ``if`` and index use are refused
    (rule ``runtime_scalars``: "using a register in Python control flow (if/while) or converting it with int() /
    range() raises TypeError" under the tracer, v2.32.0).
    """

    __slots__ = ("_value", "sources")

    def __init__(self, value: int = 0) -> None:
        self._value = _wrap(int(value), "int32")
        self.sources: tuple[Region, ...] = ()  # the register itself once an instruction loads it

    @property
    def value(self) -> int:
        """The value (host code and nki-cpu only: inside a kernel it is sealed, rule ``runtime_scalars``)."""
        state.seal("runtime_scalars", "VirtualRegister.value", _FIX)
        return self._value

    def set(self, value: int, sources: tuple[Region, ...] = ()) -> None:
        """Write the register (nki-cpu's register instructions only)."""
        self._value = _wrap(int(value), "int32")
        self.sources = sources

    def __int__(self) -> int:
        return _refuse("a VirtualRegister", "int()", self._value)

    def __index__(self) -> int:
        return _refuse("a VirtualRegister", "use as a Python index (range(), slicing)", self._value)

    def __bool__(self) -> bool:
        return bool(_refuse("a VirtualRegister", "a truth test (if / while)", self._value))

    def _compare(self, other: Any, op: str) -> bool:
        value = runtime_value(other) if isinstance(other, (int, NkiScalar, VirtualRegister)) else other
        return bool(_refuse("a VirtualRegister", f"a comparison ({op})", _COMPARE[op](self._value, value)))

    def __eq__(self, other: object) -> bool:  # type: ignore[override]
        return self._compare(other, "==")

    def __ne__(self, other: object) -> bool:  # type: ignore[override]
        return self._compare(other, "!=")

    def __lt__(self, other: Any) -> bool:
        return self._compare(other, "<")

    def __le__(self, other: Any) -> bool:
        return self._compare(other, "<=")

    def __gt__(self, other: Any) -> bool:
        return self._compare(other, ">")

    def __ge__(self, other: Any) -> bool:
        return self._compare(other, ">=")

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return "VirtualRegister(int32)"


def runtime_value(value: Any) -> int:
    """The interpreter's value of an int, ``NkiScalar`` or ``VirtualRegister`` (nki-cpu internal)."""
    if isinstance(value, (NkiScalar, VirtualRegister)):
        return value._value
    if isinstance(value, bool):
        raise TypeError(f"expected an int or a run-time value, got {value!r}")
    return int(value)


def sources_of(value: Any) -> tuple[Region, ...]:
    """The registers a run-time value was loaded into (empty for a Python int or a loop's iteration value)."""
    return getattr(value, "sources", ()) if isinstance(value, (NkiScalar, VirtualRegister)) else ()
