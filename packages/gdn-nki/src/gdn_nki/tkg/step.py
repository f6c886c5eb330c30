"""``gdn_step``: the serving decode / speculative-verification step on a state pool addressed on device.

N requests × T new tokens each (T = 1: decode; T > 1: verifying T draft tokens, or multi-token prediction), GQA
native, the fp32 state pool [P, Hv, Dk, Dv] updated in place. Each request's pool row comes from
``state_indices`` *on device*: one compiled program serves every batch of the same (N, T) whatever rows it names.

- ``state_indices`` [N]: request n reads row ``state_indices[n]`` and writes its state after the T tokens back
  there.
- ``state_indices`` [N, T] (vLLM's form): the state after token t is written to row ``state_indices[n, t]`` — every
  draft token's state kept, so a rejected draft is rolled back by resuming from the accepted one; request n reads
  row ``state_indices[n, num_accepted_tokens[n] - 1]`` (row ``state_indices[n, 0]`` without num_accepted_tokens).
- A request whose read index is -1 is padding: on device its rows become the row one past the pool's end, so every
  pool transfer it addresses is outside the pool and skipped by the DMA (``oob_mode.skip``): it reads and writes
  nothing of the pool; its outputs are zeros.

The requests run as a compiled loop (``nl.fori_loop``, "NKI Loops" and ``nki.language.fori_loop``, SDK 2.33) of
``REQUESTS_PER_ITERATION`` requests an iteration, the request index a run-time value: the program does not grow
with N.

Gating is precomputed (``g_log``, ``beta``) or fused (``a``, ``b``, ``A_log``, ``dt_bias``: g = −exp(A_log)·
softplus(a + dt_bias), β = sigmoid(b)); ``use_qk_l2norm`` L2-normalizes q and k on device (eps 1e-6).
"""

from __future__ import annotations

from typing import Any

from gdn_ref.contract import validate_step

from ..common.backend import nisa, nki, nl
from ..common.kernel_assert import assert_valid_call
from ..common.tiles import FP32, load_scalar, sbuf
from .pipeline import Request, emit_requests
from .recurrence import INT32, Constants, Gates, Shapes, allocate_out, zero_rows

# Requests one iteration of the compiled request loop runs (the program holds their instructions once, whatever
# N): the software pipeline of ``decode_pipeline.emit_requests`` fills and drains within an iteration, so more requests
# per iteration amortize that better and make the program larger (~170 instructions a request at Qwen3-Next's
# heads, T = 1; PERFORMANCE.md, "Decode", has 8 against 16).
REQUESTS_PER_ITERATION = 16


def step_tensors(query, key, value, state_pool, state_indices, num_accepted_tokens, g_log, beta, a, b, A_log,
                 dt_bias) -> dict[str, Any]:  # fmt: skip
    """The step's tensors by the names ``gdn_ref.contract.STEP_SPECS`` gives them."""
    return dict(query=query, key=key, value=value, g_log=g_log, beta=beta, a=a, b=b, A_log=A_log, dt_bias=dt_bias,
                state_pool=state_pool, state_indices=state_indices, num_accepted_tokens=num_accepted_tokens)  # fmt: skip


@nki.jit
def gdn_step(
    query: Any,
    key: Any,
    value: Any,
    state_pool: Any,
    state_indices: Any,
    num_accepted_tokens: Any = None,
    g_log: Any = None,
    beta: Any = None,
    a: Any = None,
    b: Any = None,
    A_log: Any = None,
    dt_bias: Any = None,
    scale: float = 1.0,
    use_qk_l2norm: bool = False,
) -> tuple[Any, Any]:
    """Decode / verify T tokens of N requests on a state pool addressed by device indices.

    Dimensions:
        N: requests. T: new tokens per request. Hk, Hv: key and value heads (value head h reads key head
        h // (Hv/Hk)). Dk, Dv <= 128. P: rows of the state pool.

    Args:
        query, key (nl.NkiTensor): [N, T, Hk, Dk] @ HBM, token-major, float32 or bfloat16 (the I/O dtype).
        value (nl.NkiTensor): [N, T, Hv, Dv] @ HBM, query's dtype.
        state_pool (nl.NkiTensor): [P, Hv, Dk, Dv] fp32 @ HBM, MUTABLE: only the rows named by live requests are
            read or written.
        state_indices (nl.NkiTensor): [N] or [N, T] int32 @ HBM: pool rows (module docstring); -1 = padding.
        num_accepted_tokens (nl.NkiTensor): optional [N] int32 @ HBM, with [N, T] indices: the row to resume from.
        g_log, beta (nl.NkiTensor): [N, T, Hv] fp32 @ HBM, precomputed gating; or
        a, b (nl.NkiTensor): [N, T, Hv] fp32 @ HBM raw gate inputs, with A_log, dt_bias [Hv] fp32: fused gating.
        scale (float): multiplies every output (typically Dk**-0.5).
        use_qk_l2norm (bool): L2-normalize q and k on device first.

    Returns:
        tuple: ``out`` [N, T, Hv, Dv] in query's dtype, and ``state_pool`` (the same buffer, updated).

    Notes:
        Trace-time rules (``gdn_ref.contract.validate_step``) stop the trace before anything is allocated; the
        index VALUES are device data the trace never sees — ``gdn_nki.decode_step`` validates them on the host before
        launching. Requests are split over the launch grid (``gdn_step[n]``), each program's share a compiled loop
        of groups of ``REQUESTS_PER_ITERATION`` (one group: no loop).
    """
    tensors = step_tensors(query, key, value, state_pool, state_indices, num_accepted_tokens, g_log, beta, a, b,
                           A_log, dt_bias)  # fmt: skip
    assert_valid_call(validate_step(tensors, scale, use_qk_l2norm, host=False))
    n_req, tokens, hk, dk = query.shape
    hv, dv = value.shape[2], value.shape[3]
    shapes = Shapes(requests=n_req, tokens=tokens, key_heads=hk, value_heads=hv, dk=dk, dv=dv)
    gates = Gates(g_log=g_log, beta=beta, a=a, b=b, A_log=A_log, dt_bias=dt_bias)
    out = allocate_out(shapes, query.dtype)
    consts = Constants(shapes, gates, None)
    per_token = len(state_indices.shape) == 2
    width = tokens if per_token else 1
    zeros = zero_rows(shapes, out.dtype)

    first, step = nl.program_id(0), nl.num_programs(0)
    count = len(range(first, n_req, step))  # this program's requests: first, first + step, ...
    if count == 0:  # fewer requests than programs: this one has none (N = 1 at launch grid 2)
        return out, state_pool
    group = min(REQUESTS_PER_ITERATION, count)
    trips = -(-count // group)
    # Every slot's row exists; those past N are past their tensor's end (skipped). A loop gets one spare slot, so that its program
    # (the tails' memsets included) is the same whatever N.
    slots = max(n_req, first + (trips * group - 1) * step + 1) + (trips > 1)
    rows = _request_rows(state_indices, num_accepted_tokens, n_req, tokens, slots, state_pool.shape[0])

    def entry(tile: Any, static: int, base: Any, scale: int) -> Any:  # tile[0, base·scale + static], loaded
        if isinstance(base, int):
            at = base * scale + static
            return nisa.scalar_load(tile[:, at : at + 1])
        view = tile.ap(pattern=[[tile.shape[1], 1], [1, 1]], offset=static, scalar_offset=base * scale, indirect_dim=1)
        return load_scalar(view, at_run_time=True)

    def requests(base: Any) -> Any:  # the group of requests base + first + j·step, j < group
        for j in range(group):
            static = first + j * step
            n = static if isinstance(base, int) else base + static
            # The row the loads need first; with num_accepted_tokens it is computed, else it is the index itself.
            if num_accepted_tokens is None:
                read_row = entry(rows[0], static * width, base, width)
            else:
                read_row = entry(rows[1], static, base, 1)
            token_rows = None
            if per_token:
                token_rows = tuple(entry(rows[0], static * width + t, base, width) for t in range(tokens))
            out_row, pad_row = (entry(tile, static, base, 1) for tile in rows[2:])
            yield Request(n=n, source=state_pool, target=state_pool, read_row=read_row,
                          final_row=None if per_token else read_row, token_rows=token_rows, out_row=out_row,
                          zeros=(pad_row, zeros))  # fmt: skip

    def iteration(g: Any) -> None:
        base = g * (group * step)
        emit_requests(shapes, (query, key, value, out), gates, consts, requests(base), float(scale), use_qk_l2norm)

    if trips == 1:
        iteration(0)
    else:
        nl.fori_loop(0, trips, iteration)
    return out, state_pool


def _request_rows(
    state_indices: Any, num_accepted_tokens: Any, n_req: int, tokens: int, slots: int, pool_rows: int
) -> tuple[Any, ...]:
    """Every request's rows, computed on device once per launch before any request's work (so no request's
    loads wait on another's arithmetic), as int32 [1, ·] tiles: the pool rows of the indices ([1, slots·width]),
    and per request n ([1, slots] each) the row it reads (``state_indices[n, num_accepted_tokens[n] - 1]`` with the
    count clamped to [1, T], so a padding request's unchecked count still picks one of its -1s), the row of ``out``
    it writes (n when live) and the row its zeros go to (n when padding). A padding index (-1), and every row a
    request does not have (its ``out`` row when padding, its zeros' row when live; every row of the slots past N,
    a compiled loop's last group) is the row one past its tensor's end (``pool_rows``, N): outside the tensor, so
    the transfers it addresses are skipped (``oob_mode.skip``). Past the end, not -1: the pages say a runtime
    out-of-bounds access is skipped, never how a negative offset is read (docs/nki-sources.md §6.26)."""
    width = state_indices.size // n_req
    tiles = [sbuf((1, slots * width), INT32), *(sbuf((1, slots), INT32) for _ in range(3))]
    if slots > n_req:  # only the tails: the index load must not wait on a memset of its own tile
        for tile, per_request, end in zip(tiles, (width, 1, 1, 1), (pool_rows, pool_rows, n_req, n_req), strict=True):
            nisa.memset(dst=tile[:, n_req * per_request :], value=end)
    given = sbuf((1, n_req * width), INT32)  # the indices as given (-1: padding)
    nisa.dma_copy(dst=given, src=state_indices.ap(pattern=[[n_req * width, 1], [1, n_req * width]], offset=0))
    _past_the_end(tiles[0][:, 0 : n_req * width], given, pool_rows)
    as_float = sbuf((1, n_req, width), FP32)
    nisa.tensor_copy(dst=as_float.reshape((1, n_req * width)), src=given)
    read = sbuf((1, n_req), FP32)
    if num_accepted_tokens is None:
        nisa.tensor_copy(dst=read, src=as_float[:, :, 0])
    else:
        accepted = sbuf((1, n_req), INT32)
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
    number = sbuf((1, n_req), FP32)  # n + 1
    nisa.iota(dst=number, pattern=[[1, n_req]], offset=1, channel_multiplier=0)
    live_number = sbuf((1, n_req), FP32)  # (read >= 0) · (n + 1)
    nisa.scalar_tensor_tensor(dst=live_number, data=read, op0=nl.greater_equal, operand0=0.0, op1=nl.multiply,
                              operand1=number)  # fmt: skip
    _past_the_end(tiles[1][:, 0:n_req], read, pool_rows)
    padding_number = sbuf((1, n_req), FP32)  # (read < 0) · (n + 1)
    nisa.tensor_tensor(dst=padding_number, data1=number, data2=live_number, op=nl.subtract)
    # own − 1 is n where the row is the request's, else -1: moved past the end there, N
    _past_the_end(tiles[2][:, 0:n_req], live_number, n_req, minus=1.0)
    _past_the_end(tiles[3][:, 0:n_req], padding_number, n_req, minus=1.0)
    return tuple(tiles)


def _past_the_end(dst: Any, rows: Any, end: int, minus: float = 0.0) -> None:
    """``dst`` = ``rows − minus`` (fp32, exact integers in [-1, end)) with -1 moved to ``end``, the row one past the
    tensor's last: ``(rows − minus + end + 1) mod (end + 1)``, one instruction (the sum is never negative)."""
    nisa.tensor_scalar(dst=dst, data=rows, op0=nl.add, operand0=float(end + 1) - minus, op1=nl.mod,
                       operand1=float(end + 1))  # fmt: skip
