"""``gdn_gated_rms_norm``: the gated RMSNorm of a GatedDeltaNet layer's output stage, as FLA's ``FusedRMSNormGated``
computes it (``gdn_ref.norm.gated_rms_norm_oracle``):

    y = x · rsqrt(mean(x²) + eps) · weight · act(z)        per row of D elements (head_v_dim)

Layout: the rows of x (every leading axis flattened: [tokens, heads, D] or [rows, D], row-major) go to partitions
in runs of R consecutive rows, so each partition's share of a tile is one contiguous run of R·D elements in HBM
(4 KiB: R = 16 rows of 128 bf16, 8 fp32) — DMA efficiency rises with contiguous bytes per descriptor up to 4 KiB
(docs/nki-sources.md §4.4) — and every instruction works on 128·R rows at once. x, z and y move once each.

Arithmetic is fp32 (FLA's kernel: the row statistics, the scale, the weight and the gate in fp32, y rounded once
to x's dtype). Per tile [P, R, D], each of three engines takes two streaming passes (Trn2 rates,
docs/nki-sources.md §3.6, §3.10, §3.16, §4.1):

- GpSimd: x² (``tensor_tensor``); y = x̂ · (weight · act(z)) (``tensor_tensor``);
- vector: the row sums of x² (``tensor_reduce``); weight · act(z), the weight read from PSUM, where a
  ``tensor_tensor`` with one PSUM input streams at one element per cycle instead of two (§3.6);
- scalar: act(z) (``activation``); x̂ = x · rsqrt(mean + eps), one ``activation`` per row with the row's
  reciprocal RMS as its [P, 1] ``scale`` (§3.10); and the R reciprocal RMS values themselves (``rsqrt``).

The weight reaches every partition once per launch: one HBM row, spread by a 0/1 matmul into PSUM (exact: one
nonzero term per product). Tiles rotate through ``TILE_SETS`` sets, so one tile's loads run beside another's
compute and a third's store. The tiles of a launch are unrolled (a compiled loop drains every engine at each
iteration's end, docs/nki-sources.md §4.7): the program grows with the rows, one program per shape.
"""

from __future__ import annotations

from typing import Any

from ..common.backend import nisa, nki, nl
from ..common.engines import GPSIMD, SCALAR, VECTOR
from ..common.kernel_assert import assert_valid_call
from ..common.tiles import FP32, matmul, psum, sbuf
from .rules import norm_violations

RUN_BYTES = 4096  # contiguous bytes per partition per DMA: where descriptor efficiency saturates (§4.4)
TILE_SETS = 3  # tiles in flight: one loading, one computing, one storing
BANK = 512  # fp32 columns of one PSUM bank: a matmul's largest moving free size (docs/nki-sources.md §2.9)
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
    constants = _Constants(weight, dim, per_part, eps)
    sets = [_TileSet(x.dtype, per_part, dim, z is not None) for _ in range(TILE_SETS)]
    for i, (start, parts, run) in enumerate(tile_plan(rows, per_part)):
        tiles = sets[i % TILE_SETS]
        tiles.load(x, z, start, parts, run)
        tiles.normalize(constants, parts, run, None if z is None else GATES[activation])
        tiles.store(out, start, parts, run)
    return out


def rows_per_partition(rows: int, dim: int, itemsize: int) -> int:
    """R: rows per partition of a full tile — a ``RUN_BYTES`` run, fewer when the launch has too few rows to fill
    the 128 partitions with it (decode: N·Hv rows), never below 1."""
    return max(1, min(RUN_BYTES // (dim * itemsize), rows // 128))


def tile_plan(rows: int, per_part: int) -> list[tuple[int, int, int]]:
    """The launch's tiles as (first row, partitions, rows per partition): full [128, R] tiles, then the rest as
    one [rest // R, R] tile and one [rest % R, 1] tile (each row in exactly one tile, in order)."""
    plan = []
    full = 128 * per_part
    start = 0
    while rows - start >= full:
        plan.append((start, 128, per_part))
        start += full
    rest = rows - start
    if rest // per_part:
        plan.append((start, rest // per_part, per_part))
        start += rest // per_part * per_part
    if rows - start:
        plan.append((start, rows - start, 1))
    return plan


class _Constants:
    """Per launch: eps as a [128, 1] column (the rsqrt's bias) and the weight on every partition as [128, D] fp32
    in PSUM (None without a weight), read through a stride-0 view as [P, R, D]."""

    def __init__(self, weight: Any, dim: int, per_part: int, eps: float):
        self.dim, self.per_part = dim, per_part
        self.eps = sbuf((128, 1), FP32)
        nisa.memset(dst=self.eps, value=float(eps))
        self.weight = None
        if weight is not None:
            raw = sbuf((1, dim), weight.dtype)
            nisa.dma_copy(dst=raw, src=weight.ap(pattern=[[dim, 1], [1, dim]], offset=0))
            ones = sbuf((1, 128), weight.dtype)  # a matmul's operands share a precision (ISA nc_matmul)
            nisa.memset(dst=ones, value=1.0)
            self.weight = psum((128, dim))
            for first in range(0, dim, BANK):
                cols = slice(first, min(dim, first + BANK))
                matmul(ones, raw[:, cols], dst=self.weight[:, cols], stationary_onezero=True)

    def weight_rows(self, parts: int, run: int) -> Any:
        """The weight as [parts, run, D]: each partition's row repeated ``run`` times (stride 0)."""
        return self.weight.ap(pattern=[[self.dim, parts], [0, run], [1, self.dim]], offset=0)


class _TileSet:
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
        nisa.dma_copy(dst=self.x[:parts, :run], src=_rows(x, start, parts, run))
        if z is not None:
            nisa.dma_copy(dst=self.z[:parts, :run], src=_rows(z, start, parts, run))

    def normalize(self, constants: _Constants, parts: int, run: int, gate_op: Any) -> None:
        """y = x · rsqrt(mean(x²) + eps) · weight · act(z) on the tile's first ``parts`` partitions, ``run`` rows
        each (module docstring: which engine does what, and why)."""
        dim = constants.dim
        x, work, y = self.x[:parts, :run], self.work[:parts, :run], self.y[:parts, :run]
        sums, inverse_rms = self.sums[:parts, :run], self.inverse_rms[:parts, :run]
        if gate_op is not None:  # first: the gate needs only z, so the scalar engine starts while x² streams
            gate = self.gate[:parts, :run]
            nisa.activation(dst=gate, op=gate_op, data=self.z[:parts, :run], engine=SCALAR)
            if constants.weight is not None:
                nisa.tensor_tensor(dst=gate, data1=gate, data2=constants.weight_rows(parts, run), op=nl.multiply,
                                   engine=VECTOR)  # fmt: skip
        nisa.tensor_tensor(dst=work, data1=x, data2=x, op=nl.multiply, engine=GPSIMD)
        nisa.tensor_reduce(dst=sums, op=nl.add, data=work, axis=2)
        nisa.activation(dst=inverse_rms, op=nl.rsqrt, data=sums, scale=1.0 / dim, bias=constants.eps[:parts],
                        engine=SCALAR)  # fmt: skip
        for j in range(run):
            nisa.activation(dst=work[:, j], op=nl.copy, data=x[:, j], scale=inverse_rms[:, j : j + 1],
                            engine=SCALAR)  # fmt: skip
        if gate_op is not None:
            nisa.tensor_tensor(dst=y, data1=work, data2=self.gate[:parts, :run], op=nl.multiply, engine=GPSIMD)
        elif constants.weight is not None:
            nisa.tensor_tensor(dst=y, data1=work, data2=constants.weight_rows(parts, run), op=nl.multiply,
                               engine=VECTOR)  # fmt: skip
        else:
            nisa.tensor_copy(dst=y, src=work, engine=GPSIMD)

    def store(self, out: Any, start: int, parts: int, run: int) -> None:
        nisa.dma_copy(dst=_rows(out, start, parts, run), src=self.y[:parts, :run])


def _rows(tensor: Any, start: int, parts: int, run: int) -> Any:
    """Rows ``start ..`` of a row-major [..., D] tensor as [parts, run, D]: partition p holds rows start + p·run ..
    start + p·run + run − 1, one contiguous run of run·D elements."""
    dim = tensor.shape[-1]
    return tensor.ap(pattern=[[run * dim, parts], [dim, run], [1, dim]], offset=start * dim)
