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

from ..common.backend import nki, nl
from ..common.kernel_assert import assert_valid_call, kernel_assert
from ..common.pool_rows import pool_view
from ..common.request_rows import entry, request_rows
from ..common.state_layout import kmajor_view
from .pipeline import Request, emit_requests
from .recurrence import Constants, Gates, OutputNorm, Shapes, allocate_out, zero_rows
from .request_loop import program_share

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


def step_row_tables(state_pool: Any, state_indices: Any, num_accepted_tokens: Any, n_req: int,
                    tokens: int) -> tuple[Any, ...]:  # fmt: skip
    """The requests' rows a one-program ``gdn_step`` on a K-major [P, Hv, Dk, Dv] pool would make first
    (``request_rows``), made now: its ``row_tables``."""
    share = program_share(n_req, REQUESTS_PER_ITERATION)
    return request_rows(state_indices, num_accepted_tokens, n_req, tokens, share.slots, state_pool.shape[0])


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
    norm: OutputNorm | None = None,
    state_v_first: bool = False,
    state_row_stride: int | None = None,
    row_tables: tuple[Any, ...] | None = None,
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
        norm (OutputNorm): optional, the gated RMSNorm folded into the output stage (``gdn_tkg``'s; z [N, T, Hv,
            Dv] in query's dtype, its own allocation): out = RMSNorm(o)·norm_weight·silu(z). Kernel-internal, for
            ``block.step.gdn_block_step``; ``decode_step`` passes none.
        state_v_first (bool): trace-time; the pool is V-major [P, Hv, Dv, Dk] (SGLang's and vLLM's newer pools,
            FLA's ``state_v_first``), read and written in place by the state tiles' DMAs
            (``common.state_layout``); the rules and the math see its K-major view.
        state_row_stride (int): trace-time; the pool's rows lie this many elements apart, each row dense (vLLM's
            hybrid cache, ``common.pool_rows``): ``state_pool`` is then the pool's span, 1-D fp32 of
            (P − 1)·state_row_stride + Hv·Dk·Dv elements, of which only the named rows are read or written.
        row_tables (tuple): optional, the requests' rows made earlier by ``step_row_tables`` on the same indices
            (the fused block makes them before its in_proj, whose and the conv's stores would otherwise hold their
            DMA); None: made here. Kernel-internal, one program only.

    Returns:
        tuple: ``out`` [N, T, Hv, Dv] in query's dtype, and ``state_pool`` (the same buffer, updated).

    Notes:
        Trace-time rules (``gdn_ref.contract.validate_step``) stop the trace before anything is allocated; the
        index VALUES are device data the trace never sees — ``gdn_nki.decode_step`` validates them on the host before
        launching. Requests are split over the launch grid (``gdn_step[n]``), each program's share a compiled loop
        of groups of ``REQUESTS_PER_ITERATION`` (one group: no loop).
    """
    hv, dk, dv = value.shape[2], query.shape[3], value.shape[3]
    pool = pool_view(state_pool, state_row_stride, (hv, dv, dk) if state_v_first else (hv, dk, dv))
    tensors = step_tensors(query, key, value, kmajor_view(pool, bool(state_v_first)), state_indices,
                           num_accepted_tokens, g_log, beta, a, b, A_log, dt_bias)  # fmt: skip
    assert_valid_call(validate_step(tensors, scale, use_qk_l2norm, host=False))
    n_req, tokens, hk, _ = query.shape
    shapes = Shapes(requests=n_req, tokens=tokens, key_heads=hk, value_heads=hv, dk=dk, dv=dv)
    gates = Gates(g_log=g_log, beta=beta, a=a, b=b, A_log=A_log, dt_bias=dt_bias)
    out = allocate_out(shapes, query.dtype)
    share = program_share(n_req, REQUESTS_PER_ITERATION)
    if share is None:  # fewer requests than programs: this one has none (N = 1 at launch grid 2)
        return out, state_pool
    if row_tables is None:
        rows = request_rows(state_indices, num_accepted_tokens, n_req, tokens, share.slots, pool.shape[0])
    else:
        kernel_assert(nl.num_programs(0) == 1, "row_tables are one program's. Fix: launch gdn_step itself")
        rows = row_tables
    per_token = len(state_indices.shape) == 2
    # The selection tiles after the first requests' row loads (``LayoutConstants.finish``), except for one request
    # in chunk form: its preparation, on GpSimd right after its loads, is then the launch's critical path.
    consts = Constants(shapes, gates, norm, defer=tokens == 1 or per_token or share.group > 1)
    if share.trips > 1:  # once, not in every iteration of the compiled loop
        consts.tiles.finish()
    width = tokens if per_token else 1
    zeros = zero_rows(shapes, out.dtype)

    def requests(base: Any) -> Any:  # the iteration's requests
        for static, n in share.members(base):
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
                          zeros=(pad_row, zeros), v_first=bool(state_v_first),
                          row_stride=state_row_stride)  # fmt: skip

    def iteration(g: Any) -> None:
        emit_requests(shapes, (query, key, value, out), gates, consts, requests(share.base(g)), float(scale),
                      use_qk_l2norm, norm=norm)  # fmt: skip

    share.run(iteration)
    return out, state_pool
