"""Raw ``@nki.jit`` kernels with gdn_cte's signature, run through ``nki.simulate``.

The real ``nki.simulate`` when the Neuron SDK's ``nki`` is installed, nki-cpu's otherwise. Both take numpy arrays
and return numpy arrays; the AWS documentation (nki.simulate, "Returns": "NumPy array results") does not promise
that a returned kernel argument comes back as the caller's object, and nki-cpu returns fresh arrays. So the
adapter decides aliasing by value: when a ``recurrent_state`` was supplied and, after the call, the caller's
buffer holds exactly the bytes of the returned state, the kernel wrote its final state into the caller's buffer
and the caller's object is returned. A kernel that leaves the buffer alone (or writes other values there) gets
the simulator's array back and fails the aliasing area, as it should. What a value check cannot tell apart — a
kernel that writes the buffer AND returns a separate tensor with the very same values — is indistinguishable to
any host caller too.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import numpy as np

from ..core import ImplementationError


def _real_nki() -> bool:
    try:
        return importlib.util.find_spec("nki") is not None and importlib.util.find_spec("nki.isa") is not None
    except (ImportError, ValueError):
        return False


def simulator() -> tuple[Callable[..., Any], str]:
    """(``simulate``, its name): the Neuron SDK's ``nki.simulate`` when installed, else nki-cpu's."""
    if _real_nki():  # pragma: no cover - needs the Neuron SDK
        import nki

        return nki.simulate, "nki.simulate"
    try:
        import nki_cpu
    except ImportError as exc:
        raise ImplementationError(
            "the nki adapter runs kernels through nki.simulate: install the Neuron SDK's nki, or nki-cpu"
        ) from exc
    return nki_cpu.simulate, "nki-cpu simulate"


def wrap_nki(kernel: Callable[..., Any], simulate: Callable[..., Any]) -> Callable[..., Any]:
    """gdn_cte's numpy signature around a raw kernel: ``simulate(kernel)(**call)``, aliasing mapped by value."""

    def gdn_cte(**call: Any) -> tuple[Any, Any]:
        result = simulate(kernel)(**call)
        buffer = call.get("recurrent_state")
        if not isinstance(buffer, np.ndarray) or not isinstance(result, tuple) or len(result) != 2:
            return result
        out, state = result
        state = np.asarray(state)
        if state.shape == buffer.shape and state.dtype == buffer.dtype and state.tobytes() == buffer.tobytes():
            return out, buffer
        return out, state

    return gdn_cte


__all__ = ["simulator", "wrap_nki"]
