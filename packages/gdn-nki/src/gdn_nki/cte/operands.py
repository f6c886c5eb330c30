"""The operand stage: gate prefix sums and every chunk's state-independent operands (decays, Ãᵀ, attnᵀ, scaled q
and k), the first stage of a unit.

gdn_ref twin: ``gdn_ref.chunked._gate_terms`` and ``_system_and_scores``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gdn_ref.chunked import LOG_DECAY_FLOOR

from ..common import engines, tiles
from ..common.backend import nisa, nl
from ..common.tiles import FP32
from .chunks import Chunk, Lane, tile_of


@dataclass
class Gates:
    """Per-token gate columns of one group of chunks ([C, n] tiles, column j = chunk j of the group)."""

    g: Any  # g_log floored at LOG_DECAY_FLOOR (exact, see gate_columns), fp32
    gamma: Any  # chunk-local inclusive prefix sum of g, fp32: only ever exponentiated as a decay from chunk start
    beta: Any  # β, fp32
    decay: Any = None  # e^γ, fp32


def gate_columns(g_rows: Any, beta_rows: Any, dst: Any = None) -> Gates:
    """Floor and prefix-sum the gate rows in fp32 (one vector op and one scan for the whole group) and turn them
    into the token-on-partition columns later stages scale rows with (three fp32 PE transposes), written into
    ``dst`` ([C, 3, n] fp32: γ, β, g; the tile set's ``ChunkTiles.gates``, where the transition reads β) or a new
    tile.

    The floor at LOG_DECAY_FLOOR = −1e4 is exact: a decay spanning a floored gate is e^(≤ −1e4), which is 0 in
    fp32 and bf16 just as e^(−1e30) or e^(−inf) is, and a decay not spanning one does not read it. It keeps every
    sum finite, so the masked products of ``chunk_operands`` never meet −inf · 0 = NaN.
    """
    n_chunks, chunk = g_rows.shape
    # The scan floors each gate itself (op0), so it does not wait on the floored rows (the same values, summed in
    # the same order).
    gamma_rows = tiles.sbuf((n_chunks, chunk), FP32)
    engines.active().charge(engines.VECTOR, engines.stream_ns(engines.VECTOR, chunk))
    nisa.tensor_scalar_cumulative(dst=gamma_rows, src=g_rows, op0=nl.maximum, op1=nl.add, imm0=LOG_DECAY_FLOOR)
    g_floored = tiles.sbuf((n_chunks, chunk), FP32)
    engines.active().charge(engines.VECTOR, engines.stream_ns(engines.VECTOR, chunk))
    nisa.tensor_scalar(dst=g_floored, data=g_rows, op0=nl.maximum, operand0=LOG_DECAY_FLOOR, engine=engines.VECTOR)

    columns_psum = tiles.psum((chunk, 3, n_chunks))
    for k, rows in enumerate((gamma_rows, beta_rows, g_floored)):
        nisa.nc_transpose(dst=columns_psum[:, k, :], data=rows, engine=nisa.tensor_engine)
    decay = tiles.exp(columns_psum[:, 0, :])  # e^γ straight from PSUM, beside the evacuation
    columns = tiles.copy_to(dst if dst is not None else tiles.sbuf((chunk, 3, n_chunks), FP32), columns_psum)
    gamma, beta_cols, g = (columns[:, k, :] for k in range(3))

    return Gates(g=g, gamma=gamma, beta=beta_cols, decay=decay)


def chunk_operands(lane: Lane, chunk: Chunk, gates: Gates, j: int) -> Iterator[None]:
    """The state-independent operands of one chunk (decays, A, attnᵀ, scaled q/k/v).

    A generator: it yields between phases whose instructions depend on the previous phase, so a driver can run
    the phases of several chunks step-major (see ``lockstep.lockstep``). The phase order also bounds PSUM use:
    each PSUM tile is consumed in the phase after the one that produced it.
    """
    c, dtype, consts = lane.chunk, lane.dtype, lane.consts
    dk = chunk.k_t.shape[0]

    # Γᵀ[j', i] = exp(Σ_{j'<t≤i} g_t): every decay is summed from exactly the gates it spans, by the tensor
    # engine (Σ_t [g_t·1(t > j')] · 1(t ≤ i)), never taken as a difference γ_i − γ_j' of prefix sums: after a
    # huge gate those are huge and their difference loses every later small gate (−1e7 mid-chunk: rel-RMS 2.5),
    # and after −inf it is NaN. The 0/1 mask is the moving operand (the fast fp32 mode).
    spans_lhs = tiles.scale_rows(consts.after, gates.g[:, j : j + 1], FP32)
    # rows[p, i] = e^{γ_i} on each of Dk partitions (a stride-0 stationary of the group's e^γ column against the
    # identity, exact): e^γ along the free axis of the [Dk, C] query tile, without an exp per chunk. γ only ever
    # enters decays from the chunk's start, which cannot cancel.
    rows = tiles.matmul(gates.decay[:, j : j + 1].broadcast(1, dk), consts.eye32, moving_onezero=True)
    yield
    chunk.q_decay_t = tiles.combine(tile_of(chunk, "q_decay_t", chunk.q_t, FP32), chunk.q_t, rows, nl.multiply)
    # e^{γ_last}: its last column, copied into a kept tile of its own (the chain reads it two periods later)
    chunk.decay_last = tiles.copy_to(tile_of(chunk, "decay_last", rows[:, c - 1 : c], FP32), rows[:, c - 1 : c])
    del rows
    # Made once ``rows`` is dead, so a chunk never holds more than one PSUM tile across a phase.
    spans_t = tiles.matmul(spans_lhs, consts.through, moving_onezero=True)
    del spans_lhs
    yield
    # The anti-causal half (i < j') sums no gate (every term is an exact 0·g), so it reads exp(0) = 1 exactly —
    # finite — and a multiply by the causal mask zeroes it exactly (x·0 = 0 for finite x: the bits of a select, at
    # half the cost of GpSimd's affine_select).
    decay_t = tiles.exp(spans_t)
    tiles.combine(decay_t, decay_t, consts.through, nl.multiply)
    ratio = decay_t[:, c - 1 : c]  # Γᵀ[j', C−1]: the decay from token j' to the chunk's end
    chunk.beta = gates.beta[:, j : j + 1]
    del spans_t
    if chunk.key is None:
        chunk.key = tiles.transpose(chunk.k_t)
    yield
    chunk.k_decay = tiles.scale_rows(chunk.key, ratio, dtype, dst=tile_of(chunk, "k_decay", chunk.key, dtype))
    k_gamma = tile_of(chunk, "k_gamma", chunk.key, dtype)
    chunk.k_gamma = tiles.scale_rows(chunk.key, gates.decay[:, j : j + 1], dtype, dst=k_gamma)
    chunk.release("key")
    yield
    # Each product is consumed right after it is made, so one chunk holds at most one PSUM tile here. Ãᵀ =
    # diag(β)(K Kᵀ ∘ Γᵀ): β on the evacuation of K Kᵀ, then the mask multiply, each on whichever engine is free
    # (chosen over one two-pass vector-engine scalar_tensor_tensor of both; PERFORMANCE.md).
    kk_beta = tiles.scale_rows(tiles.matmul(chunk.k_t, chunk.k_t), chunk.beta, FP32)
    chunk.a_t = tiles.combine(tile_of(chunk, "a_t", kk_beta, lane.system_dtype), kk_beta, decay_t, nl.multiply)
    qk_t = tiles.matmul(chunk.k_t, chunk.q_t)  # [j', i] = k_j' · q_i
    chunk.attn_t = tiles.combine(tile_of(chunk, "attn_t", qk_t, dtype), qk_t, decay_t, nl.multiply)
    chunk.release("q_t", "k_t")
