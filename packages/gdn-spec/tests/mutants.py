"""Deliberately broken gdn_cte implementations: the suite must fail on every one of them.

Each is the same small float64 recurrence behind the documented API shell (contract checks, aliasing, output
dtypes) with exactly one thing changed. ``CORRECT`` is the unbroken version, which must pass. Every callable
declares a small ``max_work`` so the suite draws cheap shapes for these pure-numpy loops.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gdn_ref.bucketed import bucket_violations
from gdn_ref.constants import CHUNK_SCHUR, DEFAULT_ALGORITHM, DEFAULT_GROUP_SIZE
from gdn_ref.contract import ContractError, validate
from gdn_ref.packed import pool_row_violations
from gdn_spec.regimes import NUMPY_DTYPES

CAPS = {"max_work": 1 << 22}
PREFIX_CHUNK = 64  # the chunk of the prefix-difference flaw (neumann's; schur's 128 fails the same way)
# The "lost_carry" kernel restarts from a zero state every 1024 tokens (8 schur chunks: one group at the default
# group size), as a compiled loop over groups losing its carry between iterations would.
LOST_CARRY_TOKENS = 1024
# Head sizes of the "head_dims_16_64" kernel: two of the suite's drawn sizes, so its numerics still run.
LIMITED_HEAD_DIMS = (16, 64)
# The chunk a serving call's bucket and checkpoints are multiples of (the suite's serving checks run schur).
SERVING_CHUNK = CHUNK_SCHUR


def prefix_difference_gates(g: np.ndarray) -> np.ndarray:
    """Per-token log-decays as a chunked kernel gets them from differences of fp32 chunk-local prefix sums:
    γ_t − γ_{t−1}, which a huge gate earlier in the chunk swamps, and which is NaN after a −inf."""
    g32 = g.astype(np.float32)
    gamma = np.empty_like(g32)
    for start in range(0, g.shape[-1], PREFIX_CHUNK):
        gamma[..., start : start + PREFIX_CHUNK] = np.cumsum(g32[..., start : start + PREFIX_CHUNK], axis=-1)
    before = np.concatenate([np.zeros_like(gamma[..., :1]), gamma[..., :-1]], axis=-1)
    before[..., ::PREFIX_CHUNK] = 0.0
    with np.errstate(invalid="ignore"):
        return gamma.astype(np.float64) - before.astype(np.float64)


def recurrence(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    beta: np.ndarray,
    scale: float,
    state: np.ndarray,
    flaw: str | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The gated delta rule in float64, optionally with one named flaw (see ``FLAWS``)."""
    Hk, Hv = q.shape[1], v.shape[1]
    heads = np.arange(Hv) % Hk if flaw == "h_mod_hk" else np.arange(Hv) // (Hv // Hk)
    q, k = q.astype(np.float64)[:, heads], k.astype(np.float64)[:, heads]
    if flaw == "prefix_difference":
        g = prefix_difference_gates(g)
    elif flaw == "clamp_g_at_minus_5":
        g = np.maximum(g, -5.0)
    v, alpha, b = v.astype(np.float64), np.exp(g.astype(np.float64)), beta.astype(np.float64)
    if flaw == "undecayed_tail":  # the tokens of a partial last (64-token) chunk keep the state undecayed
        alpha[..., q.shape[2] - q.shape[2] % PREFIX_CHUNK :] = 1.0
    if flaw == "beta_ignored":
        b = np.ones_like(b)
    S = state.astype(np.float64)
    out = np.empty(v.shape)
    for t in range(q.shape[2]):
        if flaw == "lost_carry" and t and t % LOST_CARRY_TOKENS == 0:
            S = np.zeros_like(S)
        a, kt, qt = alpha[:, :, t, None, None], k[:, :, t], q[:, :, t]
        before = S
        if flaw == "pre_decay_delta":  # the delta reads the state before the decay
            u = b[:, :, t, None] * (v[:, :, t] - np.einsum("bhk,bhkv->bhv", kt, S))
            S = a * S + kt[..., None] * u[:, :, None]
        elif flaw == "gate_after_delta":  # decay applied after the write
            u = b[:, :, t, None] * (v[:, :, t] - np.einsum("bhk,bhkv->bhv", kt, S))
            S = a * (S + kt[..., None] * u[:, :, None])
        else:
            S = decayed = a * S
            u = b[:, :, t, None] * (v[:, :, t] - np.einsum("bhk,bhkv->bhv", kt, S))
            S = S + kt[..., None] * u[:, :, None]
        if flaw == "fp16_state":
            S = S.astype(np.float16).astype(np.float64)
        read = S
        if flaw == "read_before_update":  # o_t from the state before this token's decay and write
            read = before
        elif flaw == "exclusive_diagonal":  # o_t from the decayed state without this token's own write
            read = decayed
        out[:, :, t] = scale * np.einsum("bhk,bhkv->bhv", qt, read)
    return out, S


def make(flaw: str | None = None, *, api: str | None = None, caps: dict[str, Any] | None = None) -> Callable[..., Any]:
    """A gdn_cte with one recurrence ``flaw`` and/or one ``api`` flaw (see ``FLAWS``); ``caps`` adds to what it
    declares."""

    def gdn_cte(
        query: np.ndarray,
        key: np.ndarray,
        value: np.ndarray,
        g_log: np.ndarray,
        beta: np.ndarray,
        scale: float = 1.0,
        algorithm: str = DEFAULT_ALGORITHM,
        mask_pack: np.ndarray | None = None,
        group_size: int = DEFAULT_GROUP_SIZE,
        recurrent_state: np.ndarray | None = None,
        cu_seqlens: np.ndarray | None = None,
        state_indices: np.ndarray | None = None,
        bucket: tuple[int, int] | None = None,
        checkpoint_every: int | None = None,
        checkpoint_indices: np.ndarray | None = None,
        read_indices: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        # Head-dim limits of a third-party kernel (the correct math otherwise): it refuses what it does not support.
        Dk, Dv = key.shape[-1], value.shape[-1]
        if api in ("square_heads_only", "state_layout_vk") and Dk != Dv:
            raise ValueError(f"gdn_cte: `value` head dim Dv={Dv} must equal `key`'s Dk={Dk} in this kernel")
        if api == "head_dims_16_64":  # naming the argument, as the contract asks of every refusal
            for name, label, size in (("key", "Dk", Dk), ("value", "Dv", Dv)):
                if size not in LIMITED_HEAD_DIMS:
                    raise ValueError(f"gdn_cte: `{name}` head dim {label}={size} must be in {LIMITED_HEAD_DIMS}")
        if cu_seqlens is not None:
            serving = Serving(state_indices, bucket, checkpoint_every, checkpoint_indices, read_indices)
            return _packed(query, key, value, g_log, beta, scale, recurrent_state, cu_seqlens, flaw, serving)
        if api == "divides_by_key_heads":  # sizes derived before the call is checked: Hk = 0 divides by zero
            _ = value.shape[1] // query.shape[1]
        if api == "mutates_state_on_reject" and recurrent_state is not None and recurrent_state.flags.writeable:
            recurrent_state[...] = 0.0  # "clears the slot" before checking the call
        violations = validate(
            query, key, value, g_log, beta, scale, algorithm, mask_pack, group_size, recurrent_state,
            values=api != "no_value_checks",
        )  # fmt: skip
        skipped = {
            "no_divisibility_check": {"seq.divisible"},
            "neumann_accepts_state": {"neumann.no_state"},
        }.get(api, set())
        violations = [v for v in violations if v.rule_id not in skipped]
        if api == "neumann_wants_128" and algorithm == "neumann" and query.shape[2] % 128:
            raise ValueError("gdn_cte: `query` S must be divisible by 128")
        if violations:
            if api == "vague_errors":
                raise ValueError("gdn_cte: invalid input")
            raise ContractError(violations)
        B, Hv, Dk, Dv = value.shape[0], value.shape[1], key.shape[3], value.shape[3]
        start = (
            np.zeros((B, Hv, Dk, Dv)) if recurrent_state is None or api == "ignores_initial_state" else recurrent_state
        )
        if api == "state_layout_vk":  # the state read (and, below, written) as [B, Hv, Dv, Dk], vLLM's layout
            start = np.swapaxes(start, 2, 3)
        eff_scale = {"scale_twice": scale * scale, "ignores_scale": Dk**-0.5}.get(api, scale)
        if api == "batch_leak":  # batch item b continues from item b-1's final state instead of its own start
            outs, finals, carry = [], [], start[:1]
            for b in range(B):
                o, carry = recurrence(
                    query[b : b + 1],
                    key[b : b + 1],
                    value[b : b + 1],
                    g_log[b : b + 1],
                    beta[b : b + 1],
                    eff_scale,
                    carry if b else start[:1],
                    flaw,
                )
                outs.append(o)
                finals.append(carry)
            out, final = np.concatenate(outs), np.concatenate(finals)
        else:
            out, final = recurrence(query, key, value, g_log, beta, eff_scale, start, flaw)
        if api == "state_layout_vk":
            final = np.swapaxes(final, 2, 3)
        if api == "zero_state_when_large" and np.abs(start).max() > 1e3:
            final = np.zeros_like(final)  # "the big incoming state was erased anyway"
        if api == "triple_bf16_error":  # 3× the error of gdn-ref's faithful bf16 emulation of a kernel
            faithful = _gdn_ref_call(query, key, value, g_log, beta, scale, algorithm, mask_pack, recurrent_state)
            out, final = (
                exact + 3.0 * (np.asarray(f, np.float64) - exact)
                for f, exact in zip(faithful, (out, final), strict=True)
            )
        if api == "nondeterministic":
            out = out * (1.0 + 1e-7 * np.random.default_rng().standard_normal(out.shape))
        out_dtype = np.float32 if api == "out_fp32" else NUMPY_DTYPES[np.dtype(query.dtype).name]
        out = out.astype(out_dtype)
        if api == "out_short_dv":  # one value column lost (an off-by-one in the output tile)
            out = np.ascontiguousarray(out[..., :-1])
        if api == "cumsum_gates_in_place":  # "reuses" the caller's g_log as scratch once done with it
            np.cumsum(g_log, axis=-1, out=g_log)
        if api == "new_state_nans_supplied" and recurrent_state is not None:
            recurrent_state[...] = np.nan  # returns a new state, and "frees" the caller's buffer
        if recurrent_state is None or api in ("state_copy", "new_state_nans_supplied"):
            return out, final.astype(np.float32)
        recurrent_state[...] = final
        return out, recurrent_state

    in_place = api not in ("new_state_nans_supplied",)
    gdn_cte.gdn_spec_capabilities = {
        **CAPS, "name": f"mutant:{api or flaw or 'none'}", "varlen": True, "state_in_place": in_place,
        **({"state_pool": True, "bucket": True, "checkpoints": True, "read_rows": True} if in_place else {}),
        **(caps or {}),
    }  # fmt: skip
    return gdn_cte


@dataclass(frozen=True)
class Serving:
    """A packed call's serving keywords (``gdn_spec.serving``): pool rows, the bucket, checkpoints, rows to start
    from; None = absent."""

    state_indices: np.ndarray | None = None
    bucket: tuple[int, int] | None = None
    checkpoint_every: int | None = None
    checkpoint_indices: np.ndarray | None = None
    read_indices: np.ndarray | None = None

    def given(self) -> bool:
        keywords = (self.state_indices, self.bucket, self.checkpoint_every, self.checkpoint_indices, self.read_indices)
        return any(x is not None for x in keywords)


def _packed(query, key, value, g_log, beta, scale, recurrent_state, cu_seqlens, flaw, serving: Serving) -> tuple:
    """Packed sequences (B = 1, ``cu_seqlens``), each from its own row of ``recurrent_state`` (or zeros), or with
    ``state_indices`` from its pool row (-1: zeros, nothing stored) or its ``read_indices`` row, checkpoints stored
    into pool rows, the layout checked by gdn-ref's bucketed rules (``bucket``: empty sequences allowed). With the
    ``chunk_edge_reset`` flaw a sequence starting inside a 64-token chunk continues from the previous one's final
    state instead (a kernel that resets only at chunk edges), with ``varlen_leak`` every sequence does, and with
    ``varlen_states_rolled`` the outputs are right but each sequence's final state lands in the next row. The serving
    flaws:
    ``minus_one_row_read`` starts a -1 sequence from row -1 as a Python index (the pool's last row),
    ``minus_one_row_written`` stores its final state there, ``checkpoint_one_chunk_late`` stores each checkpoint
    one 128-token chunk late (within the sequence), ``batch_variant`` rounds a final state differently when the
    launch holds more than one sequence, ``read_row_ignored`` starts from the row it writes, not the row named
    by ``read_indices``, and ``end_checkpoint_from_read_row``, with ``read_indices``, fills a checkpoint at a
    sequence's end with the state of the row it read (none for -1) instead of its final state."""
    bounds = [int(c) for c in cu_seqlens]
    n, Hv, Dk, Dv = len(bounds) - 1, value.shape[1], key.shape[3], value.shape[3]
    rows = np.arange(n) if serving.state_indices is None else np.asarray(serving.state_indices)
    starts = rows if serving.read_indices is None or flaw == "read_row_ignored" else np.asarray(serving.read_indices)
    if serving.given():
        pool_rows = n if recurrent_state is None else recurrent_state.shape[0]
        violations = bucket_violations(cu_seqlens, query.shape[2], SERVING_CHUNK, serving.bucket, pool_rows, rows,
                                       serving.checkpoint_every, serving.checkpoint_indices,
                                       serving.read_indices)  # fmt: skip
        if not violations and recurrent_state is not None:
            read = [int(r) for r, (lo, hi) in zip(starts, itertools.pairwise(bounds), strict=True)
                    if r >= 0 and hi > lo]  # fmt: skip
            violations = pool_row_violations(recurrent_state[read], read)
        if violations:
            raise ContractError(violations)
    zeros = np.zeros((1, Hv, Dk, Dv))
    out, finals, stores, carry = np.empty(value.shape), [], {}, None
    for i, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        leaks = flaw == "varlen_leak" and i > 0
        reads_row = starts[i] >= 0 or flaw == "minus_one_row_read"
        own = zeros if recurrent_state is None or not reads_row else recurrent_state[[starts[i]]]
        start = carry if leaks or (flaw == "chunk_edge_reset" and lo % PREFIX_CHUNK) else own
        tokens = [name[:, :, lo:hi] for name in (query, key, value, g_log, beta)]
        out[:, :, lo:hi], carry = recurrence(*tokens, scale, start)
        if flaw == "batch_variant" and n > 1:
            carry = carry * (1.0 + 1e-6)
        finals.append(carry)
        if rows[i] >= 0 or flaw == "minus_one_row_written":
            stores[int(rows[i])] = carry
        for k, row in enumerate(() if serving.checkpoint_every is None else serving.checkpoint_indices[i]):
            cut = (k + 1) * serving.checkpoint_every
            if row < 0 or cut > hi - lo:
                continue
            if flaw == "checkpoint_one_chunk_late":
                cut = min(cut + SERVING_CHUNK, hi - lo)
            if (
                flaw == "end_checkpoint_from_read_row"
                and cut == hi - lo
                and rows[i] >= 0
                and serving.read_indices is not None
            ):
                if starts[i] >= 0:  # the final state's copy taken from the row read, not the row stored to
                    stores[int(row)] = own
                continue
            stores[int(row)] = recurrence(*(x[:, :, :cut] for x in tokens), scale, own)[1]
    out = out.astype(NUMPY_DTYPES[np.dtype(query.dtype).name])
    if flaw == "varlen_states_rolled":
        finals = finals[-1:] + finals[:-1]
        stores = dict(enumerate(finals))
    if recurrent_state is None:
        return out, np.concatenate(finals).astype(np.float32)
    for row, state in stores.items():
        recurrent_state[row] = state[0]
    return out, recurrent_state


def _gdn_ref_call(query, key, value, g_log, beta, scale, algorithm, mask_pack, state) -> tuple:
    from gdn_ref import gdn_cte

    start = None if state is None else state.copy()
    return gdn_cte(query, key, value, g_log, beta, scale, algorithm, mask_pack, 8, start)


CORRECT = make()

# name -> (callable, contract areas expected to fail, -k filter that keeps the run small)
FLAWS: dict[str, tuple[Callable[..., Any], tuple[str, ...], str]] = {
    "pre_decay_delta": (make("pre_decay_delta"), ("numerics",), "schur and float32 and random"),
    "gate_after_delta": (make("gate_after_delta"), ("numerics",), "neumann and float32 and random"),
    "read_before_update": (make("read_before_update"), ("numerics",), "schur and bfloat16 and zero_gate"),
    "exclusive_diagonal": (make("exclusive_diagonal"), ("numerics",), "neumann and bfloat16 and random"),
    "h_mod_hk": (make("h_mod_hk"), ("head_mapping",), ""),
    "fp16_state": (make("fp16_state"), ("numerics",), "schur and float32 and large_state"),
    "beta_ignored": (make("beta_ignored"), ("numerics",), "schur and float32 and beta_near_zero"),
    "batch_leak": (make(api="batch_leak"), ("independence",), ""),
    "scale_twice": (make(api="scale_twice"), ("numerics",), "schur and float32 and random"),
    # Dk**-0.5 whatever the caller passes: every other call uses that very scale, so only the caller's-scale test
    # catches it.
    "ignores_scale": (make(api="ignores_scale"), ("numerics",), "float32 and callers_scale"),
    "ignores_initial_state": (make(api="ignores_initial_state"), ("aliasing",), ""),
    "state_copy": (make(api="state_copy"), ("aliasing",), ""),
    "mutates_state_on_reject": (make(api="mutates_state_on_reject"), ("rejection",), "schur"),
    "no_divisibility_check": (make(api="no_divisibility_check"), ("divisibility",), ""),
    "neumann_wants_128": (make(api="neumann_wants_128"), ("divisibility",), ""),
    "neumann_accepts_state": (make(api="neumann_accepts_state"), ("neumann",), ""),
    "vague_errors": (make(api="vague_errors"), ("rejection",), "schur"),
    "out_fp32": (make(api="out_fp32"), ("dtypes",), ""),
    "out_short_dv": (make(api="out_short_dv"), ("shapes",), ""),
    "nondeterministic": (make(api="nondeterministic"), ("determinism",), ""),
    # issue 8: decays from differences of fp32 prefix sums (huge gates mid-chunk; NaN after -inf), a clamp of g
    # at -5, no value scans, a zero final state where the large incoming state is mostly erased, and 3x the
    # error of a faithful bf16 kernel on ill-conditioned keys.
    "prefix_difference": (make("prefix_difference"), ("numerics",), "schur and float32 and huge_gates"),
    "prefix_difference_resets": (make("prefix_difference"), ("numerics",), "neumann and float32 and document_resets"),
    "clamp_g_at_minus_5": (make("clamp_g_at_minus_5"), ("numerics",), "schur and bfloat16 and strong_gates"),
    "no_value_checks": (make(api="no_value_checks"), ("rejection",), "finite or domain"),
    "zero_state_when_large": (make(api="zero_state_when_large"), ("numerics",), "schur and bfloat16 and large_state"),
    "divides_by_key_heads": (make(api="divides_by_key_heads"), ("rejection",), "empty_launch"),
    "triple_bf16_error": (make(api="triple_bf16_error"), ("numerics",), "schur and bfloat16 and collinear_keys"),
    # found by a red-team pass as a kernel author: a successful call that writes into an input, a kernel returning
    # a new state that trashes the caller's, and a varlen kernel resetting the state only at chunk edges.
    "cumsum_gates_in_place": (make(api="cumsum_gates_in_place"), ("aliasing",), ""),
    "new_state_nans_supplied": (make(api="new_state_nans_supplied"), ("aliasing",), ""),
    "chunk_edge_reset": (make("chunk_edge_reset"), ("varlen",), ""),
    # issue 29: exact for 1024 tokens, then a zero state (no short draw reaches a second group at group size 8).
    "lost_carry": (make("lost_carry"), ("numerics",), "long and float32 and model_gates"),
    # packed documents leaking into the next one (its output wrong, its final state, the leak decayed out, right),
    # and right outputs with the final states in the wrong rows: the varlen failure must name what failed.
    "varlen_leak": (make("varlen_leak"), ("varlen",), ""),
    "varlen_states_rolled": (make("varlen_states_rolled"), ("varlen",), ""),
    # issue 32: serving launches (bucket, pool rows, checkpoints) on a pool: a -1 slot's state read from or
    # written to the pool's last row (-1 as a Python index), checkpoints stored one chunk late, and results depending on what
    # shares the launch (within tolerance, not bit for bit).
    "minus_one_row_read": (make("minus_one_row_read"), ("varlen",), "serving"),
    "minus_one_row_written": (make("minus_one_row_written"), ("varlen",), "serving"),
    "checkpoint_one_chunk_late": (make("checkpoint_one_chunk_late"), ("varlen",), "checkpoints"),
    "batch_variant": (make("batch_variant"), ("varlen",), "bit_identical"),
    # a kernel taking read_indices but starting each sequence from the row it writes (a prefix-cache hit ignored).
    "read_row_ignored": (make("read_row_ignored"), ("varlen",), "read_rows"),
    # a kernel copying a last checkpoint that is its sequence's end from the row the sequence read (gdn-nki's bucket
    # kernel did, with read_indices): the checkpoint holds the initial state, or nothing for a read row -1.
    "end_checkpoint_from_read_row": (make("end_checkpoint_from_read_row"), ("varlen",), "read_rows"),
    # third-party head-dim limits left undeclared: the kernel refuses shapes the suite was never told it refuses
    # (DECLARED_HEAD_DIMS holds the same kernels declaring them, which pass).
    "square_heads_undeclared": (make(api="square_heads_only"), ("shapes",), ""),
    "head_dims_undeclared": (make(api="head_dims_16_64"), ("shapes",), ""),
    # A square-only kernel (declared) keeping the state as [Dv, Dk]: at Dk == Dv the shapes agree and only the
    # values are transposed. The fixed-shape areas reach it at their nearest supported pair, Dk = Dv = 16 (they
    # were all skipped at Dk = 32, Dv = 16 before); its numerics draws catch it too.
    "state_layout_vk": (make(api="state_layout_vk", caps={"equal_head_dims": True}), ("aliasing",), ""),
}

# The head-dim-limited kernels above, each declaring its limit: they must pass the whole suite.
DECLARED_HEAD_DIMS: dict[str, Callable[..., Any]] = {
    "square_heads_declared": make(api="square_heads_only", caps={"equal_head_dims": True}),
    "head_dims_declared": make(api="head_dims_16_64", caps={"head_dims": LIMITED_HEAD_DIMS}),
}


def limited(**limits: int) -> Callable[..., Any]:
    """The correct base declaring size limits (``max_seq_len``, ``max_lanes``, ``max_work``) and refusing any call
    above one before anything else, like a kernel sized for its hardware. The refusal names no argument, so a suite
    call above a declared limit fails whatever test made it — a rejection test included. Sizes are read only from
    a 4-D query and value: a rank violation is the contract's to refuse."""

    def gdn_cte(**call: Any) -> tuple[np.ndarray, np.ndarray]:
        q, v = np.shape(call["query"]), np.shape(call["value"])
        if len(q) == 4 and len(v) == 4:
            sizes = {"max_seq_len": q[2], "max_lanes": v[0] * v[1], "max_work": v[0] * v[1] * q[2] * q[3] * v[3]}
            over = [f"{name} {sizes[name]} > {limit}" for name, limit in limits.items() if sizes[name] > limit]
            if over:
                raise RuntimeError(f"LIMIT BREACHED, called above its declared {'; '.join(over)}")
        return CORRECT(**call)

    label = ",".join(f"{name}={limit}" for name, limit in limits.items())
    gdn_cte.gdn_spec_capabilities = {**CORRECT.gdn_spec_capabilities, **limits, "name": f"mutant:limited({label})"}
    return gdn_cte


# Correct kernels declaring size limits: the whole suite must pass them, skipping what is above a limit and never
# calling them there. S = 200 is between schur's 128 and 256 and above neumann's 192; S = 100 is below schur's
# only chunk multiple; one lane leaves a single head. One lane alone (a hand-written kernel's usual limit) shows
# the lane limit by itself; its max_work = 2^20 is above every fixed shape at one lane but one (128 x 128, whose
# one schur chunk is 2^21) and makes numerics draws shrink along max_work too (they must not breach it either).
DECLARED_LIMITS: dict[str, Callable[..., Any]] = {
    "limited_seq200_lanes2": limited(max_seq_len=200, max_lanes=2),
    "limited_seq100_lanes1": limited(max_seq_len=100, max_lanes=1),
    "limited_lanes1": limited(max_lanes=1, max_work=1 << 20),
}


def warns_on_huge_gates(**call: Any) -> tuple[np.ndarray, np.ndarray]:
    """The correct base, plus an inverse decay e^(−g) it never uses: right numbers, but numpy warns (overflow) on
    every huge gate. It proves a warning-free check can see a warning (test_power)."""
    np.exp(-np.asarray(call["g_log"], dtype=np.float32))
    return CORRECT(**call)


warns_on_huge_gates.gdn_spec_capabilities = {**CAPS, "name": "mutant:warns_on_huge_gates"}


def returns_three_items(**call: Any) -> tuple[np.ndarray, np.ndarray, None]:
    """The correct base returning (out, state, None): the suite must say how many items came back."""
    return (*CORRECT(**call), None)


returns_three_items.gdn_spec_capabilities = {**CAPS, "name": "mutant:returns_three_items"}

for _name, (_fn, _areas, _k) in FLAWS.items():
    globals()[_name] = _fn
globals().update(DECLARED_HEAD_DIMS)
globals().update(DECLARED_LIMITS)
