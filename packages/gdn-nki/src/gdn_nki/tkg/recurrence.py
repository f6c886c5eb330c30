"""The decode recurrence on device: T tokens of N requests from their state rows, every head, in plain NKI.

Both decode kernels issue their work here: ``gdn_tkg`` (AWS's fused single-token step, ``fused.py``) and the serving
step on a state pool (``step.py``). Per token and value head h (key head j = h // (Hv/Hk)), with α = exp(g), q
already scaled and c_j = k_jᵀ q_j:

    [u; o] = [β_h v_h; c_j β_h v_h] − [α_h β_h k_j, c_j α_h β_h k_j − α_h q_j]ᵀ S_h     against the old state
    S_h    = α_h S_h + k_j uᵀ

so u = β(v − α kᵀS) and o = α qᵀS + c u = qᵀ(α S + k uᵀ), the read after the write, without reading the new state
again. That is ``gdn_ref.recurrent`` token by token (decay, delta against the decayed state, rank-1 write, read
after the write). The state is held in tiles of long contiguous runs and the products are issued per tile
(``state_tiles``), the requests as a software pipeline (``decode_pipeline``); here: each token's q/k (optionally
L2-normalized), gates and the [Dk, ·] columns the tiles' stationaries are selected from, the gated RMSNorm, and the
run-time addressing of a request's rows. All arithmetic is fp32 whatever the compute dtype (the DMA widens bf16
inputs and narrows ``out``), as HF's and AWS's references compute decode.

Run-time addressing: a pool row (and a request's row of ``out``) is an ``NkiScalar`` (``nki.isa.scalar_load`` of
an index tile), used only as the ``scalar_offset`` of ``.ap`` on the tensor ("NKI Access Patterns" and
``nki.isa.scalar_load``, SDK 2.33); a padding request's row is the row one past the tensor's end, outside it,
and every transfer it addresses is skipped by the DMA (``oob_mode.skip``, "nki.isa.dma_copy", SDK 2.33): it reads
and writes nothing.
No index is ever a Python value at trace time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gdn_ref.decode import L2NORM_EPS, RMS_NORM_EPS

from ..common.backend import nisa, nl
from ..common.engines import GPSIMD
from ..common.pool_rows import row_offset
from ..common.tiles import FP32, matmul, sbuf, transpose
from .state_tiles import PLANES, PMAX, LayoutConstants, Steps, largest_divisor, tile_layout

INT32 = nl.int32


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


class Constants:
    """Per-launch tiles: the state layout and its 0/1 tiles, ones for partition sums, eps columns, and the
    per-head fused-gating constants. Per-head tiles span ``layout.lanes`` partitions (every consumer's)."""

    def __init__(self, shapes: Shapes, gates: Gates, norm: OutputNorm | None):
        dk, hv = shapes.dk, shapes.value_heads
        self.layout = tile_layout(dk, shapes.dv, hv)
        self.tiles = LayoutConstants(self.layout, shapes.tokens)
        lanes = self.layout.lanes
        self.ones = sbuf((dk, lanes), FP32)
        nisa.memset(dst=self.ones, value=1.0, engine=GPSIMD)
        self.l2_eps = sbuf((dk, 1), FP32)
        nisa.memset(dst=self.l2_eps, value=L2NORM_EPS, engine=GPSIMD)
        self.rms_eps = sbuf((lanes, 1), FP32)
        nisa.memset(dst=self.rms_eps, value=RMS_NORM_EPS, engine=GPSIMD)
        self.decay_rate = self.dt_bias = None
        if gates.fused:
            # exp(A_log) and dt_bias on every partition, once per launch: [lanes, Hv].
            a_log = sbuf((lanes, hv), FP32)
            nisa.dma_copy(dst=a_log, src=gates.A_log.ap(pattern=[[0, lanes], [1, hv]], offset=0))
            self.decay_rate = sbuf((lanes, hv), FP32)
            nisa.activation(dst=self.decay_rate, op=nl.exp, data=a_log)
            self.dt_bias = sbuf((lanes, hv), FP32)
            nisa.dma_copy(dst=self.dt_bias, src=gates.dt_bias.ap(pattern=[[0, lanes], [1, hv]], offset=0))
        self.norm_weight = None
        if norm is not None:
            self.norm_weight = sbuf((lanes, shapes.dv), FP32)
            nisa.dma_copy(dst=self.norm_weight, src=norm.norm_weight.ap(pattern=[[0, lanes], [1, shapes.dv]]))


def load_gates(shapes: Shapes, gates: Gates, lanes: int, n: Any, t: int) -> tuple[Any, Any]:
    """Token t of request n's gate inputs on every partition, [lanes, Hv] fp32 each: (g, β) precomputed, or the
    raw (a, b) of fused gating. ``n`` a trace-time int or an ``NkiScalar`` (outside the tensor: skipped)."""
    hv = shapes.value_heads
    first, second = (gates.a, gates.b) if gates.fused else (gates.g_log, gates.beta)
    tiles = sbuf((lanes, hv), FP32), sbuf((lanes, hv), FP32)
    for tile, src in zip(tiles, (first, second), strict=True):
        copy_rows(tile, row_view(src, n, [[0, lanes], [1, hv]], t * hv))
    return tiles


def token_gates(gates: Gates, consts: Constants, loaded: tuple[Any, Any]) -> Steps:
    """α = exp(g) and β of every value head from ``load_gates``' tiles, each [lanes, Hv] fp32, equal on every
    partition (``state_tiles.block_operands`` picks each partition's head from them). A ``Steps`` generator."""
    shape = tuple(loaded[0].shape)
    alpha = sbuf(shape, FP32)
    if not gates.fused:
        log_decay, beta = loaded
        nisa.activation(dst=alpha, op=nl.exp, data=log_decay)
        return alpha, beta
    raw_a, raw_b = loaded
    beta = sbuf(shape, FP32)
    nisa.activation(dst=beta, op=nl.sigmoid, data=raw_b)
    shifted = sbuf(shape, FP32)
    nisa.tensor_tensor(dst=shifted, data1=raw_a, data2=consts.dt_bias, op=nl.add)
    yield
    softplus = sbuf(shape, FP32)
    nisa.activation(dst=softplus, op=nl.softplus, data=shifted)
    yield
    rate = sbuf(shape, FP32)  # exp(A_log)·softplus(a + dt_bias) = −g
    nisa.tensor_tensor(dst=rate, data1=softplus, data2=consts.decay_rate, op=nl.multiply)
    yield
    nisa.activation(dst=alpha, op=nl.exp, data=rate, scale=-1.0)
    yield
    return alpha, beta


def load_keys(shapes: Shapes, query: Any, key: Any, n: Any, t: int) -> Any:
    """Token t of request n's q and k as rows [2Hk, Dk] fp32 (q heads, then k heads): each head's Dk is
    contiguous in HBM; a column load would move one element per descriptor. ``n`` as in ``load_gates``."""
    dk, hk = shapes.dk, shapes.key_heads
    rows = sbuf((2 * hk, dk), FP32)
    for i, tensor in enumerate((query, key)):
        copy_rows(rows[i * hk : (i + 1) * hk, :], row_view(tensor, n, [[dk, hk], [1, dk]], t * hk * dk))
    return rows


def token_keys(shapes: Shapes, rows: Any, consts: Constants, scale: float, l2norm: bool) -> Steps:
    """q and k of a token from ``load_keys``' rows: q·scale and k as columns [Dk, Hk] (turned on the tensor
    engine), L2-normalized first when asked, and their overlaps c_j = k_jᵀ q_j on every partition ([lanes, Hk]).

    The column sums of q² and k² come from one matmul against ones, which leaves every partition holding every
    sum. A ``Steps`` generator.
    """
    dk, hk = shapes.dk, shapes.key_heads
    turned = transpose(rows)
    yield
    columns = sbuf((dk, 2 * hk), FP32)
    nisa.activation(dst=columns, op=nl.copy, data=turned)
    yield
    q_cols, k_cols = sbuf((dk, hk), FP32), sbuf((dk, hk), FP32)
    if not l2norm:
        nisa.tensor_scalar(dst=q_cols, data=columns[:, 0:hk], op0=nl.multiply, operand0=float(scale))
        nisa.tensor_copy(dst=k_cols, src=columns[:, hk : 2 * hk])
        yield
        overlap = yield from _overlap(q_cols, k_cols, consts)
        return q_cols, k_cols, overlap
    squares = sbuf((dk, 2 * hk), FP32)
    nisa.tensor_tensor(dst=squares, data1=columns, data2=columns, op=nl.multiply)
    yield
    sums = matmul(consts.ones[:, 0:dk], squares)  # [Dk, 2Hk]: every partition holds every column's sum
    yield
    inverse_norm = sbuf((dk, 2 * hk), FP32)
    nisa.activation(dst=inverse_norm, op=nl.rsqrt, data=sums, bias=consts.l2_eps)
    yield
    nisa.scalar_tensor_tensor(dst=q_cols, data=columns[:, 0:hk], op0=nl.multiply, operand0=float(scale),
                              op1=nl.multiply, operand1=inverse_norm[:, 0:hk])  # fmt: skip
    nisa.tensor_tensor(dst=k_cols, data1=columns[:, hk : 2 * hk], data2=inverse_norm[:, hk : 2 * hk], op=nl.multiply)
    yield
    overlap = yield from _overlap(q_cols, k_cols, consts)
    return q_cols, k_cols, overlap


def _overlap(q_cols: Any, k_cols: Any, consts: Constants) -> Steps:
    """c_j = k_jᵀ (scale q_j) of every key head, [lanes, Hk] with every partition holding every value."""
    products = sbuf(tuple(q_cols.shape), FP32)
    nisa.tensor_tensor(dst=products, data1=q_cols, data2=k_cols, op=nl.multiply)
    yield
    sums = matmul(consts.ones, products)
    yield
    overlap = sbuf((consts.ones.shape[1], q_cols.shape[1]), FP32)
    nisa.activation(dst=overlap, op=nl.copy, data=sums)
    yield
    return overlap


def gate_operands(shapes: Shapes, keys: tuple[Any, ...], alpha: Any, beta: Any, consts: Constants) -> Steps:
    """The operands one token's gates ride on, for every value head h (key head j), q already scaled:

    - columns [Dk, tiles, 3, H] (value head h = tile·H + h'): plane 0 the recall α_h β_h k_j, plane 1 the read
      c_j α_h β_h k_j − α_h q_j (c_j = k_jᵀ q_j), plane 2 the key k_j;
    - c_j β_h [lanes, Hv] on every partition.

    With them the tile products (``state_tiles``) give u = β v − (αβk)ᵀS and the output
    o = c β v − (c αβk − α q)ᵀS = α qᵀS + c u (the read after the write, Sᵀ_new q = α Sᵀq + u kᵀq) from the old
    state. All on GpSimd (SBUF only), which the state's steps leave idle. A ``Steps`` generator.
    """
    dk, hk, r, hv = shapes.dk, shapes.key_heads, shapes.ratio, shapes.value_heads
    layout, lanes = consts.layout, consts.layout.lanes
    q_cols, k_cols, overlap = keys

    def per_value_head(per_key_head: Any) -> Any:  # [P, Hk] seen as [P, Hk, r] (stride 0)
        return per_key_head.expand_dim(2).broadcast(2, r)

    def product(a: Any, b: Any, partitions: int = dk) -> Any:  # [P, Hv] = a ⊙ b, each [P, Hv] or per key head
        dst = sbuf((partitions, hv), FP32)
        nisa.tensor_tensor(dst=dst.reshape((partitions, hk, r)), data1=a, data2=b, op=nl.multiply, engine=GPSIMD)
        return dst

    def by_value_head(tile: Any) -> Any:
        return tile.reshape((tile.shape[0], hk, r))

    columns = sbuf((dk, layout.tiles, PLANES, layout.heads), FP32)

    def plane(i: int) -> Any:
        return columns[:, :, i, :]

    def tiled(tile: Any) -> Any:
        return tile.reshape((dk, layout.tiles, layout.heads))

    alpha_k, beta_k = alpha[0:dk, :], beta[0:dk, :]
    rate = product(by_value_head(alpha_k), by_value_head(beta_k))
    read = product(by_value_head(alpha_k), per_value_head(q_cols))  # α q
    keys_v = sbuf((dk, hv), FP32)
    nisa.tensor_copy(dst=by_value_head(keys_v), src=per_value_head(k_cols), engine=GPSIMD)
    scaled_beta = product(per_value_head(overlap), by_value_head(beta), partitions=lanes)  # c β
    yield
    recall = product(per_value_head(k_cols), by_value_head(rate))  # αβ k
    nisa.tensor_copy(dst=plane(2), src=tiled(keys_v), engine=GPSIMD)
    yield
    corrected = product(by_value_head(recall), per_value_head(overlap[0:dk, :]))  # c αβ k
    nisa.tensor_copy(dst=plane(0), src=tiled(recall), engine=GPSIMD)
    yield
    nisa.tensor_tensor(dst=plane(1), data1=tiled(corrected), data2=tiled(read), op=nl.subtract, engine=GPSIMD)
    yield
    return columns, scaled_beta


def gated_rms_norm(shapes: Shapes, rows: Any, z_rows: Any, consts: Constants) -> None:
    """``rows`` [H, Dv] ← RMSNorm(rows) · norm_weight · silu(z) per head (row), in place
    (``gdn_ref.decode.gated_rms_norm``)."""
    heads, dv = rows.shape[0], shapes.dv
    squares = sbuf((heads, dv), FP32)
    nisa.tensor_tensor(dst=squares, data1=rows, data2=rows, op=nl.multiply)
    sums = sbuf((heads, 1), FP32)
    nisa.tensor_reduce(dst=sums, op=nl.add, data=squares, axis=1)
    inverse_rms = sbuf((heads, 1), FP32)
    nisa.activation(dst=inverse_rms, op=nl.rsqrt, data=sums, scale=1.0 / dv, bias=consts.rms_eps[0:heads, :])
    nisa.scalar_tensor_tensor(dst=rows, data=rows, op0=nl.multiply, operand0=inverse_rms,
                              op1=nl.multiply, operand1=consts.norm_weight[0:heads, :])  # fmt: skip
    gate = sbuf((heads, dv), FP32)
    nisa.activation(dst=gate, op=nl.silu, data=z_rows)
    nisa.tensor_tensor(dst=rows, data1=rows, data2=gate, op=nl.multiply)


def row_view(
    tensor: Any, row: Any, pattern: list[list[int]], offset: int, row_stride: int | None = None
) -> tuple[Any, dict[str, Any]]:
    """``tensor``'s view ``pattern`` at ``offset`` within row ``row`` (a trace-time int, or an ``NkiScalar``
    used as the run-time ``scalar_offset`` of dim 0) and the DMA keywords it needs: a run-time row outside the
    tensor skips the transfer ("nki.isa.dma_copy", ``oob_mode``, SDK 2.33). ``row_stride``: ``tensor`` is a
    strided pool's span (``common.pool_rows``), its rows that many elements apart."""
    if row_stride is not None:
        row = row_offset(row, row_stride)  # the row's first element: the span's rows are elements
    if isinstance(row, int):
        row_size = 1
        for size in tensor.shape[1:]:
            row_size *= size
        return tensor.ap(pattern=pattern, offset=row * row_size + offset), {}
    view = tensor.ap(pattern=pattern, offset=offset, scalar_offset=row, indirect_dim=0)
    return view, {"oob_mode": nisa.oob_mode.skip}


def copy_rows(dst: Any, src: Any) -> None:
    """One DMA between a tile and a ``_row_view`` (given as ``(view, keywords)``), either way round."""
    (dst, dst_kw), (src, src_kw) = (d if isinstance(d, tuple) else (d, {}) for d in (dst, src))
    nisa.dma_copy(dst=dst, src=src, **dst_kw, **src_kw)


def zero_rows(shapes: Shapes, dtype: Any) -> Any:
    """A tile of zeros holding one request's outputs (T·Hv·Dv elements), made once per launch: [T·Hv, Dv] when the
    (token, head) rows fit the partitions, else folded to [p, (T·Hv / p)·Dv] with p the largest divisor of T·Hv
    within them (zeros need no layout, and a request's outputs are contiguous in ``out``)."""
    rows = shapes.tokens * shapes.value_heads
    parts = largest_divisor(rows, PMAX)
    zeros = sbuf((parts, rows // parts * shapes.dv), dtype)
    nisa.memset(dst=zeros, value=0.0, engine=GPSIMD)
    return zeros


def allocate_out(shapes: Shapes, dtype: Any) -> Any:
    """The [N, T, Hv, Dv] output in HBM."""
    return nl.ndarray((shapes.requests, shapes.tokens, shapes.value_heads, shapes.dv), dtype=dtype,
                      buffer=nl.shared_hbm)  # fmt: skip
