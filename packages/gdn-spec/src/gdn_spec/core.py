"""The implementation under test as values: what it declares (`Capabilities`), how it is called
(`Implementation`), and the error a bad one raises (`ImplementationError`).

A leaf of the package: ``impl`` (finding an implementation) and ``adapters`` (calling one of another convention)
both build these, so neither has to import the other for its types.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from gdn_ref.constants import ALGORITHMS, COMPUTE_DTYPES, MAX_HEAD_DIM

from . import capability_rules
from .regimes import Geometry

# Capabilities fields an adapter fills in and a kernel never declares (no key in capability_rules.CHECKS).
ADAPTER_ONLY_FIELDS = ("set_by_adapter",)


class ImplementationError(RuntimeError):
    """The implementation under test could not be resolved (bad spec, ambiguous entry points, bad capabilities)."""


@dataclass(frozen=True)
class Capabilities:
    """What an implementation supports, from its optional ``gdn_spec_capabilities`` dict.

    Attributes:
        name (str): display name (default: the spec string).
        algorithms (tuple[str, ...]): subset of ("schur", "neumann"); default both.
        dtypes (tuple[str, ...]): subset of ("float32", "bfloat16"); default both.
        max_seq_len (int | None): largest S it accepts for the suite's draws; larger shapes are skipped.
        max_lanes (int | None): largest B·Hv per call.
        max_head_dim (int | None): largest Dk and Dv it accepts, at most the contract's MAX_HEAD_DIM = 128 (the
            default, None, means the contract's bound); draws stay below it, fixed shapes run at
            ``nearest_head_dims``.
        head_dims (tuple[int, ...] | None): the only head sizes it accepts, for Dk and Dv alike, e.g. (64, 128);
            None = every size up to ``max_head_dim``. Draws use the suite's sizes within it (its own sizes when
            none of the suite's is); fixed-shape tests at other sizes run at ``nearest_head_dims``.
        equal_head_dims (bool): it needs Dk == Dv; draws then use Dv = Dk, and fixed Dk ≠ Dv tests run at
            ``nearest_head_dims`` (skipped only where the point is Dk ≠ Dv, e.g. rejecting a transposed state).
        max_work (int | None): cost hint, largest B·Hv·S·Dk·Dv per call; slow (e.g. simulated) kernels set it
            so Hypothesis draws smaller shapes, and fixed-shape tests above it are skipped with the reason.
        example_scale (float): multiplies the Hypothesis example count of numerics tests (at least 1 example);
            e.g. 0.25 for a simulator that takes seconds per call.
        content_checks (bool): the implementation validates tensor *contents* (``HOST_ONLY_RULES``:
            mask_pack contents, read-only state). A traced kernel cannot; False skips those rejection cases.
        validates_arguments (bool): it rejects invalid calls (naming the argument, changing no buffer); False
            skips the rejection tests (``profiles``: the "validation" promise).
        state_in_place (bool): a supplied ``recurrent_state`` is updated in place and returned as the same
            object, an omitted one comes back fresh; False (a kernel returning a new state) skips those tests.
        inexpressible_rules (tuple[str, ...]): contract rule ids the call path cannot express (set by adapters:
            torch tensors have no read-only flag, so "recurrent_state.writable" cannot reach a torch kernel);
            their rejection cases are skipped with the reason.
        varlen (bool): it accepts ``cu_seqlens`` (int64 ``[N + 1]``, B = 1, one initial state per sequence),
            checked by the ``varlen`` area.
        state_pool (bool): with ``cu_seqlens`` it takes ``state_indices`` ([n] int32): ``recurrent_state`` is a
            pool [P, Hv, Dk, Dv] fp32 updated in place, sequence i starts from and stores into row
            ``state_indices[i]``, and −1 means no row (start from zero, store nothing); rows not named stay
            bit-identical. Needs ``varlen`` and ``state_in_place`` in a kernel's declaration; a seq-first adapter
            with a ``pool`` option sets it alone (its dense calls return a new state, its pool calls update the
            pool: ``suite._support.updates_state_in_place``).
        bucket (bool): with ``cu_seqlens`` it takes ``bucket=(T, N)``: one program for every layout of T tokens (a
            chunk multiple) and N sequence slots, fewer sequences and empty ones (a repeated ``cu_seqlens`` entry)
            allowed. Needs ``varlen``; the varlen area's serving checks then pass a bucket on every call.
        checkpoints (bool): it takes ``checkpoint_every`` (tokens, a chunk multiple) and ``checkpoint_indices``
            ([n, K] int32 pool rows, −1 = none): the state after ``(k + 1) · checkpoint_every`` tokens of sequence i
            is stored into row ``checkpoint_indices[i, k]`` (none past the sequence's end). Needs ``state_pool``.
        read_rows (bool): it takes ``read_indices`` ([n] int32 pool rows, −1 = start from zero): sequence i starts
            from row ``read_indices[i]`` and still stores into ``state_indices[i]`` (a prefix-cache row it resumes
            from and must not overwrite); rows may repeat, none may be a row the launch writes for another sequence
            or as a checkpoint. Needs ``state_pool``.
        any_seq_len (bool): a dense call accepts any S >= 1, not only the algorithm's chunk multiple (a seq-first
            kernel pads or masks its last chunk itself; set by the seq-first adapters). Numerics draws then end
            inside a chunk (a ragged tail) as well as on a chunk edge, and the long draws always do.
        fixed_scale (bool): it applies Dk**-0.5 itself and cannot be given another scale (HF's
            ``torch_*_gated_delta_rule``; set by the ``scale=internal`` adapters); True skips the test of a
            caller's scale.
        set_by_adapter (tuple[str, ...]): the capabilities above that the adapter set, whatever the kernel
            declared (a seq-first adapter: validates_arguments, state_in_place, varlen, fixed_scale); skip and
            failure messages say so instead of "declares". Not a key a kernel declares.
    """

    name: str
    algorithms: tuple[str, ...] = ALGORITHMS
    dtypes: tuple[str, ...] = COMPUTE_DTYPES
    max_seq_len: int | None = None
    max_lanes: int | None = None
    max_head_dim: int | None = None
    head_dims: tuple[int, ...] | None = None
    equal_head_dims: bool = False
    max_work: int | None = None
    example_scale: float = 1.0
    content_checks: bool = True
    validates_arguments: bool = True
    state_in_place: bool = True
    inexpressible_rules: tuple[str, ...] = ()
    varlen: bool = False
    state_pool: bool = False
    bucket: bool = False
    checkpoints: bool = False
    read_rows: bool = False
    any_seq_len: bool = False
    fixed_scale: bool = False
    set_by_adapter: tuple[str, ...] = ()

    def declaring(self, capability: str) -> str:
        """ "<name> declares <capability>=<value>", or "<name>'s adapter sets ..." when the adapter set it."""
        verb = "'s adapter sets" if capability in self.set_by_adapter else " declares"
        return f"{self.name}{verb} {capability}={getattr(self, capability)!r}"

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any] | None, default_name: str) -> Capabilities:
        """The capabilities a ``gdn_spec_capabilities`` declaration states, every key checked.

        Args:
            raw (Mapping[str, Any] | None): the declaration (None: nothing declared, everything supported).
            default_name (str): the display name when the declaration gives none (the spec string).

        Returns:
            Capabilities: with normalized values (tuples, sorted head_dims, ints).

        Raises:
            ImplementationError: an unknown key (naming the valid keys and the closest one) or a value breaking its
                key's rule (``capability_rules.CHECKS``: the type, the range, the allowed names); the message names
                the key, the value, the rule and the fix. A typo must not widen what is claimed.
        """
        try:
            values = capability_rules.validate(raw)
        except capability_rules.CapabilityError as exc:
            raise ImplementationError(str(exc)) from exc
        return cls(**{"name": default_name, **values})

    def allows_head_dim(self, size: int) -> bool:
        """A single head size (Dk or Dv) is within the declared head_dims and max_head_dim."""
        return self.unsupported_head_dims(size, size) is None

    def unsupported_head_dims(self, Dk: int, Dv: int) -> str | None:
        """Why a (Dk, Dv) pair is outside the declared head-dim support, or None."""
        for label, size in (("Dk", Dk), ("Dv", Dv)):
            if self.head_dims is not None and size not in self.head_dims:
                return f"{self.name}: {label}={size} is not in its declared head_dims={self.head_dims}"
            if self.max_head_dim is not None and size > self.max_head_dim:
                return f"{self.name}: {label}={size} exceeds its declared max_head_dim={self.max_head_dim}"
        if self.equal_head_dims and Dk != Dv:
            return f"{self.name}: Dk={Dk} != Dv={Dv}, and it declares equal_head_dims=True"
        return None

    def nearest_head_dims(self, Dk: int, Dv: int) -> tuple[int, int]:
        """The supported (Dk, Dv) pair a fixed-shape test runs at instead of the requested one.

        The pair itself when it is supported (so a kernel declaring no head-dim limit runs every test exactly as
        requested). Otherwise, among the supported pairs, the first by:

        1. keeping Dk ≠ Dv when the request has it and the kernel allows it: the suite's unequal shapes exist to
           catch a transposed state or swapped Dk/Dv sizes, which Dk == Dv would hide;
        2. the nearest, by |ΔDk| + |ΔDv|;
        3. the cheapest, by Dk·Dv (under equal_head_dims every Dk = Dv between the two requested sizes is equally
           near, so this picks the smaller: when that size is allowed, the call costs no more than the request
           and stays within a max_work the request fitted);
        4. keeping the request's order (Dk > Dv stays Dk > Dv), then the smaller Dk.

        E.g. (32, 16) is (16, 16) under equal_head_dims, (64, 16) under head_dims=(16, 64), and (100, 64) is
        (64, 63) under max_head_dim=64. Deterministic: it depends on the declaration and the request only.
        """
        head_dims = None if self.head_dims is None else tuple(self.head_dims)  # hashable for the cache
        return _nearest_head_dims(head_dims, self.max_head_dim, self.equal_head_dims, Dk, Dv)

    def unsupported(self, algorithm: str | None = None, dtype: str | None = None) -> str | None:
        """Why an (algorithm, dtype) is not supported, or None."""
        if algorithm is not None and algorithm not in self.algorithms:
            return f"{self.name} does not support algorithm={algorithm!r} (supports {self.algorithms})"
        if dtype is not None and dtype not in self.dtypes:
            return f"{self.name} does not support dtype {dtype} (supports {self.dtypes})"
        return None

    def too_large(self, geometry: Geometry) -> str | None:
        """Why a shape exceeds the declared limits, or None."""
        limits = (
            ("S", geometry.S, self.max_seq_len, "max_seq_len"),
            ("B·Hv", geometry.lanes, self.max_lanes, "max_lanes"),
            ("B·Hv·S·Dk·Dv", geometry.work, self.max_work, "max_work"),
        )
        for label, value, limit, key in limits:
            if limit is not None and value > limit:
                return f"{self.name}: {label}={value} exceeds its declared {key}={limit}"
        return None

    def fits(self, geometry: Geometry) -> bool:
        """The shape is within every declared limit."""
        return self.too_large(geometry) is None


@lru_cache(maxsize=256)
def _nearest_head_dims(
    head_dims: tuple[int, ...] | None, max_head_dim: int | None, equal: bool, Dk: int, Dv: int
) -> tuple[int, int]:
    """Capabilities.nearest_head_dims, cached on the declaration (a search over at most 128² pairs)."""
    caps = Capabilities("", max_head_dim=max_head_dim, head_dims=head_dims, equal_head_dims=equal)
    if caps.unsupported_head_dims(Dk, Dv) is None:
        return Dk, Dv
    sizes = head_dims or range(1, (max_head_dim or MAX_HEAD_DIM) + 1)
    pairs = [(a, b) for a in sizes for b in sizes if caps.unsupported_head_dims(a, b) is None]

    def rank(pair: tuple[int, int]) -> tuple[bool, int, int, bool, int]:
        a, b = pair
        return (
            Dk != Dv and a == b,  # a lost Dk ≠ Dv ranks last (only equal pairs remain under equal_head_dims)
            abs(a - Dk) + abs(b - Dv),
            a * b,
            (a > b) != (Dk > Dv),
            a,
        )

    return min(pairs, key=rank)


@dataclass(frozen=True)
class Implementation:
    """The callable under test, where it came from, its capabilities, and how it is called.

    Attributes:
        spec (str): the ``module:callable`` it was loaded from.
        fn (Callable): a callable with gdn_cte's numpy signature (the adapter's, when one is used).
        capabilities (Capabilities): what it declares it supports.
        via (str): the adapter between the suite and the kernel, reported in the summary ("" = called directly).
        default_profile (str): the contract profile a run uses unless one is chosen (``profiles``).
        argument_names (Mapping[str, str]): gdn_cte's argument name -> the kernel's own, where an adapter passes
            it under another name (seq-first: recurrent_state -> initial_state); empty = gdn_cte's names.
    """

    spec: str
    fn: Callable[..., Any]
    capabilities: Capabilities
    via: str = ""
    default_profile: str = "api"
    argument_names: Mapping[str, str] = field(default_factory=dict)

    def __call__(self, **call: Any) -> Any:
        return self.fn(**call)

    def argument_name(self, name: str) -> str:
        """The kernel's own name for gdn_cte's argument ``name``, for messages the kernel's author reads."""
        return self.argument_names.get(name, name)
