"""Operand rounding hooks: how the numpy references emulate the kernel's narrow matmul operands."""

from __future__ import annotations

from collections.abc import Callable

import ml_dtypes
import numpy as np

RoundFn = Callable[[np.ndarray], np.ndarray]
"""Maps an array to the values it would have as a matmul operand, in the same (wide) dtype."""

# float32 bit layout: bf16 keeps the upper 16 bits, so rounding adds half of the dropped range
# (0x7FFF) plus the kept part's lowest bit (ties to even) before truncating.
_BF16_KEEP_MASK = np.uint32(0xFFFF0000)
_BF16_HALF_MINUS_ONE = np.uint32(0x7FFF)


def keep(x: np.ndarray) -> np.ndarray:
    """Identity hook: operands are used at the compute precision."""
    return x


def to_bf16_values(x: np.ndarray) -> np.ndarray:
    """Round to the nearest bfloat16 (ties to even) and return the values in x's own float dtype.

    Args:
        x (np.ndarray): float32 or float64 array.

    Returns:
        np.ndarray: same shape and dtype as x, every value exactly representable in bfloat16.

    Notes:
        float32 goes through a bit trick (several times faster than an ml_dtypes round trip, and
        bit-identical to it for finite values and infinities; NaNs stay NaN). Other dtypes use ml_dtypes.
        A product of two bf16 values is exact in float32, so ``to_bf16_values(a) @ to_bf16_values(b)`` in
        float32 is the "bf16 operands, fp32 accumulation" matmul of the hardware.
    """
    if x.dtype != np.float32:
        return x.astype(ml_dtypes.bfloat16).astype(x.dtype)
    bits = np.ascontiguousarray(x).view(np.uint32)
    lowest_kept = (bits >> np.uint32(16)) & np.uint32(1)
    rounded = ((bits + _BF16_HALF_MINUS_ONE + lowest_kept) & _BF16_KEEP_MASK).view(np.float32)
    # The carry of the rounding add can turn a NaN payload into inf (or wrap it), so NaNs are put back.
    nan = np.isnan(x)
    return np.where(nan, x, rounded) if nan.any() else rounded


def operand_rounding(bf16_operands: bool) -> RoundFn:
    """The operand hook for a precision mode: bf16 rounding when emulating the kernel, else identity."""
    return to_bf16_values if bf16_operands else keep
