"""A segment of tokens as an affine map of its entry state, in float64: the math context parallelism rests on.

Per value head, each token maps the state affinely, S ← α_t (I − β_t k_t k_tᵀ) S + β_t k_t v_tᵀ (``recurrent``'s
decay, delta and write), so a segment of tokens maps its entry state S₀ to

    S_end = M · S₀ + L          M = Π_t α_t (I − β_t k_t k_tᵀ)  [Dk, Dk],   L = the segment's state from zero

and, because every output reads the state linearly, each output to

    o_t = o_t(from zero) + p_tᵀ S₀      p_t = scale · (Π_{τ ≤ t} α_τ (I − β_τ k_τ k_τᵀ))ᵀ q_t  [Dk]

Both M and p are the segment run with zero values from the identity state (Dv = Dk): its final state is M and its
outputs are p. A −inf gate (α = 0) makes M and every later p zero, so a reset inside a segment carries through the
composition exactly. Segments compose as affine maps (``compose``); ``split_and_combine`` runs a sequence as
contiguous segments, each from zero, and combines them — equal to the whole run up to float64 rounding.
"""

from __future__ import annotations

import itertools

import numpy as np

from .recurrent import recurrent


def segment_affine(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    g_log: np.ndarray,
    beta: np.ndarray,
    scale: float = 1.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A segment's outputs and state from zero, and its transition and output read-out of the entry state.

    Dimensions:
        B: batch. Hk: key heads. Hv: value heads. S: the segment's tokens. Dk, Dv: head dims.

    Args:
        query, key: [B, Hk, S, Dk]; value: [B, Hv, S, Dv]; g_log, beta: [B, Hv, S] — as ``recurrent``.
        scale (float): the output scale.

    Returns:
        tuple: (out_local [B, Hv, S, Dv], state_local [B, Hv, Dk, Dv], transition [B, Hv, Dk, Dk] = M,
        readout [B, Hv, S, Dk] = p), all float64: from entry state S₀ the segment gives
        out = out_local + readout @ S₀ and state = transition @ S₀ + state_local.
    """
    batch, value_heads, tokens = np.shape(g_log)
    dk = np.shape(key)[-1]
    out_local, state_local = recurrent(query, key, value, g_log, beta, scale)
    identity = np.broadcast_to(np.eye(dk), (batch, value_heads, dk, dk))
    zeros = np.zeros((batch, value_heads, tokens, dk))
    readout, transition = recurrent(query, key, zeros, g_log, beta, scale, initial_state=identity)
    return out_local, state_local, transition, readout


def compose(first: tuple[np.ndarray, np.ndarray], then: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The affine map of two segments run one after the other: ``then ∘ first``.

    Args:
        first, then: (M [.., Dk, Dk], L [.., Dk, Dv]) each, S ↦ M S + L.

    Returns:
        tuple: (M_then M_first, M_then L_first + L_then).
    """
    (m1, l1), (m2, l2) = first, then
    return m2 @ m1, m2 @ l1 + l2


def split_and_combine(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    g_log: np.ndarray,
    beta: np.ndarray,
    boundaries: list[int],
    scale: float = 1.0,
    initial_state: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """One sequence run as contiguous segments, each from zero, then combined: the context-parallel algorithm.

    Args:
        query, key, value, g_log, beta, scale, initial_state: as ``recurrent`` (one batch of sequences).
        boundaries (list[int]): the segment starts after token 0, increasing, inside (0, S).

    Returns:
        tuple: (out [B, Hv, S, Dv], final state [B, Hv, Dk, Dv]), float64 — ``recurrent``'s result.
    """
    batch, value_heads, tokens = np.shape(g_log)
    dk, dv = np.shape(key)[-1], np.shape(value)[-1]
    state = np.zeros((batch, value_heads, dk, dv)) if initial_state is None else np.asarray(initial_state, np.float64)
    outs = []
    edges = [0, *boundaries, tokens]
    for start, end in itertools.pairwise(edges):
        piece = slice(start, end)
        out_local, state_local, transition, readout = segment_affine(
            query[:, :, piece], key[:, :, piece], value[:, :, piece], g_log[:, :, piece], beta[:, :, piece], scale
        )
        outs.append(out_local + readout @ state)  # the correction from the true entry state
        state = transition @ state + state_local
    return np.concatenate(outs, axis=2), state
