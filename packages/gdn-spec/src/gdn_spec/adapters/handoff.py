"""What an adapter hands a kernel, and how a write the kernel makes to it reaches the caller's array.

The suite proves a call read only by comparing the bytes of its own numpy arrays before and after
(``suite._support.run``, the rejection tests). An adapter hands the kernel converted arrays instead: seq-first
transposes copied contiguous, torch tensors (copies on a GPU), key heads repeated, a query the adapter scaled, a
transposed state. A kernel writing one of those writes a copy the suite never sees, so ``Handoff`` carries every
such write back to the caller's array, whether the kernel returned or raised (a rejection must leave every buffer
untouched too).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

import numpy as np


class ArrayIO(Protocol):
    """Moves numpy arrays into the kernel's array type and back (numpy itself, or torch on a device)."""

    def to_kernel(self, x: np.ndarray) -> Any: ...
    def index(self, x: np.ndarray) -> Any: ...
    def from_kernel(self, x: Any) -> np.ndarray: ...


@dataclass(frozen=True)
class _Handed:
    """One array handed to the kernel: the kernel's array, what it was converted from, and both as they were."""

    kernel_array: Any
    source: np.ndarray
    caller: np.ndarray
    kernel_bytes: bytes
    caller_bytes: bytes
    back: Callable[[np.ndarray], np.ndarray] | None = None


class Handoff:
    """The arrays an adapter hands a kernel, each tied to the caller's array it was made from.

    Used as a context manager around building the kernel's arguments and calling it: on leaving (the kernel
    returned or raised), every handed array whose bytes the kernel changed is carried back (``carry_back``).

    Args:
        io (ArrayIO): converts the arrays (numpy, or torch on a device).

    Notes:
        One mechanism for the numpy and torch adapters, so a write is seen at every shape and on every device, not
        only where a conversion happens to be a view of the caller's memory (B = H = 1, torch on the CPU).
    """

    def __init__(self, io: ArrayIO) -> None:
        self._io = io
        self._handed: list[_Handed] = []

    def __enter__(self) -> Handoff:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.carry_back()

    def to_kernel(
        self,
        caller: np.ndarray,
        source: np.ndarray | None = None,
        back: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> Any:
        """``io.to_kernel(source)``, remembered for ``carry_back``.

        Args:
            caller (np.ndarray): the suite's array the kernel's argument stands for.
            source (np.ndarray | None): ``caller`` in the kernel's layout: a view of it (a transpose) or a new array
                (heads repeated, query scaled, a transposed copy); None: ``caller`` itself.
            back (Callable | None): for a new ``source`` that is an exact rearrangement of ``caller`` (a transposed
                state pool made contiguous), the kernel's array in ``caller``'s layout: what the kernel wrote is
                carried back through it, every element exactly.

        Returns:
            Any: the kernel's array.
        """
        source = caller if source is None else source
        return self._remember(self._io.to_kernel(source), source, caller, back)

    def index(self, caller: np.ndarray) -> Any:
        """``io.index(caller)`` (an int64 index array such as ``cu_seqlens``), remembered for ``carry_back``."""
        return self._remember(self._io.index(caller), caller, caller)

    def _remember(
        self, kernel_array: Any, source: np.ndarray, caller: np.ndarray, back: Callable[..., np.ndarray] | None = None
    ) -> Any:
        kernel_bytes = self._io.from_kernel(kernel_array).tobytes()  # a copy: the kernel may share this memory
        self._handed.append(_Handed(kernel_array, source, caller, kernel_bytes, caller.tobytes(), back))
        return kernel_array

    def carry_back(self) -> None:
        """Make every write the kernel made to a handed array a change of the caller's array.

        Notes:
            Only an array whose bytes changed is touched: converting back an untouched array would not be
            bit-exact where the conversion rounds (a query the adapter scaled). An array given its way back
            (``back``) takes the kernel's values through it. A source that is a view of the
            caller's elements (a transpose) takes the kernel's values, which lands them in the caller's array in
            its own layout. A new array (heads repeated, query scaled, a write lost in a cast back) has no exact
            way back: the caller's first element gets its bits flipped instead, so the suite's byte comparison
            sees the write. The caller's arrays are the suite's per-call copies, only ever compared afterwards.
        """
        for handed in self._handed:
            now = self._io.from_kernel(handed.kernel_array)
            if now.tobytes() == handed.kernel_bytes:
                continue
            if handed.back is not None:
                handed.caller[...] = handed.back(now)
                continue
            if now.shape == handed.source.shape and _is_view_of(handed.source, handed.caller):
                handed.source[...] = now
            if handed.caller.tobytes() == handed.caller_bytes:
                _flip_first_element(handed.caller)


def _is_view_of(source: np.ndarray, caller: np.ndarray) -> bool:
    """Whether ``source`` holds exactly ``caller``'s elements (caller itself or a transpose of it): writing one
    writes the other. A copy shares no memory; a view of part of the caller has fewer elements."""
    return source.size == caller.size and np.shares_memory(source, caller)


def _flip_first_element(x: np.ndarray) -> None:
    """Flip every bit of ``x``'s first element, through an unsigned integer view of the same item size (numeric
    arrays: 1, 2, 4 or 8 bytes), so its bytes differ whatever they were."""
    bits = x.view(np.dtype(f"u{x.itemsize}"))
    bits.flat[0] = ~bits.flat[0]


__all__ = ["ArrayIO", "Handoff"]
