"""``gdn_gating``: vLLM's ``fused_gdn_gating`` on device — per token and head, g = −exp(A_log)·softplus(a + dt_bias)
(fp32) and β = sigmoid(b) (b's dtype), the prefill's gates before ``gdn_cte`` (``gdn_ref.activations``' formulas).

Layout: the rows of a and b ([T, H], row-major) go to partitions in runs of R consecutive rows, as the gated
RMSNorm's (``common.row_tiles``): each partition's share of a tile is one contiguous run of R·H elements, and every
instruction works on 128·R rows at once. The per-head constants (dt_bias, −exp(A_log)) reach every partition once
per launch, spread by a 0/1 matmul into PSUM and copied to SBUF, and are read through a stride-0 view as [P, R, H].

Arithmetic is fp32 (vLLM's kernel: a and dt_bias widened, summed in fp32, the softplus, exp and product in fp32):
per tile, x = a + dt_bias (vector engine, its constant from PSUM), softplus(beta·x) (scalar engine ``activation``
with ``scale=beta``), g = softplus · (−exp(A_log) / beta) (GpSimd, from SBUF), σ(b) (scalar engine); two loads and
two stores. The tiles go through a three-stage pipeline in program order (loads of tile s, x of tile s − 1, the
rest of tile s − 2) so no engine's in-order queue waits on a chain within a tile (``norm.kernel`` explains).
"""

from __future__ import annotations

from typing import Any

from ..common.backend import nisa, nki, nl
from ..common.engines import GPSIMD, SCALAR, VECTOR
from ..common.kernel_assert import assert_valid_call
from ..common.row_tiles import repeat_rows, rows_per_partition, rows_view, spread_to_partitions, tile_plan
from ..common.tiles import FP32, sbuf
from .rules import gating_violations

TILE_SETS = 3  # tiles in flight: the pipeline's three stages


@nki.jit
def gdn_gating(a_log: Any, a: Any, b: Any, dt_bias: Any, beta: float = 1.0, threshold: float = 20.0) -> tuple:
    """The prefill gates of a GatedDeltaNet layer from its projections (vLLM's ``fused_gdn_gating``).

    Dimensions:
        T: tokens. H: heads (the layer's value heads on this shard).

    Args:
        a_log (nl.NkiTensor): [H] @ HBM float32 or bfloat16: log of each head's decay rate.
        a (nl.NkiTensor): [T, H] @ HBM float32 or bfloat16: the raw gate projection.
        b (nl.NkiTensor): [T, H] @ HBM float32 or bfloat16: the β logit projection.
        dt_bias (nl.NkiTensor): [H] @ HBM float32 or bfloat16: added to a before the softplus.
        beta (float): the softplus' beta: softplus(beta·x) / beta.
        threshold (float): vLLM's linear switch-over, at least ``rules.MIN_THRESHOLD`` (where the exact
            softplus reproduces it in fp32).

    Returns:
        tuple: g [1, T, H] float32 (<= 0) and beta_output [1, T, H] in b's dtype, as vLLM returns them.

    Notes:
        Trace-time rules (``rules.gating_violations``) stop the trace before anything is allocated. Rows are
        independent: a row's gates do not depend on the tile it falls in.
    """
    assert_valid_call(gating_violations(a_log, a, b, dt_bias, beta, threshold))
    tokens, heads = a.shape
    g = nl.ndarray((1, tokens, heads), dtype=FP32, buffer=nl.shared_hbm)
    beta_out = nl.ndarray((1, tokens, heads), dtype=b.dtype, buffer=nl.shared_hbm)
    per_part = rows_per_partition(tokens, heads, 4)
    constants = _Constants(a_log, dt_bias, heads, float(beta))
    sets = [_GateTiles(a.dtype, b.dtype, per_part, heads) for _ in range(TILE_SETS)]
    plan = tile_plan(tokens, per_part)
    for step in range(len(plan) + 2):
        if step < len(plan):
            sets[step % TILE_SETS].load(a, b, *plan[step])
        if 0 <= step - 1 < len(plan):
            sets[(step - 1) % TILE_SETS].shift(constants, *plan[step - 1][1:])
        if 0 <= step - 2 < len(plan):
            done = sets[(step - 2) % TILE_SETS]
            done.finish(constants, float(beta), *plan[step - 2][1:])
            done.store(g, beta_out, *plan[step - 2])
    return g, beta_out


class _Constants:
    """Per launch, on every partition: dt_bias [128, H] fp32 in PSUM (the vector engine reads it there), and
    −exp(A_log) / beta [128, H] fp32 in SBUF (for GpSimd, which does not read PSUM)."""

    def __init__(self, a_log: Any, dt_bias: Any, heads: int, beta: float):
        self.heads = heads
        self.dt_bias = spread_to_partitions(dt_bias, heads)
        a_log_rows = spread_to_partitions(a_log, heads)
        self.rate = sbuf((128, heads), FP32)
        nisa.activation(dst=self.rate, op=nl.exp, data=a_log_rows, engine=SCALAR)
        nisa.tensor_scalar(dst=self.rate, data=self.rate, op0=nl.multiply, operand0=-1.0 / beta, engine=VECTOR)


class _GateTiles:
    """The tiles one [P, R, H] tile of rows is gated in, allocated once per launch: a and b as moved, x then
    softplus (fp32, one buffer), g (fp32) and β (b's dtype)."""

    def __init__(self, a_dtype: Any, b_dtype: Any, per_part: int, heads: int):
        shape = (128, per_part, heads)
        self.a, self.b = sbuf(shape, a_dtype), sbuf(shape, b_dtype)
        self.work, self.g, self.beta = sbuf(shape, FP32), sbuf(shape, FP32), sbuf(shape, b_dtype)

    def load(self, a: Any, b: Any, start: int, parts: int, run: int) -> None:
        nisa.dma_copy(dst=self.a[:parts, :run], src=rows_view(a, start, parts, run))
        nisa.dma_copy(dst=self.b[:parts, :run], src=rows_view(b, start, parts, run))

    def shift(self, constants: _Constants, parts: int, run: int) -> None:
        """x = a + dt_bias in fp32 (vector engine, the bias from PSUM)."""
        bias = repeat_rows(constants.dt_bias, constants.heads, parts, run)
        nisa.tensor_tensor(dst=self.work[:parts, :run], data1=self.a[:parts, :run], data2=bias, op=nl.add,
                           engine=VECTOR)  # fmt: skip

    def finish(self, constants: _Constants, beta: float, parts: int, run: int) -> None:
        """softplus(beta·x) (scalar), g = softplus · (−exp(A_log) / beta) (GpSimd), σ(b) (scalar)."""
        work = self.work[:parts, :run]
        nisa.activation(dst=work, op=nl.softplus, data=work, scale=beta, engine=SCALAR)
        rate = repeat_rows(constants.rate, constants.heads, parts, run)
        nisa.tensor_tensor(dst=self.g[:parts, :run], data1=work, data2=rate, op=nl.multiply, engine=GPSIMD)
        nisa.activation(dst=self.beta[:parts, :run], op=nl.sigmoid, data=self.b[:parts, :run], engine=SCALAR)

    def store(self, g: Any, beta: Any, start: int, parts: int, run: int) -> None:
        """g and β to their rows of the [1, T, H] outputs (row-major: ``rows_view`` reads the last axis)."""
        nisa.dma_copy(dst=rows_view(g, start, parts, run), src=self.g[:parts, :run])
        nisa.dma_copy(dst=rows_view(beta, start, parts, run), src=self.beta[:parts, :run])
