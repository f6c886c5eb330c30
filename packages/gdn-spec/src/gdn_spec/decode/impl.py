"""Which family an implementation belongs to, and loading a decode kernel (its capabilities, its adapter).

A run checks one family: ``prefill`` (gdn_cte's signature, the suite's other areas) or ``decode``
(``decode_step``'s, the ``decode_*`` areas). ``auto`` (the default) picks decode when the callable declares
``gdn_spec_decode_capabilities`` or the adapter is a decode adapter, prefill otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from ..adapters import ADAPTERS
from ..impl import Implementation, ImplementationError, resolve
from .adapters import DECODE_ADAPTERS, adapt_decode, is_decode_adapter
from .capabilities import CAPABILITIES_ATTR, DecodeCapabilities

FAMILIES = ("auto", "prefill", "decode")


def is_decode(impl: Implementation | None) -> bool:
    """The implementation is a decode kernel (loaded by ``resolve_family`` as one)."""
    return impl is not None and isinstance(impl.capabilities, DecodeCapabilities)


def resolve_family(
    option: str | None = None,
    *,
    adapter: str | None = None,
    device: str | None = None,
    family: str = "auto",
    environ: Mapping[str, str] | None = None,
) -> Implementation | None:
    """The implementation to check, of the family asked for or detected (module docstring).

    Args:
        option, adapter, device, environ: as ``gdn_spec.impl.resolve``.
        family (str): "auto", "prefill" or "decode".

    Returns:
        Implementation | None: a decode kernel carries ``DecodeCapabilities``; None when nothing was requested.

    Raises:
        ImplementationError: as ``resolve``, an unknown family, or an adapter of the other family.
    """
    if family not in FAMILIES:
        raise ImplementationError(f"family {family!r}: choose one of {FAMILIES}")
    if family == "prefill" and is_decode_adapter(adapter):
        raise ImplementationError(f"adapter {adapter!r} is a decode adapter; the prefill family takes another")
    if family == "prefill":
        return resolve(option, environ, adapter, device)
    loaded = resolve(option, environ)
    if loaded is None:
        return None
    declared = getattr(loaded.fn, CAPABILITIES_ATTR, None) is not None
    if family == "auto" and not declared and not is_decode_adapter(adapter):
        return resolve(option, environ, adapter, device)
    if adapter and adapter.partition(":")[0] in ADAPTERS:
        raise ImplementationError(
            f"adapter {adapter!r} is a prefill adapter; a decode kernel takes one of {', '.join(DECODE_ADAPTERS)}"
        )
    try:
        caps = DecodeCapabilities.from_mapping(getattr(loaded.fn, CAPABILITIES_ATTR, None), loaded.spec)
    except ImplementationError as exc:
        raise ImplementationError(f"{loaded.spec!r}.{CAPABILITIES_ATTR}: {exc}") from exc
    decode = replace(loaded, capabilities=caps)
    if adapter:
        return adapt_decode(decode, adapter, device)
    if device:
        raise ImplementationError(f"--device {device!r} applies to the torch adapters only; choose one with --adapter")
    return decode


__all__ = ["FAMILIES", "is_decode", "resolve_family"]
