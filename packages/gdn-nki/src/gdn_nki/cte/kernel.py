"""The ``gdn_cte`` NKI kernel: argument checks at trace time, output allocation, and the lane emission it shares
with the packed-varlen kernel (``varlen.py``)."""

from __future__ import annotations

import functools
from typing import Any

from gdn_ref.constants import (
    ALGORITHM_NEUMANN,
    ALGORITHM_SCHUR,
    CHUNK_BY_ALGORITHM,
    DEFAULT_ALGORITHM,
    DEFAULT_GROUP_SIZE,
)
from gdn_ref.contract import Arguments

from ..common import engines
from ..common.backend import nki, nl
from ..common.kernel_assert import assert_valid_call
from ..common.tiles import FP32
from . import neumann, schur
from .chunks import Lane
from .constant_tiles import constants_from_pack, constants_on_device
from .lanes import LaneInputs, program_lanes, run_lanes
from .plan import Span, dense_spans


@nki.jit
def gdn_cte(
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
) -> tuple[Any, Any]:
    """Chunked gated delta-rule (GDN) prefill kernel.

    Dimensions:
        B: batch size. Hk: key/query heads. Hv: value heads, a multiple of Hk (value head h reads key head
        h // (Hv // Hk)). S: tokens, a multiple of 128 ("schur") or 64 ("neumann"). Dk, Dv: head dims <= 128.

    Args:
        query (nl.NkiTensor): [B, Hk, S, Dk] @ HBM, token-major, L2-normalized; its dtype (bfloat16 or float32)
            is the compute dtype of matmul operands, q/k/v tiles and ``out``.
        key (nl.NkiTensor): [B, Hk, S, Dk] @ HBM, L2-normalized, query's dtype.
        value (nl.NkiTensor): [B, Hv, S, Dv] @ HBM, query's dtype.
        g_log (nl.NkiTensor): [B, Hv, S] @ HBM, fp32 per-token log-decay (<= 0).
        beta (nl.NkiTensor): [B, Hv, S] @ HBM, fp32 per-token update strength in (0, 1).
        scale (float): query scaling (typically Dk**-0.5), applied on device.
        algorithm (str): "schur" (default, chunk 128, grouped Schur-merge inverse) or "neumann" (chunk 64,
            16-row doubling joined by block forward substitution). Trace-time constant.
        mask_pack (nl.NkiTensor): [N_MASKS, 128, 128] fp32 @ HBM from ``build_mask_pack()``; required by schur.
        group_size (int): chunks per grouped inverse for schur, 1..16.
        recurrent_state (nl.NkiTensor): optional [B, Hv, Dk, Dv] fp32 @ HBM, MUTABLE IN/OUT: its contents are
            the initial state and it is updated in place and returned. Omitted: zero start, no load.

    Returns:
        tuple: ``out`` [B, Hv, S, Dv] @ HBM in the compute dtype (un-normalized), and the final state
        [B, Hv, Dk, Dv] fp32 (the caller's ``recurrent_state`` buffer when one was supplied).

    Notes:
        Every documented rule a trace can see is checked before anything is allocated or written
        (``gdn_ref.contract``); a violation stops the trace with an ``AssertionError`` listing each broken rule,
        argument and fix (``kernel_assert``: the tracer does not accept ``raise`` in a kernel). The host entry
        points raise ``ContractError`` for the same calls before launching.
        The state is fp32 whatever the compute dtype; the gate prefix sum is fp32. Lanes (b, h) are split
        evenly over an SPMD launch grid (``gdn_cte[n](...)``).
    """
    call = Arguments(query, key, value, g_log, beta, scale, algorithm, mask_pack, group_size, recurrent_state)
    assert_valid_call(call.violations(host=False))

    out, final_state = allocate_outputs(query, value, recurrent_state)
    spans = dense_spans(query.shape[0], query.shape[2], CHUNK_BY_ALGORITHM[algorithm])
    emit(call, out, final_state, spans)
    return out, final_state


def allocate_outputs(query: Any, value: Any, recurrent_state: Any) -> tuple[Any, Any]:
    """A dense launch's out [B, Hv, S, Dv] in the compute dtype and its final state: the caller's
    ``recurrent_state`` when given (updated in place), else a new [B, Hv, Dk, Dv] fp32 tensor."""
    batch, _, seq_len, dk = query.shape
    value_heads, dv = value.shape[1], value.shape[3]
    out = nl.ndarray((batch, value_heads, seq_len, dv), dtype=query.dtype, buffer=nl.shared_hbm)
    final_state = recurrent_state
    if final_state is None:
        final_state = nl.ndarray((batch, value_heads, dk, dv), dtype=FP32, buffer=nl.shared_hbm)
    return out, final_state


def emit(
    call: Arguments, out: Any, final_state: Any, spans: list[Span], boundaries: Any = None, norm: Any = None
) -> None:
    """Issue the work of a checked launch: constants, then every (sequence, value head) lane of this program, with
    an engine balancer of the launch's own.

    Args:
        call (Arguments): the kernel's arguments, as checked.
        out, final_state (nl.NkiTensor): the allocated output and the final state (the caller's state when given).
        spans (list[Span]): the launch's sequences (token range in q/k/v/gates/out, state row).
        boundaries (boundaries.ChunkBoundaries): a bucketed launch's per-chunk tables (``LaneInputs.boundaries``).
        norm (normed.output_stage.OutputNorm): the gated RMSNorm every output tile gets before its store (``Lane.norm``).
    """
    balancer = engines.Balancer()
    with engines.balancing(balancer):
        _emit_lanes(call, out, final_state, spans, balancer, boundaries, norm)


def _emit_lanes(
    call: Arguments,
    out: Any,
    final_state: Any,
    spans: list[Span],
    balancer: engines.Balancer,
    boundaries: Any,
    norm: Any = None,
) -> None:
    """This program's lanes (``program_lanes``) with the algorithm's constants and inverse, issued as the pipeline
    (``run_lanes``) with ``balancer``."""
    query, key, value, mask_pack, algorithm = call.query, call.key, call.value, call.mask_pack, call.algorithm
    ratio = value.shape[1] // query.shape[1]
    dtype = query.dtype
    chunk = CHUNK_BY_ALGORITHM[algorithm]
    if algorithm == ALGORITHM_SCHUR:
        consts = constants_from_pack(mask_pack, chunk, dtype)
        deferred = functools.partial(schur.load_merge_planes, mask_pack, consts, dtype)
        # int(): the contract takes numpy's integers too, and the group sizes trace-time access patterns
        invert_group, group, system_dtype = schur.invert_group, int(call.group_size), dtype
        idle_rounds = schur.OPERAND_IDLE_ROUNDS_FP32 if dtype == FP32 else schur.OPERAND_IDLE_ROUNDS
    else:
        assert algorithm == ALGORITHM_NEUMANN  # noqa: S101 - validate() rejected anything else
        consts = constants_on_device(chunk, dtype)
        deferred = functools.partial(neumann.build_block_planes, consts, dtype)
        invert_group, group, system_dtype = neumann.invert_group, neumann.GROUP_SIZE, FP32
        idle_rounds = neumann.OPERAND_IDLE_ROUNDS

    lanes = [
        Lane(
            b=span.b,
            h=h,
            kh=h // ratio,
            offset=span.offset,
            n_chunks=span.n_chunks,
            state_row=span.state_row,
            query=query,
            key=key,
            value=value,
            out=out,
            chunk=chunk,
            dtype=dtype,
            system_dtype=system_dtype,
            scale=float(call.scale),
            consts=consts,
            norm=norm,
        )
        for span, h in program_lanes(spans, value.shape[1])
    ]
    inputs = LaneInputs(
        call.g_log, call.beta, call.recurrent_state, final_state, invert_group, deferred, idle_rounds, boundaries
    )
    run_lanes(lanes, group, inputs, balancer)
