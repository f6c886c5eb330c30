"""Every request's pool rows, computed on device once per launch: what a decode kernel on a pool addressed by
device indices (``tkg.step``, ``conv.step``) reads its rows from.

The indices are device data the trace never sees: a request's rows are ``NkiScalar``s (``nki.isa.scalar_load`` of
an int32 tile) used as the ``scalar_offset`` of ``.ap`` ("NKI Scalar Values", ``nki.isa.scalar_load``, SDK 2.33);
a -1 row is outside its tensor and the DMA skips the transfer (``oob_mode.skip``, "nki.isa.dma_copy", SDK 2.33).
"""

from __future__ import annotations

from typing import Any

from .backend import nisa, nl
from .tiles import FP32, sbuf


def entry(tile: Any, static: int, base: Any, scale: int) -> Any:
    """``tile[0, base·scale + static]`` as a [1, 1] view: a static slice for a trace-time ``base``, else a run-time
    offset (``.ap(scalar_offset=)`` on the tile as allocated)."""
    if isinstance(base, int):
        at = base * scale + static
        return tile[:, at : at + 1]
    return tile.ap(pattern=[[tile.shape[1], 1], [1, 1]], offset=static, scalar_offset=base * scale, indirect_dim=1)


def request_rows(
    state_indices: Any, num_accepted_tokens: Any, n_req: int, tokens: int, slots: int, outputs: bool = True
) -> tuple[Any, ...]:
    """Every request's rows, computed on device once per launch before any request's work (so no request's
    loads wait on another's arithmetic), as int32 [1, ·] tiles: the indices as given ([1, slots·width]), and per
    request n ([1, slots] each) the row it reads (``state_indices[n, num_accepted_tokens[n] - 1]`` with the count
    clamped to [1, T], so a padding request's unchecked count still picks one of its -1s), the row of ``out`` it
    writes (n when live, else -1) and the row its zeros go to (n when padding, else -1). Slots past N (a compiled
    loop's last group) hold -1 everywhere. A -1 row is outside its tensor: the transfers it addresses are
    skipped. ``outputs=False``: only the indices and the rows read (a kernel that writes every request's row of
    its output itself); the read rows' tile only with ``num_accepted_tokens`` (else they are the indices)."""
    width = state_indices.size // n_req
    count = 4 if outputs else 1 + (num_accepted_tokens is not None)
    tiles = [sbuf((1, slots * width), nl.int32), *(sbuf((1, slots), nl.int32) for _ in range(count - 1))]
    if slots > n_req:  # only the tails: the index load must not wait on a memset of its own tile
        for tile, per_request in zip(tiles, (width, 1, 1, 1)[:count], strict=True):
            nisa.memset(dst=tile[:, n_req * per_request :], value=-1)
    indices = tiles[0][:, 0 : n_req * width]
    nisa.dma_copy(dst=indices, src=state_indices.ap(pattern=[[n_req * width, 1], [1, n_req * width]], offset=0))
    if count == 1:
        return tuple(tiles)
    as_float = sbuf((1, n_req, width), FP32)
    nisa.tensor_copy(dst=as_float.reshape((1, n_req * width)), src=indices)
    read = sbuf((1, n_req), FP32)
    if num_accepted_tokens is None:
        nisa.tensor_copy(dst=read, src=as_float[:, :, 0])
    else:
        accepted = sbuf((1, n_req), nl.int32)
        nisa.dma_copy(dst=accepted, src=num_accepted_tokens.ap(pattern=[[n_req, 1], [1, n_req]], offset=0))
        position = sbuf((1, n_req), FP32)  # clamp(count, 1, T) - 1
        nisa.tensor_scalar(dst=position, data=accepted, op0=nl.maximum, operand0=1.0, op1=nl.minimum,
                           operand1=float(tokens))  # fmt: skip
        nisa.tensor_scalar(dst=position, data=position, op0=nl.subtract, operand0=1.0)
        token = sbuf((1, n_req, width), FP32)
        nisa.iota(dst=token, pattern=[[0, n_req], [1, width]], offset=0, channel_multiplier=0)
        chosen = sbuf((1, n_req, width), FP32)
        nisa.tensor_tensor(dst=chosen, data1=token, data2=position.expand_dim(2).broadcast(2, width), op=nl.equal)
        nisa.tensor_tensor(dst=chosen, data1=chosen, data2=as_float, op=nl.multiply)
        nisa.tensor_reduce(dst=read, op=nl.add, data=chosen, axis=2)
    if not outputs:
        nisa.tensor_copy(dst=tiles[1][:, 0:n_req], src=read)
        return tuple(tiles)
    number = sbuf((1, n_req), FP32)  # n + 1
    nisa.iota(dst=number, pattern=[[1, n_req]], offset=1, channel_multiplier=0)
    live_number = sbuf((1, n_req), FP32)  # (read >= 0) · (n + 1)
    nisa.scalar_tensor_tensor(dst=live_number, data=read, op0=nl.greater_equal, operand0=0.0, op1=nl.multiply,
                              operand1=number)  # fmt: skip
    nisa.tensor_copy(dst=tiles[1][:, 0:n_req], src=read)
    nisa.tensor_scalar(dst=tiles[2][:, 0:n_req], data=live_number, op0=nl.subtract, operand0=1.0)
    padding_number = sbuf((1, n_req), FP32)
    nisa.tensor_tensor(dst=padding_number, data1=number, data2=live_number, op=nl.subtract)
    nisa.tensor_scalar(dst=tiles[3][:, 0:n_req], data=padding_number, op0=nl.subtract, operand0=1.0)
    return tuple(tiles)
