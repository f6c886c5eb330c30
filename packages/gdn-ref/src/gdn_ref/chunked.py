"""Chunk-parallel (WY / UT-transform) form of the gated delta rule, with either intra-chunk inverse.

Layout inside this module: (batch, key head) pairs are flattened into L "lanes"; every tensor is split into
chunks and grouped by lane, so value-head tensors are ``[L, G, N, C, ...]`` (G = Hv // Hk value heads per key
head, N chunks of C tokens) and key/query tensors are ``[L, 1, N, C, Dk]``. Broadcasting over the G axis is how
value head h reads key head h // G, without materializing repeated key heads.
"""

from __future__ import annotations

import contextvars
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from threadpoolctl import threadpool_limits

from .constants import ALGORITHM_NEUMANN, ALGORITHM_SCHUR, ALGORITHMS, CHUNK_BY_ALGORITHM, SUBBLOCK_NEUMANN
from .inverse import neumann_inverse, schur_inverse, schur_inverse_blocked
from .masks import PLANE_TRIL_STRICT, PLANE_UPPER_NEG, build_mask_pack
from .recurrent import value_head_to_key_head
from .rounding import RoundFn, keep, operand_rounding

WriteFn = Callable[[int, np.ndarray], np.ndarray]
"""(chunk index n, X S₀ with X = K or W) → that chunk's effective writes V_new."""

# Work is done in slabs of lanes (lane = one (batch, key head) pair with its G value heads), sized so each
# per-slab array stays near this many bytes, and each worker thread reuses its arrays from slab to slab
# (_Workspace). Measured on the 2-core dev box: writing a freshly allocated page cost ~10x the arithmetic that
# fills it (16 MiB: 40 ms fresh vs 4 ms reused), and whole-problem temporaries (~130 MiB each at B=1, Hv=32,
# S=8192) made the run time swing 1.2-5.6 s. Lanes are independent, so slabbing changes no arithmetic. Slabs run
# on one thread per CPU with single-threaded BLAS: numpy releases the GIL in matmul and elementwise loops, so
# the elementwise half of the work runs in parallel too, and multi-threaded OpenBLAS on 128x128 products was 10x
# slower whenever other processes shared the cores (its threads spin-wait for each other).
SLAB_BYTES = 16 * 2**20


class _Workspace:
    """Named arrays a worker thread reuses across its slabs (contents are never assumed, only the memory)."""

    def __init__(self) -> None:
        self._arrays: dict[str, np.ndarray] = {}

    def take(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        array = self._arrays.get(name)
        if array is None or array.shape != shape or array.dtype != dtype:
            array = self._arrays[name] = np.empty(shape, dtype)
        return array


@dataclass
class _ChunkedInputs:
    """One slab's inputs, padded to whole chunks, cast to the compute dtype and grouped by key head."""

    query: np.ndarray  # [L, 1, N, C, Dk]
    key: np.ndarray  # [L, 1, N, C, Dk]
    value: np.ndarray  # [L, G, N, C, Dv]
    g_log: np.ndarray  # [L, G, N, C]
    beta: np.ndarray  # [L, G, N, C]


# Every gate is floored here before any sum (``_gate_terms``): e^(−1e4) is 0 in fp32 and in fp64 (whose
# smallest subnormal is e^(−744.4)), so a decay spanning a floored gate is exactly what it would have been.
LOG_DECAY_FLOOR = -1e4


@dataclass(frozen=True)
class _GateMasks:
    """The two chunk-sized masks the decays need, in the compute dtype."""

    strict_lower: np.ndarray  # [C, C] 1 where j < i
    upper_neg: np.ndarray  # [C, C] −1e9 where j > i, else 0


@dataclass
class _GateTerms:
    """The chunk's decays (all values ≤ 1 for g ≤ 0, none overflow)."""

    decay: np.ndarray  # [L, G, N, C, C] Γ_ij = exp(Σ_{j<t≤i} g_t) for i ≥ j, else exactly 0
    exp_gamma: np.ndarray  # [L, G, N, C] e^{γ_i}: decay from chunk entry to token i
    to_end: np.ndarray  # [L, G, N, C] e^{Σ_{j<t≤C} g_t}: decay from token j to the chunk's end
    total: np.ndarray  # [L, G, N] e^{γ_C}: decay over the whole chunk


def _split_chunks(x: np.ndarray, chunk: int, dtype: np.dtype) -> np.ndarray:
    """[L, G, S, ...] → [L, G, N, C, ...] in dtype, zero-padding S up to N·C tokens.

    Zero padding is exact: a padded token has β = 0 (writes nothing), g = 0 (decays nothing), k = q = v = 0.
    """
    L, G, S = x.shape[:3]
    n_chunks = -(-S // chunk)
    x = x.astype(dtype, copy=False)
    if n_chunks * chunk != S:
        pad = [(0, 0)] * x.ndim
        pad[2] = (0, n_chunks * chunk - S)
        x = np.pad(x, pad)
    return x.reshape(L, G, n_chunks, chunk, *x.shape[3:])


def _gate_terms(g_log: np.ndarray, masks: _GateMasks, ws: _Workspace) -> _GateTerms:
    """The chunk's decays, each an exponential of a sum of exactly the gates it spans.

    Γ_ij = exp(Σ_{j<t≤i} g_t) is summed directly (a masked cumulative sum down each column), never taken as the
    difference γ_i − γ_j of two prefix sums: after one huge gate the prefix sums are huge and their difference
    loses every later small gate (g = −1e7 mid-chunk: rel-RMS 2.5), and after g = −inf it is −inf − (−inf) =
    NaN. Only decays that start at the chunk's first token use the prefix sum γ, which has no such cancellation.
    The anti-causal half is pushed to −1e9 before exp (added, so a decay above 1 from an out-of-contract g > 0
    is kept, not capped): exactly 0, never inf.

    Every gate is first floored at ``LOG_DECAY_FLOOR``: a decay spanning a floored gate is e^(≤ −1e4), which is 0
    in fp32 and fp64 exactly as e^(−1e30) or e^(−inf) is, and a decay not spanning one is untouched, so the floor
    changes no value, while keeping every sum finite (−inf · 0 would be NaN).
    """
    g = np.maximum(g_log, LOG_DECAY_FLOOR)
    gamma = np.cumsum(g, axis=-1)
    decay = ws.take("decay", (*gamma.shape, gamma.shape[-1]), gamma.dtype)
    np.multiply(g[..., :, None], masks.strict_lower, out=decay)  # [i, j] = g_i where i > j, else 0
    np.cumsum(decay, axis=-2, out=decay)  # [i, j] = Σ_{j<t≤i} g_t (0 on and above the diagonal)
    decay += masks.upper_neg
    np.exp(decay, out=decay)
    return _GateTerms(
        decay=decay,
        exp_gamma=np.exp(gamma),
        to_end=decay[..., -1, :].copy(),  # Γ_{C−1, j}: from token j to the chunk's end
        total=np.exp(gamma[..., -1]),
    )


def _system_and_scores(
    inputs: _ChunkedInputs, gates: _GateTerms, scale: float, rnd: RoundFn, ws: _Workspace
) -> tuple[np.ndarray, np.ndarray]:
    """The strictly-lower system matrix A = β_i (k_i·k_j) Γ_ij and the causal scores scale·(q_i·k_j) Γ_ij.

    Both Gram matrices are formed once per KEY head and broadcast over its value heads. The scores reuse the
    decay buffer, which is not needed afterwards.
    """
    key_op = rnd(inputs.key)
    key_t = key_op.swapaxes(-1, -2)
    gram = ws.take("gram", (*key_op.shape[:-1], key_op.shape[-2]), key_op.dtype)  # [L, 1, N, C, C]
    np.matmul(key_op, key_t, out=gram)
    system = np.multiply(gram, gates.decay, out=ws.take("system", gates.decay.shape, gram.dtype))
    system *= inputs.beta[..., :, None]  # β scales the receiving token's row
    chunk = system.shape[-1]
    system.reshape(*system.shape[:-2], chunk * chunk)[..., :: chunk + 1] = 0  # strictly lower: drop Γ_ii = 1
    scores = np.matmul(rnd(inputs.query), key_t, out=gram)
    scores *= scale
    gates.decay *= scores  # keeps the diagonal: the output is read after the write
    return system, gates.decay


def _schur_chain(
    inputs: _ChunkedInputs, gates: _GateTerms, inverse: np.ndarray, rnd: RoundFn, ws: _Workspace
) -> tuple[np.ndarray, WriteFn]:
    """The kernel's schur dataflow: T is applied ON the state chain, V_new = T (diag(β)V − diag(βe^γ) K S₀).

    Returns the stacked left operand [Q; K] ([L, 1, N, 2C, Dk]) and the step computing V_new from K S₀.
    """
    query, key = inputs.query, inputs.key
    stacked = ws.take("stacked", (*key.shape[:-2], 2 * key.shape[-2], key.shape[-1]), key.dtype)
    np.concatenate([rnd(query), rnd(key)], axis=-2, out=stacked)
    beta_value = np.multiply(
        inputs.beta[..., None], inputs.value, out=ws.take("beta_value", inputs.value.shape, key.dtype)
    )
    beta_decay = (inputs.beta * gates.exp_gamma)[..., None]
    inverse_op = rnd(inverse)

    def write_of_chunk(n: int, key_state: np.ndarray) -> np.ndarray:
        rhs = beta_value[..., n, :, :] - beta_decay[..., n, :, :] * key_state
        return rnd(inverse_op[..., n, :, :] @ rnd(rhs))

    return stacked, write_of_chunk


def _neumann_chain(
    inputs: _ChunkedInputs, gates: _GateTerms, inverse: np.ndarray, rnd: RoundFn, ws: _Workspace
) -> tuple[np.ndarray, WriteFn]:
    """The FLA / neumann dataflow: W = T diag(βe^γ) K and U = T diag(β) V up front, then V_new = U − W S₀.

    Returns the stacked left operand [Q; W] ([L, G, N, 2C, Dk]) and the step computing V_new from W S₀.
    """
    chunk, dk = inputs.key.shape[-2:]
    dtype = inverse.dtype
    inverse_op = rnd(inverse)
    stacked = ws.take("stacked", (*inverse.shape[:-2], 2 * chunk, dk), dtype)
    stacked[..., :chunk, :] = rnd(inputs.query)
    weights = stacked[..., chunk:, :]
    rhs_w = np.multiply(
        (inputs.beta * gates.exp_gamma)[..., None], inputs.key, out=ws.take("rhs_w", weights.shape, dtype)
    )
    np.matmul(inverse_op, rnd(rhs_w), out=weights)
    weights[...] = rnd(weights)
    rhs_u = np.multiply(inputs.beta[..., None], inputs.value, out=ws.take("rhs_u", inputs.value.shape, dtype))
    updates = np.matmul(inverse_op, rnd(rhs_u), out=ws.take("updates", inputs.value.shape, dtype))

    def write_of_chunk(n: int, weight_state: np.ndarray) -> np.ndarray:
        return rnd(updates[..., n, :, :] - weight_state)

    return stacked, write_of_chunk


def _state_chain(
    state: np.ndarray,
    stacked: np.ndarray,
    write_of_chunk: WriteFn,
    key_to_end: np.ndarray,
    total: np.ndarray,
    rnd: RoundFn,
    ws: _Workspace,
) -> tuple[np.ndarray, np.ndarray]:
    """Carry the state across chunks: the only sequential part.

    Args:
        state (np.ndarray): [L, G, Dk, Dv] state at sequence start; the full-precision master, updated in place.
        stacked (np.ndarray): [L, 1 or G, N, 2C, Dk] per chunk the rows [Q; X], X = K (schur) or W (neumann),
            as matmul operands. One product with the entry state gives the output's Q S₀ and the X S₀ the
            writes need: one tall matmul instead of two short ones, and no stored entry states.
        write_of_chunk (WriteFn): (n, X S₀ [L, G, C, Dv]) → chunk n's effective writes V_new (rounded).
        key_to_end (np.ndarray): [L, G, N, C, Dk] e^{Σ_{j<t≤C} g_t} k_j (decay to the chunk's end), as a matmul operand.
        total (np.ndarray): [L, G, N] e^{γ_C}.
        rnd (RoundFn): operand rounding of everything but the state, which the kernel keeps fp32 even as an operand.
        ws (_Workspace): where the products and writes live.

    Returns:
        tuple[np.ndarray, np.ndarray]: Q S₀ [L, G, N, C, Dv] (a view) and the writes V_new [L, G, N, C, Dv].
    """
    n_chunks, chunk = key_to_end.shape[-3:-1]
    lanes, groups, _, dv = state.shape
    products = ws.take("products", (lanes, groups, n_chunks, 2 * chunk, dv), state.dtype)
    writes = ws.take("writes", (lanes, groups, n_chunks, chunk, dv), state.dtype)
    for n in range(n_chunks):
        np.matmul(stacked[..., n, :, :], state, out=products[..., n, :, :])  # the state is never narrowed
        writes[..., n, :, :] = write_of_chunk(n, products[..., n, chunk:, :])
        # S_C = e^{γ_C} S₀ + (diag(e^{γ_C − γ}) K)ᵀ V_new
        state *= total[..., n, None, None]
        state += key_to_end[..., n, :, :].swapaxes(-1, -2) @ writes[..., n, :, :]
    return products[..., :chunk, :], writes


def _slab(
    inputs: _ChunkedInputs,
    state: np.ndarray,
    scale: float,
    algorithm: str,
    rnd: RoundFn,
    mask_pack: np.ndarray | None,
    ws: _Workspace,
) -> np.ndarray:
    """The whole chunked computation for one slab of lanes; updates ``state`` in place, returns [L, G, N, C, Dv]."""
    chunk = inputs.key.shape[-2]
    pack = build_mask_pack(chunk)
    masks = _GateMasks(pack[PLANE_TRIL_STRICT].astype(state.dtype), pack[PLANE_UPPER_NEG].astype(state.dtype))
    gates = _gate_terms(inputs.g_log, masks, ws)
    system, scores = _system_and_scores(inputs, gates, scale, rnd, ws)
    inverse = ws.take("inverse", system.shape, system.dtype)
    if algorithm == ALGORITHM_NEUMANN:
        # The kernel runs the doubling in fp32: bf16 powers of near-collinear 16-blocks do not cancel back.
        neumann_inverse(system, SUBBLOCK_NEUMANN, keep, out=inverse)
        stacked, write_of_chunk = _neumann_chain(inputs, gates, inverse, rnd, ws)
    else:
        if mask_pack is None:
            schur_inverse_blocked(system, rnd, out=inverse)
        else:
            inverse[...] = schur_inverse(system, mask_pack, rnd)
        stacked, write_of_chunk = _schur_chain(inputs, gates, inverse, rnd, ws)
    key_to_end = ws.take("key_to_end", (*gates.to_end.shape, inputs.key.shape[-1]), state.dtype)
    key_to_end = rnd(np.multiply(gates.to_end[..., None], inputs.key, out=key_to_end))
    query_state, writes = _state_chain(state, stacked, write_of_chunk, key_to_end, gates.total, rnd, ws)
    query_state *= scale * gates.exp_gamma[..., None]
    query_state += np.matmul(rnd(scores), writes, out=ws.take("intra", writes.shape, writes.dtype))
    return query_state


def _cpu_count() -> int:
    """CPUs this process may run on (the affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def _lanes_per_slab(n_chunks: int, chunk: int, groups: int, widest: int, itemsize: int) -> int:
    """Lanes whose largest per-slab array ([G, N, C, max(C, Dk, Dv)] per lane) fits in SLAB_BYTES."""
    lane_bytes = groups * n_chunks * chunk * max(chunk, widest) * itemsize
    return max(1, SLAB_BYTES // lane_bytes)


def chunked(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    g_log: np.ndarray,
    beta: np.ndarray,
    scale: float = 1.0,
    initial_state: np.ndarray | None = None,
    *,
    algorithm: str = ALGORITHM_SCHUR,
    compute_dtype: type | np.dtype = np.float32,
    bf16_operands: bool = False,
    mask_pack: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Gated delta rule in chunk-parallel WY/UT form, using the named intra-chunk inverse.

    Dimensions:
        B: batch. Hk: key/query heads. Hv: value heads (a multiple of Hk). S: tokens (any length).
        Dk, Dv: head dims. C: chunk length, CHUNK_BY_ALGORITHM[algorithm] (schur 128, neumann 64).

    Args:
        query (np.ndarray): [B, Hk, S, Dk], any float dtype (bfloat16 included).
        key (np.ndarray): [B, Hk, S, Dk].
        value (np.ndarray): [B, Hv, S, Dv].
        g_log (np.ndarray): [B, Hv, S] per-token log-decay (≤ 0; −inf is a reset: decay exactly 0).
        beta (np.ndarray): [B, Hv, S] per-token update strength.
        scale (float): output scale (typically Dk^-0.5).
        initial_state (np.ndarray | None): [B, Hv, Dk, Dv]; None means zeros. Never modified.
        algorithm (str): "schur" or "neumann": the inverse, the chunk length and the dataflow.
        compute_dtype (type | np.dtype): float32 or float64, for every array including the cumsum.
        bf16_operands (bool): round matmul operands to bfloat16 as the kernel does (accumulation stays in
            compute_dtype). Two exceptions, also the kernel's: the state is never rounded, not even as an operand,
            and neumann's doubling inverse runs unrounded (its powers do not survive bf16).
        mask_pack (np.ndarray | None): schur only. Given, the inverse is the mask-pack-driven
            :func:`schur_inverse` (two full C×C products per level, exactly the kernel's recipe); None uses
            :func:`schur_inverse_blocked`, the same arithmetic on the nonzero blocks only (much faster).

    Returns:
        tuple[np.ndarray, np.ndarray]: out [B, Hv, S, Dv] and final state [B, Hv, Dk, Dv], both compute_dtype.

    Notes:
        Per chunk with entry state S₀: γ = chunk-local cumsum of g; Γ_ij = e^{Σ_{j<t≤i} g_t}
        (i ≥ j; summed directly, never as γ_i − γ_j, so a huge or −inf gate mid-chunk costs nothing);
        A = strictly_lower(diag(β)(KKᵀ∘Γ)); T = (I + A)^{-1};
        V_new = T·(diag(β)V − diag(βe^γ) K S₀)  (schur applies T on the state chain;
        neumann forms W = T diag(βe^γ)K and U = T diag(β)V first and takes V_new = U − W S₀, as FLA does);
        O = scale·(diag(e^γ) Q S₀ + (QKᵀ∘Γ) V_new);  S_C = e^{γ_C} S₀ + (diag(e^{γ_C−γ}) K)ᵀ V_new.
        State-independent work is vectorized over every (lane, head, chunk) of a slab; only the state chain
        loops over chunks, with batched matmuls; outputs are formed after it from the stored entry states and
        writes. S need not be a multiple of C: the tail is padded with g = 0, β = 0 tokens, which is exact.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    dtype = np.dtype(compute_dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"compute_dtype must be float32 or float64, got {dtype}")
    chunk = CHUNK_BY_ALGORITHM[algorithm]
    rnd = operand_rounding(bf16_operands)
    B, Hk, S, Dk = query.shape
    Hv, Dv = value.shape[1], value.shape[3]
    value_head_to_key_head(Hk, Hv)  # validates the head ratio
    groups = Hv // Hk
    lanes = B * Hk

    # Lane views: [B, Hk, ...] → [L, 1, ...] and [B, Hv, ...] → [L, G, ...] (value head h = key head h//G).
    query_l = np.asarray(query).reshape(lanes, 1, S, Dk)
    key_l = np.asarray(key).reshape(lanes, 1, S, Dk)
    value_l = np.asarray(value).reshape(lanes, groups, S, Dv)
    g_l = np.asarray(g_log).reshape(lanes, groups, S)
    beta_l = np.asarray(beta).reshape(lanes, groups, S)
    state = np.zeros((lanes, groups, Dk, Dv), dtype)
    if initial_state is not None:
        state[...] = np.asarray(initial_state).reshape(state.shape)

    n_chunks = -(-S // chunk)
    out = np.empty((lanes, groups, n_chunks, chunk, Dv), dtype)  # padded; the tail is cut off at the end
    per_thread = threading.local()

    def run_slab(lanes_of_slab: slice) -> None:  # writes only its own lanes of `out` and `state`
        if not hasattr(per_thread, "workspace"):
            per_thread.workspace = _Workspace()
        inputs = _ChunkedInputs(
            query=_split_chunks(query_l[lanes_of_slab], chunk, dtype),
            key=_split_chunks(key_l[lanes_of_slab], chunk, dtype),
            value=_split_chunks(value_l[lanes_of_slab], chunk, dtype),
            g_log=_split_chunks(g_l[lanes_of_slab], chunk, dtype),
            beta=_split_chunks(beta_l[lanes_of_slab], chunk, dtype),
        )
        ws = per_thread.workspace
        out[lanes_of_slab] = _slab(inputs, state[lanes_of_slab], scale, algorithm, rnd, mask_pack, ws)

    workers = _cpu_count()
    step = _lanes_per_slab(n_chunks, chunk, groups, max(Dk, Dv), dtype.itemsize)
    step = min(step, -(-lanes // workers))  # at least one slab per worker when there are enough lanes
    slabs = [slice(lo, lo + step) for lo in range(0, lanes, step)]
    with threadpool_limits(limits=1, user_api="blas"):
        if len(slabs) == 1 or workers == 1:
            for lanes_of_slab in slabs:
                run_slab(lanes_of_slab)
        else:
            # Each task runs in a copy of the caller's context, so settings such as np.errstate carry over.
            contexts = [contextvars.copy_context() for _ in slabs]
            with ThreadPoolExecutor(min(workers, len(slabs))) as pool:
                list(pool.map(lambda ctx, lanes_of_slab: ctx.run(run_slab, lanes_of_slab), contexts, slabs))
    out = out.reshape(lanes, groups, n_chunks * chunk, Dv)[:, :, :S]
    return out.reshape(B, Hv, S, Dv), state.reshape(B, Hv, Dk, Dv)
