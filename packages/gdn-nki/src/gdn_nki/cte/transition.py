"""The transition stage: from a chunk's inverse, U and W, and from them the transition Tᵀ and the effective query
Q_effᵀ the chain multiplies the state with (``chunks`` module docstring).

gdn_ref twin: ``gdn_ref.chunked._neumann_chain`` (U and W up front; ``_schur_chain`` applies the inverse on the
chain instead).
"""

from __future__ import annotations

from collections.abc import Iterator

from ..common import tiles
from ..common.backend import nl
from .chunks import Chunk, Lane, tile_of


def chunk_transition(lane: Lane, chunk: Chunk) -> Iterator[None]:
    """U, W and from them the transition Tᵀ and the effective query Q_effᵀ (state independent).

    Each product is evacuated right after it is made, so a chunk holds at most one PSUM tile at a time.
    """
    dtype = lane.dtype
    # β on the evacuations: U = diag(β)(I + Ã)⁻¹ V, W = diag(β)(I + Ã)⁻¹ diag(e^γ) K (module docstring)
    u = tiles.matmul(chunk.inverse_t, chunk.value)
    chunk.u = tiles.scale_rows(u, chunk.beta, dtype, dst=tile_of(chunk, "u", u, dtype))
    w = tiles.scale_rows(tiles.matmul(chunk.inverse_t, chunk.k_gamma), chunk.beta, dtype)
    yield
    # Tᵀ = −Wᵀ K_dec; the sign is applied on the evacuation for free. Tᵀ and Q_effᵀ multiply the state's
    # parts, so they take the parts' dtype (see State).
    transition_t = tiles.matmul(w, chunk.k_decay)
    chunk.transition_t = tiles.copy_to(tile_of(chunk, "transition_t", transition_t, dtype), transition_t, -1.0)
    attn_w_t = tiles.matmul(w, chunk.attn_t)  # (attn W)ᵀ
    chunk.q_eff_t = tile_of(chunk, "q_eff_t", chunk.q_decay_t, dtype)
    tiles.combine(chunk.q_eff_t, chunk.q_decay_t, attn_w_t, nl.subtract)
    chunk.release("a_t", "inverse_t", "k_gamma", "value", "q_decay_t")
