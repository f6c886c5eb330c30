"""Every request's pool rows, computed on device once per launch: what a decode kernel on a pool addressed by
device indices (``tkg.step``, ``conv.step``) reads its rows from.

The indices are device data the trace never sees: a request's rows are ``NkiScalar``s (``nki.isa.scalar_load`` of
an int32 tile, ``tiles.load_scalar``) used as the ``scalar_offset`` of ``.ap`` ("NKI Scalar Values",
``nki.isa.scalar_load``, SDK 2.33); a row a request does not have is one past its tensor's end, and the DMA skips
the transfer (``oob_mode.skip``, "nki.isa.dma_copy", SDK 2.33).
"""

from __future__ import annotations

from typing import Any

from .backend import nisa, nl
from .tiles import FP32, load_scalar, sbuf

INT32 = nl.int32


def entry(tile: Any, static: int, base: Any, scale: int) -> Any:
    """``tile[0, base·scale + static]`` loaded as an ``NkiScalar``: a static slice for a trace-time ``base``, else a
    run-time offset (``.ap(scalar_offset=)`` on the tile as allocated) copied into a fixed tile first
    (``tiles.load_scalar``)."""
    if isinstance(base, int):
        at = base * scale + static
        return nisa.scalar_load(tile[:, at : at + 1])
    view = tile.ap(pattern=[[tile.shape[1], 1], [1, 1]], offset=static, scalar_offset=base * scale, indirect_dim=1)
    return load_scalar(view, at_run_time=True)


def request_rows(
    state_indices: Any,
    num_accepted_tokens: Any,
    n_req: int,
    tokens: int,
    slots: int,
    pool_rows: int,
    outputs: bool = True,
) -> tuple[Any, ...]:
    """Every request's rows, computed on device once per launch before any request's work (so no request's
    loads wait on another's arithmetic), as int32 [1, ·] tiles: the pool rows of the indices ([1, slots·width]),
    and per request n ([1, slots] each) the row it reads (``state_indices[n, num_accepted_tokens[n] - 1]`` with the
    count clamped to [1, T], so a padding request's unchecked count still picks one of its -1s), the row of ``out``
    it writes (n when live) and the row its zeros go to (n when padding). A padding index (-1), and every row a
    request does not have (its ``out`` row when padding, its zeros' row when live; every row of the slots past N,
    a compiled loop's last group) is the row one past its tensor's end (``pool_rows``, N): outside the tensor, so
    the transfers it addresses are skipped (``oob_mode.skip``). Past the end, not -1: the pages say a runtime
    out-of-bounds access is skipped, never how a negative offset is read (docs/nki-sources.md §6.26).
    ``outputs=False``: only the indices and the rows read (a kernel that writes every request's row of its output
    itself, ``conv.step``); the read rows' tile only with ``num_accepted_tokens`` (else they are the indices)."""
    width = state_indices.size // n_req
    count = 4 if outputs else 1 + (num_accepted_tokens is not None)
    tiles = [sbuf((1, slots * width), INT32), *(sbuf((1, slots), INT32) for _ in range(count - 1))]
    if slots > n_req:  # only the tails: the index load must not wait on a memset of its own tile
        ends = (pool_rows, pool_rows, n_req, n_req)[:count]
        for tile, per_request, end in zip(tiles, (width, 1, 1, 1)[:count], ends, strict=True):
            nisa.memset(dst=tile[:, n_req * per_request :], value=end)
    given = sbuf((1, n_req * width), INT32)  # the indices as given (-1: padding)
    nisa.dma_copy(dst=given, src=state_indices.ap(pattern=[[n_req * width, 1], [1, n_req * width]], offset=0))
    _past_the_end(tiles[0][:, 0 : n_req * width], given, pool_rows)
    if count == 1:
        return tuple(tiles)
    as_float = sbuf((1, n_req, width), FP32)
    nisa.tensor_copy(dst=as_float.reshape((1, n_req * width)), src=given)
    if num_accepted_tokens is None:  # the first index of each request, read in place (no copy to wait on)
        read = as_float[:, :, 0]
    else:
        read = sbuf((1, n_req), FP32)
        position = sbuf((1, n_req), FP32)
        _accepted_positions(position, num_accepted_tokens, n_req, tokens)
        token = sbuf((1, n_req, width), FP32)
        nisa.iota(dst=token, pattern=[[0, n_req], [1, width]], offset=0, channel_multiplier=0)
        chosen = sbuf((1, n_req, width), FP32)
        nisa.tensor_tensor(dst=chosen, data1=token, data2=position.expand_dim(2).broadcast(2, width), op=nl.equal)
        nisa.tensor_tensor(dst=chosen, data1=chosen, data2=as_float, op=nl.multiply)
        nisa.tensor_reduce(dst=read, op=nl.add, data=chosen, axis=2)
    if not outputs:
        _past_the_end(tiles[1][:, 0:n_req], read, pool_rows)
        return tuple(tiles)
    number = sbuf((1, n_req), FP32)  # n + 1
    nisa.iota(dst=number, pattern=[[1, n_req]], offset=1, channel_multiplier=0)
    live_number = sbuf((1, n_req), FP32)  # (read >= 0) · (n + 1)
    nisa.scalar_tensor_tensor(dst=live_number, data=read, op0=nl.greater_equal, operand0=0.0, op1=nl.multiply,
                              operand1=number)  # fmt: skip
    padding_number = sbuf((1, n_req), FP32)  # (read < 0) · (n + 1), beside live_number: neither waits on the other
    nisa.scalar_tensor_tensor(dst=padding_number, data=read, op0=nl.less, operand0=0.0, op1=nl.multiply,
                              operand1=number)  # fmt: skip
    if num_accepted_tokens is not None:  # the row the loads need first (without the count: the index, ``tiles[0]``)
        _past_the_end(tiles[1][:, 0:n_req], read, pool_rows)
    # own − 1 is n where the row is the request's, else -1: moved past the end there, N
    _past_the_end(tiles[2][:, 0:n_req], live_number, n_req, minus=1.0)
    _past_the_end(tiles[3][:, 0:n_req], padding_number, n_req, minus=1.0)
    if num_accepted_tokens is None:
        _past_the_end(tiles[1][:, 0:n_req], read, pool_rows)
    return tuple(tiles)


def accepted_offsets(num_accepted_tokens: Any, n_req: int, tokens: int, slots: int) -> Any:
    """[1, slots] int32: request n's ``clamp(num_accepted_tokens[n], 1, T) − 1`` (0 past N): the offset of vLLM's
    in-row form (``conv.step``), clamped as ``request_rows``' read rows are, so a padding request's unchecked count
    addresses inside its (skipped) row."""
    offsets = sbuf((1, slots), INT32)
    if slots > n_req:
        nisa.memset(dst=offsets[:, n_req:], value=0)
    _accepted_positions(offsets[:, 0:n_req], num_accepted_tokens, n_req, tokens)
    return offsets


def _accepted_positions(dst: Any, num_accepted_tokens: Any, n_req: int, tokens: int) -> None:
    """``dst`` [1, N] = clamp(num_accepted_tokens, 1, T) − 1, loaded from HBM (exact small integers)."""
    accepted = sbuf((1, n_req), INT32)
    nisa.dma_copy(dst=accepted, src=num_accepted_tokens.ap(pattern=[[n_req, 1], [1, n_req]], offset=0))
    nisa.tensor_scalar(dst=dst, data=accepted, op0=nl.maximum, operand0=1.0, op1=nl.minimum, operand1=float(tokens))
    nisa.tensor_scalar(dst=dst, data=dst, op0=nl.subtract, operand0=1.0)


def _past_the_end(dst: Any, rows: Any, end: int, minus: float = 0.0) -> None:
    """``dst`` = ``rows − minus`` (fp32, exact integers in [-1, end)) with -1 moved to ``end``, the row one past the
    tensor's last: ``(rows − minus + end + 1) mod (end + 1)``, one instruction (the sum is never negative)."""
    nisa.tensor_scalar(dst=dst, data=rows, op0=nl.add, operand0=float(end + 1) - minus, op1=nl.mod,
                       operand1=float(end + 1))  # fmt: skip
