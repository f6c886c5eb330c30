"""Resolving the implementation under test: by spec, environment or entry point, then through an adapter.

An implementation is any callable with gdn_cte's signature. It is found, in order, from
``--gdn-impl module:callable``, the ``GDN_SPEC_IMPL`` environment variable, or the entry-point group
``gdn_spec.implementations`` (used when exactly one is installed; several need an explicit choice).

It may carry a ``gdn_spec_capabilities`` dict (see :class:`Capabilities`, defined in ``core`` with the other
types); whatever it leaves out defaults to "everything", and whatever it excludes is reported as SKIPPED with the
reason, never passed — except head dims: a fixed-shape test at head dims it excludes runs at the nearest pair it
supports (``nearest_head_dims``), and is skipped only when its point needs the excluded shape.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from .adapters import adapt
from .core import ADAPTER_ONLY_FIELDS, Capabilities, Implementation, ImplementationError

ENV_VAR = "GDN_SPEC_IMPL"
ENTRY_POINT_GROUP = "gdn_spec.implementations"
CAPABILITIES_ATTR = "gdn_spec_capabilities"


def load(spec: str) -> Implementation:
    """Import ``module:callable`` (dots allowed after the colon) and read its capabilities."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ImplementationError(f"implementation spec {spec!r} must look like 'module:callable'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        hint = _current_directory_hint(spec, exc)
        raise ImplementationError(f"cannot import {module_name!r} for {spec!r}: {exc}{hint}") from exc
    except Exception as exc:  # the module's own code failed at import: the same one line, the same exit code
        raise ImplementationError(
            f"cannot import {module_name!r} for {spec!r}: importing it raised {type(exc).__name__}: {exc}"
        ) from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ImplementationError(f"{spec!r}: {type(obj).__name__} {obj!r} has no attribute {part!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ImplementationError(f"{spec!r} is not callable")
    try:
        capabilities = Capabilities.from_mapping(getattr(obj, CAPABILITIES_ATTR, None), spec)
    except ImplementationError as exc:  # say whose declaration it is: the error is read far from the kernel
        raise ImplementationError(f"{spec!r}.{CAPABILITIES_ATTR}: {exc}") from exc
    return Implementation(spec, obj, capabilities)


def _current_directory_hint(spec: str, exc: ImportError) -> str:
    """The fix when the spec's module is a file (or package) of the current directory that Python did not look in.

    Args:
        spec (str): the ``module:callable`` spec, e.g. "my_kernel:gdn_cte" or "pkg.kernels:gdn_cte".
        exc (ImportError): what importing its module raised.

    Returns:
        str: "; ./my_kernel.py is here, ... run with PYTHONPATH=. ..." or "" (another cause: the module imports a
        missing dependency, or it is nowhere near).

    Notes:
        A console script (``gdn-spec``, ``pytest``) puts its own directory on sys.path, not the current one, so a
        kernel next to the user is not found unless PYTHONPATH says so.
    """
    top = spec.partition(":")[0].split(".")[0]
    if not isinstance(exc, ModuleNotFoundError) or exc.name != top:
        return ""
    cwd = Path.cwd()
    if any(Path(entry or ".").resolve() == cwd for entry in sys.path):
        return ""
    found = next((f"./{p.name}" for p in (cwd / f"{top}.py", cwd / top) if p.exists()), None)
    if found is None:
        return ""
    return (
        f"; {found} is in the current directory, which is not on sys.path for console scripts: run with "
        f"PYTHONPATH=. (PYTHONPATH=. gdn-spec check {spec})"
    )


def registered() -> dict[str, str]:
    """Entry points of ``gdn_spec.implementations``: name -> 'module:callable'."""
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def resolve(
    option: str | None = None,
    environ: Mapping[str, str] | None = None,
    adapter: str | None = None,
    device: str | None = None,
) -> Implementation | None:
    """The implementation requested by the option, the environment or the only registered entry point.

    Args:
        option (str | None): ``--gdn-impl`` value; a registered entry-point name is accepted too.
        environ (Mapping[str, str] | None): environment (default ``os.environ``).
        adapter (str | None): ``NAME[:key=value,...]`` of a ``gdn_spec.adapters`` adapter to call it through.
        device (str | None): torch device for the torch adapters (default: cuda when torch sees one, else cpu).

    Returns:
        Implementation | None: None when nothing was requested and nothing is registered.

    Raises:
        ImplementationError: bad spec, or several entry points and no choice.
    """
    environ = os.environ if environ is None else environ
    eps = registered()
    spec = option or environ.get(ENV_VAR) or None
    if spec is None:
        if not eps:
            return None
        if len(eps) > 1:
            raise ImplementationError(
                f"several GDN implementations are registered ({', '.join(sorted(eps))}); "
                f"choose one with --gdn-impl NAME or {ENV_VAR}"
            )
        spec = next(iter(eps.values()))
    loaded = load(eps.get(spec, spec))
    if adapter:
        return adapt(loaded, adapter, device)
    if device:
        raise ImplementationError(f"--device {device!r} applies to the torch adapters only; choose one with --adapter")
    return loaded


__all__ = [
    "ADAPTER_ONLY_FIELDS",
    "CAPABILITIES_ATTR",
    "ENTRY_POINT_GROUP",
    "ENV_VAR",
    "Capabilities",
    "Implementation",
    "ImplementationError",
    "load",
    "registered",
    "resolve",
]
