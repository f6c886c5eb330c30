"""Packed variable-length prefill in ONE launch: the ``gdn_cte_varlen`` kernel.

Serving engines pack a batch's prompts back to back (``cu_seqlens``) and keep recurrent states in a pool. Here
every sequence is padded exactly (g = 0, β = 0 tokens) to its own chunk multiple and the padded sequences are
packed into batch row 0 (``plan.packed_plan``); each (sequence, value head) is one lane of the launch with its own
token range and its own state row (a row of the pool). Units of the software pipeline span lanes (``lanes.py``),
so short and long sequences share grouped inverses exactly as the heads of a dense launch do. The layout's rules
are gdn-ref's (``gdn_ref.packed``).

The per-sequence chunk counts and state rows are trace-time integers: one trace per distinct batch layout (see
the package's DESIGN.md, "Varlen: a trace-time layout", for what that costs on Trainium and where NKI's on-device
scalars would take over).
"""

from __future__ import annotations

from typing import Any

from gdn_ref.constants import CHUNK_BY_ALGORITHM, DEFAULT_ALGORITHM, DEFAULT_GROUP_SIZE
from gdn_ref.contract import Arguments
from gdn_ref.packed import packed_violations

from ..common.backend import nki, nl
from ..common.kernel_assert import assert_valid_call
from ..common.state_layout import kmajor_shape, kmajor_view
from ..common.tiles import FP32
from .kernel import emit
from .plan import packed_plan


@nki.jit
def gdn_cte_varlen(
    query: Any,
    key: Any,
    value: Any,
    g_log: Any,
    beta: Any,
    scale: float = 1.0,
    algorithm: str = DEFAULT_ALGORITHM,
    mask_pack: Any = None,
    group_size: int = DEFAULT_GROUP_SIZE,
    recurrent_state: Any = None,
    seq_chunks: tuple[int, ...] = (),
    state_rows: tuple[int, ...] | None = None,
    state_v_first: bool = False,
) -> tuple[Any, Any]:
    """Chunked gated delta-rule prefill of packed sequences of different lengths, in one launch.

    Dimensions:
        N: sequences. T: packed tokens, the sum of the sequences' padded lengths (each a chunk multiple).
        P: rows of the state pool. Hk, Hv, Dk, Dv: as ``gdn_cte``.

    Args:
        query, key (nl.NkiTensor): [1, Hk, T, Dk] @ HBM, the sequences back to back, each padded with zero tokens
            to its chunk multiple.
        value (nl.NkiTensor): [1, Hv, T, Dv] @ HBM, packed the same way.
        g_log, beta (nl.NkiTensor): [1, Hv, T] fp32 @ HBM; padding tokens carry g = 0 and β = 0.
        scale, algorithm, mask_pack, group_size: as ``gdn_cte``.
        recurrent_state (nl.NkiTensor): optional [P, Hv, Dk, Dv] fp32 @ HBM state pool, MUTABLE IN/OUT: sequence
            i starts from row ``state_rows[i]`` and its final state is written back there; no other row is read
            or written. Omitted: zero starts, and a new [N, Hv, Dk, Dv] final state.
        seq_chunks (tuple[int, ...]): trace-time chunks per sequence, in packing order.
        state_rows (tuple[int, ...] | None): trace-time pool row per sequence, distinct; None = row i for
            sequence i (then P == N).
        state_v_first (bool): trace-time; states are V-major, [P, Hv, Dv, Dk] (FLA's ``state_v_first``, SGLang's
            pool): read and written in place by the state DMAs (``common.state_layout``); the rules see the
            K-major view. The new final state (no ``recurrent_state``) is V-major too.

    Returns:
        tuple: ``out`` [1, Hv, T, Dv] in the compute dtype (padding rows hold the padding tokens' outputs), and the
        final states: the pool when one was supplied, else [N, Hv, Dk, Dv] fp32.

    Notes:
        Each (sequence, value head) is a lane with its own token range and state row; lanes are split over the
        launch grid like gdn_cte's. Every rule a trace can see is checked before anything is allocated or written;
        a violation stops the trace with an ``AssertionError`` listing each rule, argument and fix.
    """
    v_first = bool(state_v_first)
    states = kmajor_view(recurrent_state, v_first)  # every rule and every lane's [Dk, Dv] view see K-major states
    call = Arguments(query, key, value, g_log, beta, scale, algorithm, mask_pack, group_size, states)
    assert_valid_call(packed_violations(call, seq_chunks, state_rows, host=False), "gdn_cte_varlen")  # no raise
    value_heads, seq_len, dk, dv = value.shape[1], query.shape[2], query.shape[3], value.shape[3]
    out = nl.ndarray((1, value_heads, seq_len, dv), dtype=query.dtype, buffer=nl.shared_hbm)
    rows = tuple(range(len(seq_chunks))) if state_rows is None else state_rows
    final_state = recurrent_state
    if final_state is None:
        shape = kmajor_shape((len(seq_chunks), value_heads, dk, dv), v_first)  # the layout's own shape
        final_state = nl.ndarray(shape, dtype=FP32, buffer=nl.shared_hbm)
    chunk = CHUNK_BY_ALGORITHM[algorithm]
    plan = packed_plan([n * chunk for n in seq_chunks], chunk)
    emit(call, out, kmajor_view(final_state, v_first), plan.spans(rows))
    return out, final_state
