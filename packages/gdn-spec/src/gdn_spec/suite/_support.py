"""Helpers shared by the suite's test modules: calling the implementation, the oracle, reporting numbers."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import numpy as np
import pytest
from hypothesis import strategies as st

from gdn_ref.constants import ALGORITHM_NEUMANN, ALGORITHM_SCHUR, CHUNK_BY_ALGORITHM, CHUNK_SCHUR, DEFAULT_GROUP_SIZE
from gdn_ref.masks import build_mask_pack

from ..contract import geometry_of
from ..failures import returned_kind
from ..impl import Capabilities, Implementation
from ..metrics import Error, describe
from ..plugin import note_substitution
from ..regimes import EQUAL_HEAD_GEOMETRIES, GROUP_SIZES, HEAD_DIMS, HEAD_GEOMETRIES, Case, Geometry

NUMERICS_PROPERTY = "gdn_numerics"
# Longest short draws, in chunks: schur 7 chunks = 3 groups of 2 plus a partial group (group_size 2), or 2 groups
# of 3 plus one; neumann 8 chunks = 512 tokens. Long enough for state carry at every head size, short enough for a
# 2-core CI; several full groups at the default group size are the long cases' (``LONG_CASES``).
MAX_CHUNKS = {ALGORITHM_SCHUR: 7, ALGORITHM_NEUMANN: 8}
# Default per-call budget of drawn shapes, B·Hv·S·Dk·Dv (e.g. 1·4·512·64·128): the float64 oracle and a numpy
# reference take about a second there on one core. A kernel's declared max_work can only lower it.
DEFAULT_MAX_WORK = 1 << 24


@lru_cache(maxsize=1)
def mask_pack() -> np.ndarray:
    """The schur mask pack (built once; each call gets a copy so a mutating implementation cannot poison it)."""
    return build_mask_pack()


def call_args(case: Case, algorithm: str, group_size: int = DEFAULT_GROUP_SIZE) -> dict[str, Any]:
    """gdn_cte keyword arguments for a case (fresh copies, so every call starts from the case's values)."""
    args = {name: None if x is None else x.copy() for name, x in case.kernel.items()}
    args.update(
        scale=case.scale,
        algorithm=algorithm,
        mask_pack=mask_pack().copy() if algorithm == ALGORITHM_SCHUR else None,
        group_size=group_size,
    )
    return args


def run(impl: Implementation, args: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Call the implementation and return (out, state) as numpy arrays (the state object itself, not a copy).

    A call outside the declared support (head dims, max_seq_len, max_lanes, max_work) is skipped with the reason
    instead of made (``require_call_supported``). Every call the suite makes through here also checks that the caller's arrays are as they were: the inputs
    are read-only, and so is a supplied ``recurrent_state`` unless the implementation declares ``state_in_place``
    (a kernel returning a new state must not touch the caller's — in a serving stack it is a row of the state
    pool), or, for a call with ``state_indices``, ``state_pool`` (a pool's rows are written in place).
    Comparing bytes catches any write, NaN-filling included.
    """
    require_call_supported(impl.capabilities, args)
    writable = {"recurrent_state"} if updates_state_in_place(impl.capabilities, args) else set()
    before = {name: data for name, data in snapshot(args).items() if name not in writable}
    result = impl(**args)
    for name in changed(before, args):
        # Named as the kernel under test calls it (an adapter may rename it: initial_state for a seq-first kernel).
        shown = impl.argument_name(name)
        aka = "" if shown == name else f" (the suite's `{name}`, renamed by the adapter)"
        pytest.fail(f"the call changed the caller's `{shown}`{aka}: {_read_only_rule(impl, name, shown)}",
                    pytrace=False)  # fmt: skip
    if not isinstance(result, tuple) or len(result) != 2:
        pytest.fail(f"gdn_cte must return (out, final_state); got {returned_kind(result)}", pytrace=False)
    out, state = result
    return np.asarray(out), state if isinstance(state, np.ndarray) else np.asarray(state)


def updates_state_in_place(caps: Capabilities, args: dict[str, Any]) -> bool:
    """Whether the call may write the caller's ``recurrent_state``: the kernel updates a supplied state in place
    (``state_in_place``), or the call names pool rows (``state_indices``) of a kernel declaring ``state_pool``. A
    seq-first adapter with a pool declares the second only: its dense calls return a new state, read only."""
    return caps.state_in_place or (caps.state_pool and args.get("state_indices") is not None)


def _read_only_rule(impl: Implementation, name: str, shown: str) -> str:
    """The rule a write to the caller's argument ``name`` (``shown`` as the kernel calls it) broke, and the fix."""
    if name != "recurrent_state":
        return "the inputs are read only; work on a copy"
    caps = impl.capabilities
    rule = f"a supplied `{shown}` is read only for an implementation that returns a new state ({caps.declaring('state_in_place')})"
    if "state_in_place" not in caps.set_by_adapter:
        return f"{rule}; work on a copy, or declare state_in_place=True and return the updated buffer itself"
    # A seq-first kernel follows FLA: the final state is returned and initial_state is left as passed. A kernel
    # updating a state pool in place (SGLang's) declares its row keyword: its pool calls may write the pool.
    return (
        f"{rule}: a seq-first kernel returns its final state and leaves `{shown}` as passed (FLA's convention); "
        "a kernel updating a state pool in place (SGLang-style) is checked through the adapter option "
        "pool=<its keyword for the pool rows>, whose pool calls (state_indices) may write it"
    )


def assert_close(errors: list[Error], context: str) -> None:
    """Fail with every number when any output is out of tolerance or non-finite."""
    if not all(e.ok for e in errors):
        pytest.fail(f"{context}: {describe(errors)}", pytrace=False)


def record_worst(node: pytest.Item, errors: list[Error], **labels: Any) -> None:
    """Keep, per output, the worst error seen by this test in its user_properties (JSON, xdist-safe)."""
    props = node.user_properties
    for error in errors:
        key = f"{NUMERICS_PROPERTY}:{error.output}"
        entry = {**labels, **error.as_dict()}
        for i, (name, value) in enumerate(props):
            if name == key:
                if json.loads(value)["ratio"] < error.ratio:
                    props[i] = (key, json.dumps(entry))
                break
        else:
            props.append((key, json.dumps(entry)))


def fit(geometry: Geometry, caps: Capabilities, algorithm: str) -> Geometry:
    """Shrink a drawn shape into the declared limits and the default work budget, along the limit it exceeds.

    Args:
        geometry (Geometry): the drawn shape (S a multiple of the algorithm's chunk; Hk == Hv for neumann).
        caps (Capabilities): what the implementation declares (max_seq_len, max_lanes, max_work, head dims).
        algorithm (str): "schur" or "neumann": its chunk is the unit S shrinks by, and neumann needs Hk == Hv.

    Returns:
        Geometry: ``geometry`` itself when it fits; otherwise, each exceeded limit shrinking only what it bounds,
        in this order:

        - above max_seq_len: S only, to the most whole chunks within it (at least one);
        - above max_lanes (B·Hv): B, then the heads (``_fewer_lanes``), S and the head dims kept;
        - above max_work (at most ``DEFAULT_MAX_WORK``): S halved, in whole chunks, down to one chunk (a length
          ending inside a chunk keeps its partial last chunk); then the head dims, to the smallest drawable size,
          only when one lane of that S is above the budget; then as many lanes as the budget allows, shrunk as for
          max_lanes (B, then the heads).

    Notes:
        A lane limit used to shrink S and the head sizes first (the work rule, applied to every limit): every
        schur draw of a one-lane kernel ran one chunk (the state carried across chunks never checked) at
        Dk = Dv = 16. The work rule itself then cut the heads and the head dims together: under the self-tests'
        max_work = 2^22, 31% of schur draws ran at Dk = Dv = 16 (67% under 2^20) where fewer heads at the drawn
        sizes fitted — the head dims (100's masked tile, 128's full width) are what a kernel tiles, while more
        lanes repeat the same recurrence. The result can still exceed a limit no shape of the algorithm meets
        (max_seq_len below its chunk, a max_work below one lane of one chunk at the smallest head size): the
        caller skips it (``require_fits``).
    """
    chunk = CHUNK_BY_ALGORITHM[algorithm]
    g = geometry
    if caps.max_seq_len is not None and g.S > caps.max_seq_len:
        g = replace(g, S=max(chunk, caps.max_seq_len // chunk * chunk))
    if caps.max_lanes is not None and g.lanes > caps.max_lanes:
        g = _fewer_lanes(g, caps.max_lanes)
    budget = min(caps.max_work or DEFAULT_MAX_WORK, DEFAULT_MAX_WORK)
    if g.work <= budget:
        return g
    tail = -g.S % chunk  # tokens short of whole chunks: a ragged draw stays ragged
    while g.work > budget and g.S + tail > chunk:
        g = replace(g, S=max(chunk, (g.S + tail) // 2 // chunk * chunk) - tail)
    if g.S * g.Dk * g.Dv > budget:  # one lane alone is above the budget: fewer lanes cannot help
        smallest = min(drawable_head_dims(caps))  # the cheapest head size the implementation declares
        g = replace(g, Dk=smallest, Dv=smallest)
    if g.work > budget:
        g = _fewer_lanes(g, max(1, budget // (g.S * g.Dk * g.Dv)))
    return g


def _fewer_lanes(geometry: Geometry, max_lanes: int) -> Geometry:
    """``geometry`` within ``max_lanes`` lanes (B·Hv): fewer batch items, then fewer heads; S and head dims kept.

    Args:
        geometry (Geometry): a shape above the limit, with Hv a multiple of Hk.
        max_lanes (int): the lanes allowed, at least 1: the declared max_lanes, or as many as the work budget
            allows (``fit``).

    Returns:
        Geometry: B = max_lanes // Hv items when Hv fits (the heads kept); else B = 1 and the draw's GQA ratio
        Hv / Hk at as many key heads as fit (Hk == Hv stays equal, as neumann needs); else, the ratio itself above
        max_lanes, one key head and max_lanes value heads (still a multiple of Hk = 1).

    Notes:
        The heads go last because they are what a shape varies for GQA; S and the head dims are never touched
        here: they cost no lanes. The one lane-shrinking rule of the suite: numerics draws (``fit``) and fixed
        shapes whose lanes are incidental (``supported``) both use it.
    """
    g = geometry
    if g.Hv <= max_lanes:
        return replace(g, B=max_lanes // g.Hv)
    ratio = g.Hv // g.Hk
    if ratio <= max_lanes:
        key_heads = min(g.Hk, max_lanes // ratio)
        return replace(g, B=1, Hk=key_heads, Hv=key_heads * ratio)
    return replace(g, B=1, Hk=1, Hv=max_lanes)


def drawable_head_dims(caps: Capabilities) -> tuple[int, ...]:
    """The suite's head sizes within the declared support; when none is, the declared sizes themselves (or the
    declared max_head_dim), so a kernel claiming only head dim 32 is still drawn at 32, never at what it refused."""
    within = tuple(d for d in HEAD_DIMS if caps.allows_head_dim(d))
    return within or caps.head_dims or (caps.max_head_dim,)


@st.composite
def shapes(
    draw: st.DrawFn,
    algorithm: str,
    caps: Capabilities,
    max_lanes: int | None = None,
    inside_chunk: bool = False,
) -> tuple[Geometry, int]:
    """A (geometry, group_size) draw for the algorithm, fitted into the implementation's limits.

    Args:
        draw (st.DrawFn): Hypothesis's draw.
        algorithm (str): "schur" or "neumann".
        caps (Capabilities): what the implementation declares.
        max_lanes (int | None): at most this many lanes (B·Hv; ``_fewer_lanes``: S and the head dims kept).
        inside_chunk (bool): for a kernel taking any S, a length ending inside a chunk every time (otherwise a
            chunk multiple is one of the tails drawn, and Hypothesis favours it in its first examples).

    Returns:
        tuple[Geometry, int]: the shape and the schur group size.
    """
    Hk, Hv = draw(st.sampled_from(HEAD_GEOMETRIES if algorithm == ALGORITHM_SCHUR else EQUAL_HEAD_GEOMETRIES))
    chunks = draw(st.integers(1, MAX_CHUNKS[algorithm]))
    head_dims = drawable_head_dims(caps)
    chunk = CHUNK_BY_ALGORITHM[algorithm]
    # A kernel taking any S gets lengths ending inside a chunk too: real prompts are almost never chunk multiples.
    tail = draw(st.integers(1 if inside_chunk else 0, chunk - 1)) if caps.any_seq_len else 0
    geometry = Geometry(
        B=draw(st.integers(1, 2)),
        Hk=Hk,
        Hv=Hv,
        S=chunks * chunk - tail,
        Dk=(Dk := draw(st.sampled_from(head_dims))),
        # An implementation without Dk ≠ Dv is drawn at Dv = Dk (its other draws are unchanged).
        Dv=Dk if caps.equal_head_dims else draw(st.sampled_from(head_dims)),
    )
    if max_lanes is not None and geometry.lanes > max_lanes:  # before the work budget, which would halve S first
        geometry = _fewer_lanes(geometry, max_lanes)
    return fit(geometry, caps, algorithm), draw(st.sampled_from(GROUP_SIZES))


@dataclass(frozen=True)
class LongCase:
    """One long sequence every run checks, whatever the example budget: many chunks at a few small lanes.

    Attributes:
        regime (str): the input regime (``REGIMES``).
        chunks (int): schur chunks of 128 tokens (neumann runs the same tokens in 64-token chunks).
        group_size (int): schur's chunks per group (8 is the default a serving stack runs).
        geometry (Geometry): B, Hk, Hv, Dk, Dv of the call (S is ``chunks`` · 128, less ``RAGGED_TAIL`` for a
            kernel taking any S).
    """

    regime: str
    chunks: int
    group_size: int
    geometry: Geometry

    @property
    def id(self) -> str:
        return f"{self.regime}-{self.chunks}chunks-group{self.group_size}"


# Long draws: a state carried across many chunks and groups (a compiled loop losing its carry after N iterations,
# accumulation drift). Two full groups at the default group size and a partial one (17 chunks = 2176 tokens), 40
# chunks (5120 tokens, five groups) at one lane, and 20 chunks in groups of 3 from an incoming state; cheap at a
# few lanes and small head dims (the oracle and a numpy kernel take ~0.1 s per case, gdn-nki's simulation ~0.6 s).
LONG_CASES = (
    LongCase("model_gates", 17, 8, Geometry(1, 1, 2, 0, 32, 16)),
    LongCase("zero_gate", 40, 8, Geometry(1, 1, 1, 0, 16, 16)),
    LongCase("initial_state", 20, 3, Geometry(2, 1, 1, 0, 16, 32)),
)
# Tokens short of a chunk multiple in a long draw for a kernel taking any S: 2176 - 37 = 2139 = 33·64 + 27, a
# partial last chunk for either algorithm.
RAGGED_TAIL = 37


def long_geometry(caps: Capabilities, case: LongCase, algorithm: str) -> Geometry:
    """The geometry of a long case for this implementation, or a skip naming the limit it cannot meet.

    Args:
        caps (Capabilities): what the implementation declares.
        case (LongCase): the long sequence to run.
        algorithm (str): "schur" or "neumann" (which needs Hk == Hv: the case's value heads get a key head each).

    Returns:
        Geometry: the case's S (less ``RAGGED_TAIL`` under ``any_seq_len``) at the nearest supported head dims and
        within max_lanes (``supported``); above max_work, at the smallest drawable head dims and one lane first —
        the length is the point of the case, the lanes and head dims are not.

    Notes:
        A kernel declaring a max_seq_len below the case's S is skipped naming it, never run shorter: a short run
        would pass the case without checking what it is for.
    """
    S = case.chunks * CHUNK_SCHUR - (RAGGED_TAIL if caps.any_seq_len else 0)
    Hk = case.geometry.Hv if algorithm == ALGORITHM_NEUMANN else case.geometry.Hk
    geometry = supported(caps, replace(case.geometry, Hk=Hk, S=S), shrink_lanes=True)
    if caps.max_work is not None and geometry.work > caps.max_work:
        smallest = min(drawable_head_dims(caps))
        cheaper = replace(geometry, B=1, Hk=1, Hv=1, Dk=smallest, Dv=smallest)
        note_substitution(
            f"ran at B=1, Hk=1, Hv=1, Dk=Dv={smallest} instead of {geometry}: {caps.name}: "
            f"B·Hv·S·Dk·Dv={geometry.work} exceeds its declared max_work={caps.max_work}"
        )
        geometry = cheaper
    require_fits(caps, geometry)
    return geometry


def supported(caps: Capabilities, geometry: Geometry, *, shrink_lanes: bool = False) -> Geometry:
    """The geometry a fixed-shape test runs at, each substitution noted on the test's report and in front of any
    failure message, so a failure names the sizes that ran.

    Args:
        caps (Capabilities): what the implementation declares.
        geometry (Geometry): the shape the test names.
        shrink_lanes (bool): the test's lanes are incidental (its rule or property holds lane by lane): above
            ``max_lanes`` it runs at fewer (``_fewer_lanes``: B, then the heads, Hv a multiple of Hk and Hk == Hv
            kept). False for a test whose point is several lanes (batch or head independence, the GQA head map):
            it keeps its lanes, and ``require_fits`` skips it naming the limit.

    Returns:
        Geometry: ``geometry`` itself when the implementation supports its head dims (always, for one declaring no
        head-dim limit) and its lanes fit or are the point; else the same S at ``caps.nearest_head_dims``, and at
        fewer lanes when ``shrink_lanes`` allows it.
    """
    fitted = geometry
    Dk, Dv = caps.nearest_head_dims(geometry.Dk, geometry.Dv)
    if (Dk, Dv) != (geometry.Dk, geometry.Dv):
        reason = caps.unsupported_head_dims(geometry.Dk, geometry.Dv)
        note_substitution(f"ran at Dk={Dk}, Dv={Dv} instead of Dk={geometry.Dk}, Dv={geometry.Dv}: {reason}")
        fitted = replace(fitted, Dk=Dk, Dv=Dv)
    if shrink_lanes and caps.max_lanes is not None and geometry.lanes > caps.max_lanes:
        fewer = _fewer_lanes(fitted, caps.max_lanes)
        note_substitution(
            f"ran at B={fewer.B}, Hk={fewer.Hk}, Hv={fewer.Hv} instead of B={geometry.B}, Hk={geometry.Hk}, "
            f"Hv={geometry.Hv}: {caps.name}: B·Hv={geometry.lanes} exceeds its declared max_lanes={caps.max_lanes}"
        )
        fitted = fewer
    return fitted


def require_fits(caps: Capabilities, geometry: Geometry) -> None:
    """Skip (with the reason) a test whose shape is above the implementation's declared limits (max_seq_len,
    max_lanes, max_work) or outside its declared head dims (which a geometry passed through ``supported`` never is).

    Args:
        caps (Capabilities): what the implementation declares.
        geometry (Geometry): the sizes of the call the test is about to make.

    Notes:
        A kernel called above what it declares may refuse the call or fail for that reason alone: reported as the
        kernel's failure, it would blame the kernel for the suite's choice of shape. Skipped, the summary names
        the limit.
    """
    reason = caps.unsupported_head_dims(geometry.Dk, geometry.Dv) or caps.too_large(geometry)
    if reason:
        pytest.skip(reason)


def fixed_shape(caps: Capabilities, geometry: Geometry, *, shrink_lanes: bool = False) -> Geometry:
    """The geometry a fixed-shape test calls the implementation at, or a skip naming the declared limit it exceeds.

    Args:
        caps (Capabilities): what the implementation declares.
        geometry (Geometry): the shape the test names.
        shrink_lanes (bool): the test's lanes are incidental: above ``max_lanes`` it runs at fewer lanes instead
            of being skipped (see ``supported``).

    Returns:
        Geometry: ``supported(caps, geometry, shrink_lanes=...)`` — the same S at the nearest supported head dims,
        at fewer lanes where allowed — when that is within max_seq_len, max_lanes and max_work; otherwise the test
        is skipped with the reason.

    Notes:
        Every fixed-shape test builds its shape here, so none can call a kernel above a declared limit by
        forgetting a separate check (``run`` and ``require_call_supported`` are the safety net).
    """
    fitted = supported(caps, geometry, shrink_lanes=shrink_lanes)
    require_fits(caps, fitted)
    return fitted


def call_geometry(call: dict[str, Any]) -> Geometry | None:
    """The sizes of a gdn_cte call, or None when query or value is not 4-D (a rank violation has no sizes)."""
    if np.ndim(call["query"]) != 4 or np.ndim(call["value"]) != 4:
        return None
    return geometry_of(call)


def require_call_supported(caps: Capabilities, call: dict[str, Any]) -> None:
    """Skip (with the reason) a test whose call is outside the declared support: head dims (head_dims,
    max_head_dim, equal_head_dims) or sizes (max_seq_len, max_lanes, max_work).

    Args:
        caps (Capabilities): what the implementation declares.
        call (dict[str, Any]): the gdn_cte keyword arguments about to be passed (a packed varlen call counts
            as B = 1 with every sequence's tokens in S).

    Notes:
        A valid call would be refused for what the kernel never claimed. A safety net: the suite builds its fixed
        shapes through ``fixed_shape`` and draws inside the support, and ``run`` checks every call it makes.
    """
    reason = caps.unsupported_head_dims(np.shape(call["key"])[-1], np.shape(call["value"])[-1])
    geometry = call_geometry(call)
    if reason is None and geometry is not None:
        reason = caps.too_large(geometry)
    if reason:
        pytest.skip(reason)


def snapshot(args: dict[str, Any]) -> dict[str, bytes]:
    """Bytes of every array argument, to prove a call left them untouched."""
    return {name: np.asarray(x).tobytes() for name, x in args.items() if isinstance(x, np.ndarray)}


def changed(before: dict[str, bytes], args: dict[str, Any]) -> list[str]:
    """Names of array arguments whose bytes differ from the snapshot."""
    return [name for name, data in before.items() if np.asarray(args[name]).tobytes() != data]
