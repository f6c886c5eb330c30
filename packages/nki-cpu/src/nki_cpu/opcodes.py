"""Operator tokens: the ``nl.add`` / ``nl.exp`` ... objects that are both opcodes and callables.

An :class:`Op` carries the fp32 numpy semantics the instructions use (``binary``, ``unary``), its reduction
identity, and a slot (``convenience``) that ``nki_cpu.language`` fills with the allocate-and-compute behaviour of
the ``nl.<op>(x, ...)`` call form.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from nki_cpu import checks

F32 = np.float32


class Op:
    """One NKI operator token.

    Args:
        name: the NKI name (``"add"``, ``"exp"``...), also the opcode name recorded in traces.
        binary: fp32 ``f(lhs, rhs)`` for ALU use (tensor_tensor, tensor_scalar, scans), or None.
        unary: fp32 ``f(x)`` for activation-function / unary-ALU use, or None.
        bitvec: True for integer bit-pattern ops (no fp32 conversion).
        identity: reduction identity (None when the op is not a legal reduction).

    Notes:
        Calling the token (``nl.add(x, y)``) runs the ``nl`` convenience op installed by ``nki_cpu.language``.
    """

    def __init__(
        self,
        name: str,
        binary: Callable[[Any, Any], Any] | None = None,
        unary: Callable[[Any], Any] | None = None,
        *,
        bitvec: bool = False,
        identity: float | None = None,
    ) -> None:
        self.name = name
        self.binary = binary
        self.unary = unary
        self.bitvec = bitvec
        self.identity = identity
        self.convenience: Callable[..., Any] | None = None
        # The numpy ufunc behind ``binary`` / ``unary`` when there is one (directly or under ``_errstate``): the
        # instructions then compute straight into dst (``out=``) in fp32, with the same single rounding.
        self.binary_ufunc: np.ufunc | None = _ufunc_of(binary) if not bitvec else None
        self.unary_ufunc: np.ufunc | None = _ufunc_of(unary) if not bitvec else None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.convenience is None:
            raise NotImplementedError(f"nki-cpu: nl.{self.name}(...) has no convenience form")
        return self.convenience(*args, **kwargs)

    def __repr__(self) -> str:
        return f"nl.{self.name}"

    def reduce(self, values: np.ndarray, axis: int) -> np.ndarray:
        """Reduce ``values`` along ``axis`` with this op (left fold; see README for subtract)."""
        if self.binary is None:
            checks.fail(f"reduction op must be a binary operator token, got nl.{self.name}")
        ufunc = _REDUCERS.get(self.name)
        if ufunc is not None:
            return ufunc.reduce(values, axis=axis)
        moved = np.moveaxis(values, axis, 0)
        acc = moved[0]
        for item in moved[1:]:
            acc = self.binary(acc, item)
        return np.asarray(acc)


def _ufunc_of(fn: Callable[..., Any] | None) -> np.ufunc | None:
    """The ufunc ``fn`` is, or wraps via :func:`_errstate`; None otherwise."""
    if isinstance(fn, np.ufunc):
        return fn
    return getattr(fn, "ufunc", None)


def _cmp(fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    return lambda a, b: fn(a, b).astype(F32)


def _gelu(x: np.ndarray) -> np.ndarray:
    erf = np.vectorize(math.erf, otypes=[np.float64])
    return (0.5 * x * (1.0 + erf(x.astype(np.float64) / math.sqrt(2.0)))).astype(F32)


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x.astype(np.float64)).astype(F32)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(F32)


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    return (0.5 * x64 * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x64 + 0.044715 * x64**3)))).astype(F32)


def _gelu_dx(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    cdf = 0.5 * (1.0 + _erf(x64 / math.sqrt(2.0)).astype(np.float64))
    pdf = np.exp(-0.5 * x64 * x64) / math.sqrt(2.0 * math.pi)
    return (cdf + x64 * pdf).astype(F32)


def _silu_dx(x: np.ndarray) -> np.ndarray:
    s = _sigmoid(x).astype(np.float64)
    return (s * (1.0 + x.astype(np.float64) * (1.0 - s))).astype(F32)


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x.astype(np.float64)).astype(F32)


def _abs_max(a: Any, b: Any) -> Any:
    return np.where(np.abs(a) > np.abs(b), a, b)


def _abs_min(a: Any, b: Any) -> Any:
    return np.where(np.abs(a) < np.abs(b), a, b)


def _errstate(fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapped(*args: Any) -> Any:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return fn(*args)

    wrapped.ufunc = fn if isinstance(fn, np.ufunc) else None  # type: ignore[attr-defined]
    return wrapped


_REDUCERS: dict[str, np.ufunc] = {
    "add": np.add,
    "multiply": np.multiply,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "bitwise_and": np.bitwise_and,
    "bitwise_or": np.bitwise_or,
    "bitwise_xor": np.bitwise_xor,
    "subtract": np.subtract,
}

# --- ALU binary (arithmetic) -------------------------------------------------------------------------------------
add = Op("add", np.add, identity=0.0)
subtract = Op("subtract", np.subtract, identity=0.0)
multiply = Op("multiply", np.multiply, identity=1.0)
maximum = Op("maximum", np.maximum, identity=-np.inf)
minimum = Op("minimum", np.minimum, identity=np.inf)
divide = Op("divide", _errstate(np.divide))
power = Op("power", _errstate(np.power))
mod = Op("mod", _errstate(np.mod))
fmod = Op("fmod", _errstate(np.fmod))
abs_max = Op("abs_max", _abs_max, identity=0.0)
abs_min = Op("abs_min", _abs_min, identity=np.inf)
equal = Op("equal", _cmp(np.equal))
not_equal = Op("not_equal", _cmp(np.not_equal))
greater = Op("greater", _cmp(np.greater))
greater_equal = Op("greater_equal", _cmp(np.greater_equal))
less = Op("less", _cmp(np.less))
less_equal = Op("less_equal", _cmp(np.less_equal))
logical_and = Op("logical_and", _cmp(lambda a, b: (a != 0) & (b != 0)), identity=1.0)
logical_or = Op("logical_or", _cmp(lambda a, b: (a != 0) | (b != 0)), identity=0.0)
logical_xor = Op("logical_xor", _cmp(lambda a, b: (a != 0) ^ (b != 0)), identity=0.0)
logical_not = Op("logical_not", unary=lambda x: (x == 0).astype(F32))
# --- bit-vector ops (integers, raw bits) -------------------------------------------------------------------------
bitwise_and = Op("bitwise_and", np.bitwise_and, bitvec=True, identity=-1)
bitwise_or = Op("bitwise_or", np.bitwise_or, bitvec=True, identity=0)
bitwise_xor = Op("bitwise_xor", np.bitwise_xor, bitvec=True, identity=0)
left_shift = Op("left_shift", np.left_shift, bitvec=True)
right_shift = Op("right_shift", lambda a, b: a.astype(np.uint64) >> np.asarray(b, np.uint64), bitvec=True)
invert = Op("invert", unary=np.invert, bitvec=True)
# --- unary: activation functions and unary ALU ops ---------------------------------------------------------------
copy = Op("copy", unary=lambda x: x)
bypass = Op("bypass", unary=lambda x: x)
exp = Op("exp", unary=_errstate(np.exp))
log = Op("log", unary=_errstate(np.log))
sqrt = Op("sqrt", unary=_errstate(np.sqrt))
rsqrt = Op("rsqrt", unary=_errstate(lambda x: 1.0 / np.sqrt(x)))
reciprocal = Op("reciprocal", unary=_errstate(lambda x: 1.0 / x))
square = Op("square", unary=lambda x: x * x)
abs = Op("abs", unary=np.abs)
negative = Op("negative", unary=np.negative)
sign = Op("sign", unary=np.sign)
relu = Op("relu", unary=lambda x: np.maximum(x, 0))
sigmoid = Op("sigmoid", unary=_sigmoid)
tanh = Op("tanh", unary=np.tanh)
gelu = Op("gelu", unary=_gelu)
gelu_dx = Op("gelu_dx", unary=_gelu_dx)
gelu_apprx_tanh = Op("gelu_apprx_tanh", unary=_gelu_tanh)
gelu_apprx_sigmoid = Op("gelu_apprx_sigmoid", unary=lambda x: (x * _sigmoid(F32(1.702) * x)).astype(F32))
gelu_apprx_sigmoid_dx = Op(
    "gelu_apprx_sigmoid_dx",
    unary=lambda x: (_sigmoid(F32(1.702) * x) * (1 + F32(1.702) * x * (1 - _sigmoid(F32(1.702) * x)))).astype(F32),
)
silu = Op("silu", unary=lambda x: (x * _sigmoid(x)).astype(F32))
silu_dx = Op("silu_dx", unary=_silu_dx)
softplus = Op("softplus", unary=_softplus)
mish = Op("mish", unary=lambda x: (x * np.tanh(_softplus(x))).astype(F32))
erf = Op("erf", unary=_erf)
erf_dx = Op("erf_dx", unary=lambda x: (2.0 / math.sqrt(math.pi) * np.exp(-(x.astype(np.float64) ** 2))).astype(F32))
sin = Op("sin", unary=np.sin)
cos = Op("cos", unary=np.cos)
tan = Op("tan", unary=np.tan)
arctan = Op("arctan", unary=np.arctan)
ceil = Op("ceil", unary=np.ceil)
floor = Op("floor", unary=np.floor)
trunc = Op("trunc", unary=np.trunc)
prelu = Op("prelu", unary=lambda x: np.maximum(x, 0))
average = Op("average", np.add, identity=0.0)

ALL_OPS: dict[str, Op] = {v.name: v for v in list(globals().values()) if isinstance(v, Op)}

IDENTITY = {"add": 0.0, "subtract": 0.0, "multiply": 1.0, "maximum": -np.inf, "minimum": np.inf}


def require_op(op: object, instr: str, arg: str) -> Op:
    """Return ``op`` if it is an operator token, else raise the simulator-style error (``checks``)."""
    if not isinstance(op, Op):
        checks.fail(f"{instr} {arg} must be an nl operator token (e.g. nl.add), got {op!r}")
    return op
