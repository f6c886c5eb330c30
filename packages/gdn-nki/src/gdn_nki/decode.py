"""The decode recurrence on device: T tokens of one request from a state row, every head, in plain NKI.

Both decode kernels issue their work here: ``gdn_tkg`` (AWS's fused single-token step, ``tkg.py``) and the serving
step on a state pool (``step.py``). A request's state is held in SBUF as [Dk, heads·Dv] fp32 (Dk on partitions,
each head's [Dk, Dv] block contiguous, as the pool stores it) for a block of heads at a time, so on-chip memory is
bounded whatever Hv (a block's token rows fill one PSUM bank: ``heads_per_block``). Per token and value head h
(key head j = h // (Hv/Hk)), with α = exp(g), q already scaled and c_j = k_jᵀ q_j:

    [r; w] = [α_h β_h k_j, c_j α_h β_h k_j − α_h q_j]ᵀ S_h       one matmul against the old state, [2, Dv]
    [u; o] = [β_h v_h; c_j β_h v_h] − [r; w]                      one subtract for a block of heads
    S_h    = α_h S_h + k_j uᵀ                                     outer product (tensor engine) + one update

so u = β(v − α kᵀS) and o = α qᵀS + c u = qᵀ(α S + k uᵀ), the read after the write, without reading the new state
again: per head two matmuls and one [Dk, Dv] vector instruction, the gates riding on the matmul's stationary. That is
``gdn_ref.recurrent`` token by token (decay, delta against the decayed state, rank-1 write, read after the
write). All arithmetic is fp32 whatever the compute dtype (the DMA widens bf16 inputs and narrows ``out``),
as HF's and AWS's references compute decode.

Run-time addressing: a pool row is an ``NkiScalar`` (``nki.isa.scalar_load`` of an index tile), used only as the
``scalar_offset`` of ``.ap`` on the pool ("NKI Access Patterns" and ``nki.isa.scalar_load``, SDK 2.33); a padding
request's work sits in an ``nl.fori_loop`` whose trip count (0 or 1) is itself loaded from device memory, so it
reads and writes nothing of the pool ("NKI Dynamic Loops"; ``nl.fori_loop`` with a 32-bit NkiScalar bound,
SDK 2.33). No index is ever a Python value at trace time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gdn_ref.decode import L2NORM_EPS, RMS_NORM_EPS

from .backend import nisa, nl
from .engines import GPSIMD
from .tiles import FP32, matmul, psum, sbuf, transpose

# Value heads per state block: the heads whose token rows (kᵀS, the outputs) fill one fp32 PSUM bank per partition
# (2 KiB = 512 fp32; a PSUM tile's free size is at most a bank). A block's state is heads·Dv·4 bytes per partition
# (2 KiB for Qwen3-Next's Dv = 128), two blocks live at a time (the next one is loaded while this one computes):
# on-chip memory is bounded whatever Hv and N.
PSUM_BANK_FP32 = 512
INT32 = nl.int32


def heads_per_block(value_heads: int, dv: int) -> int:
    """Value heads per state block (at least one)."""
    return max(1, min(value_heads, PSUM_BANK_FP32 // dv))


@dataclass(frozen=True)
class Shapes:
    """The sizes of a decode launch: requests, tokens each, key/value heads, head dims."""

    requests: int
    tokens: int
    key_heads: int
    value_heads: int
    dk: int
    dv: int

    @property
    def ratio(self) -> int:
        return self.value_heads // self.key_heads


@dataclass(frozen=True)
class Gates:
    """Where a launch's gates come from: precomputed (``g_log``, ``beta`` [N, T, Hv]) or fused (``a``, ``b``
    [N, T, Hv] raw, ``A_log``, ``dt_bias`` [Hv])."""

    g_log: Any = None
    beta: Any = None
    a: Any = None
    b: Any = None
    A_log: Any = None
    dt_bias: Any = None

    @property
    def fused(self) -> bool:
        return self.a is not None


@dataclass(frozen=True)
class OutputNorm:
    """The gated RMSNorm ``gdn_tkg`` folds into its output: ``z`` [N, T, Hv, Dv] (compute dtype) and
    ``norm_weight`` [Dv] fp32."""

    z: Any
    norm_weight: Any


def state_block(pool: Any, row: Any, shapes: Shapes, h0: int, heads: int) -> Any:
    """The [Dk, heads, Dv] HBM view of heads ``h0 .. h0 + heads`` of pool row ``row``: a trace-time int, or an
    ``NkiScalar`` used as the run-time ``scalar_offset`` (counted in rows of the pool: indirect_dim 0)."""
    head = shapes.dk * shapes.dv
    pattern = [[shapes.dv, shapes.dk], [head, heads], [1, shapes.dv]]
    if isinstance(row, int):
        return pool.ap(pattern=pattern, offset=(row * shapes.value_heads + h0) * head)
    return pool.ap(pattern=pattern, offset=h0 * head, scalar_offset=row, indirect_dim=0)


def _token_offset(shapes: Shapes, n: int, t: int, heads: int, width: int) -> int:
    """Element offset of token t of request n in a token-major [N, T, heads, width] tensor."""
    return ((n * shapes.tokens + t) * heads) * width


class Constants:
    """Per-launch tiles: ones for partition sums, eps columns, and the per-head fused-gating constants."""

    def __init__(self, shapes: Shapes, gates: Gates, norm: OutputNorm | None):
        dk, hv = shapes.dk, shapes.value_heads
        self.ones = sbuf((dk, dk), FP32)
        nisa.memset(dst=self.ones, value=1.0)
        self.l2_eps = sbuf((dk, 1), FP32)
        nisa.memset(dst=self.l2_eps, value=L2NORM_EPS)
        self.rms_eps = sbuf((1, 1), FP32)
        nisa.memset(dst=self.rms_eps, value=RMS_NORM_EPS)
        self.second_row = sbuf((2, 1), FP32)  # [0; 1]: selects partition 1 of a two-row tile
        nisa.iota(dst=self.second_row, pattern=[[0, 1]], offset=0, channel_multiplier=1)
        self.decay_rate = self.dt_bias = None
        if gates.fused:
            # exp(A_log) and dt_bias on every partition, once per launch: [Dk, Hv].
            a_log = sbuf((dk, hv), FP32)
            nisa.dma_copy(dst=a_log, src=gates.A_log.ap(pattern=[[0, dk], [1, hv]], offset=0))
            self.decay_rate = sbuf((dk, hv), FP32)
            nisa.activation(dst=self.decay_rate, op=nl.exp, data=a_log)
            self.dt_bias = sbuf((dk, hv), FP32)
            nisa.dma_copy(dst=self.dt_bias, src=gates.dt_bias.ap(pattern=[[0, dk], [1, hv]], offset=0))
        self.norm_weight = None
        if norm is not None:
            self.norm_weight = sbuf((1, shapes.dv), FP32)
            nisa.dma_copy(dst=self.norm_weight, src=norm.norm_weight.ap(pattern=[[shapes.dv, 1], [1, shapes.dv]]))


def token_gates(shapes: Shapes, gates: Gates, consts: Constants, n: int, t: int) -> tuple[Any, Any]:
    """α = exp(g) and β of every value head for token t of request n, each [Dk, Hv] fp32, equal on every
    partition (a column is a per-partition scalar for the state's rows, partition 0 one for the token's rows)."""
    dk, hv = shapes.dk, shapes.value_heads
    every_partition = [[0, dk], [1, hv]]
    offset = _token_offset(shapes, n, t, hv, 1)
    alpha, beta = sbuf((dk, hv), FP32), sbuf((dk, hv), FP32)
    if not gates.fused:
        log_decay = sbuf((dk, hv), FP32)
        nisa.dma_copy(dst=log_decay, src=gates.g_log.ap(pattern=every_partition, offset=offset))
        nisa.activation(dst=alpha, op=nl.exp, data=log_decay)
        nisa.dma_copy(dst=beta, src=gates.beta.ap(pattern=every_partition, offset=offset))
        return alpha, beta
    raw_a, raw_b = sbuf((dk, hv), FP32), sbuf((dk, hv), FP32)
    nisa.dma_copy(dst=raw_a, src=gates.a.ap(pattern=every_partition, offset=offset))
    nisa.dma_copy(dst=raw_b, src=gates.b.ap(pattern=every_partition, offset=offset))
    shifted = sbuf((dk, hv), FP32)
    nisa.tensor_tensor(dst=shifted, data1=raw_a, data2=consts.dt_bias, op=nl.add)
    softplus = sbuf((dk, hv), FP32)
    nisa.activation(dst=softplus, op=nl.softplus, data=shifted)
    rate = sbuf((dk, hv), FP32)  # exp(A_log)·softplus(a + dt_bias) = −g
    nisa.tensor_tensor(dst=rate, data1=softplus, data2=consts.decay_rate, op=nl.multiply)
    nisa.activation(dst=alpha, op=nl.exp, data=rate, scale=-1.0)
    nisa.activation(dst=beta, op=nl.sigmoid, data=raw_b)
    return alpha, beta


def token_keys(
    shapes: Shapes, query: Any, key: Any, consts: Constants, n: int, t: int, scale: float, l2norm: bool
) -> tuple[Any, Any, Any]:
    """q and k of token t of request n in fp32: q·scale and k as columns [Dk, Hk] (the matmuls' stationaries),
    k again as a row [1, Hk·Dk] on partition 0 (the outer product's stationary); L2-normalized first when asked.

    The column sums of q² and k² come from one matmul against ones, which leaves every partition holding every
    sum, so partition 0 has the key norms its row needs.
    """
    dk, hk = shapes.dk, shapes.key_heads
    offset = _token_offset(shapes, n, t, hk, dk)
    # Loaded as rows (each head's Dk contiguous in HBM) and turned into columns on the tensor engine: a column
    # load straight from HBM would move one element per descriptor.
    rows = sbuf((2 * hk, dk), FP32)  # [q_0 .. q_{Hk-1}, k_0 .. k_{Hk-1}] as rows
    as_rows = [[dk, hk], [1, dk]]
    nisa.dma_copy(dst=rows[0:hk, :], src=query.ap(pattern=as_rows, offset=offset))
    nisa.dma_copy(dst=rows[hk : 2 * hk, :], src=key.ap(pattern=as_rows, offset=offset))
    columns = sbuf((dk, 2 * hk), FP32)
    nisa.activation(dst=columns, op=nl.copy, data=transpose(rows))
    k_row = sbuf((1, hk * dk), FP32)
    nisa.dma_copy(dst=k_row, src=key.ap(pattern=[[hk * dk, 1], [1, hk * dk]], offset=offset))
    q_cols, k_cols = sbuf((dk, hk), FP32), sbuf((dk, hk), FP32)
    if not l2norm:
        nisa.tensor_scalar(dst=q_cols, data=columns[:, 0:hk], op0=nl.multiply, operand0=float(scale))
        nisa.tensor_copy(dst=k_cols, src=columns[:, hk : 2 * hk])
        return q_cols, k_cols, k_row, _overlap(q_cols, k_cols, consts)
    squares = sbuf((dk, 2 * hk), FP32)
    nisa.tensor_tensor(dst=squares, data1=columns, data2=columns, op=nl.multiply)
    sums = matmul(consts.ones, squares)  # [Dk, 2Hk]: every partition holds every column's sum
    inverse_norm = sbuf((dk, 2 * hk), FP32)
    nisa.activation(dst=inverse_norm, op=nl.rsqrt, data=sums, bias=consts.l2_eps)
    nisa.scalar_tensor_tensor(dst=q_cols, data=columns[:, 0:hk], op0=nl.multiply, operand0=float(scale),
                              op1=nl.multiply, operand1=inverse_norm[:, 0:hk])  # fmt: skip
    nisa.tensor_tensor(dst=k_cols, data1=columns[:, hk : 2 * hk], data2=inverse_norm[:, hk : 2 * hk], op=nl.multiply)
    for j in range(hk):
        piece = k_row[:, j * dk : (j + 1) * dk]
        nisa.tensor_scalar(dst=piece, data=piece, op0=nl.multiply, operand0=inverse_norm[0:1, hk + j : hk + j + 1])
    return q_cols, k_cols, k_row, _overlap(q_cols, k_cols, consts)


def _overlap(q_cols: Any, k_cols: Any, consts: Constants) -> Any:
    """c_j = k_jᵀ (scale q_j) of every key head, [Dk, Hk] with every partition holding every value."""
    products = sbuf(tuple(q_cols.shape), FP32)
    nisa.tensor_tensor(dst=products, data1=q_cols, data2=k_cols, op=nl.multiply)
    overlap = sbuf(tuple(q_cols.shape), FP32)
    nisa.activation(dst=overlap, op=nl.copy, data=matmul(consts.ones, products))
    return overlap


def gate_operands(shapes: Shapes, keys: tuple[Any, ...], alpha: Any, beta: Any, consts: Constants) -> tuple[Any, Any]:
    """The operands one token's gates ride on, for every value head h (key head j): the tensor engine's
    stationaries [Dk, 2·Hv] (column 2h = α_h β_h k_j, column 2h + 1 = c_j α_h β_h k_j − α_h q_j, c_j = k_jᵀ q_j,
    q already scaled) and the row factors [2, Hv] (row 0 = β_h, row 1 = c_j β_h).

    With them one matmul per head gives the rows r = (αβk)ᵀS and c r − α qᵀS, and one subtract for a block
    of heads gives u = βv − r on partition 0 and the output o = α qᵀS + c u (the read after the write,
    Sᵀ_new q = α Sᵀq + u kᵀq) on partition 1.
    """
    dk, hk, r, hv = shapes.dk, shapes.key_heads, shapes.ratio, shapes.value_heads
    q_cols, k_cols, _, overlap = keys
    by_value_head = (dk, hk, r)

    def per_value_head(per_key_head: Any) -> Any:  # [Dk, Hk] seen as [Dk, Hk, r] (stride 0)
        return per_key_head.expand_dim(2).broadcast(2, r)

    def product(a: Any, b: Any) -> Any:  # [Dk, Hv] = a ⊙ b, each a [Dk, Hv] tile or a per-key-head view
        dst = sbuf((dk, hv), FP32)
        nisa.tensor_tensor(dst=dst.reshape(by_value_head), data1=a, data2=b, op=nl.multiply)
        return dst

    rate = product(alpha.reshape(by_value_head), beta.reshape(by_value_head))
    recall = product(per_value_head(k_cols), rate.reshape(by_value_head))  # αβ k
    corrected = product(recall.reshape(by_value_head), per_value_head(overlap))  # c αβ k
    read = product(alpha.reshape(by_value_head), per_value_head(q_cols))  # α q
    stationaries = sbuf((dk, 2 * hv), FP32)
    pairs = stationaries.reshape((dk, hv, 2))
    nisa.tensor_copy(dst=pairs[:, :, 0:1], src=recall.reshape((dk, hv, 1)))
    nisa.tensor_tensor(dst=pairs[:, :, 1:2], data1=corrected.reshape((dk, hv, 1)), data2=read.reshape((dk, hv, 1)),
                       op=nl.subtract)  # fmt: skip
    scaled_beta = product(per_value_head(overlap), beta.reshape(by_value_head))  # c β
    difference = sbuf((2, hv), FP32)
    nisa.tensor_tensor(dst=difference, data1=scaled_beta[0:2, :], data2=beta[0:2, :], op=nl.subtract)
    factors = sbuf((2, hv), FP32)  # β + [0; 1] (cβ − β)
    nisa.scalar_tensor_tensor(dst=factors, data=difference, op0=nl.multiply, operand0=consts.second_row,
                              op1=nl.add, operand1=beta[0:2, :])  # fmt: skip
    return stationaries, factors


def advance_heads(
    shapes: Shapes, state: Any, h0: int, heads: int, k_row: Any, v_rows: Any, operands: tuple[Any, Any], alpha: Any
) -> Any:
    """One token through heads ``h0 .. h0 + heads`` of a state block (updated in place).

    Args:
        k_row: [1, Hk·Dk] the keys on partition 0. v_rows: [2, heads·Dv] the block's values on partitions 0 and 1.
        operands: ``gate_operands``'. alpha: [Dk, Hv] α on every partition.

    Returns:
        [2, heads·Dv] fp32: row 0 the deltas u, row 1 the outputs.

    Notes:
        Per head the tensor engine runs two matmuls (the two rows against the old state, the rank-1 write) and
        the vector engine one [Dk, Dv] update; the row arithmetic is one GpSimd multiply and one vector subtract
        for the block.
    """
    dv, dk, r = shapes.dv, shapes.dk, shapes.ratio
    stationaries, factors = operands
    as_heads = (2, heads, dv)
    scaled_v = sbuf((2, heads * dv), FP32)  # [β v; c β v]
    nisa.tensor_tensor(dst=scaled_v.reshape(as_heads), data1=v_rows.reshape(as_heads),
                       data2=factors[:, h0 : h0 + heads].expand_dim(2).broadcast(2, dv), op=nl.multiply,
                       engine=GPSIMD)  # fmt: skip
    rows = psum((2, heads * dv))
    for i in range(heads):
        h = h0 + i
        matmul(stationaries[:, 2 * h : 2 * h + 2], state[:, i * dv : (i + 1) * dv], dst=rows[:, i * dv : (i + 1) * dv])
    mixed = sbuf((2, heads * dv), FP32)  # [u; o]
    nisa.tensor_tensor(dst=mixed, data1=scaled_v, data2=rows, op=nl.subtract)
    for i in range(heads):
        h, j = h0 + i, (h0 + i) // r
        block = state[:, i * dv : (i + 1) * dv]
        write = matmul(k_row[:, j * dk : (j + 1) * dk], mixed[0:1, i * dv : (i + 1) * dv])  # k uᵀ, [Dk, Dv]
        nisa.scalar_tensor_tensor(dst=block, data=block, op0=nl.multiply, operand0=alpha[:, h : h + 1],
                                  op1=nl.add, operand1=write)  # fmt: skip
    return mixed


def gated_rms_norm(shapes: Shapes, out_row: Any, z_row: Any, consts: Constants, heads: int) -> None:
    """``out_row`` ← RMSNorm(out) · norm_weight · silu(z) per head, in place (``gdn_ref.decode.gated_rms_norm``)."""
    dv = shapes.dv
    squares = sbuf((1, heads * dv), FP32)
    nisa.tensor_tensor(dst=squares, data1=out_row, data2=out_row, op=nl.multiply)
    sums = sbuf((1, heads), FP32)
    nisa.tensor_reduce(dst=sums, op=nl.add, data=squares.reshape((1, heads, dv)), axis=2)
    inverse_rms = sbuf((1, heads), FP32)
    nisa.activation(dst=inverse_rms, op=nl.rsqrt, data=sums, scale=1.0 / dv, bias=consts.rms_eps)
    for i in range(heads):
        piece = out_row[:, i * dv : (i + 1) * dv]
        nisa.scalar_tensor_tensor(dst=piece, data=piece, op0=nl.multiply, operand0=inverse_rms[:, i : i + 1],
                                  op1=nl.multiply, operand1=consts.norm_weight)  # fmt: skip
    gate = sbuf((1, heads * dv), FP32)
    nisa.activation(dst=gate, op=nl.silu, data=z_row)
    nisa.tensor_tensor(dst=out_row, data1=out_row, data2=gate, op=nl.multiply)


@dataclass(frozen=True)
class Request:
    """Where one request's state comes from and goes: ``source`` / ``target`` HBM tensors of rows
    [.., Hv, Dk, Dv]; ``read_row`` a trace-time int or an NkiScalar; ``token_rows`` the row the state after
    each token is written to (None: only the final state, to ``final_row``)."""

    n: int
    source: Any
    target: Any
    read_row: Any
    final_row: Any = None
    token_rows: tuple[Any, ...] | None = None


def emit_request(
    shapes: Shapes,
    tensors: tuple[Any, Any, Any, Any],
    gates: Gates,
    consts: Constants,
    request: Request,
    scale: float,
    l2norm: bool,
    norm: OutputNorm | None = None,
) -> None:
    """Every token of one request, a block of heads at a time: each token's q/k and gates once, then per block
    load its state (the next block's load issued before this one computes, so the DMA overlaps the math),
    advance it token by token (storing outputs, and the state after each token when ``token_rows``), and store
    the final state.

    Args:
        tensors: (query [N, T, Hk, Dk], key, value [N, T, Hv, Dv], out [N, T, Hv, Dv]) in HBM.
    """
    query, key, value, out = tensors
    dv, hv, n = shapes.dv, shapes.value_heads, request.n
    per_token = []
    for t in range(shapes.tokens):
        keys = token_keys(shapes, query, key, consts, n, t, scale, l2norm)
        alpha, beta = token_gates(shapes, gates, consts, n, t)
        per_token.append((keys[2], alpha, gate_operands(shapes, keys, alpha, beta, consts)))
    size = heads_per_block(hv, dv)
    blocks = [(h0, min(size, hv - h0)) for h0 in range(0, hv, size)]

    def load(h0: int, heads: int) -> Any:
        state = sbuf((shapes.dk, heads * dv), FP32)
        nisa.dma_copy(dst=state, src=state_block(request.source, request.read_row, shapes, h0, heads))
        return state

    upcoming = load(*blocks[0])
    for b, (h0, heads) in enumerate(blocks):
        state = upcoming
        if b + 1 < len(blocks):
            upcoming = load(*blocks[b + 1])
        row_pattern = [[heads * dv, 1], [1, heads * dv]]
        for t, (k_row, alpha, operands) in enumerate(per_token):
            offset = _token_offset(shapes, n, t, hv, dv) + h0 * dv
            v_rows = sbuf((2, heads * dv), FP32)  # the same values on partitions 0 and 1
            nisa.dma_copy(dst=v_rows, src=value.ap(pattern=[[0, 2], [1, heads * dv]], offset=offset))
            out_row = advance_heads(shapes, state, h0, heads, k_row, v_rows, operands, alpha)[1:2, :]
            if norm is not None:
                normed = sbuf((1, heads * dv), FP32)  # the norm's row arithmetic on partition 0
                nisa.dma_copy(dst=normed, src=out_row)
                z_row = sbuf((1, heads * dv), FP32)
                nisa.dma_copy(dst=z_row, src=norm.z.ap(pattern=row_pattern, offset=offset))
                gated_rms_norm(shapes, normed, z_row, consts, heads)
                out_row = normed
            nisa.dma_copy(dst=out.ap(pattern=row_pattern, offset=offset), src=out_row)
            if request.token_rows is not None:
                target = state_block(request.target, request.token_rows[t], shapes, h0, heads)
                nisa.dma_copy(dst=target, src=state)
        if request.token_rows is None:
            nisa.dma_copy(dst=state_block(request.target, request.final_row, shapes, h0, heads), src=state)


def load_scalar(src: Any) -> Any:
    """An int32 [1, 1] HBM or SBUF view as a run-time ``NkiScalar`` (``nki.isa.scalar_load`` reads SBUF)."""
    tile = sbuf((1, 1), INT32)
    if src.buffer == nl.sbuf:
        nisa.tensor_copy(dst=tile, src=src)
    else:
        nisa.dma_copy(dst=tile, src=src)
    return nisa.scalar_load(tile)


def when_live(row_tile: Any, body: Callable[[], None]) -> None:
    """Run ``body`` once when the int32 [1, 1] ``row_tile`` holds a row (>= 0), never for padding (-1): the trip
    count of a compiled loop, computed and loaded on device."""
    live = sbuf((1, 1), INT32)
    nisa.tensor_scalar(dst=live, data=row_tile, op0=nl.greater_equal, operand0=0)
    trips = nisa.scalar_load(live)
    nl.fori_loop(0, trips, lambda _: body())


def zero_outputs(shapes: Shapes, out: Any, n: int) -> None:
    """Write zeros to every output of request n (a padding request's outputs are defined as zeros)."""
    width = shapes.tokens * shapes.value_heads * shapes.dv
    zeros = sbuf((1, width), out.dtype)
    nisa.memset(dst=zeros, value=0.0)
    nisa.dma_copy(dst=out.ap(pattern=[[width, 1], [1, width]], offset=n * width), src=zeros)


def allocate_out(shapes: Shapes, dtype: Any) -> Any:
    """The [N, T, Hv, Dv] output in HBM."""
    return nl.ndarray((shapes.requests, shapes.tokens, shapes.value_heads, shapes.dv), dtype=dtype,
                      buffer=nl.shared_hbm)  # fmt: skip
