"""Context-parallel kernels that go wrong on purpose, for gdn-spec's context-parallel check (``module:callable`` specs
resolved in the spawned ranks, which inherit the test's ``sys.path``).

Two fail part-way on rank 1 — in its second kernel call (pass B, after the header exchange) or in its correction
(after the carries' exchange) — and must make every rank raise with no pool row written. Two are wrong CP kernels
the check must reject: one that never applies the carries (each rank prefills its slice from zero) and one that
writes a pool row on every rank a sequence's piece ends on, not only where the sequence ends. Without
``cp_context`` each is ``gdn_nki.torch.chunk_gated_delta_rule`` (the judge's single-rank call).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

import gdn_nki.torch.chunk as chunk
import gdn_nki.torch.context_parallel as context_parallel
from gdn_nki.torch import chunk_gated_delta_rule, context_parallel_chunk_gated_delta_rule

FAILING_RANK = 1


def _failing(real: Any, from_call: int) -> Any:
    """``real`` raising on the failing rank from its ``from_call``-th call on (1-based)."""
    calls = 0

    def fail(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if dist.get_rank() == FAILING_RANK and calls >= from_call:
            raise RuntimeError(f"injected failure in {real.__name__}, call {calls}")
        return real(*args, **kwargs)

    return fail


def failing_in_pass_b(*args: Any, **kwargs: Any) -> Any:
    """``chunk_gated_delta_rule`` whose rank 1 fails in its second kernel launch (pass B, from the identity)."""
    chunk.prefill_varlen = _failing(chunk.prefill_varlen, from_call=2)
    return chunk_gated_delta_rule(*args, **kwargs)


def failing_in_correction(*args: Any, **kwargs: Any) -> Any:
    """``chunk_gated_delta_rule`` whose rank 1 fails while correcting its first piece (after every kernel ran)."""
    context_parallel._corrected = _failing(context_parallel._corrected, from_call=1)
    return chunk_gated_delta_rule(*args, **kwargs)


def _single_rank(q, k, v, g, beta, cu_seqlens, initial_state, initial_state_indices, output_final_state,
                 **options: Any) -> tuple[Any, Any]:  # fmt: skip
    return chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu_seqlens, initial_state=initial_state,
                                  initial_state_indices=initial_state_indices, output_final_state=output_final_state,
                                  **options)  # fmt: skip


def _rows_here(context: Any, pool: Any, rows: Any) -> tuple[list[int], Any]:
    """This rank's pieces' pool rows, and their initial states read from them (zero for −1)."""
    here = rows.tolist()[context.first_sequence : context.first_sequence + context.num_seqs]
    dense = torch.zeros(len(here), *pool.shape[1:])
    for i, row in enumerate(here):
        if row >= 0:
            dense[i] = pool[row]
    return here, dense


def no_carry(q, k, v, g, beta, cu_seqlens=None, cp_context=None, initial_state=None, initial_state_indices=None,
             output_final_state=False, **options: Any) -> tuple[Any, Any]:  # fmt: skip
    """A wrong CP kernel: each rank prefills its pieces on its own, a continued piece from zero (no carry), and
    writes the rows of the sequences that end here."""
    if cp_context is None:
        return _single_rank(q, k, v, g, beta, cu_seqlens, initial_state, initial_state_indices, output_final_state,
                            **options)  # fmt: skip
    if initial_state_indices is None:
        return _single_rank(q, k, v, g, beta, cp_context.cu_seqlens, None, None, False, **options)
    here, dense = _rows_here(cp_context, initial_state, initial_state_indices)
    if not cp_context.is_first_rank:
        dense[0] = 0
    o, states = _single_rank(q, k, v, g, beta, cp_context.cu_seqlens, dense, None, True, **options)
    for i, row in enumerate(here):
        if row >= 0 and (i < len(here) - 1 or cp_context.is_last_rank):
            initial_state[row] = states[i]
    return o, initial_state


def writes_every_rank(q, k, v, g, beta, cu_seqlens=None, cp_context=None, initial_state=None,
                      initial_state_indices=None, output_final_state=False, **options: Any) -> tuple[Any, Any]:  # fmt: skip
    """A wrong CP kernel: right outputs, but each piece's state written to its sequence's row on this rank, also
    where the sequence continues onto the next rank (its partial state)."""
    if cp_context is None or initial_state_indices is None:
        return no_carry(q, k, v, g, beta, cu_seqlens, cp_context, initial_state, initial_state_indices,
                        output_final_state, **options)  # fmt: skip
    here, dense = _rows_here(cp_context, initial_state, initial_state_indices)
    everyone = torch.zeros(cp_context.sequences, *initial_state.shape[1:])
    everyone[cp_context.first_sequence : cp_context.first_sequence + len(here)] = dense
    o, states = context_parallel_chunk_gated_delta_rule(q, k, v, g, beta, cp_context, initial_state=everyone,
                                                        output_final_state=True, **options)  # fmt: skip
    for i, row in enumerate(here):
        if row >= 0:
            initial_state[row] = states[i]
    return o, initial_state
