"""Adapters: call a kernel that does not have gdn_cte's numpy signature through the conformance suite.

The suite always calls ``fn(query, key, value, g_log, beta, scale, algorithm, mask_pack, group_size,
recurrent_state)`` with head-major numpy arrays. An adapter turns that call into the kernel's own convention and
the kernel's results back, and is reported with the verdict ("via fla-torch adapter (...), torch 2.5 cpu"):

| adapter | the kernel is | default profile |
|---|---|---|
| ``fla`` | a seq-first numpy function ``fn(q, k, v, g=, beta=, scale=, initial_state=, output_final_state=)`` | math |
| ``fla-torch`` | the same with torch tensors (FLA's ``chunk_gated_delta_rule`` & co.) | math |
| ``hf-torch`` | ``fla-torch`` with ``scale=internal``: HF transformers' ``torch_*_gated_delta_rule`` | math |
| ``torch`` | gdn_cte's signature and layout with torch tensors | api |
| ``nki`` | a raw ``@nki.jit`` kernel with gdn_cte's signature, run through ``nki.simulate`` (nki-cpu without the SDK) | api |

Seq-first conventions are declared after a colon, e.g. ``fla-torch:scale=internal,gqa=repeat,state=vk``
(``seqfirst.Conventions``). A wrong declaration is a wrong adapter, and the suite fails it: the self-tests hold
one mutant each for scale applied twice, heads repeated wrongly and the state transposed. A kernel that takes a
state pool declares its keyword for the rows and the serving keywords it takes, e.g.
``fla-torch:varlen=yes,pool=initial_state_indices,bucket=yes,checkpoints=yes,read_rows=yes``: the adapter then
declares ``state_pool`` (and ``bucket``, ``checkpoints``, ``read_rows``) and the varlen area's serving checks run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..core import Implementation, ImplementationError


@dataclass(frozen=True)
class AdapterKind:
    """One registered adapter: what it wraps, its default profile and what it forces in the capabilities."""

    doc: str
    default_profile: str
    seq_first: bool
    array_io: str  # "numpy", "torch" or "nki"
    preset: tuple[tuple[str, str], ...] = ()


ADAPTERS: dict[str, AdapterKind] = {
    "fla": AdapterKind("seq-first numpy function (FLA calling convention)", "math", True, "numpy"),
    "fla-torch": AdapterKind(
        "seq-first torch function (FLA's chunk/fused_recurrent_gated_delta_rule)", "math", True, "torch"
    ),
    "hf-torch": AdapterKind(
        "seq-first torch function that scales q by K**-0.5 itself (HF's torch_*_gated_delta_rule)",
        "math",
        True,
        "torch",
        (("scale", "internal"),),
    ),
    "torch": AdapterKind("gdn_cte's signature and layout with torch tensors", "api", False, "torch"),
    "nki": AdapterKind("raw @nki.jit kernel with gdn_cte's signature, through nki.simulate", "api", False, "nki"),
}


def parse(spec: str, presets: Mapping[str, tuple[tuple[str, str], ...]] | None = None) -> tuple[str, dict[str, str]]:
    """``NAME[:key=value,...]`` -> (name, options); unknown names and malformed options are errors.

    ``presets``: adapter name -> its preset options, for another registry (``gdn_spec.decode.adapters``);
    default ``ADAPTERS``'."""
    presets = {n: kind.preset for n, kind in ADAPTERS.items()} if presets is None else presets
    name, _, raw = spec.partition(":")
    if name not in presets:
        raise ImplementationError(f"unknown adapter {name!r}; choose one of {', '.join(presets)}")
    given: dict[str, str] = {}
    for item in filter(None, raw.split(",")):
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key or not value:
            raise ImplementationError(f"adapter option {item!r} of {spec!r} must look like key=value")
        if key in given:  # the last one would silently win: say which of the two was meant
            raise ImplementationError(
                f"adapter option {key!r} given twice in {spec!r} ({given[key]!r} and {value!r}); keep one"
            )
        given[key] = value
    return name, {**dict(presets[name]), **given}


def adapt(impl: Implementation, spec: str, device: str | None = None) -> Implementation:
    """``impl`` called through the adapter ``spec``: the wrapped callable, its capabilities and its description.

    Args:
        impl (Implementation): the loaded kernel (its ``fn`` has the kernel's own convention).
        spec (str): ``NAME[:key=value,...]``, a key of ``ADAPTERS`` with options.
        device (str | None): torch device for the torch adapters (default cuda when available, else cpu).

    Returns:
        Implementation: gdn_cte's numpy signature around the kernel; ``via`` describes the adapter.

    Raises:
        ImplementationError: unknown adapter or option, a missing optional dependency (torch, nki), or a
            device given to an adapter that has none.
    """
    name, options = parse(spec)
    kind = ADAPTERS[name]
    if device and kind.array_io != "torch":
        raise ImplementationError(f"--device applies to the torch adapters; {name!r} has no device")
    caps = impl.capabilities
    io_label = ""
    if kind.array_io == "torch":
        from .torch_io import TorchIO

        io = TorchIO.create(device)
        io_label = f", {io.describe()}"
    else:
        io = None
    names: dict[str, str] = {}
    if kind.seq_first:
        from .seqfirst import Conventions, kernel_names, wrap_seq_first

        conventions = Conventions.from_options(options)
        fn: Callable[..., Any] = wrap_seq_first(impl.fn, conventions, io)
        caps = replace(
            caps,
            validates_arguments=False,
            state_in_place=False,  # a dense call returns a new state; a pool call updates the pool (state_pool)
            varlen=conventions.takes_cu_seqlens,
            any_seq_len=True,  # FLA's and HF's kernels take any T (the last chunk padded or masked inside)
            fixed_scale=conventions.scale == "internal",
            # what reaches the kernel besides cu_seqlens: pool rows and the serving keywords, as declared
            state_pool=conventions.takes_pool,
            bucket=conventions.bucket == "yes",
            checkpoints=conventions.checkpoints == "yes",
            read_rows=conventions.read_rows == "yes",
            set_by_adapter=(
                "validates_arguments",
                "state_in_place",
                "varlen",
                "any_seq_len",
                "fixed_scale",
                "state_pool",
                "bucket",
                "checkpoints",
                "read_rows",
            ),
        )
        label = f"{name} adapter ({conventions.describe()}){io_label}"
        names = kernel_names(impl.fn)
        if conventions.takes_pool:
            names["state_indices"] = conventions.pool
    elif kind.array_io == "torch":
        _no_options(name, options)
        from .torch_io import wrap_torch_signature

        fn = wrap_torch_signature(impl.fn, io)
        # A read-only numpy buffer becomes a writable tensor: the rule cannot reach the kernel.
        caps = replace(caps, inexpressible_rules=(*caps.inexpressible_rules, "recurrent_state.writable"))
        label = f"{name} adapter{io_label}"
    else:
        _no_options(name, options)
        from .nki_sim import simulator, wrap_nki

        run, backend = simulator()
        fn = wrap_nki(impl.fn, run)
        # Traced: shapes, dtypes and scalars are known at trace time, tensor contents are not.
        caps = replace(caps, content_checks=False)
        label = f"{name} adapter, {backend}"
    return replace(
        impl, fn=fn, capabilities=caps, via=label, default_profile=kind.default_profile, argument_names=names
    )


def _no_options(name: str, options: dict[str, str]) -> None:
    if options:
        raise ImplementationError(f"adapter {name!r} takes no options, got {sorted(options)}")


__all__ = ["ADAPTERS", "AdapterKind", "adapt", "parse"]
