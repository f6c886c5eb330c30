"""Launching kernels: ``jit``, ``simulate``, the ``kernel[n]`` grid, traces, and the opt-in ``import nki`` alias.

A launch wraps every numpy argument as an HBM ``NkiTensor`` over the caller's memory (no copy, so in-place writes
reach the caller), runs the kernel body eagerly once per program id, and converts returned tensors (or views of
them) into fresh numpy arrays in the returned view's shape. Each program gets its own :class:`Trace`.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import sys
import types
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from nki_cpu import checks, frameworks, isa, language, registers_live, state
from nki_cpu.cost.record import Trace
from nki_cpu.target import get_nc_version
from nki_cpu.tensor import MemoryRegion, NkiTensor, wrap_array

_last_traces: list[Trace] = []


class Kernel:
    """A ``@jit``-decorated kernel.

    Args:
        fn: the kernel body (plain Python using ``nl`` / ``nisa``).
        grid: launch-grid size (``kernel[n]``), None for a plain launch.
        options: ``jit`` keywords (accepted and ignored: ``mode``, ``debug_kernel``, ...).

    Notes:
        Called inside a running kernel it is an inlined Python call (same program, same tensors). Called outside
        any launch it runs in simulation exactly like ``simulate(kernel)(...)`` (README).
    """

    def __init__(self, fn: Callable[..., Any], grid: int | None = None, options: dict[str, Any] | None = None):
        self.fn = fn
        self.grid = grid
        self.options = dict(options or {})
        functools.update_wrapper(self, fn)

    def __getitem__(self, grid: Any) -> Kernel:
        if isinstance(grid, tuple):
            if len(grid) != 1:
                raise ValueError(f"nki-cpu: the launch bracket holds exactly one number, got {grid!r}")
            grid = grid[0]
        if not isinstance(grid, (int, np.integer)) or isinstance(grid, bool) or grid < 1:
            raise ValueError(
                f"nki-cpu: the launch grid must be a positive int (kernel[n]), got {grid!r}; a string, float or "
                "bool is not converted"
            )
        return Kernel(self.fn, int(grid), self.options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if state.in_kernel():
            return self.fn(*args, **kwargs)
        return simulate(self)(*args, **kwargs)


def jit(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    """Decorate a kernel: ``@jit``, ``@jit(mode='trace')``, ``jit(fn)``; unknown keywords are ignored.

    Args:
        fn: the kernel function.
        options: compiler options of the real ``nki.jit`` (ignored).

    Returns:
        A :class:`Kernel` (or a decorator when ``fn`` is None).
    """
    if fn is None:
        return lambda f: Kernel(f, None, options)
    return Kernel(fn, None, options)


def _wrap(value: Any, buffer: MemoryRegion, copies: list[tuple[np.ndarray, np.ndarray]], name: str = "") -> Any:
    if isinstance(value, np.ndarray):
        array = value
        if not value.flags.c_contiguous:
            array = np.ascontiguousarray(value).copy()
            if value.flags.writeable:
                copies.append((value, array))
        tensor = wrap_array(array, buffer)
        if not value.flags.writeable:
            # No silent copy for a read-only array: the kernel could not update the caller's memory, so a write
            # into it is an error naming the argument (``NkiTensor.write``).
            tensor.storage.read_only_argument = name or "?"
        return tensor
    if isinstance(value, tuple) and any(isinstance(v, np.ndarray) for v in value):
        return tuple(_wrap(v, buffer, copies, f"{name}[{i}]") for i, v in enumerate(value))
    return value


def _wrap_named(name: str, value: Any, buffer: MemoryRegion, copies: list[tuple[np.ndarray, np.ndarray]]) -> Any:
    """``_wrap``, with an array whose dtype NKI lacks (numpy's default float64, say) reported by argument name; a
    CPU torch tensor is wrapped through its numpy view (same memory)."""
    if frameworks.is_torch_tensor(value):
        value = frameworks.torch_to_numpy(name, value)
    try:
        return _wrap(value, buffer, copies, name)
    except TypeError as exc:
        raise TypeError(f"nki-cpu: kernel argument `{name}`: {exc}; cast it before the launch") from exc


def _positional_names(fn: Callable[..., Any], count: int) -> list[str]:
    """Names of the first ``count`` positional parameters of ``fn`` (``arg<i>`` past its signature)."""
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        params = []
    return [params[i] if i < len(params) else f"arg{i}" for i in range(count)]


def _unwrap(value: Any, as_torch: bool = False) -> Any:
    if isinstance(value, NkiTensor):
        return frameworks.numpy_to_torch(value._read()) if as_torch else value._read()
    if isinstance(value, (tuple, list)):
        return type(value)(_unwrap(v, as_torch) for v in value)
    return value


def simulate(
    kernel: Callable[..., Any],
    *,
    check_capacity: bool = True,
    sbuf_bytes_per_partition: int = checks.SBUF_BYTES_PER_PARTITION,
    blas_threads: int | None = 1,
    relax: Iterable[str] = (),
) -> Callable[..., Any]:
    """Run a kernel on the CPU: numpy arrays in, numpy arrays out (like ``nki.simulate``).

    Args:
        kernel: a :class:`Kernel`, ``kernel[n]`` or a plain function.
        check_capacity: raise when live SBUF/PSUM bytes per partition exceed the capacity.
        sbuf_bytes_per_partition: SBUF capacity used by the check.
        blas_threads: BLAS threads while the launch runs (``threadpoolctl``, set once per launch); None leaves
            the process setting alone. One thread is the default: an interpreted ``nc_matmul`` is at most
            128×128×512, too small to gain from BLAS threads, and busy-waiting BLAS threads on a loaded machine
            made GDN-size launches 7-25× slower on 2 cores (README, "Speed").
        relax: names of documented rules (``checks.RULES``; README, "What is enforced") to report as
            ``RuntimeWarning`` instead of raising, for this launch only. Nothing is ever skipped silently.

    Returns:
        A callable taking the kernel's arguments; numpy arrays (and CPU torch tensors, through their numpy view)
        become HBM tensors sharing the caller's memory. Results are numpy, or torch when any argument was torch.
        Programs of a grid run one after another (program 0 first); the returned value is program 0's.

    Notes:
        The traces of the launch are available afterwards from :func:`last_trace` / :func:`last_traces`.
    """
    if isinstance(kernel, Kernel):
        fn, grid = kernel.fn, kernel.grid
    else:
        fn, grid = kernel, None
    relaxed = frozenset(relax)
    unknown = relaxed - checks.RULES
    if unknown:
        raise ValueError(
            f"nki-cpu: simulate relax names unknown rules {sorted(unknown)}; known: {sorted(checks.RULES)}"
        )

    def run(*args: Any, **kwargs: Any) -> Any:
        if state.in_kernel():
            return fn(*args, **kwargs)
        programs = grid or 1
        _check_grid(programs, relaxed)
        buffer = MemoryRegion.shared_hbm if programs > 1 else MemoryRegion.private_hbm
        traces: list[Trace] = []
        results: list[Any] = []
        copies: list[tuple[np.ndarray, np.ndarray]] = []
        names = _positional_names(fn, len(args))
        wrapped_args = [_wrap_named(name, a, buffer, copies) for name, a in zip(names, args, strict=True)]
        wrapped_kwargs = {k: _wrap_named(k, v, buffer, copies) for k, v in kwargs.items()}
        limits = threadpool_limits(blas_threads, user_api="blas") if blas_threads is not None else None
        try:
            _run_programs(programs, launch_kwargs, results, traces, wrapped_args, wrapped_kwargs)
        finally:
            if limits is not None:
                limits.restore_original_limits()
        for original, working in copies:
            original[...] = working
        torch_in = any(frameworks.is_torch_tensor(v) for v in (*args, *kwargs.values()))
        return _unwrap(results[0], torch_in)

    launch_kwargs = {
        "check_capacity": check_capacity,
        "sbuf_capacity": sbuf_bytes_per_partition,
        "program_ndim": 0 if grid is None else 1,
        "relaxed": relaxed,
    }

    def _run_programs(
        programs: int,
        options: dict[str, Any],
        results: list[Any],
        traces: list[Trace],
        args: list[Any],
        kwargs: dict[str, Any],
    ) -> None:
        shared_pool: list[Any] = []
        for pid in range(programs):
            launch = state.Launch(shared_pool=shared_pool, program_id=pid, num_programs=programs, **options)
            previous = state.push(launch)
            try:
                results.append(fn(*args, **kwargs))
                over = registers_live.over_the_limit(launch.trace)
                if over:  # a hardware limit of the whole program: known once the launch's last instruction ran
                    checks.rule("live_registers", over, launch.relaxed)
            finally:
                state.pop(previous)
                traces.append(launch.trace)
                _last_traces[:] = traces

    return run


def lnc_degrees() -> tuple[int, ...]:
    """Launch-grid sizes the target accepts: the LNC degree, 1 or 2 on Trn2/Trn3, 1 on Trn1/Inf2.

    The SDK supports an LNC degree of 1 or 2, and since NKI 0.7.0 (SDK 2.33) a grid that differs from the
    compiler's LNC degree is an error (LNC page, v2.33.1; docs/nki-sources.md §1.3).
    """
    return (1,) if get_nc_version().value <= 2 else (1, 2)


def _check_grid(programs: int, relaxed: frozenset[str]) -> None:
    allowed = lnc_degrees()
    if programs not in allowed:
        checks.rule(
            "lnc_grid",
            f"launch grid {programs} is not an LNC degree of this target (allowed: {', '.join(map(str, allowed))}); "
            "launch kernel[1] or kernel[2] and split the work inside the kernel",
            relaxed,
        )


def last_trace() -> Trace:
    """Trace of program 0 of the most recent ``simulate`` launch (raises if none ran yet)."""
    if not _last_traces:
        raise RuntimeError("nki-cpu: no kernel has been simulated yet")
    return _last_traces[0]


def last_traces() -> list[Trace]:
    """Traces of every program of the most recent launch, by program id."""
    return list(_last_traces)


_ALIAS_MARK = "__nki_cpu_alias__"


def install_as_nki() -> types.ModuleType:
    """Opt in: make ``import nki``, ``import nki.language as nl``, ``import nki.isa as nisa`` resolve to nki-cpu.

    Returns:
        The ``nki`` facade module (``jit``, ``simulate``, ``language``, ``isa``, ``typing``).

    Raises:
        RuntimeError: when a real ``nki`` package is importable (it would be shadowed) — nki-cpu refuses to
            hide it; use the real package, or uninstall it.

    Notes:
        Idempotent. Detection uses ``importlib.util.find_spec``, which locates a package without importing it.
    """
    existing = sys.modules.get("nki")
    if existing is not None and getattr(existing, _ALIAS_MARK, False):
        return existing
    if existing is not None or importlib.util.find_spec("nki") is not None:
        raise RuntimeError(
            "nki-cpu: a real 'nki' package is importable in this environment; install_as_nki() refuses to shadow "
            "it. Use the real package, or uninstall it to run kernels on nki-cpu."
        )
    facade = types.ModuleType("nki", "nki-cpu standing in for the Neuron 'nki' package (nki_cpu.install_as_nki)")
    typing_mod = types.ModuleType("nki.typing")
    typing_mod.tensor = _TensorAnnotation()  # type: ignore[attr-defined]
    setattr(facade, _ALIAS_MARK, True)
    facade.jit = jit  # type: ignore[attr-defined]
    facade.simulate = simulate  # type: ignore[attr-defined]
    facade.language = language  # type: ignore[attr-defined]
    facade.isa = isa  # type: ignore[attr-defined]
    facade.typing = typing_mod  # type: ignore[attr-defined]
    facade.__path__ = []  # a package, so submodule imports consult sys.modules
    sys.modules["nki"] = facade
    sys.modules["nki.language"] = language
    sys.modules["nki.isa"] = isa
    sys.modules["nki.typing"] = typing_mod
    return facade


class _TensorAnnotation:
    """``nki.typing.tensor[shape]`` annotations: subscripting returns the NkiTensor type."""

    def __getitem__(self, item: Any) -> type:
        return NkiTensor
