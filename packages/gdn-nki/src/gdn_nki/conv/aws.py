"""``gdn_conv1d_prefill`` and ``gdn_conv1d_decode``: AWS's documented conv1d kernels of the GDN family (SDK 2.33,
``nkilib.experimental.gdn``, "GDN Conv1D Kernel API Reference"), in NKI, with their signatures and semantics.

- ``gdn_conv1d_prefill(mixed [B, C, T], conv_weight [C, K]) -> (out [B, C, T], conv_state [B, C, K])``: every
  batch row from an empty window, out = silu(causal depthwise conv1d(mixed)), the new conv state the last K raw
  inputs of mixed. The page does not say what a row shorter than K keeps: Hugging Face's Qwen3-Next cache decides
  (its inputs left-padded with zeros to K), as ``gdn_tkg`` follows HF where its page is silent.
- ``gdn_conv1d_decode(x [B, C, 1], conv_state [B, C, K], conv_weight [C, K]) -> (out [B, C, 1], new_conv_state
  [B, C, K])``: one token per row: the window slides by one (the state holds K inputs, HF's layout; the taps read
  its last K − 1 and the token), out = silu(conv); ``conv_state`` is only read.

No bias (the pages take none; Qwen3-Next's conv has none). The serving forms — pools, −1 rows, per-token rows and
``num_accepted_tokens``, packed sequences in a bucket, checkpoints — are ``step.py`` and ``prefill.py``; this
module is the documented API. Prefill puts 128 channels on the partitions and the tokens on the free axis, the
layout the page names ("Channels map to the partition axis (128-wide tiles), T to the free axis"), where mixed's
channel-major rows are contiguous runs of T: each tap is one fused multiply-add with the tap as a per-partition
scalar (``nisa.scalar_tensor_tensor``, ISA v2.33.0). Decode uses ``step.py``'s layout and arithmetic with static
rows b.
"""

from __future__ import annotations

from typing import Any

from ..common.backend import nisa, nki, nl
from ..common.engines import SCALAR
from ..common.kernel_assert import kernel_assert
from ..common.tiles import FP32, sbuf
from .step import PARTITIONS_PER_REQUEST, REQUESTS_PER_GROUP, _constants, _convolve, _TileSet

TOKEN_BLOCK = 512  # prefill tokens per tile: fp32 accumulators of 2 KiB per partition
IO_DTYPES = (nl.float32, nl.bfloat16)


@nki.jit
def gdn_conv1d_prefill(mixed: Any, conv_weight: Any) -> tuple[Any, Any]:
    """Prefill depthwise causal conv1d + SiLU + conv_state (AWS's documented signature).

    Dimensions:
        B: batch rows. C: channels (conv_dim, 8192 at Qwen3-Next's shapes), a multiple of 128. T: tokens. K: width.

    Args:
        mixed (nl.NkiTensor): [B, C, T] @ HBM, float32 or bfloat16, the raw pre-conv q|k|v.
        conv_weight (nl.NkiTensor): [C, K] @ HBM, the depthwise taps (``conv1d.weight`` squeezed).

    Returns:
        tuple: out [B, C, T] in mixed's dtype, silu(causal_conv1d(mixed)); conv_state [B, C, K], mixed's dtype, the
        last K raw inputs (zeros before the first when T < K).

    Notes:
        Each (row, 128-channel tile, block of ``TOKEN_BLOCK`` tokens) loads its tokens after the K − 1 before them
        (zeros before token 0), so a block's taps never reach outside its tile.
    """
    batch, channels, tokens = mixed.shape
    width = conv_weight.shape[1]
    kernel_assert(
        len(mixed.shape) == 3 and channels % 128 == 0 and mixed.dtype in IO_DTYPES
        and tuple(conv_weight.shape) == (channels, width) and 2 <= width <= 5,
        f"gdn_conv1d_prefill: mixed {tuple(mixed.shape)} {mixed.dtype} must be [B, C, T] float32/bfloat16 with C a "
        f"multiple of 128, conv_weight {tuple(conv_weight.shape)} [C, K] with 2 <= K <= 5. Fix: pass the layer's "
        "raw q|k|v channel-major and its conv1d weight squeezed",
    )  # fmt: skip
    out = nl.ndarray((batch, channels, tokens), dtype=mixed.dtype, buffer=nl.shared_hbm)
    state = nl.ndarray((batch, channels, width), dtype=mixed.dtype, buffer=nl.shared_hbm)
    halo = width - 1
    for c0 in range(0, channels, 128):
        taps_raw = sbuf((128, width), conv_weight.dtype)
        nisa.dma_copy(dst=taps_raw, src=conv_weight[c0 : c0 + 128, :])
        taps = sbuf((128, width), FP32)
        nisa.tensor_copy(dst=taps, src=taps_raw)
        for b in range(batch):
            for t0 in range(0, tokens, TOKEN_BLOCK):
                count = min(TOKEN_BLOCK, tokens - t0)
                series = sbuf((128, halo + count), mixed.dtype)  # the K − 1 inputs before the block, then it
                before = min(halo, t0)
                if before < halo:
                    nisa.memset(dst=series[:, 0 : halo - before], value=0.0)
                nisa.dma_copy(dst=series[:, halo - before :], src=mixed[b, c0 : c0 + 128, t0 - before : t0 + count])
                acc = sbuf((128, count), FP32)
                # tap K − 1 (the current token), then each earlier tap fused onto the sum
                nisa.activation(dst=acc, op=nl.copy, data=series[:, halo:], scale=taps[:, halo : halo + 1],
                                engine=SCALAR)  # fmt: skip
                for j in range(halo):
                    nisa.scalar_tensor_tensor(dst=acc, data=series[:, j : j + count], op0=nl.multiply,
                                              operand0=taps[:, j : j + 1], op1=nl.add, operand1=acc)  # fmt: skip
                result = sbuf((128, count), mixed.dtype)
                nisa.activation(dst=result, op=nl.silu, data=acc, engine=SCALAR)
                nisa.dma_copy(dst=out[b, c0 : c0 + 128, t0 : t0 + count], src=result)
                if t0 + count == tokens:  # the last K raw inputs: the series' tail
                    kept = sbuf((128, width), mixed.dtype)
                    nisa.tensor_copy(dst=kept, src=series[:, halo + count - width : halo + count])
                    nisa.dma_copy(dst=state[b, c0 : c0 + 128, :], src=kept)
    return out, state


@nki.jit
def gdn_conv1d_decode(x: Any, conv_state: Any, conv_weight: Any) -> tuple[Any, Any]:
    """Decode-step depthwise causal conv1d update + SiLU, one token per row (AWS's documented signature).

    Dimensions:
        B: batch rows. C: channels, a multiple of 16. K: width.

    Args:
        x (nl.NkiTensor): [B, C, 1] @ HBM float32 or bfloat16, the current token's raw q|k|v.
        conv_state (nl.NkiTensor): [B, C, K] @ HBM, x's dtype, the previous window (read only).
        conv_weight (nl.NkiTensor): [C, K] @ HBM, the depthwise taps.

    Returns:
        tuple: out [B, C, 1] in x's dtype; new_conv_state [B, C, K]: the window slid by one, ending in x.
    """
    batch, channels, one = x.shape
    width = conv_weight.shape[1]
    kernel_assert(
        one == 1 and channels % PARTITIONS_PER_REQUEST == 0 and x.dtype in IO_DTYPES
        and tuple(conv_state.shape) == (batch, channels, width) and conv_state.dtype == x.dtype
        and tuple(conv_weight.shape) == (channels, width) and 2 <= width <= 5,
        f"gdn_conv1d_decode: x {tuple(x.shape)}, conv_state {tuple(conv_state.shape)}, conv_weight "
        f"{tuple(conv_weight.shape)} must be [B, C, 1], [B, C, K] in x's dtype and [C, K] (C a multiple of "
        f"{PARTITIONS_PER_REQUEST}, 2 <= K <= 5). Fix: pass one token per row and the layer's K-input window",
    )  # fmt: skip
    out = nl.ndarray((batch, channels, 1), dtype=x.dtype, buffer=nl.shared_hbm)
    new_state = nl.ndarray((batch, channels, width), dtype=x.dtype, buffer=nl.shared_hbm)
    per_part = channels // PARTITIONS_PER_REQUEST
    taps, _ = _constants(conv_weight, None, per_part)
    ones = sbuf((128, 1), FP32)
    nisa.memset(dst=ones, value=1.0)
    tiles = _TileSet(x.dtype, per_part, 1, width, width, False, None)
    for b0 in range(0, batch, REQUESTS_PER_GROUP):
        rows = range(b0, min(batch, b0 + REQUESTS_PER_GROUP))
        for j, b in enumerate(rows):
            part = slice(j * PARTITIONS_PER_REQUEST, (j + 1) * PARTITIONS_PER_REQUEST)
            nisa.dma_copy(dst=tiles.windows[part], src=_row(conv_state, b, width))
            nisa.dma_copy(dst=tiles.inputs[part], src=_row(x, b, 1).reshape((PARTITIONS_PER_REQUEST, 1, per_part)))
        _convolve(tiles, taps, ones, (1, width, width), "silu")
        for j, b in enumerate(rows):
            part = slice(j * PARTITIONS_PER_REQUEST, (j + 1) * PARTITIONS_PER_REQUEST)
            nisa.dma_copy(dst=_row(new_state, b, width), src=tiles.kept[part, 0])
            nisa.dma_copy(dst=_row(out, b, 1).reshape((PARTITIONS_PER_REQUEST, 1, per_part)), src=tiles.result[part])
    return out, new_state


def _row(tensor: Any, b: int, inner: int) -> Any:
    """Row b of a [B, C, inner] tensor as [16, F, inner] (partition s: channels s·F .., each with its inner run)."""
    channels = tensor.shape[1]
    per_part = channels // PARTITIONS_PER_REQUEST
    pattern = [[per_part * inner, PARTITIONS_PER_REQUEST], [inner, per_part], [1, inner]]
    return tensor.ap(pattern=pattern, offset=b * channels * inner)
