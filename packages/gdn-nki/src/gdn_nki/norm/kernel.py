"""``gdn_gated_rms_norm``: the gated RMSNorm of a GatedDeltaNet layer's output stage, as FLA's ``FusedRMSNormGated``
computes it (``gdn_ref.norm.gated_rms_norm_oracle``):

    y = x · rsqrt(mean(x²) + eps) · weight · act(z)        per row of D elements (head_v_dim)

Layout: the rows of x (every leading axis flattened: [tokens, heads, D] or [rows, D], row-major) go to partitions
in runs of R consecutive rows, so each partition's share of a tile is one contiguous run of R·D elements in HBM
(4 KiB: R = 16 rows of 128 bf16, 8 fp32) — DMA efficiency rises with contiguous bytes per descriptor up to 4 KiB
(docs/nki-sources.md §4.4) — and every instruction works on 128·R rows at once. x, z and y move once each.

Arithmetic is fp32 (FLA's kernel: the row statistics, the scale, the weight and the gate in fp32, y rounded once
to x's dtype). Per tile [P, R, D], three engines share the streaming passes (Trn2 rates, docs/nki-sources.md §3.6,
§3.10, §3.16, §4.1):

- GpSimd: x² (``tensor_tensor``); y = x̂ · (weight · act(z)) (``tensor_tensor``); weight · act(z) for a
  quarter of the rows (``GPSIMD_SHARE``);
- vector: the row sums of x² (``tensor_reduce``); weight · act(z) for the other rows, the weight read from PSUM,
  where a ``tensor_tensor`` with one PSUM input streams at one element per cycle instead of two (§3.6);
- scalar: act(z) (``activation``); x̂ = x · rsqrt(mean + eps), one ``activation`` per row with the row's
  reciprocal RMS as its [P, 1] ``scale`` (§3.10); and the R reciprocal RMS values themselves (``rsqrt``).

Per D elements of 16 rows on each of the 128 partitions that is 36 GpSimd, 28 vector and 32 scalar cycles, 30.0 /
29.2 / 26.7 ns at their clocks, against 33.9 ns for the DMA to move x, z and y (3 · 16 · 2 · 128 bytes at 362.5
B/ns, bf16): the DMA binds, narrowly (bench/bench_norm.py: 1.11–1.12× the HBM floor at 8192 and 32768 tokens × 32
heads; fp32, twice the bytes, 0.99×).

The weight reaches every partition once per launch: one HBM row, spread by a 0/1 matmul into PSUM (exact: one
nonzero term per product), and copied once to SBUF for GpSimd (which does not read PSUM). The tiles go through a
four-stage software pipeline in program order over ``TILE_SETS`` tile sets (``gdn_gated_rms_norm``). The tiles of a
launch are unrolled (a compiled loop drains every engine at each iteration's end, docs/nki-sources.md §4.7): the
program grows with the rows (13k instructions at 32768 tokens × 32 heads), one program per shape.
"""

from __future__ import annotations

from typing import Any

from ..common.backend import nisa, nki, nl
from ..common.engines import GPSIMD, SCALAR, VECTOR
from ..common.kernel_assert import assert_valid_call
from ..common.row_tiles import (  # noqa: F401 - MIN_TILES, RUN_BYTES: the launch plan's constants, read by tests
    MIN_TILES,
    RUN_BYTES,
    repeat_rows,
    rows_per_partition,
    rows_view,
    spread_to_partitions,
    tile_plan,
)
from ..common.tiles import FP32, sbuf
from .rules import norm_violations

TILE_SETS = 4  # tiles in flight: the pipeline's four stages (gdn_gated_rms_norm)
# 1 / the share of act(z) · weight GpSimd takes from the vector engine, which would otherwise carry 32 of the 96
# cycles per D of 16 rows at the slowest clock (module docstring): at 1/4, 29.2 ns per D against GpSimd's 30.0.
GPSIMD_SHARE = 4
GATES = {"silu": nl.silu, "swish": nl.silu, "sigmoid": nl.sigmoid}


@nki.jit
def gdn_gated_rms_norm(x: Any, z: Any, weight: Any, eps: float = 1e-6, activation: str = "silu") -> Any:
    """Normalize each row of x over its last axis, scale by ``weight`` and gate by ``act(z)``.

    Dimensions:
        D: the normalized (last) axis, at most ``rules.MAX_DIM``. rows: the product of x's leading axes.

    Args:
        x (nl.NkiTensor): [..., D] @ HBM, float32 or bfloat16, row-major (the recurrence's output, e.g. [tokens,
            heads, D]).
        z (nl.NkiTensor): x's shape and dtype @ HBM: the gate (Qwen3-Next's ``z`` projection); None: no gate.
        weight (nl.NkiTensor): [D] @ HBM float32 or bfloat16; None: no scale (FLA's ``elementwise_affine=False``).
        eps (float): added to mean(x²) (HF's ``rms_norm_eps``).
        activation (str): the gate, "silu" / "swish" (z · sigmoid(z)) or "sigmoid".

    Returns:
        nl.NkiTensor: y, x's shape and dtype.

    Notes:
        Trace-time rules (``rules.norm_violations``) stop the trace before anything is allocated. Rows are
        independent: a row's result does not depend on the rows beside it or on the tile it falls in.
    """
    assert_valid_call(norm_violations(x, z, weight, eps, activation))
    dim = x.shape[-1]
    rows = x.size // dim
    out = nl.ndarray(tuple(x.shape), dtype=x.dtype, buffer=nl.shared_hbm)
    per_part = rows_per_partition(rows, dim, 2 if x.dtype != FP32 else 4)
    constants = NormConstants(weight, dim, per_part, eps)
    sets = [NormTiles(x.dtype, per_part, dim, z is not None) for _ in range(TILE_SETS)]
    plan = tile_plan(rows, per_part)
    gate_op = None if z is None else GATES[activation]

    def tile(k: int) -> tuple[NormTiles, tuple[int, int, int]] | None:
        return (sets[k % TILE_SETS], plan[k]) if 0 <= k < len(plan) else None

    # A software pipeline in program order: step s loads tile s, starts tile s − 1 (act(z) · weight and x²), takes
    # tile s − 2's row statistics and finishes tile s − 3 (x̂, y, store). Each engine runs its instructions in
    # issue order, so an instruction is issued after the ones it waits on have been issued on other engines in an
    # earlier step or earlier in this one: no engine's queue stalls on a chain within a tile.
    for step in range(len(plan) + 3):
        if (new := tile(step)) is not None:
            new[0].load(x, z, *new[1])
        started, measured, finished = tile(step - 1), tile(step - 2), tile(step - 3)
        if started is not None:
            started[0].activate_gate(gate_op, *started[1][1:])
            started[0].square(*started[1][1:])
        if measured is not None:
            measured[0].sum_squares(*measured[1][1:])
        if started is not None:
            started[0].weigh_gate(constants, *started[1][1:])
        if finished is not None:
            finished[0].output(constants, *finished[1][1:])
            finished[0].store(out, *finished[1])
        if measured is not None:
            measured[0].inverse_rms_of(constants, *measured[1][1:])
    return out


class NormConstants:
    """Per launch: eps as a [128, 1] column (the rsqrt's bias) and the weight on every partition as [128, D] fp32
    in PSUM (None without a weight), read through a stride-0 view as [P, R, D]."""

    def __init__(self, weight: Any, dim: int, per_part: int, eps: float):
        self.dim, self.per_part = dim, per_part
        self.eps = sbuf((128, 1), FP32)
        nisa.memset(dst=self.eps, value=float(eps))
        self.weight = self.weight_sbuf = None
        if weight is not None:
            self.weight = spread_to_partitions(weight, dim)
            self.weight_sbuf = sbuf((128, dim), FP32)
            nisa.activation(dst=self.weight_sbuf, op=nl.copy, data=self.weight, engine=SCALAR)

    def weight_rows(self, parts: int, run: int, in_psum: bool = True) -> Any:
        """The weight as [parts, run, D] from its PSUM copy (or its SBUF copy, for GpSimd, which does not read
        PSUM): each partition's row repeated ``run`` times (stride 0)."""
        return repeat_rows(self.weight if in_psum else self.weight_sbuf, self.dim, parts, run)


class NormTiles:
    """The tiles one [P, R, D] tile of rows is normalized in, allocated once per launch: x, z and y in the I/O
    dtype as moved; x² then x̂ (fp32, one buffer); act(z) then weight · act(z) (fp32, one buffer); the row sums
    and reciprocal RMS values [P, R] fp32."""

    def __init__(self, dtype: Any, per_part: int, dim: int, gated: bool):
        shape = (128, per_part, dim)
        self.x = sbuf(shape, dtype)
        self.z = sbuf(shape, dtype) if gated else None
        self.y = sbuf(shape, dtype)
        self.work = sbuf(shape, FP32)
        self.gate = sbuf(shape, FP32) if gated else None
        self.sums = sbuf((128, per_part), FP32)
        self.inverse_rms = sbuf((128, per_part), FP32)

    def load(self, x: Any, z: Any, start: int, parts: int, run: int) -> None:
        nisa.dma_copy(dst=self.x[:parts, :run], src=rows_view(x, start, parts, run))
        if z is not None:
            nisa.dma_copy(dst=self.z[:parts, :run], src=rows_view(z, start, parts, run))

    def activate_gate(self, gate_op: Any, parts: int, run: int) -> None:
        """act(z) (scalar engine); nothing without a gate."""
        if gate_op is not None:
            nisa.activation(dst=self.gate[:parts, :run], op=gate_op, data=self.z[:parts, :run], engine=SCALAR)

    def weigh_gate(self, constants: NormConstants, parts: int, run: int) -> None:
        """act(z) · weight in place, nothing without both: the first ``run // GPSIMD_SHARE`` rows of each
        partition on GpSimd (the weight's SBUF copy), the rest on the vector engine (its PSUM copy)."""
        if self.gate is None or constants.weight is None:
            return
        split = run // GPSIMD_SHARE
        for engine, rows in ((GPSIMD, slice(0, split)), (VECTOR, slice(split, run))):
            if rows.stop > rows.start:
                gate = self.gate[:parts, rows]
                weight = constants.weight_rows(parts, rows.stop - rows.start, in_psum=engine == VECTOR)
                nisa.tensor_tensor(dst=gate, data1=gate, data2=weight, op=nl.multiply, engine=engine)

    def square(self, parts: int, run: int) -> None:
        """x² in fp32 (GpSimd)."""
        x = self.x[:parts, :run]
        nisa.tensor_tensor(dst=self.work[:parts, :run], data1=x, data2=x, op=nl.multiply, engine=GPSIMD)

    def sum_squares(self, parts: int, run: int) -> None:
        """Each row's sum of x² (vector engine)."""
        nisa.tensor_reduce(dst=self.sums[:parts, :run], op=nl.add, data=self.work[:parts, :run], axis=2)

    def inverse_rms_of(self, constants: NormConstants, parts: int, run: int) -> None:
        """Each row's rsqrt(sum / D + eps) (scalar engine: one instruction for the tile's rows)."""
        nisa.activation(dst=self.inverse_rms[:parts, :run], op=nl.rsqrt, data=self.sums[:parts, :run],
                        scale=1.0 / constants.dim, bias=constants.eps[:parts], engine=SCALAR)  # fmt: skip

    def output(self, constants: NormConstants, parts: int, run: int) -> None:
        """The second half: x̂ = x · rsqrt(mean + eps) per row, then y = x̂ · (weight · act(z))."""
        self.normalize(parts, run)
        self.gate_output(constants, parts, run)

    def normalize(self, parts: int, run: int) -> None:
        """x̂ = x · rsqrt(mean + eps), one scalar-engine ``activation`` per row of each partition."""
        x, normed, inverse_rms = self.x[:parts, :run], self.work[:parts, :run], self.inverse_rms[:parts, :run]
        for j in range(run):
            nisa.activation(dst=normed[:, j], op=nl.copy, data=x[:, j], scale=inverse_rms[:, j : j + 1],
                            engine=SCALAR)  # fmt: skip

    def gate_output(self, constants: NormConstants, parts: int, run: int) -> None:
        """y = x̂ · (weight · act(z)) (or x̂ · weight, or x̂), rounded to the I/O dtype."""
        normed, y = self.work[:parts, :run], self.y[:parts, :run]
        if self.gate is not None:
            nisa.tensor_tensor(dst=y, data1=normed, data2=self.gate[:parts, :run], op=nl.multiply, engine=GPSIMD)
        elif constants.weight is not None:
            nisa.tensor_tensor(dst=y, data1=normed, data2=constants.weight_rows(parts, run), op=nl.multiply,
                               engine=VECTOR)  # fmt: skip
        else:
            nisa.tensor_copy(dst=y, src=normed, engine=GPSIMD)

    def store(self, out: Any, start: int, parts: int, run: int) -> None:
        nisa.dma_copy(dst=rows_view(out, start, parts, run), src=self.y[:parts, :run])
