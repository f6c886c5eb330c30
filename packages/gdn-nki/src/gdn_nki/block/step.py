"""``gdn_block_step``: one decode / verify step of a GatedDeltaNet layer in one launch, on the conv-state and
recurrent-state pools (``gdn_ref.block.gdn_block_decode_pool``).

Everything between the layer's input (after its input norm) and its out_proj: in_proj (hidden → q|k|v, z, b, a),
the causal conv1d over q|k|v with SiLU (window from its conv-pool row), the split into heads with GQA, the fused
gating, the gated delta rule with q and k L2-normalized (state from its state-pool row), and the gated RMSNorm with
z. The stages are the existing kernels composed inside the launch — ``block.in_proj``, ``conv.step.gdn_conv_step``
and ``tkg.step.gdn_step`` with the gated RMSNorm folded into its output stage (``tkg.recurrence.OutputNorm``, as
``gdn_tkg`` folds it), called as nested kernels (the form AWS's ``gdn_block_tkg`` reuses ``gdn_conv1d_decode`` and
``gdn_tkg`` in) — handing each other token-major HBM scratch, so the conv and the recurrence are the separate
kernels' instructions, and given the same projections give their bits (the norm reads the recurrence's fp32
outputs, where the separate ``gated_rms_norm`` reads them rounded to the I/O dtype).

Rows: one index per request ([N]) or per token ([N, T]) names the same row of both pools, as the separate kernels
address them: −1 is padding (nothing of either pool read or written, zeros out), and with [N, T] rows and
``num_accepted_tokens`` a request resumes from row ``[n, num_accepted_tokens[n] − 1]`` and keeps every token's
states (speculative rollback of both states with one set of indices).

Stage order: every projection first (q|k|v, whose stores the conv waits on, then z, b and a), then the conv, the
q/k/v split, and the recurrence with the norm. Measured against z's projection after the conv (its weights loaded
ahead, its products after the recurrence's, so the in-order tensor engine never holds the steps behind a weight in
flight): 293.2 against 299.2 µs at Qwen3-Next's shapes, N = 8, before the in_proj's stores moved; q|k|v first
rather than last: N = 64, T = 4 2,468.8 -> 2,462.2 µs (PERFORMANCE.md, "Fused decode block", step 6); both stages'
row tables made before the in_proj: 2,462.2 -> 2,460.6 µs (step 7).
"""

from __future__ import annotations

from typing import Any

from gdn_ref.block_rules import block_violations
from gdn_ref.decode import RMS_NORM_EPS

from ..common.backend import nki, nl
from ..common.kernel_assert import assert_valid_call, kernel_assert
from ..common.tiles import FP32
from ..conv.step import RowTables, conv_row_tables, gdn_conv_step, split_parts
from ..norm.kernel import gdn_gated_rms_norm
from ..tkg.recurrence import OutputNorm
from ..tkg.step import gdn_step, step_row_tables
from .in_proj import HiddenTiles, copy_by_rows, project_all, scratch


@nki.jit
def gdn_block_step(
    hidden: Any,
    w_qkv: Any,
    w_z: Any,
    w_b: Any,
    w_a: Any,
    conv_weight: Any,
    conv_bias: Any,
    A_log: Any,
    dt_bias: Any,
    norm_weight: Any,
    conv_pool: Any,
    state_pool: Any,
    state_indices: Any,
    num_accepted_tokens: Any = None,
) -> tuple[Any, Any, Any]:
    """One fused decode / verify step of a GatedDeltaNet layer on its two state pools.

    Dimensions:
        N: requests. T: tokens each (N·T <= 1024). E: hidden size, a multiple of 128. Hk, Hv: key and value heads
        (Hk derived: C = 2·Hk·Dk + Hv·Dv). Dk, Dv <= 128. C: q|k|v channels, a multiple of 16. W: conv width 2..5.
        L >= W − 1: the conv window. P: rows of both pools.

    Args:
        hidden (nl.NkiTensor): [N, T, E] @ HBM float32 or bfloat16 (the compute dtype).
        w_qkv (nl.NkiTensor): [E, C]; w_z (nl.NkiTensor): [E, Hv·Dv]; w_b, w_a (nl.NkiTensor): [E, Hv] — hidden's
            dtype (``nn.Linear.weight.T``).
        conv_weight (nl.NkiTensor): [C, W] float32 or bfloat16; conv_bias (nl.NkiTensor): [C] or None.
        A_log, dt_bias (nl.NkiTensor): [Hv] fp32. norm_weight (nl.NkiTensor): [Dv] fp32.
        conv_pool (nl.NkiTensor): [P, C, L] hidden's dtype, MUTABLE at the rows live requests name.
        state_pool (nl.NkiTensor): [P, Hv, Dk, Dv] fp32, MUTABLE likewise.
        state_indices (nl.NkiTensor): [N] or [N, T] int32 rows of both pools; −1 = padding.
        num_accepted_tokens (nl.NkiTensor): optional [N] int32 with [N, T] rows.

    Returns:
        tuple: ``out`` [N, T, Hv·Dv] in hidden's dtype (out_proj's input; zeros for padding requests), and the two
        pools (the same buffers, updated).

    Notes:
        Trace-time rules (``gdn_ref.block_rules.block_violations``) stop the trace before anything is allocated;
        index values are device data: ``gdn_nki.block_decode_step`` checks them on the host first.
    """
    assert_valid_call(block_violations(hidden, w_qkv, w_z, w_b, w_a, conv_weight, conv_bias, A_log, dt_bias,
                                       norm_weight, conv_pool, state_pool, state_indices, num_accepted_tokens,
                                       host=False))  # fmt: skip
    # One program: every stage would run on each program of a larger grid, writing the same rows twice.
    kernel_assert(nl.num_programs(0) == 1, f"gdn_block_step runs on one program, got a launch grid of "
                  f"{nl.num_programs(0)}. Fix: launch gdn_block_step itself, not gdn_block_step[n]")  # fmt: skip
    n_req, tokens, size = hidden.shape
    hv, dk, dv = state_pool.shape[1:]
    channels = w_qkv.shape[1]
    hk = (channels - hv * dv) // (2 * dk)
    rows = n_req * tokens
    dtype = hidden.dtype

    mixed = scratch((n_req, tokens, channels), dtype)
    z = scratch((n_req, tokens, hv, dv), dtype)
    a, b = scratch((n_req, tokens, hv), FP32), scratch((n_req, tokens, hv), FP32)
    # Both stages' row tables first, while the in_proj's weights stream: made by the stages themselves, their index
    # loads queued behind the in_proj's stores and the conv's (a DMA queue is in order) and put the tables on the
    # chain (PERFORMANCE.md, "Fused decode block" step 7).
    conv_tables = conv_row_tables(mixed, conv_pool, conv_weight, state_indices, num_accepted_tokens)
    step_tables = step_row_tables(state_pool, state_indices, num_accepted_tokens, n_req, tokens)
    tiles = HiddenTiles(hidden.reshape((rows, size)))
    project_all(
        tiles, [(w, out.reshape((rows, w.shape[1]))) for w, out in ((w_qkv, mixed), (w_z, z), (w_b, b), (w_a, a))]
    )

    q, k, v = _convolve_into_heads(mixed, conv_pool, conv_weight, conv_bias, state_indices, num_accepted_tokens,
                                   (hk, dk), (hv, dv), conv_tables)  # fmt: skip

    # Decode: the gated RMSNorm folded into the recurrence's output stage (as gdn_tkg's), each request's norm
    # running while the next requests' states stream, instead of a norm stage after the last request. Verification:
    # the norm kernel after the recurrence — folded, the T tokens' norms held the recurrence's engines (N = 8,
    # T = 4: 504.2 against 461.7 µs; PERFORMANCE.md, "Fused decode block").
    folded = OutputNorm(z, norm_weight) if tokens == 1 else None
    o, _ = gdn_step(q, k, v, state_pool, state_indices, num_accepted_tokens, a=a, b=b, A_log=A_log,
                    dt_bias=dt_bias, scale=dk**-0.5, use_qk_l2norm=True, norm=folded, row_tables=step_tables)  # fmt: skip
    if folded is not None:
        return o.reshape((n_req, tokens, hv * dv)), conv_pool, state_pool
    out = gdn_gated_rms_norm(o.reshape((rows * hv, dv)), z.reshape((rows * hv, dv)), norm_weight, RMS_NORM_EPS)
    return out.reshape((n_req, tokens, hv * dv)), conv_pool, state_pool


def _convolve_into_heads(mixed: Any, conv_pool: Any, conv_weight: Any, conv_bias: Any, state_indices: Any,
                         num_accepted_tokens: Any, key_heads: tuple[int, int], value_heads: tuple[int, int],
                         row_tables: RowTables) -> tuple[Any, Any, Any]:  # fmt: skip
    """The conv with SiLU over q|k|v, split into q, k [N, T, Hk, Dk] and v [N, T, Hv, Dv]: written by the conv as
    three tensors when each part is whole partitions of its layout (``conv.step.split_parts``; Qwen3-Next's
    shapes), else copied out of its one output (N = 64, T = 4: the copies moved 8 MiB HBM to HBM between the conv
    and the recurrence; PERFORMANCE.md, "Fused decode block")."""
    n_req, tokens, channels = mixed.shape
    conv_args = (mixed, conv_pool, conv_weight, conv_bias, state_indices, num_accepted_tokens, "silu")
    shapes = (key_heads, key_heads, value_heads)
    widths = tuple(heads * dim for heads, dim in shapes)
    if split_parts(channels, widths):
        # The parts allocated in the recurrence's shapes (not reshaped views): its run-time row offsets index the
        # tensor itself.
        parts = tuple(scratch((n_req, tokens, *shape), mixed.dtype) for shape in shapes)
        gdn_conv_step(*conv_args, parts, row_tables=row_tables)
        return parts
    conv_out, _ = gdn_conv_step(*conv_args, row_tables=row_tables)
    rows, first, parts = n_req * tokens, 0, []
    for shape, width in zip(shapes, widths, strict=True):
        part = scratch((n_req, tokens, *shape), mixed.dtype)
        _copy_columns(conv_out.reshape((rows, channels)), first, part.reshape((rows, width)))
        parts.append(part)
        first += width
    return tuple(parts)


def _copy_columns(src: Any, first: int, dst: Any) -> None:
    """``dst [M, w] = src[:, first : first + w]``, HBM to HBM: each row one run of w elements, in pieces of whole
    rows (``in_proj.copy_by_rows``)."""
    copy_by_rows(dst, src.ap(pattern=[[src.shape[1], src.shape[0]], [1, dst.shape[1]]], offset=first))
