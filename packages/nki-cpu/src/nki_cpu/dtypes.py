"""NKI dtypes as numpy dtypes, and the one rounding step every instruction ends with.

NKI dtypes are plain ``numpy.dtype`` objects here (bfloat16 and the fp8 types come from ``ml_dtypes``), so
``t.dtype == nl.bfloat16`` and ``t.dtype == np.float32`` both work and storage is an ordinary numpy array.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

float32 = np.dtype(np.float32)
float16 = np.dtype(np.float16)
bfloat16 = np.dtype(ml_dtypes.bfloat16)
# tfloat32 has no numpy type: stored as float32 without mantissa rounding (README, known unknown 6).
tfloat32 = float32
float8_e4m3 = np.dtype(ml_dtypes.float8_e4m3)
float8_e4m3fn = np.dtype(ml_dtypes.float8_e4m3fn)
float8_e5m2 = np.dtype(ml_dtypes.float8_e5m2)
float8_e8m0fnu = np.dtype(ml_dtypes.float8_e8m0fnu)
# 32-bit containers of four packed values (MX matmul only); stored as raw uint32 words.
float8_e5m2_x4 = np.dtype(np.uint32)
float8_e4m3fn_x4 = np.dtype(np.uint32)
float4_e2m1fn_x4 = np.dtype(np.uint32)
int8 = np.dtype(np.int8)
int16 = np.dtype(np.int16)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
uint8 = np.dtype(np.uint8)
uint16 = np.dtype(np.uint16)
uint32 = np.dtype(np.uint32)
# NKI stores booleans as one byte.
bool_ = np.dtype(np.uint8)

SUPPORTED = frozenset(
    {
        float32,
        float16,
        bfloat16,
        float8_e4m3,
        float8_e4m3fn,
        float8_e5m2,
        float8_e8m0fnu,
        int8,
        int16,
        int32,
        int64,
        uint8,
        uint16,
        uint32,
    }
)

# Float dtypes whose every value converts exactly to fp32 (inputs of that dtype may be cast on the fly).
EXACT_IN_F32 = frozenset({float32, float16, bfloat16, float8_e4m3, float8_e4m3fn, float8_e5m2, float8_e8m0fnu})

NAN_FILL_INT = 4  # the real simulator fills fresh integer tensors with 4 (SIM)


def as_dtype(dtype: object) -> np.dtype:
    """Normalise a user-given dtype (nl dtype, numpy type, string) to a supported ``numpy.dtype``.

    Args:
        dtype: anything ``numpy.dtype`` accepts, e.g. ``nl.bfloat16``, ``np.float32``, ``"bfloat16"``.

    Returns:
        The ``numpy.dtype``.

    Notes:
        float64 and bool numpy types are rejected: NKI has neither (bool maps to ``nl.bool_`` = uint8 only when
        spelled ``nl.bool_``).
    """
    if isinstance(dtype, np.dtype) and dtype in SUPPORTED:
        return dtype
    if isinstance(dtype, str) and hasattr(ml_dtypes, dtype):
        dt = np.dtype(getattr(ml_dtypes, dtype))
    else:
        dt = np.dtype(dtype)  # type: ignore[call-overload]
    if dt == np.dtype(np.bool_):
        return bool_
    if dt not in SUPPORTED:
        raise TypeError(f"nki-cpu: dtype {dt} is not an NKI dtype (supported: float32, bfloat16, float16, fp8, ints)")
    return dt


def is_float(dtype: np.dtype) -> bool:
    """True for floating-point dtypes (including the ml_dtypes ones)."""
    return not is_int(dtype)


def is_int(dtype: np.dtype) -> bool:
    """True for integer dtypes."""
    return dtype.kind in "iu"


_NAMES: dict[np.dtype, str] = {}


def name(dtype: np.dtype) -> str:
    """The NKI spelling of a dtype (``"bfloat16"``, ``"float32"``, ``"int32"``...); cached per dtype."""
    cached = _NAMES.get(dtype)
    if cached is None:
        cached = _NAMES[dtype] = str(np.dtype(dtype))
    return cached


def fill_value(dtype: np.dtype) -> float | int:
    """Sentinel a fresh allocation is filled with: NaN for floats, 4 for integers (like the real simulator)."""
    return NAN_FILL_INT if is_int(dtype) else np.nan


def round_to(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Round fp32 (or wider) values ONCE into ``dtype``.

    Args:
        values: numpy array of computed values (fp32 for arithmetic, integers for bit-vector results).
        dtype: destination dtype.

    Returns:
        A new array of ``dtype``.

    Notes:
        Floats: round-to-nearest-even via numpy/ml_dtypes ``astype`` (the simulator's precise mode). Integers from
        floats: round-to-nearest-even then saturate to the destination range, NaN → 0 (RN 0.6.0). Integers from
        integers: two's-complement wrap.
    """
    values = np.asarray(values)
    if is_int(dtype):
        if values.dtype.kind in "iub":
            return values.astype(dtype)
        info = np.iinfo(dtype)
        as64 = np.nan_to_num(np.rint(values.astype(np.float64)), nan=0.0)
        return np.clip(as64, info.min, info.max).astype(dtype)
    if values.dtype.kind in "iub" and dtype != float32:
        values = values.astype(np.float32)
    return values.astype(dtype)


def to_f32(values: np.ndarray) -> np.ndarray:
    """Convert stored values to fp32 (exact for every ≤32-bit float dtype)."""
    return np.asarray(values).astype(np.float32)
