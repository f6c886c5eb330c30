"""Varlen (packed sequences), for implementations that declare ``varlen``: called with B = 1, the sequences
packed along S and ``cu_seqlens`` = their int64 offsets [0, L1, L1 + L2, ...], each sequence's output and final
state equal its own call, each starting from its own initial state (``recurrent_state`` ``[N, Hv, Dk, Dv]``)."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from gdn_ref.constants import ALGORITHM_SCHUR, CHUNK_SCHUR
from gdn_spec.impl import Capabilities, Implementation
from gdn_spec.metrics import Error, compare
from gdn_spec.regimes import Geometry, make_case

from ..oracle import errors_vs_oracle, oracle
from ..serving import (
    POOL_ROWS,
    Layout,
    ServingCall,
    bucket_of,
    edge_layouts,
    layout_violations,
    serving_call,
    truncated,
    with_checkpoints,
)
from ._support import call_args, changed, require_fits, run, snapshot, supported

# Sequence lengths in chunks: unequal, with a long one between short ones (a leak shows at either side).
LENGTHS = (1, 3, 2)
# Sequence lengths in tokens whose boundaries fall inside chunks (45 and 345 of 384 = 3 chunks): a kernel that
# resets the state, or masks the intra-chunk attention, only at chunk edges leaks one document into the next.
UNALIGNED_LENGTHS = (45, 300, 39)
QUANTITY = {"out": "output", "state": "final state"}


@pytest.mark.parametrize("gdn_algorithm", [ALGORITHM_SCHUR])
@pytest.mark.parametrize("regime", ["initial_state", "random"], ids=["own-initial-states", "zero-start"])
def test_each_packed_sequence_equals_its_own_call(
    gdn_impl: Implementation, gdn_algorithm: str, gdn_dtype: str, regime: str
) -> None:
    _, singles, out, state, bounds = _run_packed(
        gdn_impl, gdn_algorithm, gdn_dtype, regime, [n * CHUNK_SCHUR for n in LENGTHS], seed=50
    )
    per_sequence = []
    for i, single in enumerate(singles):
        out_i, state_i = run(gdn_impl, single)
        per_sequence.append([
            compare("out", out[:, :, bounds[i] : bounds[i + 1]], out_i.astype(np.float64), gdn_dtype),
            compare("state", state[i : i + 1], state_i, gdn_dtype),
        ])  # fmt: skip
    _assert_each_sequence_close(per_sequence, bounds, "its own call")


@pytest.mark.parametrize("gdn_algorithm", [ALGORITHM_SCHUR])
@pytest.mark.parametrize("regime", ["initial_state", "random"], ids=["own-initial-states", "zero-start"])
def test_sequences_ending_inside_a_chunk_match_the_oracle(
    gdn_impl: Implementation, gdn_algorithm: str, gdn_dtype: str, regime: str
) -> None:
    """Boundaries inside chunks: each sequence against the fp64 oracle of its own tokens (its own call may not
    exist: a dense call needs a chunk multiple)."""
    cases, _, out, state, bounds = _run_packed(
        gdn_impl, gdn_algorithm, gdn_dtype, regime, list(UNALIGNED_LENGTHS), seed=60
    )
    per_sequence = [
        errors_vs_oracle(case, out[:, :, bounds[i] : bounds[i + 1]], np.asarray(state[i : i + 1]))
        for i, case in enumerate(cases)
    ]
    _assert_each_sequence_close(per_sequence, bounds, "the oracle of its own tokens")


def _assert_each_sequence_close(per_sequence: list[list[Error]], bounds: np.ndarray, against: str) -> None:
    """Fail naming every packed sequence out of bounds and, for each, the quantity that failed (output or final
    state) with its figures against the bounds; a quantity within bounds follows only as context. (A leak into
    the next document can be decayed out of that document's final state — rel_rms exactly 0 — while its output
    is wrong, so a message listing both in fixed order led with the figure that was fine.)"""
    failures = []
    for i, errors in enumerate(per_sequence):
        failed = [e for e in errors if not e.ok]
        if not failed:
            continue
        text = f"sequence {i} (tokens {bounds[i]}..{bounds[i + 1]}): " + "; ".join(
            f"{QUANTITY[e.output]} out of bounds, {e.against_bounds()}" for e in failed
        )
        fine = [f"{QUANTITY[e.output]} within bounds, rel_rms {e.rel_rms:.1e}" for e in errors if e.ok]
        failures.append(text + (f" [{'; '.join(fine)}]" if fine else ""))
    if failures:
        pytest.fail(
            f"{len(failures)} of {len(per_sequence)} packed sequences differ from {against}: " + " | ".join(failures),
            pytrace=False,
        )


def _require_varlen(caps: Capabilities) -> None:
    """Skip a kernel without ``varlen``: every test of the area passes ``cu_seqlens`` (one reason for them all)."""
    if not caps.varlen:
        pytest.skip(f"{caps.name} does not declare varlen (cu_seqlens) support")


def _run_packed(impl: Implementation, algorithm: str, dtype: str, regime: str, lengths: list[int], seed: int) -> tuple:
    """One case per sequence length (seeds ``seed``, ``seed`` + 1, …), packed into one B = 1 call with its
    ``cu_seqlens`` and one initial state per sequence; returns the cases, their single-call arguments, the packed
    call's out and state, and the boundaries (skips an implementation without varlen)."""
    caps = impl.capabilities
    _require_varlen(caps)
    fitted = supported(
        caps, Geometry(1, 2, 4, CHUNK_SCHUR, 32, 16), shrink_lanes=True
    )  # for its head dims (the lengths set S)
    Hk, Hv, Dk, Dv = fitted.Hk, fitted.Hv, fitted.Dk, fitted.Dv
    cases = [make_case(regime, Geometry(1, Hk, Hv, n, Dk, Dv), dtype, seed + i) for i, n in enumerate(lengths)]
    require_fits(caps, Geometry(1, Hk, Hv, sum(lengths), Dk, Dv))
    singles = [call_args(case, algorithm) for case in cases]
    packed = dict(singles[0])
    for name in ("query", "key", "value", "g_log", "beta"):
        packed[name] = np.ascontiguousarray(np.concatenate([s[name] for s in singles], axis=2))
    states = [s["recurrent_state"] for s in singles]
    packed["recurrent_state"] = None if states[0] is None else np.concatenate(states, axis=0)
    bounds = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    packed["cu_seqlens"] = bounds
    out, state = run(impl, packed)
    assert state.shape == (len(cases), Hv, Dk, Dv), f"packed final state shape {state.shape}, one per sequence"
    return cases, singles, out, state, bounds


# --- Serving launches: a bucket, pool rows (-1 = none), checkpoints (for kernels declaring them) -----------------

SERVING_SEED = 70
# The serving checks' heads and head dims: two value heads on one key head (the GQA map still matters), small dims.
SERVING_GEOMETRY = Geometry(1, 1, 2, CHUNK_SCHUR, 32, 16)
SERVING_KEYS = ("bucket", "state_pool")
# A checkpoint row no sequence of the fixed layouts below (batch invariance, rejections) starts from.
CHECKPOINT_ROW = 13


def _serving(impl: Implementation, keys: tuple[str, ...] = SERVING_KEYS) -> tuple[Capabilities, Geometry]:
    """The capabilities and the geometry of a serving check, or a skip when the kernel declares none of ``keys``."""
    caps = impl.capabilities
    _require_varlen(caps)
    if not any(getattr(caps, key) for key in keys):
        pytest.skip(f"{caps.name} declares none of {', '.join(keys)} (serving launches)")
    geometry = supported(caps, SERVING_GEOMETRY, shrink_lanes=True)
    require_fits(caps, replace(geometry, S=bucket_of(CHUNK_SCHUR)[0]))
    return caps, geometry


def _serve(impl: Implementation, served: ServingCall) -> np.ndarray:
    """Run a serving call; return out. The state checks read the caller's buffer: the kernel updates it in place
    (a returned state that is another array must hold the same bytes)."""
    out, state = run(impl, served.call)
    buffer = served.call["recurrent_state"]
    if state is not buffer and np.asarray(state).tobytes() != buffer.tobytes():
        pytest.fail(f"{served.layout.label}: the returned state differs from the caller's buffer, which a serving "
                    "kernel updates in place and returns", pytrace=False)  # fmt: skip
    return out


def _judge(served: ServingCall, out: np.ndarray) -> list[str]:
    """What a serving call got wrong: each sequence's output and stored final state against the fp64 oracle, each
    stored checkpoint against the oracle of the sequence cut there, and every row the call may not write (rows of
    no sequence, of empty sequences, of checkpoints past a sequence's end or given as -1) bit-identical."""
    state, bounds, problems = served.call["recurrent_state"], served.bounds, []
    for i, case in enumerate(served.cases):
        if case is None:
            continue
        row = served.row_of(i)
        got = out[:, :, bounds[i] : bounds[i + 1]]
        if row is None:  # no row to store into: the output alone (from a zero state)
            errors = errors_vs_oracle(case, got, oracle(case)[1])[:1]
        else:
            errors = errors_vs_oracle(case, got, state[row : row + 1])
        at = f"sequence {i} (tokens {bounds[i]}..{bounds[i + 1]}, row {-1 if row is None else row})"
        problems += [f"{at}: {QUANTITY[e.output]} {e.against_bounds()}" for e in errors if not e.ok]
    for i, k, tokens in served.stored_checkpoints():
        row = int(served.checkpoint_rows[i, k])
        cut = truncated(served.cases[i], tokens)
        error = errors_vs_oracle(cut, out[:, :, bounds[i] : bounds[i] + tokens], state[row : row + 1])[1]
        if not error.ok:
            problems.append(
                f"checkpoint {k} of sequence {i} (after {tokens} tokens, row {row}): {error.against_bounds()}"
            )
    kept = [r for r in range(len(state)) if r not in served.written_rows()]
    moved = [r for r in kept if state[r].tobytes() != served.state_before[r].tobytes()]
    if moved:
        problems.append(f"rows {moved} changed, which the call names for no store (no sequence, an empty one, -1, "
                        "or a checkpoint past its sequence's end): they must keep every bit")  # fmt: skip
    return problems


def _fail_on(problems: list[str], what: str) -> None:
    if problems:
        pytest.fail(f"{what}: " + " | ".join(problems), pytrace=False)


@pytest.mark.parametrize("gdn_algorithm", [ALGORITHM_SCHUR])
def test_serving_layouts_match_the_oracle(gdn_impl: Implementation, gdn_algorithm: str, gdn_dtype: str) -> None:
    """Every layout of the bucket (one sequence filling it, N of one token, empty slots and sequences, a random
    one) on rows of a pool: each sequence against the oracle of its own tokens; a -1 row is neither read (its
    sequence starts from zero, though pool[-1] holds a large state) nor written; rows not named keep every bit."""
    caps, geometry = _serving(gdn_impl)
    problems = []
    for index, layout in enumerate(edge_layouts(caps, CHUNK_SCHUR, seed=SERVING_SEED)):
        served = serving_call(caps, layout, geometry, gdn_dtype, gdn_algorithm, CHUNK_SCHUR, SERVING_SEED + 10 * index,
                              call_args)  # fmt: skip
        problems += [f"[{layout.label}: lengths {layout.lengths}, rows {layout.rows}] {p}"
                     for p in _judge(served, _serve(gdn_impl, served))]  # fmt: skip
    _fail_on(problems, "serving layouts")


@pytest.mark.parametrize("gdn_algorithm", [ALGORITHM_SCHUR])
def test_pool_rows_keep_their_layout_at_square_heads(
    gdn_impl: Implementation, gdn_algorithm: str, gdn_dtype: str
) -> None:
    """At Dk = Dv a state row read or written in the other layout ([.., V, K] for [.., K, V]: SGLang's and FLA's
    ``state_v_first`` pools against FLA's default) passes every shape rule and runs: only the values tell. The
    serving checks' own heads have Dk != Dv, where such a mix-up fails by shape; here the heads are square and the
    rows' states random (not symmetric), so a transposed read or write misses the oracle."""
    caps, geometry = _serving(gdn_impl)
    dim = min(geometry.Dk, geometry.Dv)  # the smaller: square heads within the work the serving heads take
    square = supported(caps, replace(geometry, Dk=dim, Dv=dim), shrink_lanes=True)
    if square.Dk != square.Dv:
        pytest.skip(f"{caps.name} supports no square head dims near Dk={geometry.Dk}, Dv={geometry.Dv}")
    require_fits(caps, replace(square, S=bucket_of(CHUNK_SCHUR)[0]))
    layout = Layout("square heads", (CHUNK_SCHUR + 5, 45), (3, 6) if caps.state_pool else None)
    served = serving_call(caps, layout, square, gdn_dtype, gdn_algorithm, CHUNK_SCHUR, SERVING_SEED + 900, call_args)
    problems = [f"[Dk = Dv = {square.Dk}, lengths {layout.lengths}, rows {layout.rows}] {p}"
                for p in _judge(served, _serve(gdn_impl, served))]  # fmt: skip
    _fail_on(problems, "square heads (a state row in the other layout)")


@pytest.mark.parametrize("gdn_algorithm", [ALGORITHM_SCHUR])
def test_a_sequence_is_bit_identical_wherever_it_runs(gdn_impl: Implementation, gdn_algorithm: str) -> None:
    """Batch invariance: one sequence's output, final state (and checkpoint, where declared) keep every bit whatever
    shares the launch, in whichever slot, on whichever row, and in a larger bucket."""
    caps, geometry = _serving(gdn_impl)
    dtype = "bfloat16" if "bfloat16" in caps.dtypes else caps.dtypes[0]
    length = CHUNK_SCHUR + 37
    target = make_case("initial_state", replace(geometry, S=length), dtype, SERVING_SEED + 500)
    tokens, slots = bucket_of(CHUNK_SCHUR)
    placements = [  # (lengths, rows, the target's slot, bucket)
        ((length,), (2,), 0, None),
        ((40, 1, length), (5, -1, 9), 2, None),
        ((2 * CHUNK_SCHUR, length, 0, 3), (0, 11, 3, 14), 1, None),
        ((100, 0, 2 * CHUNK_SCHUR, length), (1, 2, -1, 4), 3, (tokens + CHUNK_SCHUR, slots + 1)),
    ]
    seen = []
    for trial, (lengths, rows, at, bucket) in enumerate(placements):
        if bucket is not None and not caps.bucket:
            continue
        keep = [i for i, n in enumerate(lengths) if n > 0 or caps.bucket]
        layout = Layout(f"placement {trial}", tuple(lengths[i] for i in keep),
                        tuple(rows[i] for i in keep) if caps.state_pool else None)  # fmt: skip
        slot = keep.index(at)
        served = serving_call(caps, layout, geometry, dtype, gdn_algorithm, CHUNK_SCHUR, SERVING_SEED + 50 * trial,
                              call_args, bucket=bucket, target=target, target_at=slot)  # fmt: skip
        if caps.checkpoints:
            table = np.full((len(layout.lengths), 1), -1, np.int32)
            table[slot, 0] = CHECKPOINT_ROW
            with_checkpoints(served, CHUNK_SCHUR, table)
        out = _serve(gdn_impl, served)
        state = served.call["recurrent_state"]
        row = served.row_of(slot)
        result = [out[:, :, served.bounds[slot] : served.bounds[slot + 1]].tobytes(), state[row].tobytes()]
        if caps.checkpoints:
            result.append(state[int(served.checkpoint_rows[slot, 0])].tobytes())
        seen.append((layout, bucket, result))
    first = seen[0][2]
    names = ("output", "final state", "checkpoint")[: len(first)]
    for layout, bucket, result in seen[1:]:
        differ = [name for name, a, b in zip(names, first, result, strict=True) if a != b]
        assert not differ, (
            f"the sequence of {length} tokens changed its {', '.join(differ)} when run in {layout.label} (lengths "
            f"{layout.lengths}, rows {layout.rows}, bucket {bucket or 'default'}) instead of alone: a sequence's "
            "results must not depend on what shares the launch"
        )


@pytest.mark.parametrize("gdn_algorithm", [ALGORITHM_SCHUR])
def test_checkpoints_equal_the_oracle_and_the_truncated_prefill(
    gdn_impl: Implementation, gdn_algorithm: str, gdn_dtype: str
) -> None:
    """``checkpoint_every`` = one chunk: a sequence of 3 chunks + 17 tokens stores after 1 and 3 chunks (the 2nd
    is -1, the 4th past its end), a 40-token one none (its only row is past its end), a one-chunk sequence without
    a state row stores its final state as a checkpoint. Each stored checkpoint equals the oracle's state there and,
    bit for bit, the final state of the same kernel run on the sequence cut at the boundary."""
    caps, geometry = _serving(gdn_impl, ("checkpoints",))
    C = CHUNK_SCHUR
    layout = Layout("checkpoints", (3 * C + 17, 40, C), (0, 1, -1))
    served = serving_call(caps, layout, geometry, gdn_dtype, gdn_algorithm, C, SERVING_SEED + 900, call_args)
    with_checkpoints(served, C, np.array([[4, -1, 5, 10], [6, -1, -1, -1], [9, -1, -1, -1]]))
    out = _serve(gdn_impl, served)
    _fail_on(_judge(served, out), "checkpoints")
    pool = served.call["recurrent_state"]
    for i, k, tokens in served.stored_checkpoints():
        if served.row_of(i) is None:
            continue  # a cut run of a sequence without a row stores nothing to compare
        cut = Layout(f"sequence {i} cut after {tokens} tokens", (tokens,), (0,))
        alone = serving_call(caps, cut, geometry, gdn_dtype, gdn_algorithm, C, 0, call_args,
                             target=truncated(served.cases[i], tokens), target_at=0)  # fmt: skip
        _serve(gdn_impl, alone)
        row = int(served.checkpoint_rows[i, k])
        assert pool[row].tobytes() == alone.call["recurrent_state"][0].tobytes(), (
            f"checkpoint {k} of sequence {i} (row {row}, after {tokens} tokens) differs from the final state of the "
            "same kernel run on the sequence cut there: a prefix-cache hit resuming from it would not continue the "
            "sequence exactly"
        )


# Layouts whose last checkpoints fall at sequence ends where a bucketed kernel's tables treat them apart (lengths,
# rows, checkpoint rows every chunk; bucket_of: 6 chunks, 4 slots): the bucket's last slot ending at its last
# checkpoint before the bucket's last chunk (a kernel copying each slot's final state to that checkpoint once its
# chain is done must copy the last slot's too); and a sequence after another ending exactly at the bucket's last
# chunk at its last checkpoint, empty slots after it (a kernel storing that copy with the last chunk's store must
# find the sequence wherever its slot is). Other checkpoints inside and past the sequences around them.
LAST_CHECKPOINT_LAYOUTS = (
    ("the last slot ends at its last checkpoint", (CHUNK_SCHUR, 40, CHUNK_SCHUR + 9, CHUNK_SCHUR), (0, 1, 2, 3),
     ((4, -1), (-1, -1), (5, 6), (7, -1))),
    ("a sequence ends at the bucket's last chunk, empty slots after it", (CHUNK_SCHUR + 5, 4 * CHUNK_SCHUR, 0, 0),
     (0, 1, 2, 3), ((4, 5, -1, -1), (6, -1, 8, 9), (-1,) * 4, (-1,) * 4)),
)  # fmt: skip


@pytest.mark.parametrize("gdn_algorithm", [ALGORITHM_SCHUR])
@pytest.mark.parametrize("layout_index", range(len(LAST_CHECKPOINT_LAYOUTS)), ids=["last-slot", "last-chunk"])
def test_last_checkpoints_at_sequence_ends_hold_the_final_state(
    gdn_impl: Implementation, gdn_algorithm: str, gdn_dtype: str, layout_index: int
) -> None:
    """``LAST_CHECKPOINT_LAYOUTS``: each sequence and stored checkpoint against the oracle, rows not written keeping
    every bit, and a last checkpoint at its sequence's end holding that sequence's final state bit for bit (a
    prefix-cache hit on it continues the sequence exactly). Without ``bucket`` the empty sequences are left out."""
    caps, geometry = _serving(gdn_impl, ("checkpoints",))
    label, lengths, rows, table = LAST_CHECKPOINT_LAYOUTS[layout_index]
    keep = [i for i, n in enumerate(lengths) if n > 0 or caps.bucket]
    layout = Layout(label, tuple(lengths[i] for i in keep), tuple(rows[i] for i in keep))
    served = serving_call(caps, layout, geometry, gdn_dtype, gdn_algorithm, CHUNK_SCHUR,
                          SERVING_SEED + 1500 + 10 * layout_index, call_args)  # fmt: skip
    with_checkpoints(served, CHUNK_SCHUR, np.array([table[i] for i in keep]))
    out = _serve(gdn_impl, served)
    problems = _judge(served, out)
    pool = served.call["recurrent_state"]
    for i, k, tokens in served.stored_checkpoints():
        row, end_row = int(served.checkpoint_rows[i, k]), served.row_of(i)
        if tokens == layout.lengths[i] and end_row is not None and pool[row].tobytes() != pool[end_row].tobytes():
            problems.append(f"checkpoint {k} of sequence {i} (row {row}) is at its end but differs from its final "
                            f"state (row {end_row})")  # fmt: skip
    _fail_on(problems, f"{label} (lengths {layout.lengths}, rows {layout.rows})")


# Layouts of the read-rows check (lengths in chunks + tokens, write rows, read rows): two sequences resuming from one
# prefix-cache row and a row-less one from another; then a sequence reading its own row, one starting from zero
# though its row holds a state, and a row-less one from a row next to the pool's last (the -1 as a Python index);
# then sequences a chunk multiple long, from a read row and from zero, whose last checkpoint is their end.
READ_ROW_LAYOUTS = (
    ("resuming from prefix-cache rows", (CHUNK_SCHUR + 37, 45, 1), (3, 7, -1), (12, 12, 5)),
    ("own row, zero start, a row-less sequence", (2 * CHUNK_SCHUR + 10, 60, 3), (4, 6, -1), (4, -1, 14)),
    ("last checkpoints at sequence ends", (2 * CHUNK_SCHUR, CHUNK_SCHUR, 9), (4, 6, -1), (12, -1, 12)),
)
# Where the kernel declares checkpoints, the checkpoint rows of those layouts (every chunk; by layout index): the first
# sequence's state after one chunk; then none; then each chunk of the first two sequences, the last of each at its
# end, before the bucket's last chunk (a kernel storing an end once and copying it to the checkpoint must copy the
# final state, not the row the sequence read).
READ_ROW_CHECKPOINTS = {0: [[CHECKPOINT_ROW], [-1], [-1]], 2: [[10, 11], [CHECKPOINT_ROW, -1], [-1, -1]]}


@pytest.mark.parametrize("gdn_algorithm", [ALGORITHM_SCHUR])
def test_sequences_start_from_their_read_rows(gdn_impl: Implementation, gdn_algorithm: str, gdn_dtype: str) -> None:
    """``read_indices``: each sequence's output, final state (in its ``state_indices`` row) and, where declared, its
    checkpoints (``READ_ROW_CHECKPOINTS``) against the oracle started from its read row's state (-1: zero, though
    its own row holds one); the read rows, which the launch does not write, keep every bit, and so does every row
    not named."""
    caps, geometry = _serving(gdn_impl, ("read_rows",))
    problems = []
    for index, (label, lengths, rows, reads) in enumerate(READ_ROW_LAYOUTS):
        layout = Layout(label, lengths, rows, reads)
        served = serving_call(caps, layout, geometry, gdn_dtype, gdn_algorithm, CHUNK_SCHUR,
                              SERVING_SEED + 1200 + 10 * index, call_args)  # fmt: skip
        if caps.checkpoints and index in READ_ROW_CHECKPOINTS:
            with_checkpoints(served, CHUNK_SCHUR, np.array(READ_ROW_CHECKPOINTS[index]))
        problems += [f"[{label}: lengths {lengths}, rows {rows}, read rows {reads}] {p}"
                     for p in _judge(served, _serve(gdn_impl, served))]  # fmt: skip
    _fail_on(problems, "read rows")


def _rejections(C: int) -> dict[str, tuple[str, tuple[str, ...], Any]]:
    """Invalid serving calls: id -> (the capability it needs, the arguments a refusal may name, the change)."""
    tokens, slots = bucket_of(C)
    return {
        "bucket-not-a-chunk-multiple": ("bucket", ("bucket",), lambda s: {"bucket": (tokens + 1, slots)}),
        "bucket-too-few-tokens": ("bucket", ("bucket",), lambda s: {"bucket": (C, slots)}),
        "bucket-too-few-slots": ("bucket", ("bucket",), lambda s: {"bucket": (tokens, 1)}),
        "cu_seqlens-decreasing": ("bucket", ("cu_seqlens",), lambda s: {"cu_seqlens": _past_the_end(s.bounds)}),
        "state_indices-past-the-pool": ("state_pool", ("state_indices",),
                                        lambda s: {"state_indices": _rows(s, -1, POOL_ROWS)}),
        "state_indices-below-minus-one": ("state_pool", ("state_indices",),
                                          lambda s: {"state_indices": _rows(s, -1, -2)}),
        "state_indices-repeated": ("state_pool", ("state_indices",),
                                   lambda s: {"state_indices": _rows(s, -1, int(s.call["state_indices"][0]))}),
        "recurrent_state-non-finite-start-row": ("state_pool", ("recurrent_state",), _non_finite_start_row),
        "checkpoint_every-not-a-chunk-multiple": ("checkpoints", ("checkpoint_every",),
                                                  lambda s: _checkpoints(s, C + 1, -1)),
        "checkpoint_every-zero": ("checkpoints", ("checkpoint_every",), lambda s: _checkpoints(s, 0, -1)),
        "checkpoint_indices-past-the-pool": ("checkpoints", ("checkpoint_indices",),
                                             lambda s: _checkpoints(s, C, POOL_ROWS)),
        "checkpoint_indices-wrong-rows": ("checkpoints", ("checkpoint_indices",),
                                          lambda s: {**_checkpoints(s, C, -1), "checkpoint_indices": np.full((9, 1), -1, np.int32)}),
        "checkpoint_indices-without-checkpoint_every": ("checkpoints", ("checkpoint_every", "checkpoint_indices"),
                                                        _checkpoint_rows_alone),
        "checkpoint_indices-repeated": ("checkpoints", ("checkpoint_indices",), _repeated_checkpoint_row),
        "checkpoint_indices-a-state-row": ("checkpoints", ("checkpoint_indices", "state_indices"),
                                           lambda s: _checkpoints(s, C, int(s.call["state_indices"][0]))),
        "read_indices-a-row-written-for-another": ("read_rows", ("read_indices",),
                                                   lambda s: _reads(s, 0, _last_row(s))),
        "read_indices-past-the-pool": ("read_rows", ("read_indices",), lambda s: _reads(s, 0, POOL_ROWS)),
        "recurrent_state-non-finite-read-row": ("read_rows", ("recurrent_state",), _non_finite_read_row),
    }  # fmt: skip


def _past_the_end(bounds: np.ndarray) -> np.ndarray:
    """The offsets with the first sequence's end past the last offset: decreasing after it."""
    wrong = bounds.copy()
    wrong[1] = bounds[-1] + 1
    return wrong


def _non_finite_start_row(served: ServingCall) -> dict[str, Any]:
    """A NaN in the pool row the first sequence starts from (a value rule: ``content_checks``)."""
    pool = served.call["recurrent_state"].copy()
    pool[served.row_of(0), 0, 0, 0] = np.nan
    return {"recurrent_state": pool}


def _checkpoint_rows_alone(served: ServingCall) -> dict[str, Any]:
    """``checkpoint_indices`` without ``checkpoint_every``: rows of checkpoints taken at no stated spacing."""
    return {"checkpoint_indices": _checkpoints(served, CHUNK_SCHUR, CHECKPOINT_ROW)["checkpoint_indices"]}


def _repeated_checkpoint_row(served: ServingCall) -> dict[str, Any]:
    """Two checkpoints of the first sequence into one row (each row is written by one store)."""
    change = _checkpoints(served, CHUNK_SCHUR, CHECKPOINT_ROW)
    change["checkpoint_indices"][0, 1] = CHECKPOINT_ROW
    return change


def _last_row(served: ServingCall) -> int:
    """The row the last sequence writes (it is not empty in the rejection base)."""
    return int(served.call["state_indices"][-1])


def _reads(served: ServingCall, at: int, row: int) -> dict[str, Any]:
    """``read_indices``: every sequence from its own row but sequence ``at``, from ``row``."""
    reads = served.call["state_indices"].copy()
    reads[at] = row
    return {"read_indices": reads}


def _non_finite_read_row(served: ServingCall) -> dict[str, Any]:
    """The first sequence starts from a row no sequence writes, and that row holds a NaN (a value rule:
    ``content_checks``)."""
    pool = served.call["recurrent_state"].copy()
    pool[CHECKPOINT_ROW, 0, 0, 0] = np.nan
    return {"recurrent_state": pool, **_reads(served, 0, CHECKPOINT_ROW)}


def _rows(served: ServingCall, at: int, row: int) -> np.ndarray:
    rows = served.call["state_indices"].copy()
    rows[at] = row
    return rows


def _checkpoints(served: ServingCall, every: int, first: int) -> dict[str, Any]:
    table = np.full((len(served.layout.lengths), 2), -1, np.int32)
    table[0, 0] = first
    return {"checkpoint_every": every, "checkpoint_indices": table}


REJECTIONS = _rejections(CHUNK_SCHUR)


@pytest.mark.gdn_requires("validation")
@pytest.mark.parametrize("gdn_algorithm", [ALGORITHM_SCHUR])
@pytest.mark.parametrize("rejection", list(REJECTIONS))
def test_rejects_an_invalid_serving_call(gdn_impl: Implementation, gdn_algorithm: str, rejection: str) -> None:
    """A bad bucket, pool row, checkpoint or read-row argument, or a non-finite row a sequence starts from, is
    refused naming the argument (gdn-ref's bucketed and pool-row rules), and nothing is written: the pool and every
    input keep their bytes."""
    needs, names, change = REJECTIONS[rejection]
    caps, geometry = _serving(gdn_impl, (needs,))
    if rejection.startswith("recurrent_state") and not caps.content_checks:
        pytest.skip(f"[{rejection}] needs the tensor contents; {caps.declaring('content_checks')}")
    lengths = (CHUNK_SCHUR + 5, 0, 45) if caps.bucket else (CHUNK_SCHUR + 5, 45)
    layout = Layout("rejection base", lengths, (3, 7, 8)[: len(lengths)] if caps.state_pool else None)
    served = serving_call(caps, layout, geometry, caps.dtypes[0], gdn_algorithm, CHUNK_SCHUR, SERVING_SEED + 1000,
                          call_args)  # fmt: skip
    bad = {**served.call, **change(served)}
    assert layout_violations(bad, CHUNK_SCHUR), f"[{rejection}] the suite's call breaks no rule of gdn-ref"
    before = snapshot(bad)
    with pytest.raises(Exception) as info:  # any exception type is a rejection; the message is checked
        gdn_impl(**bad)
    message = str(info.value)
    assert any(re.search(rf"\b{re.escape(name)}\b", message) for name in names), (
        f"[{rejection}] the refusal must name {' or '.join(f'`{n}`' for n in names)}: {message!r}"
    )
    assert not changed(before, bad), f"[{rejection}] the rejected call modified {changed(before, bad)}"
