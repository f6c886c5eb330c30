"""How many programs a compiling backend traces: the launches of gdn-nki's host and torch entry points, counted per
trace key.

torch-neuronx compiles an ``@nki.jit`` kernel on its first call "for the input shapes, data types, and non-tensor
argument values of that call", and later calls with the same ones reuse it ("How to work with NKI kernels from
torch-neuronx", Neuron docs, SDK 2.33, "How NKI kernels run in torch-neuronx"). So a launch's trace key is the
kernel, each array's shape and dtype, and every other argument's value — never an array's contents, device data a
trace does not read — and the number of distinct keys is the number of compiles. nki-cpu interprets every launch
(there is no compile to cache); what it adds is the proof that one key is one program: its trace's
``fingerprint()`` is the same for every launch of a key whose kernel never specialised on data.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np

from . import backend

_SCALARS = (int, float, str, bool, tuple, type(None))


def trace_key(kernel: Any, args: tuple, kwargs: dict[str, Any]) -> tuple:
    """What a launch's trace depends on: the kernel's name, every array's shape and dtype, every other argument's
    value (another object by its type's name)."""

    def part(x: Any) -> Any:
        if isinstance(x, np.ndarray):
            return ("array", x.shape, str(x.dtype))
        return x if isinstance(x, _SCALARS) else type(x).__name__

    name = getattr(kernel, "__name__", None) or getattr(getattr(kernel, "func", None), "__name__", repr(kernel))
    return (name, tuple(part(a) for a in args), tuple(sorted((k, part(v)) for k, v in kwargs.items())))


@contextlib.contextmanager
def counting_traces() -> Iterator[Counter]:
    """Count every launch made through ``backend.simulate`` while the context is open, per ``trace_key``.

    Yields:
        Counter: trace key -> launches; ``len`` of it is how many programs a compiling backend would trace.

    Notes:
        Not thread-safe: it swaps ``backend.simulate`` for the context's duration (each host entry point looks it
        up at call time).
    """
    seen: Counter = Counter()
    launch = backend.simulate

    def recording(kernel: Any) -> Any:
        run = launch(kernel)

        def call(*args: Any, **kwargs: Any) -> Any:
            seen[trace_key(kernel, args, kwargs)] += 1
            return run(*args, **kwargs)

        return call

    backend.simulate = recording
    try:
        yield seen
    finally:
        backend.simulate = launch
