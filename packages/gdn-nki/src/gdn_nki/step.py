"""``gdn_step``: the serving decode / speculative-verification step on a state pool addressed on device.

N requests × T new tokens each (T = 1: decode; T > 1: verifying T draft tokens, or multi-token prediction), GQA
native, the fp32 state pool [P, Hv, Dk, Dv] updated in place. Each request's pool row comes from
``state_indices`` *on device*: one compiled program serves every batch of the same (N, T) whatever rows it names.

- ``state_indices`` [N]: request n reads row ``state_indices[n]`` and writes its state after the T tokens back
  there.
- ``state_indices`` [N, T] (vLLM's form): the state after token t is written to row ``state_indices[n, t]`` — every
  draft token's state kept, so a rejected draft is rolled back by resuming from the accepted one; request n reads
  row ``state_indices[n, num_accepted_tokens[n] - 1]`` (row ``state_indices[n, 0]`` without num_accepted_tokens).
- A request whose read index is -1 is padding: every pool transfer it addresses is outside the pool and skipped by
  the DMA (``oob_mode.skip``), so it reads and writes nothing of the pool; its outputs are zeros.

Gating is precomputed (``g_log``, ``beta``) or fused (``a``, ``b``, ``A_log``, ``dt_bias``: g = −exp(A_log)·
softplus(a + dt_bias), β = sigmoid(b)); ``use_qk_l2norm`` L2-normalizes q and k on device (eps 1e-6).
"""

from __future__ import annotations

from typing import Any

from gdn_ref.contract import validate_step

from .backend import nisa, nki, nl
from .decode import (
    INT32,
    Constants,
    Gates,
    Request,
    Shapes,
    allocate_out,
    emit_requests,
    load_scalar,
    zero_outputs,
    zero_row,
)
from .kernel_assert import assert_valid_call
from .tiles import sbuf


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
        index VALUES are device data the trace never sees — ``gdn_nki.decode`` validates them on the host before
        launching. Requests are split over the launch grid (``gdn_step[n]``).
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
    zeros = zero_row(shapes, out.dtype)

    def requests() -> Any:
        for n in range(nl.program_id(0), n_req, nl.num_programs(0)):
            indices = sbuf((1, width), INT32)
            nisa.dma_copy(dst=indices, src=state_indices.ap(pattern=[[width, 1], [1, width]], offset=n * width))
            read_tile = _read_index(state_indices, num_accepted_tokens, indices, n, tokens)
            read_row = load_scalar(read_tile)
            zero_outputs(out, _row_if(read_tile, n, live=False), zeros)
            out_row = _row_if(read_tile, n, live=True)
            if per_token:
                token_rows = tuple(load_scalar(indices[:, t : t + 1]) for t in range(tokens))
                yield Request(n=n, source=state_pool, target=state_pool, read_row=read_row, token_rows=token_rows,
                              out_row=out_row)  # fmt: skip
            else:
                yield Request(n=n, source=state_pool, target=state_pool, read_row=read_row, final_row=read_row,
                              out_row=out_row)  # fmt: skip

    emit_requests(shapes, (query, key, value, out), gates, consts, requests(), float(scale), use_qk_l2norm)
    return out, state_pool


def _read_index(state_indices: Any, num_accepted_tokens: Any, indices: Any, n: int, tokens: int) -> Any:
    """The [1, 1] int32 tile holding request n's read row: ``indices[0]``, or with ``num_accepted_tokens`` the
    entry ``num_accepted_tokens[n] - 1`` of its row, gathered by a run-time offset (the count clamped to [1, T] on
    device, so that a padding request's unchecked count still addresses its own row)."""
    if num_accepted_tokens is None:
        return indices[:, 0:1]
    accepted = sbuf((1, 1), INT32)
    nisa.dma_copy(dst=accepted, src=num_accepted_tokens.ap(pattern=[[1, 1], [1, 1]], offset=n))
    nisa.tensor_scalar(dst=accepted, data=accepted, op0=nl.maximum, operand0=1, op1=nl.minimum, operand1=tokens)
    nisa.tensor_scalar(dst=accepted, data=accepted, op0=nl.subtract, operand0=1)  # the position, 0-based
    position = nisa.scalar_load(accepted)
    read_tile = sbuf((1, 1), INT32)
    entry = state_indices.ap(pattern=[[1, 1], [1, 1]], offset=n * tokens, scalar_offset=position, indirect_dim=1)
    nisa.dma_copy(dst=read_tile, src=entry)
    return read_tile


def _row_if(read_tile: Any, n: int, live: bool) -> Any:
    """Row n of ``out`` as a run-time value when request n is live (``live``) or padding (``not live``), else -1
    (outside ``out``: the transfers it addresses are skipped). The [1, 1] int32 ``read_tile`` holds the request's
    read row, -1 for padding."""
    flag = sbuf((1, 1), INT32)
    nisa.tensor_scalar(dst=flag, data=read_tile, op0=nl.greater_equal if live else nl.less, operand0=0,
                       op1=nl.multiply, operand1=n + 1)  # fmt: skip
    nisa.tensor_scalar(dst=flag, data=flag, op0=nl.subtract, operand0=1)
    return nisa.scalar_load(flag)
