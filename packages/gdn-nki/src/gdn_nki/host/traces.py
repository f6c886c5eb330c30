"""How many programs a compiling backend traces: the launches of gdn-nki's host and torch entry points, counted per
trace key.

torch-neuronx compiles an ``@nki.jit`` kernel on its first call "for the input shapes, data types, and non-tensor
argument values of that call", and later calls with the same ones reuse it ("How to work with NKI kernels from
torch-neuronx", Neuron docs, SDK 2.33, "How NKI kernels run in torch-neuronx"). So a launch's trace key is the
kernel, each array's shape and dtype, and every other argument's value — never an array's contents, device data a
trace does not read — and the number of distinct keys is the number of compiles. nki-cpu interprets every launch
(there is no compile to cache); what it adds is the proof that one key is one program: its trace's
``fingerprint()`` is the same for every launch of a key whose kernel never specialised on data.

``recording_launches`` records both per launch (``Launch``): ``trace_counts`` of its record is the number of
compiles, and a server's launches grouped by bucket show each bucket ran one static program.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..common import backend

_SCALARS = (int, float, str, bool, tuple, type(None))


def kernel_name(kernel: Any) -> str:
    """The name of a kernel function, of a ``kernel[grid]`` launch (its ``func``), or its repr."""
    return getattr(kernel, "__name__", None) or getattr(getattr(kernel, "func", None), "__name__", repr(kernel))


def trace_key(kernel: Any, args: tuple, kwargs: dict[str, Any]) -> tuple:
    """What a launch's trace depends on: the kernel's name, every array's shape and dtype, every other argument's
    value (another object by its type's name)."""

    def part(x: Any) -> Any:
        if isinstance(x, np.ndarray):
            return ("array", x.shape, str(x.dtype))
        return x if isinstance(x, _SCALARS) else type(x).__name__

    return (kernel_name(kernel), tuple(part(a) for a in args), tuple(sorted((k, part(v)) for k, v in kwargs.items())))


@dataclass(frozen=True)
class Launch:
    """One completed kernel launch.

    Attributes:
        key (tuple): its ``trace_key``; ``key[0]`` is the kernel's name.
        programs (tuple[str, ...] | None): nki-cpu's ``Trace.fingerprint()`` of each program of the launch grid, the
            static program it ran; None with the real ``nki``, whose traces nki-cpu cannot see.
    """

    key: tuple
    programs: tuple[str, ...] | None

    @property
    def kernel(self) -> str:
        """The kernel's name."""
        return self.key[0]


@contextlib.contextmanager
def recording_launches() -> Iterator[list[Launch]]:
    """Record every launch made through ``backend.simulate`` while the context is open, in order.

    Yields:
        list[Launch]: one entry per launch, appended once the launch completed (a launch that raised is not in it).

    Notes:
        Not thread-safe: it swaps ``backend.simulate`` for the context's duration (each host entry point looks it
        up at call time).
    """
    launches: list[Launch] = []
    launch = backend.simulate

    def recording(kernel: Any) -> Any:
        run = launch(kernel)

        def call(*args: Any, **kwargs: Any) -> Any:
            result = run(*args, **kwargs)
            launches.append(Launch(trace_key(kernel, args, kwargs), backend.last_program_fingerprints()))
            return result

        return call

    backend.simulate = recording
    try:
        yield launches
    finally:
        backend.simulate = launch


def trace_counts(launches: Iterable[Launch]) -> Counter:
    """Trace key -> launches; ``len`` of it is how many programs a compiling backend would trace."""
    return Counter(launch.key for launch in launches)
