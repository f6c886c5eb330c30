"""What the stages pass each other: a lane, a chunk's tiles stage by stage, and the tiles a chunk keeps between
periods (``ChunkTiles``).

The kernel uses the *transition form* of the chunked delta rule. For a chunk with entry state ``h`` (fp32 master,
[Dk, Dv]) everything except two products is state independent:

    U  = Inv · diag(β) V                 W  = Inv · diag(β e^γ) K            (Inv = (I + A)⁻¹, A = diag(β)(K Kᵀ ∘ Γ))
    out = scale · (Q_eff h + attn U)     Q_eff = diag(e^γ) Q − attn W        attn = (Q Kᵀ) ∘ Γ (causal, incl. diag)
    h'  = e^{γ_last} h + T h + K_decᵀ U  T = −K_decᵀ W                       K_dec = diag(e^{γ_last−γ}) K

so the sequential chain per chunk is one accumulating matmul group plus one vector op (per column half of the
state, see ``state.State``), and all the rest (the inverse, U, W, T, Q_eff) can run ahead on otherwise idle
engines. It is algebraically the WY form (δ = U − W h is the per-token write) with δ substituted into the output
and state updates. The state's master is fp32 throughout; as a matmul operand it is split into two bf16 parts when
the compute dtype is bf16 (``state.State``).

U and W are computed through the other ordering of β, ``Inv · diag(β) = diag(β) · (I + Ã)⁻¹`` with
``Ã = (K Kᵀ ∘ Γ) diag(β)`` (push-through: ``(I + D M)⁻¹ D = D (I + M D)⁻¹``): ``U = diag(β) (I + Ã)⁻¹ V`` and
``W = diag(β) (I + Ã)⁻¹ diag(e^γ) K``, β applied on the evacuation of each fp32 product. The system the inverse
is handed is then ``Ãᵀ = diag(β)(K Kᵀ ∘ Γᵀ)`` (``Chunk.a_t``), made from Γᵀ — the orientation attnᵀ and K_dec
use — with no transpose of Γᵀ, and the inverse it returns, ``(I + Ã)⁻ᵀ = (I + Ãᵀ)⁻¹``, is the stationary operand
of both products. V enters unscaled (no rounding of diag(β) V) and so does diag(e^γ) K. Against
``A = diag(β)(K Kᵀ ∘ Γ)`` from a tensor-engine transpose of Γᵀ this saves PE time and loses no accuracy in any
numerics regime. Moving β into attn and K_dec instead (no β in the transition stage) is faster still, but rounds
diag(β) K_dec where K_dec is otherwise exact, and its errors grow (PERFORMANCE.md has the figures).

Layout conventions: ``*_t`` tiles are transposed ([head dim, tokens]); columns are [tokens, 1] per-partition
scalars; ``nc_matmul(stationary=X, moving=Y)`` computes ``Xᵀ Y`` contracting the partition axis.

gdn_ref twin: ``gdn_ref.chunked`` computes the same chunk quantities in float64 over whole tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..common import engines, tiles
from ..common.backend import nisa
from ..common.tiles import FP32
from .constant_tiles import Constants


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
    key: Any = None  # [C, Dk] token-major key, a PSUM transpose of k_t or loaded so (operand stage only)
    value: Any = None  # [C, Dv] V, loaded into the chunk's tiles (transition stage only: ``hbm.load_values``)
    place: ChunkTiles | None = None  # the tiles it keeps between periods, where each stage writes (None: fresh)

    def release(self, *names: str) -> None:
        """Drop tiles no later stage reads, so their on-chip memory is free for the chunks behind."""
        for name in names:
            setattr(self, name, None)


@dataclass
class Lane:
    """One (sequence, value head) lane and what its stages read.

    A lane's sequence is the token range ``[offset, offset + n_chunks·chunk)`` of batch row ``b`` of q/k/v, the
    gates and ``out``; its initial and final state are row ``state_row`` of the state tensors. A dense launch has
    one sequence per batch row (offset 0, state row b); a packed varlen launch has several sequences in row 0.
    """

    b: int
    h: int
    kh: int  # the key/query head this value head reads
    offset: int  # first token of the sequence, a multiple of chunk
    n_chunks: int
    state_row: int  # the sequence's row of the initial/final state tensors
    query: Any
    key: Any
    value: Any
    out: Any
    chunk: int
    dtype: Any  # compute dtype
    system_dtype: Any  # dtype of Ãᵀ: what the algorithm's inverse takes as operands
    scale: float
    consts: Constants
    norm: Any = None  # ``normed.output_stage.OutputNorm``: the gated RMSNorm the output stage applies before its store


@dataclass
class ChunkTiles:
    """Every tile the chunk at one position of a unit keeps between periods, allocated once per launch
    (``allocate_tile_sets``) and reused by the units of one tile set (``lanes.Pipeline``: units p, p + depth,
    p + 2·depth, … share a set).

    In a compiled loop each value that crosses from one period to the next must live in a tile allocated before
    the loop (nki-cpu README, "compiled loop bodies"), and a unit's stages run in consecutive periods: the operand
    stage writes its outputs here (``a_t`` for the inverse; ``k_gamma``, ``q_decay_t`` and the gate columns for the
    transition; ``k_decay``, ``decay_last``, ``attn_t`` for the chain) and v is DMA'd here (``hbm.load_values``);
    the inverse writes ``inverse_t``; the transition stage writes ``u``, ``transition_t`` and ``q_eff_t``, which the
    chain reads in the same period — those three are one tile per position shared by every set. Each stage reads
    its inputs back from here (``for_inverse``, ``for_transition``, ``for_chain``), so nothing but tiles passes
    from one period to the next.
    """

    a_t: Any  # [C, C] Ãᵀ, the lane's system dtype
    k_decay: Any  # [C, Dk] compute dtype
    decay_last: Any  # [Dk, 1] fp32
    beta: Any  # [C, 1] fp32, β of position j: a view of ``gates``
    gates: Any  # [C, 3, count] fp32, γ, β and g of every position of the set: ``gate_columns`` fills them per segment
    values: Any  # [C, count, Dv] compute dtype, the v of every position: ``load_values`` fills them per segment
    attn_t: Any  # [C, C] compute dtype
    u: Any  # [C, Dv] compute dtype (shared by the sets)
    transition_t: Any  # [Dk, Dk] compute dtype (shared)
    q_eff_t: Any  # [Dk, C] compute dtype (shared)
    inverse_t: Any  # [C, C] compute dtype
    value: Any  # [C, Dv] compute dtype, position j of ``values``
    k_gamma: Any  # [C, Dk] compute dtype, diag(e^γ) K
    q_decay_t: Any  # [Dk, C] fp32
    # A bucketed launch's boundary tiles, one [Dk, 3·w] fp32 tile per state column block of width w: the block of
    # the state after the chunk (``after``), of the initial state of a sequence starting after the chunk
    # (``initial``) and zeros, side by side so the next chunk reads the one it starts from at a run-time offset
    # (``boundaries.BoundaryLink``). A tile per block: an access at a run-time offset is ordered against the whole
    # tile, and the state's two column blocks are two independent chains (``state.State``).
    boundary: list[Any] | None = None
    initial: list[Any] | None = None
    after: list[Any] | None = None

    def for_inverse(self, token: Any) -> Chunk:
        """The chunk starting at ``token`` as the inverse sees it: Ãᵀ from the operand stage, its inverse written
        here."""
        return Chunk(token=token, a_t=self.a_t, place=self)

    def for_transition(self, token: Any) -> Chunk:
        """The chunk starting at ``token`` as the transition stage sees it: the operands and the inverse, from
        here."""
        return self._view(token, (*OPERANDS_FOR_CHAIN, "beta", *TRANSITION_INPUTS), place=self)

    def for_chain(self, token: Any) -> Chunk:
        """The chunk starting at ``token`` as the chain sees it: its values read from here."""
        return self._view(token, (*OPERANDS_FOR_CHAIN, *TRANSITION_OUTPUTS))

    def _view(self, token: Any, names: tuple[str, ...], **extra: Any) -> Chunk:
        return Chunk(token=token, **{name: getattr(self, name) for name in names}, **extra)


OPERANDS_FOR_CHAIN = (
    "k_decay",
    "decay_last",
    "attn_t",
)  # what the operand stage writes for the chain (and the transition)
TRANSITION_INPUTS = ("inverse_t", "value", "k_gamma", "q_decay_t")  # what the transition reads besides those and β
TRANSITION_OUTPUTS = ("u", "transition_t", "q_eff_t")  # what the transition writes for the chain


# Narrowest state column block worth splitting into: below it the fixed per-instruction costs dominate.
STATE_BLOCK_MIN = 32


def column_blocks(dv: int) -> list[slice]:
    """The state's column blocks: two halves when Dv allows, else one."""
    if dv < 2 * STATE_BLOCK_MIN:
        return [slice(0, dv)]
    half = dv // 2
    return [slice(0, half), slice(half, dv)]


def allocate_tile_sets(count: int, lane: Lane, sets: int, initial: bool = False) -> list[list[ChunkTiles]]:
    """``sets`` tile sets of ``count`` positions for chunks of ``lane``'s shapes and dtypes (every lane of a launch
    has the same); the transition's outputs are one tile per position, shared by the sets. ``initial``: each
    position also holds a bucketed launch's boundary tiles (``ChunkTiles.boundary``: the state after the chunk, the
    initial state a sequence may start after it, loaded with the unit so the chain never waits for it, and zeros)."""
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
        tile_set = [
            ChunkTiles(
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
        if initial:
            for place in tile_set:
                widths = [cols.stop - cols.start for cols in column_blocks(dv)]
                place.boundary = [tiles.sbuf((dk, 3 * w), FP32) for w in widths]
                place.after = [tile[:, :w] for tile, w in zip(place.boundary, widths, strict=True)]
                place.initial = [tile[:, w : 2 * w] for tile, w in zip(place.boundary, widths, strict=True)]
                for tile, w in zip(place.boundary, widths, strict=True):
                    nisa.memset(dst=tile[:, 2 * w :], value=0.0, engine=engines.GPSIMD)
        # Zero once: schur never writes the lower-left 64-block of Invᵀ (schur._level5). On GpSimd, idle at the
        # launch's start: on the vector engine these memsets sit ahead of the first unit's gate columns.
        for place in tile_set:
            nisa.memset(dst=place.inverse_t, value=0.0, engine=engines.GPSIMD)
        result.append(tile_set)
    return result


def chunk_tiles_bytes(lane: Lane, initial: bool = False) -> int:
    """SBUF bytes per partition of one position's own tiles (``allocate_tile_sets``, with ``initial`` as there; not
    the shared transition outputs)."""
    c, dk, dv = lane.chunk, lane.key.shape[3], lane.value.shape[3]

    def size(dtype: Any) -> int:
        return 4 if dtype == FP32 else 2

    compute = size(lane.dtype) * (c + dk + dv + c + dk)  # attn_t, k_decay, v, inverse_t, k_gamma
    own = compute + size(lane.system_dtype) * c + 4 * (c + 1 + 3)  # a_t; q_decay_t, e^γ_last, the gate columns
    return own + (12 * dv if initial else 0)


def tile_of(chunk: Chunk, name: str, like: Any, dtype: Any) -> Any:
    """The chunk's kept tile ``name`` when it has a place in a tile set, else a fresh SBUF tile shaped like
    ``like``."""
    if chunk.place is not None:
        return getattr(chunk.place, name)
    return tiles.sbuf(tuple(like.shape), dtype)
