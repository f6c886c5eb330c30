"""Stages both algorithms share: gate prefix sums, per-chunk operands, the chunk transition, the state chain.

The kernel uses the *transition form* of the chunked delta rule. For a chunk with entry state ``S`` (fp32 master,
[Dk, Dv]) everything except two products is state independent:

    U  = Inv · diag(β) V                 W  = Inv · diag(β e^γ) K            (Inv = (I + A)⁻¹, A = diag(β)(K Kᵀ ∘ Γ))
    out = scale · (Q_eff S + attn U)     Q_eff = diag(e^γ) Q − attn W        attn = (Q Kᵀ) ∘ Γ (causal, incl. diag)
    S'  = e^{γ_last} S + T S + H          T = −K_decᵀ W                       H = K_decᵀ U,  K_dec = diag(e^{γ_last−γ}) K

so the sequential chain per chunk is one accumulating matmul group plus one vector op (per column half of the
state, see State), and all the rest (the inverse, U, W, T, H, Q_eff) can run ahead on otherwise idle engines. It
is algebraically the WY form (δ = U − W S is the per-token write) with δ substituted into the output and state
updates. The state's master is fp32 throughout; as a matmul operand it is split into two bf16 parts when the
compute dtype is bf16 (see State).

U and W are computed through the other ordering of β, ``Inv · diag(β) = diag(β) · (I + Ã)⁻¹`` with
``Ã = (K Kᵀ ∘ Γ) diag(β)`` (push-through: ``(I + D M)⁻¹ D = D (I + M D)⁻¹``): ``U = diag(β) (I + Ã)⁻¹ V`` and
``W = diag(β) (I + Ã)⁻¹ diag(e^γ) K``, β applied on the evacuation of each fp32 product. The system the inverse
is handed is then ``Ãᵀ = diag(β)(K Kᵀ ∘ Γᵀ)`` (``Chunk.a_t``), made from Γᵀ — the orientation attnᵀ and K_dec
use — with no transpose of Γᵀ, and the inverse it returns, ``(I + Ã)⁻ᵀ = (I + Ãᵀ)⁻¹``, is the stationary operand
of both products. V enters unscaled (no rounding of diag(β) V) and so does diag(e^γ) K. Measured, one lane bf16
schur, against ``A = diag(β)(K Kᵀ ∘ Γ)`` from a tensor-engine transpose of Γᵀ: PE time per chunk 1.32 -> 1.20
µs, S = 8192 139.0 -> 136.1 µs, and every numerics regime's error as small or smaller (zero gates: state rel-RMS
3.60e-3 -> 2.98e-3). Moving β into attn and K_dec instead (no β in stage 3) was faster, 133.9 µs, but rounds
diag(β) K_dec where K_dec is otherwise exact (zero gates: 3.60e-3 -> 3.80e-3).

Layout conventions: ``*_t`` tiles are transposed ([head dim, tokens]); columns are [tokens, 1] per-partition
scalars; ``nc_matmul(stationary=X, moving=Y)`` computes ``Xᵀ Y`` contracting the partition axis.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from gdn_ref.chunked import LOG_DECAY_FLOOR
from gdn_ref.masks import PLANE_EYE, PLANE_TRIL_STRICT

from . import engines, tiles
from .backend import nisa, nl
from .tiles import FP32


@dataclass
class Constants:
    """Constant tiles one kernel launch loads or builds once.

    Attributes:
        eye32: [C, C] fp32 identity (moving operand of the gate broadcast).
        eye: [C, C] identity in the compute dtype (seeds and transposes of the inverse).
        after: [C, C] fp32, 1 where row t > column j: the gates a decay from token j spans start after j.
        through: [C, C] fp32, 1 where row t <= column i: ... and end at token i (the moving operand, 0/1).
        planes: algorithm-specific masks (schur: off-block planes; neumann: block masks).
    """

    eye32: Any
    eye: Any
    after: Any
    through: Any
    planes: dict[str, Any] = field(default_factory=dict)


def constants_from_pack(mask_pack: Any, chunk: int, dtype: Any) -> Constants:
    """Load the shared constants from the host-built mask pack (one DMA each, no on-device mask building)."""
    eye32 = nl.load(mask_pack[PLANE_EYE, 0:chunk, 0:chunk], dtype=FP32)
    eye = tiles.sbuf((chunk, chunk), dtype)
    tiles.copy_to(eye, eye32)
    after = nl.load(mask_pack[PLANE_TRIL_STRICT, 0:chunk, 0:chunk], dtype=FP32)  # 1 where column < row
    return Constants(eye32=eye32, eye=eye, after=after, through=_complement(after))


def constants_on_device(chunk: int, dtype: Any) -> Constants:
    """Build the shared constants with GpSimd selects (for the algorithm that takes no mask pack)."""
    ones = tiles.sbuf((chunk, chunk), FP32)
    nisa.memset(dst=ones, value=1.0)
    eye32 = tiles.select_by_diagonal(tiles.sbuf((chunk, chunk), FP32), ones, 0.0, nl.equal)
    eye = tiles.copy_to(tiles.sbuf((chunk, chunk), dtype), eye32)
    after = tiles.select_by_diagonal(tiles.sbuf((chunk, chunk), FP32), ones, 0.0, nl.less)
    return Constants(eye32=eye32, eye=eye, after=after, through=_complement(after))


def _complement(mask: Any) -> Any:
    """1 − mask for a 0/1 tile (exact), in one vector-engine instruction (GpSimd's tensor_scalar is rsqrt-only)."""
    out = tiles.sbuf(tuple(mask.shape), FP32)
    engines.BALANCER.charge(engines.VECTOR, engines.stream_ns(engines.VECTOR, mask.shape[1]))
    nisa.tensor_scalar(
        dst=out, data=mask, op0=nl.multiply, operand0=-1.0, op1=nl.add, operand1=1.0, engine=engines.VECTOR
    )
    return out


@dataclass
class Gates:
    """Per-token gate columns of one group of chunks ([C, n] tiles, column j = chunk j of the group)."""

    g: Any  # g_log floored at LOG_DECAY_FLOOR (exact, see gate_columns), fp32
    gamma: Any  # chunk-local inclusive prefix sum of g, fp32: only ever exponentiated as a decay from chunk start
    beta: Any  # β, fp32
    decay: Any = None  # e^γ, fp32


def load_gate_rows(g_log: Any, beta: Any, lane: Lane, start: Any, width: int) -> tuple:
    """DMA ``width`` chunks' g_log and β from token ``start`` (an int, or a compiled loop's run-time scalar) as
    rows (one row per chunk): the chunk-local cumsum then runs on the free axis."""
    chunk = lane.chunk
    tokens = nl.ds(start, width * chunk)
    g_rows = tiles.sbuf((width, chunk), FP32)
    nisa.dma_copy(dst=g_rows, src=g_log[lane.b, lane.h, tokens])
    beta_rows = tiles.sbuf((width, chunk), FP32)
    nisa.dma_copy(dst=beta_rows, src=beta[lane.b, lane.h, tokens])
    return g_rows, beta_rows


def gate_columns(g_rows: Any, beta_rows: Any, dst: Any = None) -> Gates:
    """Floor and prefix-sum the gate rows in fp32 (one vector op and one scan for the whole group) and turn them
    into the token-on-partition columns later stages scale rows with (three fp32 PE transposes), written into
    ``dst`` ([C, 3, n] fp32: γ, β, g; the chain slots' ``ChainSlot.gates``, where stage 3 reads β) or a new tile.

    The floor at LOG_DECAY_FLOOR = −1e4 is exact: a decay spanning a floored gate is e^(≤ −1e4), which is 0 in
    fp32 and bf16 just as e^(−1e30) or e^(−inf) is, and a decay not spanning one does not read it. It keeps every
    sum finite, so the masked products of ``chunk_operands`` never meet −inf · 0 = NaN.
    """
    n_chunks, chunk = g_rows.shape
    # The scan floors each gate itself (op0), so it does not wait on the floored rows (the same values, summed in
    # the same order).
    gamma_rows = tiles.sbuf((n_chunks, chunk), FP32)
    engines.BALANCER.charge(engines.VECTOR, engines.stream_ns(engines.VECTOR, chunk))
    nisa.tensor_scalar_cumulative(dst=gamma_rows, src=g_rows, op0=nl.maximum, op1=nl.add, imm0=LOG_DECAY_FLOOR)
    g_floored = tiles.sbuf((n_chunks, chunk), FP32)
    engines.BALANCER.charge(engines.VECTOR, engines.stream_ns(engines.VECTOR, chunk))
    nisa.tensor_scalar(dst=g_floored, data=g_rows, op0=nl.maximum, operand0=LOG_DECAY_FLOOR, engine=engines.VECTOR)

    columns_psum = tiles.psum((chunk, 3, n_chunks))
    for k, rows in enumerate((gamma_rows, beta_rows, g_floored)):
        nisa.nc_transpose(dst=columns_psum[:, k, :], data=rows, engine=nisa.tensor_engine)
    decay = tiles.exp(columns_psum[:, 0, :])  # e^γ straight from PSUM, beside the evacuation
    columns = tiles.copy_to(dst if dst is not None else tiles.sbuf((chunk, 3, n_chunks), FP32), columns_psum)
    gamma, beta_cols, g = (columns[:, k, :] for k in range(3))

    return Gates(g=g, gamma=gamma, beta=beta_cols, decay=decay)


@dataclass
class Chunk:
    """The tiles of one chunk, filled stage by stage (names follow the module docstring)."""

    token: Any  # the chunk's first token in q/k/v/out: an int, or a compiled loop's run-time scalar
    q_t: Any = None  # [Dk, C] query, compute dtype
    k_t: Any = None  # [Dk, C] key
    a_t: Any = None  # [C, C] Ãᵀ = diag(β)(K Kᵀ ∘ Γᵀ) in Lane.system_dtype; only its strictly-upper part is read
    attn_t: Any = None  # [C, C] attnᵀ (causal incl. diagonal), compute dtype
    q_decay_t: Any = None  # [Dk, C] (diag(e^γ) Q)ᵀ, fp32
    k_decay: Any = None  # [C, Dk] K_dec
    k_gamma: Any = None  # [C, Dk] diag(e^γ) K
    decay_last: Any = None  # [Dk, 1] e^{γ_last}
    beta: Any = None  # [C, 1] β
    inverse_t: Any = None  # [C, C] (I + Ã)⁻ᵀ = (I + Ãᵀ)⁻¹, compute dtype
    u: Any = None  # [C, Dv]
    transition_t: Any = None  # [Dk, Dk] Tᵀ, compute dtype (the dtype of the state's parts)
    q_eff_t: Any = None  # [Dk, C] Q_effᵀ, compute dtype
    key: Any = None  # [C, Dk] token-major key, a PSUM transpose of k_t or loaded so (stage 1 only)
    value: Any = None  # [C, Dv] V, loaded into the chain slot (stage 3 only: ``load_values``)
    slot: ChainSlot | None = None  # where stage 3 writes what the chain reads (None: fresh tiles)

    def release(self, *names: str) -> None:
        """Drop tiles no later stage reads, so their on-chip memory is free for the chunks behind."""
        for name in names:
            setattr(self, name, None)


@dataclass
class Lane:
    """One (sequence, value head) lane and what its stages read.

    A lane's sequence is the token range ``[offset, offset + n_chunks·chunk)`` of batch row ``b`` of q/k/v, the
    gates and ``out``; its initial and final state are row ``slot`` of the state tensors. A dense launch has one
    sequence per batch row (offset 0, slot b); a packed varlen launch has several sequences in row 0.
    """

    b: int
    h: int
    kh: int  # the key/query head this value head reads
    offset: int  # first token of the sequence, a multiple of chunk
    n_chunks: int
    slot: int  # the sequence's row of the initial/final state tensors
    query: Any
    key: Any
    value: Any
    out: Any
    chunk: int
    dtype: Any  # compute dtype
    system_dtype: Any  # dtype of Ãᵀ: what the algorithm's inverse takes as operands
    scale: float
    consts: Constants


def load_chunks(lane: Lane, start: Any, width: int) -> list[Chunk]:
    """DMA ``width`` consecutive chunks of q and k from token ``start`` (an int, or a compiled loop's run-time
    scalar), transposed ([Dk, width·C]); the chunks get views. (v goes straight to the chain slots: ``load_values``.)

    From a trace-time start, q and k are transposed on the way in from HBM, and the token-major key is a
    tensor-engine transpose of k_t (``chunk_operands``): its 256-byte token rows would make a second, token-major
    load ~2× slower per byte than the transposing one. A DMA transpose from a run-time start is not a documented
    form (nki-cpu README, rule ``indirect_transpose``), so from a compiled loop's start q and k are loaded
    token-major (``dma_copy`` documents dynamic start addresses) and transposed SBUF to SBUF by a second
    DMA, from a tile whose address is fixed (ISA ``dma_transpose``: src "a tile in HBM or SBUF", v2.33.0). The
    token-major key is then kept, so the tensor engine transposes nothing. Measured (one lane, bf16 schur, against
    tensor-engine transposes of both loads): S = 8192 163.8 -> 157.1 µs, S = 2048 47.2 -> 46.3 µs; fp32 S = 8192
    283.4 -> 269.5 µs.
    """
    c, dtype = lane.chunk, lane.dtype
    dk = lane.key.shape[3]
    if isinstance(start, int):
        tokens = nl.ds(start, width * c)
        q_t = tiles.sbuf((dk, width * c), dtype)
        nisa.dma_transpose(dst=q_t, src=lane.query[lane.b, lane.kh, tokens, :])
        k_t = tiles.sbuf((dk, width * c), dtype)
        nisa.dma_transpose(dst=k_t, src=lane.key[lane.b, lane.kh, tokens, :])
        return [
            Chunk(token=start + j * c, q_t=q_t[:, j * c : (j + 1) * c], k_t=k_t[:, j * c : (j + 1) * c])
            for j in range(width)
        ]
    query, key = (tiles.sbuf((c, width, dk), dtype) for _ in range(2))
    nisa.dma_copy(dst=query, src=_chunk_major(lane.query, lane.b, lane.kh, start, width, c))
    nisa.dma_copy(dst=key, src=_chunk_major(lane.key, lane.b, lane.kh, start, width, c))
    q_t, k_t = (tiles.sbuf((dk, width, c), dtype) for _ in range(2))  # [d, j, t]: chunk j's transposed tile
    nisa.dma_transpose(dst=q_t, src=query)
    nisa.dma_transpose(dst=k_t, src=key)
    return [Chunk(token=start + j * c, q_t=q_t[:, j, :], k_t=k_t[:, j, :], key=key[:, j, :]) for j in range(width)]


def load_values(lane: Lane, start: Any, width: int, dst: Any) -> None:
    """DMA ``width`` chunks of v from token ``start`` token-major into ``dst`` ([C, width, Dv], chunk j at free-axis
    slot j): views of the chain slots (``ChainSlot.values``), where stage 3 reads them — v is read nowhere else."""
    nisa.dma_copy(dst=dst, src=_chunk_major(lane.value, lane.b, lane.h, start, width, lane.chunk))


def _chunk_major(tensor: Any, b: int, head: int, start: Any, width: int, chunk: int) -> Any:
    """View of row ``b``, head ``head`` of a token-major [B, H, S, D] HBM argument from token ``start`` as
    [chunk, width, D]: token t of chunk j at [t, j, :]. A run-time ``start`` is the access pattern's scalar offset,
    counted in rows of the S dimension (``indirect_dim=2``).

    ``.ap`` is called on the argument itself, never on an indexed view of it, with the (b, head) row's offset
    written out: the NKI pages disagree on what ``.ap`` on a view counts from — the ``NkiTensor.ap`` reference
    adds ``offset`` to the view's own offset and reads ``indirect_dim`` in the view's shape, the "NKI Access
    Patterns" deep dive interprets both against the underlying tensor — and on the argument itself both readings
    address the same bytes (docs/nki-sources.md §2.6; nki-cpu rule ``ap_scalar_offset_view``).
    """
    _, heads, seq_len, dim = tensor.shape
    row = (b * heads + head) * seq_len
    pattern = [[dim, chunk], [chunk * dim, width], [1, dim]]
    if isinstance(start, int):
        return tensor.ap(pattern=pattern, offset=(row + start) * dim)
    return tensor.ap(pattern=pattern, offset=row * dim, scalar_offset=start, indirect_dim=2)


def chunk_operands(lane: Lane, chunk: Chunk, gates: Gates, j: int) -> Iterator[None]:
    """Stage 1: the state-independent operands of one chunk (decays, A, attnᵀ, scaled q/k/v).

    A generator: it yields between phases whose instructions depend on the previous phase, so a driver can run
    the phases of several chunks step-major (see ``lanes.lockstep``). The phase order also bounds PSUM use:
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
    chunk.q_decay_t = tiles.combine(_chain_tile(chunk, "q_decay_t", chunk.q_t, FP32), chunk.q_t, rows, nl.multiply)
    # e^{γ_last}: its last column, copied into the slot's tile of its own (the chain reads it two periods later)
    chunk.decay_last = tiles.copy_to(_chain_tile(chunk, "decay_last", rows[:, c - 1 : c], FP32), rows[:, c - 1 : c])
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
    chunk.k_decay = tiles.scale_rows(chunk.key, ratio, dtype, dst=_chain_tile(chunk, "k_decay", chunk.key, dtype))
    k_gamma = _chain_tile(chunk, "k_gamma", chunk.key, dtype)
    chunk.k_gamma = tiles.scale_rows(chunk.key, gates.decay[:, j : j + 1], dtype, dst=k_gamma)
    chunk.release("key")
    yield
    # Each product is consumed right after it is made, so one chunk holds at most one PSUM tile here. Ãᵀ =
    # diag(β)(K Kᵀ ∘ Γᵀ): β on the evacuation of K Kᵀ, then the mask multiply, each on whichever engine is free
    # (measured against one two-pass vector-engine scalar_tensor_tensor of both: S = 8192 137.1 -> 146.3 µs).
    kk_beta = tiles.scale_rows(tiles.matmul(chunk.k_t, chunk.k_t), chunk.beta, FP32)
    chunk.a_t = tiles.combine(_chain_tile(chunk, "a_t", kk_beta, lane.system_dtype), kk_beta, decay_t, nl.multiply)
    qk_t = tiles.matmul(chunk.k_t, chunk.q_t)  # [j', i] = k_j' · q_i
    chunk.attn_t = tiles.combine(_chain_tile(chunk, "attn_t", qk_t, dtype), qk_t, decay_t, nl.multiply)
    chunk.release("q_t", "k_t")


def chunk_transition(lane: Lane, chunk: Chunk) -> Iterator[None]:
    """Stage 3: U, W and from them the transition Tᵀ and the effective query Q_effᵀ (state independent).

    Each product is evacuated right after it is made, so a chunk holds at most one PSUM tile at a time.
    """
    dtype = lane.dtype
    # β on the evacuations: U = diag(β)(I + Ã)⁻¹ V, W = diag(β)(I + Ã)⁻¹ diag(e^γ) K (module docstring)
    u = tiles.matmul(chunk.inverse_t, chunk.value)
    chunk.u = tiles.scale_rows(u, chunk.beta, dtype, dst=_chain_tile(chunk, "u", u, dtype))
    w = tiles.scale_rows(tiles.matmul(chunk.inverse_t, chunk.k_gamma), chunk.beta, dtype)
    yield
    # Tᵀ = −Wᵀ K_dec; the sign is applied on the evacuation for free. Tᵀ and Q_effᵀ multiply the state's
    # parts, so they take the parts' dtype (see State).
    transition_t = tiles.matmul(w, chunk.k_decay)
    chunk.transition_t = tiles.copy_to(_chain_tile(chunk, "transition_t", transition_t, dtype), transition_t, -1.0)
    attn_w_t = tiles.matmul(w, chunk.attn_t)  # (attn W)ᵀ
    chunk.q_eff_t = _chain_tile(chunk, "q_eff_t", chunk.q_decay_t, dtype)
    tiles.combine(chunk.q_eff_t, chunk.q_decay_t, attn_w_t, nl.subtract)
    chunk.release("a_t", "inverse_t", "k_gamma", "value", "q_decay_t")


@dataclass
class ChainSlot:
    """Every tile of the chunk at one position of a unit, allocated once per launch (``chain_slots``) and reused by
    the units of one slot set (``lanes.Pipeline``: units p, p + depth, p + 2·depth, … share a set).

    In a compiled loop each value that crosses from one period to the next must live in a tile allocated before
    the loop (nki-cpu README, "compiled loop bodies"), and a unit's stages run in consecutive periods: stage 1
    writes its outputs here (``a_t`` for the inverse; ``k_gamma``, ``q_decay_t`` and the gate columns for stage 3;
    ``k_decay``, ``decay_last``, ``attn_t`` for the chain) and v is DMA'd here (``load_values``); the inverse writes
    ``inverse_t``; stage 3 writes ``u``, ``transition_t`` and ``q_eff_t``, which the chain reads in the same period
    — those three are one tile per position shared by every set. Each stage reads its inputs back from the slot
    (``system``, ``prepared``, ``chunk``), so nothing but tiles passes from one period to the next.
    """

    a_t: Any  # [C, C] Ãᵀ, the lane's system dtype
    k_decay: Any  # [C, Dk] compute dtype
    decay_last: Any  # [Dk, 1] fp32
    beta: Any  # [C, 1] fp32, β of slot j: a view of ``gates``
    gates: Any  # [C, 3, count] fp32, γ, β and g of every slot of the set: ``gate_columns`` fills them per segment
    values: Any  # [C, count, Dv] compute dtype, the v of every slot: ``load_values`` fills them one segment at a time
    attn_t: Any  # [C, C] compute dtype
    u: Any  # [C, Dv] compute dtype (shared by the sets)
    transition_t: Any  # [Dk, Dk] compute dtype (shared)
    q_eff_t: Any  # [Dk, C] compute dtype (shared)
    inverse_t: Any  # [C, C] compute dtype
    value: Any  # [C, Dv] compute dtype, slot j of ``values``
    k_gamma: Any  # [C, Dk] compute dtype, diag(e^γ) K
    q_decay_t: Any  # [Dk, C] fp32

    def system(self, token: Any) -> Chunk:
        """The chunk starting at ``token`` as the inverse sees it: Ãᵀ from stage 1, its inverse written here."""
        return Chunk(token=token, a_t=self.a_t, slot=self)

    def prepared(self, token: Any) -> Chunk:
        """The chunk starting at ``token`` as its stage 3 sees it: stage 1's outputs and the inverse, from here."""
        return self._view(token, (*STAGE1_CHAIN_VALUES, "beta", *STAGE3_INPUTS), slot=self)

    def chunk(self, token: Any) -> Chunk:
        """The chunk starting at ``token`` as the chain sees it: its values read from this slot."""
        return self._view(token, (*STAGE1_CHAIN_VALUES, *CHAIN_INPUTS))

    def _view(self, token: Any, names: tuple[str, ...], **extra: Any) -> Chunk:
        return Chunk(token=token, **{name: getattr(self, name) for name in names}, **extra)


STAGE1_CHAIN_VALUES = ("k_decay", "decay_last", "attn_t")  # what stage 1 writes for the chain (and stage 3)
STAGE3_INPUTS = ("inverse_t", "value", "k_gamma", "q_decay_t")  # what stage 3 reads besides those and β
CHAIN_INPUTS = ("u", "transition_t", "q_eff_t")  # what stage 3 writes for the chain


def chain_slots(count: int, lane: Lane, sets: int) -> list[list[ChainSlot]]:
    """``sets`` sets of ``count`` chain slots for chunks of ``lane``'s shapes and dtypes (every lane of a launch has
    the same); stage 3's outputs are one tile per position, shared by the sets."""
    c, dtype = lane.chunk, lane.dtype
    dk, dv = lane.key.shape[3], lane.value.shape[3]
    shared = [
        {
            "u": tiles.sbuf((c, dv), dtype),
            "transition_t": tiles.sbuf((dk, dk), dtype),
            "q_eff_t": tiles.sbuf((dk, c), dtype),
        }
        for _ in range(count)
    ]
    result = []
    for _ in range(sets):
        gates = tiles.sbuf((c, 3, count), FP32)
        values = tiles.sbuf((c, count, dv), dtype)
        slots = [
            ChainSlot(
                a_t=tiles.sbuf((c, c), lane.system_dtype),
                k_decay=tiles.sbuf((c, dk), dtype),
                decay_last=tiles.sbuf((dk, 1), FP32),
                beta=gates[:, 1, j : j + 1],
                gates=gates,
                values=values,
                attn_t=tiles.sbuf((c, c), dtype),
                inverse_t=tiles.sbuf((c, c), dtype),
                value=values[:, j, :],
                k_gamma=tiles.sbuf((c, dk), dtype),
                q_decay_t=tiles.sbuf((dk, c), FP32),
                **shared[j],
            )
            for j in range(count)
        ]
        # Zero once: schur never writes the lower-left 64-block of Invᵀ (schur._level5). On GpSimd, idle at the
        # launch's start: on the vector engine these memsets sat ahead of the first unit's gate columns (measured,
        # one lane bf16 schur: S = 2048 38.8 -> 38.3 µs, S = 8192 134.8 -> 134.3; fp32 S = 2048 70.0 -> 69.7).
        for slot in slots:
            nisa.memset(dst=slot.inverse_t, value=0.0, engine=engines.GPSIMD)
        result.append(slots)
    return result


def slot_bytes(lane: Lane) -> int:
    """SBUF bytes per partition of one chain slot's own tiles (``chain_slots``; not the shared stage-3 ones)."""
    c, dk, dv = lane.chunk, lane.key.shape[3], lane.value.shape[3]

    def size(dtype: Any) -> int:
        return 4 if dtype == FP32 else 2

    compute = size(lane.dtype) * (c + dk + dv + c + dk)  # attn_t, k_decay, v, inverse_t, k_gamma
    return compute + size(lane.system_dtype) * c + 4 * (c + 1 + 3)  # a_t; q_decay_t, e^γ_last, the gate columns


def _chain_tile(chunk: Chunk, name: str, like: Any, dtype: Any) -> Any:
    """The chunk's slot tile ``name`` when it has a slot, else a fresh SBUF tile shaped like ``like``."""
    if chunk.slot is not None:
        return getattr(chunk.slot, name)
    return tiles.sbuf(tuple(like.shape), dtype)


@dataclass
class State:
    """The recurrent state of a lane: an fp32 master whatever the compute dtype, held as column blocks.

    The state carries the whole sequence, so its master never passes through the compute dtype. Its two products
    (with Tᵀ and with Q_effᵀ) read each block as ``parts(j)``: with fp32 compute the master itself; with bf16 two
    bf16 operands whose sum is the master to ~16 bits (``split_block``), so each product is two matmuls at the bf16
    rate instead of one at the fp32 rate, a quarter of it. Column block j of S' = e^{γ_last}S + TS + H depends only
    on column block j of S, so the chain is two independent chains over halves of Dv: the next chunk's product on
    one half starts while the vector engine still updates the other, halving the chain's exposed latency.

    A lane without an initial state starts from a state known to be zero: its products vanish and are not issued.

    Within a unit's chain, each block's decayed copy e^{γ_last}·S for the NEXT chunk (``decayed``) is made right
    after the block is written, beside its split and off the vector engine, so the next link's chain op is a plain
    add of it to the PSUM product (see ``advance_state``).

    A state tile reused by a compiled loop (``lanes.py``'s state ring, ``state_tile(reused=True)``) also holds the
    tiles its parts and decayed copies are made in (``lo``, ``decayed_tiles``), so nothing it holds is allocated
    inside the loop.
    """

    blocks: list[Any] | None  # the master's column blocks (views of ``whole``); None for the zero state
    whole: Any = None  # [Dk, Dv] fp32 tile
    operand_dtype: Any = FP32  # dtype of the products' state operands: the compute dtype
    _parts: dict[int, list[Any]] = field(default_factory=dict, repr=False)
    lo: list[Any] | None = None  # per block, the tile its low part is made in (None: a fresh tile)
    decayed_tiles: list[Any] | None = None  # per block, the tile its decayed copy is made in (None: a fresh tile)
    decayed: dict[int, Any] = field(default_factory=dict, repr=False)  # block -> e^{γ_last}·S for the next chunk

    @property
    def zero(self) -> bool:
        return self.blocks is None

    def parts(self, j: int) -> list[Any]:
        """Block j's matmul operands, made on first use (after the state is written: ``written``)."""
        if j not in self._parts:
            self._parts[j] = split_block(self.blocks[j], self.operand_dtype, self.lo[j] if self.lo else None)
        return self._parts[j]

    def written(self) -> State:
        """Forget the parts and decayed copies made from the tile's previous contents (a reused tile was just
        written)."""
        self._parts.clear()
        self.decayed.clear()
        return self

    def decay_for_next(self, j: int, decay_last: Any) -> None:
        """Make block j times the next chunk's e^{γ_last} ([Dk, 1] fp32), on GpSimd.

        GpSimd, not the balancer's pick of GpSimd or the scalar engine: an SBUF-only multiply is the one kind of
        work that can leave the scalar engine, which evacuates PSUM and sets the floor from S = 4096 on, for the
        engine with the most room (measured, one lane bf16 schur, S = 2048 / 4096 / 8192 / 16384 / 32768:
        33.9 / 59.6 / 109.4 / 210.9 / 411.3 -> 33.6 / 58.8 / 108.0 / 208.0 / 405.8 µs; fp32 S = 2048 / 8192 and
        32 lanes S = 128 unchanged; the gate-span scaling moved too: 33.8 / 59.0 / 108.2, so it stays balanced).
        """
        block = self.blocks[j]
        dst = self.decayed_tiles[j] if self.decayed_tiles else tiles.sbuf(tuple(block.shape), FP32)
        self.decayed[j] = tiles.scale_rows(block, decay_last, FP32, dst=dst, among=(engines.GPSIMD,))


def column_blocks(dv: int) -> list[slice]:
    """The state's column blocks: two halves when Dv allows, else one."""
    if dv < 2 * STATE_BLOCK_MIN:
        return [slice(0, dv)]
    half = dv // 2
    return [slice(0, half), slice(half, dv)]


# Narrowest state column block worth splitting into: below it the fixed per-instruction costs dominate.
STATE_BLOCK_MIN = 32


def split_block(block: Any, dtype: Any, lo: Any = None) -> list[Any]:
    """The matmul operands of an fp32 state block for the compute ``dtype``, which sum to the block.

    fp32: ``[block]``. bf16: ``[hi, lo]`` with ``hi`` the block truncated to bf16 — the upper half of each fp32
    element, read in place (``tiles.high_half``, no instruction) — and ``lo = bf16(block − hi)``, one GpSimd
    instruction (``block − hi`` is exact in fp32; its rounding to bf16 is the split's only error, below 2⁻¹⁶ of
    the element). GpSimd: the one engine with room in the chain's period (measured: on the vector engine, in
    line with the chain's update, a chain link takes 0.75 µs instead of 0.3 µs). ``lo`` is made in the given tile
    (else a fresh one).
    """
    if dtype == FP32:
        return [block]
    hi = tiles.high_half(block)
    lo = lo if lo is not None else tiles.sbuf(tuple(block.shape), dtype)
    return [hi, tiles.combine(lo, block, hi, nl.subtract, engine=engines.GPSIMD)]


def state_tile(lane: Lane, reused: bool = False) -> State:
    """A fresh [Dk, Dv] fp32 state tile for ``lane``'s shapes; ``reused``: with its parts' tiles too (for a tile a
    compiled loop writes again and again)."""
    dk, dv = lane.key.shape[3], lane.value.shape[3]
    whole = tiles.sbuf((dk, dv), FP32)
    blocks = [whole[:, cols] for cols in column_blocks(dv)]
    if not reused:
        return State(blocks, whole, lane.dtype)

    def per_block(dtype: Any) -> list[Any]:
        return [tiles.sbuf((dk, cols.stop - cols.start), dtype) for cols in column_blocks(dv)]

    lo = per_block(lane.dtype) if lane.dtype != FP32 else None
    return State(blocks, whole, lane.dtype, lo=lo, decayed_tiles=per_block(FP32))


def initial_state(recurrent_state: Any, lane: Lane, dst: State | None = None) -> State:
    """Load the lane's row of the caller's state (aliased in/out), or the zero state (nothing emitted).

    Into ``dst`` (a reused state tile), the zero state is written (memset) and the parts are made at once, so a
    compiled loop finds the same state tile, parts made, at the start of every iteration.
    """
    if dst is not None:
        if recurrent_state is None:
            nisa.memset(dst=dst.whole, value=0.0)
        else:
            nisa.dma_copy(dst=dst.whole, src=recurrent_state[lane.slot, lane.h, :, :])
        dst.written()
        for j in range(len(dst.blocks)):
            dst.parts(j)
        return dst
    if recurrent_state is None:
        return State(None, operand_dtype=lane.dtype)
    whole = nl.load(recurrent_state[lane.slot, lane.h, :, :], dtype=FP32)
    return State([whole[:, cols] for cols in column_blocks(whole.shape[1])], whole, lane.dtype)


def store_state(final_state: Any, lane: Lane, state: State) -> None:
    """Write the lane's final state to its row of the caller's buffer (or the allocated output) in one DMA."""
    nl.store(final_state[lane.slot, lane.h, :, :], state.whole)


def _product_terms(stationary: Any, moving: Any, state_stationary: Any, state: State, j: int) -> list[tuple]:
    """The (stationary, moving) operands of ``stationaryᵀ·moving + state_stationaryᵀ·S[:, block j]``, summed in this
    order in one PSUM tile: the first product, then one term per part of the state's block (none for zero)."""
    terms = [(stationary, moving)]
    if not state.zero:
        terms += [(state_stationary, part) for part in state.parts(j)]
    return terms


def _issue_products(groups: list[tuple[Any, list[tuple]]]) -> None:
    """Issue each ``(psum tile, terms)`` group's accumulating matmuls, the groups' terms alternating.

    Each group's terms still accumulate in their own order (the same sums, bit for bit); the alternation only puts
    an independent matmul between two that accumulate into one tile, so the tensor engine does not wait out a
    result's latency (nki-cpu: 64 PE cycles, the pipeline fill, an inference from the PERF guide) before each.
    Measured, one lane bf16 schur, the chain's products beside the previous chunk's output products instead of
    after them: S = 2048 / 4096 / 8192 / 16384 34.8 / 62.3 / 114.5 / 222.0 -> 33.9 / 60.2 / 111.0 / 214.6 µs, fp32
    S = 2048 / 8192 67.4 / 243.2 -> 66.1 / 237.4; with the chain's first two terms ahead of the output's (its link
    ends one matmul sooner): S = 2048 / 8192 34.3 / 112.2.
    """
    for k, row in enumerate(itertools.zip_longest(*(terms for _, terms in groups))):
        for (dst, _), term in zip(groups, row, strict=True):
            if term is not None:
                tiles.matmul(*term, dst=dst, accumulate=k > 0)


def advance_state(
    lane: Lane,
    chunk: Chunk,
    state: State,
    final: bool = False,
    dst: State | None = None,
    next_decay: Any = None,
    pending: tuple[Chunk, State] | None = None,
) -> State:
    """Stage 4, the sequential chain: S' = e^{γ_last} S + (Tᵀ)ᵀ S + K_decᵀ U, per column block of S, into ``dst``
    (a reused state tile; else a fresh one); with ``pending`` (the previous chunk and its entry state), that chunk's
    output too, its products alternating with the chain's on the tensor engine (``_issue_products``).

    Each new block is split into its matmul parts right after its update (measured: issued at first use instead,
    the split waits in GpSimd's queue behind later work, +4% at S = 8192) — except the lane's ``final`` state,
    which is only stored. Given the next chunk's e^{γ_last} (``next_decay``: the unit's chain goes on), the block's
    decayed copy is made then too (``State.decay_for_next``), so the next link adds it to its PSUM product in one
    single-pass vector op instead of a two-pass scalar_tensor_tensor that also scales (measured, one lane bf16
    schur, S = 2048 / 4096 / 8192 / 16384: 35.3 / 62.8 / 114.9 / 222.5 -> 34.8 / 62.3 / 114.5 / 222.0 µs; the
    copy on the vector engine instead saves nothing, on a fixed engine it waits in that queue: ACT 34.8 / 115.5,
    GpSimd 34.8 / 115.8). Both forms round e^{γ_last}·S to fp32 once before the add.
    """
    dv = lane.value.shape[3]
    following = dst.written() if dst is not None else state_tile(lane)
    output = None if pending is None else _Output(lane, *pending)
    for j, (cols, new) in enumerate(zip(column_blocks(dv), following.blocks, strict=True)):
        update = tiles.psum((chunk.k_decay.shape[1], cols.stop - cols.start))
        groups = [(update, _product_terms(chunk.k_decay, chunk.u[:, cols], chunk.transition_t, state, j))]
        if output is not None:
            groups.append(output.block_products(j, cols))
        _issue_products(groups)
        # The chain's one vector op per block, on the vector engine like every chain link, so no other engine's
        # queue holds an instruction that waits on the chain (the split's one GpSimd op excepted, see split_block).
        if state.zero:
            tiles.copy_to(new, update, engine=engines.VECTOR)
        elif j in state.decayed:
            tiles.combine(new, update, state.decayed[j], nl.add, engine=engines.VECTOR)
        else:
            tiles.scale_add(new, state.blocks[j], chunk.decay_last, update)
        if not final:
            following.parts(j)
            if next_decay is not None:
                following.decay_for_next(j, next_decay)
        if output is not None:
            output.evacuate(cols)
    if output is not None:
        output.store()
    return following


class _Output:
    """One chunk's output, out = scale · (attn U + Q_eff S) from its entry state, block by block of Dv: the
    products into PSUM, their evacuations into one SBUF tile and its store to HBM."""

    def __init__(self, lane: Lane, chunk: Chunk, entry_state: State) -> None:
        self.lane, self.chunk, self.entry_state = lane, chunk, entry_state
        self.tile = tiles.sbuf((lane.chunk, lane.value.shape[3]), lane.dtype)
        self.psum: Any = None

    def block_products(self, j: int, cols: slice) -> tuple[Any, list[tuple]]:
        """Block j's PSUM tile and the terms of its products (``_issue_products``)."""
        chunk = self.chunk
        self.psum = tiles.psum((self.lane.chunk, cols.stop - cols.start))
        return self.psum, _product_terms(chunk.attn_t, chunk.u[:, cols], chunk.q_eff_t, self.entry_state, j)

    def evacuate(self, cols: slice) -> None:
        # Either engine (the balancer's choice): fixed on the vector engine it queued behind the chain's updates
        # (measured: S = 8192 148.4 -> 147.1 µs free)
        tiles.copy_to(self.tile[:, cols], self.psum, scale=self.lane.scale)

    def store(self) -> None:
        lane = self.lane
        nisa.dma_copy(dst=lane.out[lane.b, lane.h, nl.ds(self.chunk.token, lane.chunk), :], src=self.tile)


def emit_output(lane: Lane, chunk: Chunk, entry_state: State) -> None:
    """The chunk's output from its entry state, stored to HBM, on its own: a lane's last chunk, whose chain link
    is already issued (every other chunk's output is issued with the next chunk's link, ``advance_state``)."""
    output = _Output(lane, chunk, entry_state)
    for j, cols in enumerate(column_blocks(lane.value.shape[3])):
        _issue_products([output.block_products(j, cols)])
        output.evacuate(cols)
    output.store()
