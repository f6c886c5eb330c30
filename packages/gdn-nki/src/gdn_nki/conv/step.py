"""``gdn_conv_step``: the causal depthwise conv1d of a GatedDeltaNet layer's decode / verify step on a conv-state
pool addressed on device (``gdn_ref.conv.causal_conv1d_decode_pool``).

N requests × T new tokens each, C channels (q|k|v), kernel width W, a pool [P, C, L] of windows (the last L >= W − 1
inputs of each request, channel-major, oldest first: vLLM's and HF's ``[.., dim, state_len]``) updated in place.
Rows are addressed exactly as ``tkg.step`` addresses the recurrent state pool, so one set of indices and one
``num_accepted_tokens`` roll both states back:

- ``state_indices`` [N]: request n reads row ``state_indices[n]`` and writes its window after the T tokens there;
- [N, T]: the window after token t goes to row ``[n, t]``; the request reads row ``[n, num_accepted_tokens[n] − 1]``
  (``[n, 0]`` without it);
- −1 is padding: every pool transfer it addresses is skipped by the DMA (``oob_mode.skip``, "nki.isa.dma_copy",
  SDK 2.33) and its outputs are zeros.

Layout: a request's data lives on ``PARTITIONS_PER_REQUEST`` (16) partitions, channel c = s·F + f on partition s of
them (F = C / 16 consecutive channels per partition), so ``REQUESTS_PER_GROUP`` (8) requests fill the 128 partitions
and every instruction works on 8 requests at once. Each partition's share of a pool row is one run of F·L elements
(3 KiB for bf16 at C = 8192, L = 3) and of a token's inputs one run of F (1 KiB): DMA efficiency rises with
contiguous bytes per descriptor (docs/nki-sources.md §4.4), and a layout with the 128 channels of a tile on
partitions would move each request's elements in runs of L or 1 (6 or 2 bytes). Depthwise: each channel is
independent, so any channel-to-partition map works as long as inputs, taps, windows and outputs share it.

All arithmetic is fp32 (the DMA widens bf16 inputs and the activation narrows the output), as HF's fallback computes
in the weight's dtype and vLLM's kernels accumulate in fp32. The groups run as a compiled loop (``nl.fori_loop``,
SDK 2.33): the program does not grow with N; one compiled program per (N, T).
"""

from __future__ import annotations

from typing import Any

from gdn_ref.conv_rules import conv_step_violations

from ..common.backend import nisa, nki, nl
from ..common.engines import GPSIMD, SCALAR, VECTOR
from ..common.kernel_assert import assert_valid_call
from ..common.request_rows import entry, request_rows
from ..common.tiles import FP32, sbuf

PARTITIONS_PER_REQUEST = 16  # runs of 2^k KiB per partition at Qwen3-Next's C = 8192 (module docstring)
REQUESTS_PER_GROUP = 128 // PARTITIONS_PER_REQUEST


@nki.jit
def gdn_conv_step(
    x: Any,
    conv_pool: Any,
    weight: Any,
    bias: Any,
    state_indices: Any,
    num_accepted_tokens: Any = None,
    activation: str | None = "silu",
) -> tuple[Any, Any]:
    """Convolve T new tokens of N requests, each from its window in a conv-state pool, and store the windows.

    Dimensions:
        N: requests. T: new tokens each. C: channels, a multiple of 16. W: kernel width, 2..5. L >= W − 1: the
        inputs a window holds. P: pool rows.

    Args:
        x (nl.NkiTensor): [N, T, C] @ HBM, float32 or bfloat16, token-major (as the projections give it).
        conv_pool (nl.NkiTensor): [P, C, L] @ HBM, x's dtype (windows hold inputs: exact), MUTABLE: only rows named
            by live requests are read or written.
        weight (nl.NkiTensor): [C, W] @ HBM fp32 or bf16; tap W − 1 multiplies the current token.
        bias (nl.NkiTensor): [C] @ HBM fp32 or bf16, or None.
        state_indices (nl.NkiTensor): [N] or [N, T] int32 @ HBM: pool rows (module docstring); −1 = padding.
        num_accepted_tokens (nl.NkiTensor): optional [N] int32 @ HBM, with [N, T] indices: the row to resume from.
        activation (str | None): "silu" (Qwen3-Next) or None.

    Returns:
        tuple: ``out`` [N, T, C] in x's dtype (zeros for padding requests) and ``conv_pool`` (the same buffer).

    Notes:
        Trace-time rules (``gdn_ref.conv_rules.conv_step_violations``) stop the trace before anything is allocated;
        the index values are device data: ``gdn_nki.conv_decode_step`` checks them on the host first.
    """
    assert_valid_call(conv_step_violations(x, conv_pool, weight, bias, state_indices, num_accepted_tokens, activation))
    n_req, tokens, channels = x.shape
    state_len, width = conv_pool.shape[2], weight.shape[1]
    per_part = channels // PARTITIONS_PER_REQUEST
    per_token = len(state_indices.shape) == 2
    out = nl.ndarray((n_req, tokens, channels), dtype=x.dtype, buffer=nl.shared_hbm)

    group = REQUESTS_PER_GROUP
    trips = -(-n_req // group)
    slots = trips * group  # slots past N hold −1 rows: their transfers are skipped
    rows = request_rows(state_indices, num_accepted_tokens, n_req, tokens, slots)
    taps, shift = _constants(weight, bias, per_part, width)

    # Working tiles allocated once, before the loop: a compiled body touches the same tiles every iteration.
    windows = sbuf((128, per_part, state_len), x.dtype)
    inputs = sbuf((128, tokens, per_part), x.dtype)
    nisa.memset(dst=windows, value=0.0)  # a padding slot's skipped load leaves defined values
    nisa.memset(dst=inputs, value=0.0)
    series = sbuf((128, per_part, state_len + tokens), FP32)  # window then tokens, per channel
    acc = sbuf((128, per_part, tokens), FP32)
    product = sbuf((128, per_part, tokens), FP32)
    result = sbuf((128, tokens, per_part), x.dtype)
    kept = sbuf((128, tokens if per_token else 1, per_part, state_len), x.dtype)
    zeros = sbuf((PARTITIONS_PER_REQUEST, tokens, per_part), x.dtype)
    nisa.memset(dst=zeros, value=0.0)

    def requests(base: Any) -> list[tuple[int, Any, Any, tuple[Any, ...], Any, Any]]:
        found = []
        for j in range(group):
            n = j if isinstance(base, int) else base + j
            width_rows = tokens if per_token else 1
            if num_accepted_tokens is None:
                read_row = nisa.scalar_load(entry(rows[0], j * width_rows, base, width_rows))
            else:
                read_row = nisa.scalar_load(entry(rows[1], j, base, 1))
            writes = (
                tuple(nisa.scalar_load(entry(rows[0], j * tokens + t, base, tokens)) for t in range(tokens))
                if per_token
                else (read_row,)
            )
            out_row, pad_row = (nisa.scalar_load(entry(tile, j, base, 1)) for tile in rows[2:])
            found.append((j, n, read_row, writes, out_row, pad_row))
        return found

    def iteration(g: Any) -> None:
        base = g * group
        slots_of = requests(base)
        for j, n, read_row, _, _, _ in slots_of:
            part = slice(j * PARTITIONS_PER_REQUEST, (j + 1) * PARTITIONS_PER_REQUEST)
            nisa.dma_copy(dst=windows[part], src=_pool_view(conv_pool, read_row), oob_mode=nisa.oob_mode.skip)
            if not isinstance(n, int) or n < x.shape[0]:  # a static slot past N has no inputs
                nisa.dma_copy(dst=inputs[part], src=_input_view(x, n), **_skip_if_scalar(n))
        _convolve(windows, inputs, series, acc, product, result, kept, taps, shift, width, activation)
        for j, _, _, writes, out_row, pad_row in slots_of:
            part = slice(j * PARTITIONS_PER_REQUEST, (j + 1) * PARTITIONS_PER_REQUEST)
            for t, row in enumerate(writes):
                nisa.dma_copy(dst=_pool_view(conv_pool, row), src=kept[part, t], oob_mode=nisa.oob_mode.skip)
            nisa.dma_copy(dst=_input_view(out, out_row), src=result[part], oob_mode=nisa.oob_mode.skip)
            nisa.dma_copy(dst=_input_view(out, pad_row), src=zeros, oob_mode=nisa.oob_mode.skip)

    if trips == 1:
        iteration(0)
    else:
        nl.fori_loop(0, trips, iteration)
    return out, conv_pool


def _skip_if_scalar(n: Any) -> dict[str, Any]:
    """A run-time request index past N (a loop's last group) is outside ``x``: its load is skipped."""
    return {} if isinstance(n, int) else {"oob_mode": nisa.oob_mode.skip}


def _pool_view(pool: Any, row: Any) -> Any:
    """Pool row ``row`` (a run-time scalar) as [16, F, L]: partition s holds channels s·F .. s·F + F − 1, each with
    its L inputs (one contiguous run per partition)."""
    _, channels, state_len = pool.shape
    per_part = channels // PARTITIONS_PER_REQUEST
    pattern = [[per_part * state_len, PARTITIONS_PER_REQUEST], [state_len, per_part], [1, state_len]]
    return pool.ap(pattern=pattern, offset=0, scalar_offset=row, indirect_dim=0)


def _input_view(tensor: Any, n: Any) -> Any:
    """Request ``n``'s [T, C] rows of ``x`` or ``out`` as [16, T, F] (partition s: channels s·F .., per token);
    ``n`` a trace-time int or a run-time scalar."""
    _, tokens, channels = tensor.shape
    per_part = channels // PARTITIONS_PER_REQUEST
    pattern = [[per_part, PARTITIONS_PER_REQUEST], [channels, tokens], [1, per_part]]
    if isinstance(n, int):
        return tensor.ap(pattern=pattern, offset=n * tokens * channels)
    return tensor.ap(pattern=pattern, offset=0, scalar_offset=n, indirect_dim=0)


def _constants(weight: Any, bias: Any, per_part: int, width: int) -> tuple[Any, Any]:
    """The taps [128, F, W] and the bias [128, F] (zeros without one), fp32, replicated for each request slot of the
    128 partitions: loaded once per launch."""
    taps_in = sbuf((128, per_part, width), weight.dtype)
    for j in range(REQUESTS_PER_GROUP):
        part = slice(j * PARTITIONS_PER_REQUEST, (j + 1) * PARTITIONS_PER_REQUEST)
        view = weight.ap(pattern=[[per_part * width, PARTITIONS_PER_REQUEST], [width, per_part], [1, width]], offset=0)
        nisa.dma_copy(dst=taps_in[part], src=view)
    taps = sbuf((128, per_part, width), FP32)
    nisa.tensor_copy(dst=taps, src=taps_in)
    shift = sbuf((128, per_part), FP32)
    if bias is None:
        nisa.memset(dst=shift, value=0.0)
        return taps, shift
    bias_in = sbuf((128, per_part), bias.dtype)
    for j in range(REQUESTS_PER_GROUP):
        part = slice(j * PARTITIONS_PER_REQUEST, (j + 1) * PARTITIONS_PER_REQUEST)
        view = bias.ap(pattern=[[per_part, PARTITIONS_PER_REQUEST], [1, per_part]], offset=0)
        nisa.dma_copy(dst=bias_in[part], src=view)
    nisa.tensor_copy(dst=shift, src=bias_in)
    return taps, shift


def _convolve(
    windows: Any,
    inputs: Any,
    series: Any,
    acc: Any,
    product: Any,
    result: Any,
    kept: Any,
    taps: Any,
    shift: Any,
    width: int,
    activation: str | None,
) -> None:
    """One group's conv over all 128 partitions: ``series`` = window ++ tokens per channel (fp32), the taps'
    products summed onto the bias, the activation into ``result`` ([128, T, F], x's dtype), and the windows to keep
    (after the last token, or after each with per-token rows) into ``kept``.

    Engines: the products go to GpSimd and the sums to the vector engine (two streams side by side); the copies
    and the activation to the scalar engine (``activation`` is ScalarE's instruction, ISA v2.33.0).
    """
    state_len = windows.shape[2]
    tokens = inputs.shape[1]
    nisa.activation(dst=series[:, :, 0:state_len], op=nl.copy, data=windows, engine=SCALAR)
    nisa.activation(dst=series[:, :, state_len:], op=nl.copy, data=_token_last(inputs), engine=SCALAR)
    first = state_len - (width - 1)  # tap j reads the input W − 1 − j tokens back

    def tap(j: int) -> Any:
        return taps[:, :, j : j + 1].broadcast(2, tokens)

    nisa.tensor_tensor(dst=acc, data1=series[:, :, first : first + tokens], data2=tap(0), op=nl.multiply, engine=GPSIMD)
    nisa.tensor_tensor(dst=acc, data1=acc, data2=shift.expand_dim(2).broadcast(2, tokens), op=nl.add, engine=VECTOR)
    for j in range(1, width):
        start = first + j
        nisa.tensor_tensor(dst=product, data1=series[:, :, start : start + tokens], data2=tap(j), op=nl.multiply,
                           engine=GPSIMD)  # fmt: skip
        nisa.tensor_tensor(dst=acc, data1=acc, data2=product, op=nl.add, engine=VECTOR)
    out_view = _token_last(result)
    if activation is None:
        nisa.activation(dst=out_view, op=nl.copy, data=acc, engine=SCALAR)
    else:
        nisa.activation(dst=out_view, op=nl.silu, data=acc, engine=SCALAR)
    kept_tokens = range(tokens) if kept.shape[1] > 1 else (tokens - 1,)
    for i, t in enumerate(kept_tokens):  # the window after token t: inputs t + 1 .. t + L of the series
        nisa.activation(dst=kept[:, i], op=nl.copy, data=series[:, :, t + 1 : t + 1 + state_len], engine=SCALAR)


def _token_last(tile: Any) -> Any:
    """A [P, T, F] tile seen as [P, F, T] (a strided view: the series is channel-major within a partition)."""
    return tile.ap(
        pattern=[[tile.shape[1] * tile.shape[2], tile.shape[0]], [1, tile.shape[2]], [tile.shape[2], tile.shape[1]]],
        offset=0,
    )
