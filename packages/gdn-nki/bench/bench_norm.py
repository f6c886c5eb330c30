"""Gated RMSNorm cost: makespan per launch from nki-cpu's cost model against the launch's HBM floor (issue 43 item 4).

Qwen3-Next's output stage: y = rmsnorm(o) · weight · silu(z) over head_v_dim = 128 for 32 value heads, o and z as
[tokens, 32, 128] (the recurrence's output and the z projection), the weight fp32, through
``gdn_nki.gated_rms_norm`` (``gdn_gated_rms_norm``). Prefill: 8192 and 32768 packed tokens; decode: N requests of
one token (N·32 rows), N in {8, 64, 256}; bf16 and fp32 I/O.

HBM floor: the bytes any launch must move — o and z read, y written, the weight — at one NeuronCore's share of
Trn2's 2.9 TB/s (362.5 B/ns, as ``bench_decode.py`` and ``bench_conv.py``). The model's DMA floor is the bytes the
kernel moves at 16 engines × 23 B/ns and each transfer's run efficiency. Per-engine busy times are reported for
the fusion estimate in PERFORMANCE.md ("Gated RMSNorm").

Fused (``--fused``): the norm folded into ``gdn_cte``'s output stage (``gdn_cte_normed``) against ``gdn_cte`` then
``gdn_gated_rms_norm`` on its o, at Qwen3-Next's head dim: one lane (Hk = Hv = 1) at S = 8192 and 32768, and
Qwen3-Next's heads (Hk = 16, Hv = 32) at S = 8192; schur, bf16, group 8. Each row also checks that the fused y
equals the two launches' bit for bit.

Bucketed (``--bucket``): the serving prefill's form, the norm folded into ``gdn_cte_bucket``'s output stage
(``gdn_cte_bucket_normed``, ``gdn_nki.prefill_bucket`` with ``z``) against ``gdn_cte_bucket`` then
``gdn_gated_rms_norm`` on the bucket's T tokens × Hv rows (the serving example's two launches: the norm's rows
padded to the bucket), at Qwen3-Next's heads in a bucket of T = 8192 tokens and 8 slots holding four prompts that
end at its last chunk (3000, 2000, 1500 and 1500 tokens); schur, bf16, group 8. The row checks the fused y against
the two launches' on every real token, bit for bit.

    python packages/gdn-nki/bench/bench_norm.py [--out DIR] [--quick] [--smoke] [--fused] [--bucket]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

import gdn_nki
import nki_cpu
from nki_cpu.cost import estimate

VALUE_HEADS, HEAD_DIM = 32, 128
HBM_BYTES_PER_NS = 2.9e12 / 8 / 1e9  # one NeuronCore's share of Trn2's 2.9 TB/s (bench_decode.py)
PREFILL_TOKENS = (8192, 32768)
DECODE_REQUESTS = (8, 64, 256)
DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float32": np.float32}


@dataclass
class Row:
    """One cell of the table."""

    form: str
    tokens: int
    dtype: str
    makespan_us: float
    necessary_bytes: int
    bytes_moved: int
    model_floor_us: float
    binding: str
    busy_us: dict[str, float]
    instructions: int

    @property
    def hbm_floor_us(self) -> float:
        return self.necessary_bytes / HBM_BYTES_PER_NS / 1e3

    @property
    def hbm_ratio(self) -> float:
        return self.makespan_us / self.hbm_floor_us


def measure(form: str, tokens: int, dtype: str, seed: int = 0) -> Row:
    """One ``gated_rms_norm`` launch over [tokens, 32, 128], estimated."""
    rng = np.random.default_rng(seed)
    shape = (tokens, VALUE_HEADS, HEAD_DIM)
    o = rng.standard_normal(shape).astype(DTYPES[dtype])
    z = rng.standard_normal(shape).astype(DTYPES[dtype])
    weight = (1.0 + 0.1 * rng.standard_normal(HEAD_DIM)).astype(np.float32)
    gdn_nki.gated_rms_norm(o, z, weight, eps=1e-6, check_values=False)
    trace = nki_cpu.last_trace()
    report = estimate(trace)
    return Row(
        form=form,
        tokens=tokens,
        dtype=dtype,
        makespan_us=report.makespan_ns / 1e3,
        necessary_bytes=3 * o.nbytes + weight.nbytes,
        bytes_moved=int(report.dma_bytes),
        model_floor_us=report.makespan_floor.parts["dma"] / 1e3,
        binding=report.makespan_floor.binding,
        busy_us={engine: ns / 1e3 for engine, ns in report.engine_busy_ns.items()},
        instructions=len(trace.records),
    )


FUSED_CELLS = ((1, 1, 8192), (1, 1, 32768), (16, 32, 8192))  # (Hk, Hv, S)


@dataclass
class FusedRow:
    """One fused launch against the two it replaces (makespans in µs) and the engines' busy time of each."""

    key_heads: int
    value_heads: int
    seq_len: int
    cte_us: float
    norm_us: float
    fused_us: float
    bit_identical: bool
    busy_us: dict[str, tuple[float, float]]  # engine: (gdn_cte + norm, fused)

    @property
    def separate_us(self) -> float:
        return self.cte_us + self.norm_us


def _report() -> tuple[float, dict[str, float]]:
    report = estimate(nki_cpu.last_trace())
    return report.makespan_ns / 1e3, {engine: ns / 1e3 for engine, ns in report.engine_busy_ns.items()}


def measure_fused(key_heads: int, value_heads: int, seq_len: int, seed: int = 0) -> FusedRow:
    """``gdn_cte_normed`` against ``gdn_cte`` + ``gdn_gated_rms_norm`` on one bf16 prefill, estimated."""
    rng = np.random.default_rng(seed)
    bf16 = ml_dtypes.bfloat16

    def unit_rows(shape: tuple[int, ...]) -> np.ndarray:
        x = rng.standard_normal(shape)
        return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(bf16)

    q, k = unit_rows((1, key_heads, seq_len, HEAD_DIM)), unit_rows((1, key_heads, seq_len, HEAD_DIM))
    v = rng.standard_normal((1, value_heads, seq_len, HEAD_DIM)).astype(bf16)
    g = -rng.uniform(0.01, 0.2, (1, value_heads, seq_len)).astype(np.float32)
    beta = rng.uniform(0.1, 0.9, (1, value_heads, seq_len)).astype(np.float32)
    z = rng.standard_normal((1, seq_len, value_heads, HEAD_DIM)).astype(bf16)
    weight = (1.0 + 0.1 * rng.standard_normal(HEAD_DIM)).astype(np.float32)
    args = (q, k, v, g, beta)
    scale = HEAD_DIM**-0.5
    o, _ = gdn_nki.simulate(*args, scale, mask_pack=gdn_nki.build_mask_pack(), group_size=8, check_values=False)
    cte_us, cte_busy = _report()
    y_two = gdn_nki.gated_rms_norm(o, np.ascontiguousarray(z.transpose(0, 2, 1, 3)), weight, check_values=False)
    norm_us, norm_busy = _report()
    y, _ = gdn_nki.simulate_normed(*args, z, weight, scale, group_size=8, check_values=False)
    fused_us, fused_busy = _report()
    busy = {e: (cte_busy.get(e, 0.0) + norm_busy.get(e, 0.0), fused_busy.get(e, 0.0)) for e in fused_busy}
    same = bool(np.array_equal(np.asarray(y).view(np.uint16), np.asarray(y_two).view(np.uint16)))
    return FusedRow(key_heads, value_heads, seq_len, cte_us, norm_us, fused_us, same, busy)


BUCKET_CELL = (16, 32, (8192, 8), (3000, 2000, 1500, 1500))  # (Hk, Hv, bucket, prompt lengths)


def measure_bucket(key_heads: int, value_heads: int, bucket: tuple[int, int], lengths: tuple[int, ...],
                   seed: int = 0) -> FusedRow:  # fmt: skip
    """``gdn_cte_bucket_normed`` against ``gdn_cte_bucket`` + ``gdn_gated_rms_norm`` on the bucket's rows, one bf16
    serving batch, estimated (``seq_len``: the bucket's T)."""
    rng = np.random.default_rng(seed)
    bf16, tokens = ml_dtypes.bfloat16, sum(lengths)

    def unit_rows(shape: tuple[int, ...]) -> np.ndarray:
        x = rng.standard_normal(shape)
        return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(bf16)

    call = dict(
        query=unit_rows((1, key_heads, tokens, HEAD_DIM)), key=unit_rows((1, key_heads, tokens, HEAD_DIM)),
        value=rng.standard_normal((1, value_heads, tokens, HEAD_DIM)).astype(bf16),
        g_log=-rng.uniform(0.01, 0.2, (1, value_heads, tokens)).astype(np.float32),
        beta=rng.uniform(0.1, 0.9, (1, value_heads, tokens)).astype(np.float32),
        cu_seqlens=np.cumsum((0, *lengths)).astype(np.int32), bucket=bucket, scale=HEAD_DIM**-0.5, group_size=8,
        recurrent_state=np.zeros((len(lengths), value_heads, HEAD_DIM, HEAD_DIM), np.float32), check_values=False,
    )  # fmt: skip
    z = rng.standard_normal((1, tokens, value_heads, HEAD_DIM)).astype(bf16)
    weight = (1.0 + 0.1 * rng.standard_normal(HEAD_DIM)).astype(np.float32)
    o, _ = gdn_nki.prefill_bucket(**call)
    cte_us, cte_busy = _report()
    rows = bucket[0] * value_heads  # the serving example's norm launch: the bucket's rows, padding rows zero
    x, gate = (np.zeros((rows, HEAD_DIM), bf16) for _ in range(2))
    x[: tokens * value_heads] = np.asarray(o)[0].transpose(1, 0, 2).reshape(-1, HEAD_DIM)
    gate[: tokens * value_heads] = z[0].reshape(-1, HEAD_DIM)
    y_two = gdn_nki.gated_rms_norm(x, gate, weight, check_values=False)[: tokens * value_heads]
    norm_us, norm_busy = _report()
    call["recurrent_state"] = np.zeros_like(call["recurrent_state"])
    y, _ = gdn_nki.prefill_bucket(**call, z=z, norm_weight=weight)
    fused_us, fused_busy = _report()
    busy = {e: (cte_busy.get(e, 0.0) + norm_busy.get(e, 0.0), fused_busy.get(e, 0.0)) for e in fused_busy}
    y = np.asarray(y)[0].transpose(1, 0, 2).reshape(-1, HEAD_DIM)
    same = bool(np.array_equal(y.view(np.uint16), np.asarray(y_two).view(np.uint16)))
    return FusedRow(key_heads, value_heads, bucket[0], cte_us, norm_us, fused_us, same, busy)


def fused_table(rows: list[FusedRow]) -> str:
    """The markdown table of the fused cells."""
    lines = [
        "| heads Hk / Hv | S | gdn_cte µs | norm µs | two launches µs | fused µs | fused / two | "
        "scalar / vector / GpSimd / DMA busy µs, two → fused | y bit-identical |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        busy = " / ".join(
            f"{r.busy_us[e][0]:,.0f} → {r.busy_us[e][1]:,.0f}" for e in ("scalar", "vector", "gpsimd", "dma")
        )
        lines.append(
            f"| {r.key_heads} / {r.value_heads} | {r.seq_len:,} | {r.cte_us:,.1f} | {r.norm_us:,.1f} | "
            f"{r.separate_us:,.1f} | {r.fused_us:,.1f} | {r.fused_us / r.separate_us:.3f} | {busy} | "
            f"{'yes' if r.bit_identical else 'NO'} |"
        )
    return "\n".join(lines)


def table(rows: list[Row]) -> str:
    """The markdown table of the cells."""
    lines = [
        "| form | tokens (rows) | dtype | makespan µs | MiB moved | HBM floor µs | × HBM floor | model DMA floor µs | "
        "binding floor | vector / scalar / GpSimd busy µs | instructions |",
        "|---|---:|---|---:|---:|---:|---:|---:|---|---|---:|",
    ]
    for r in rows:
        busy = " / ".join(f"{r.busy_us[e]:,.1f}" for e in ("vector", "scalar", "gpsimd"))
        lines.append(
            f"| {r.form} | {r.tokens:,} ({r.tokens * VALUE_HEADS:,}) | {r.dtype} | {r.makespan_us:,.1f} | "
            f"{r.bytes_moved / 2**20:,.2f} | {r.hbm_floor_us:,.1f} | {r.hbm_ratio:.2f} | {r.model_floor_us:,.1f} | "
            f"{r.binding} | {busy} | {r.instructions:,} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Measure the cells, print the tables, and write them to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="directory for bench_norm.md and bench_norm_fused.md")
    parser.add_argument("--quick", action="store_true", help="8192 tokens and N = 8, 64 only; fused: one lane, 8192")
    parser.add_argument("--smoke", action="store_true", help="128 tokens and N = 8, bf16 only (seconds; for CI)")
    parser.add_argument("--fused", action="store_true", help="only the fused prefill rows (minutes)")
    parser.add_argument("--bucket", action="store_true", help="only the bucketed serving prefill's row (minutes)")
    args = parser.parse_args(argv)
    tables = {}
    if args.bucket:  # only the bucketed row
        cell = (1, 2, (256, 2), (100, 128)) if args.smoke else BUCKET_CELL
        tables["bench_norm_bucket.md"] = fused_table([_announced(measure_bucket(*cell))])
    else:
        if not args.fused:
            tables["bench_norm.md"] = table([_announced(measure(*cell)) for cell in _cells(args)])
        fused_cells = [(1, 2, 256)] if args.smoke else FUSED_CELLS[:1] if args.quick else FUSED_CELLS
        tables["bench_norm_fused.md"] = fused_table([_announced(measure_fused(*cell)) for cell in fused_cells])
    for name, text in tables.items():
        print(text)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / name).write_text(text + "\n")


def _cells(args: argparse.Namespace) -> list[tuple[str, int, str]]:
    """The separate kernel's cells at the run's size."""
    if args.smoke:
        return [("prefill", 128, "bfloat16"), ("decode", 8, "bfloat16")]
    prefill = PREFILL_TOKENS[:1] if args.quick else PREFILL_TOKENS
    decode = DECODE_REQUESTS[:2] if args.quick else DECODE_REQUESTS
    return [("prefill", t, d) for t in prefill for d in DTYPES] + [("decode", n, d) for n in decode for d in DTYPES]


def _announced(row: Row | FusedRow) -> Row | FusedRow:
    """Print one measured cell as it is done (the full run takes minutes)."""
    if isinstance(row, FusedRow):
        print(f"fused {row.key_heads}/{row.value_heads} S={row.seq_len}: {row.fused_us:,.1f} us against "
              f"{row.separate_us:,.1f}", flush=True)  # fmt: skip
    else:
        print(f"{row.form} {row.tokens} {row.dtype}: {row.makespan_us:,.1f} us ({row.hbm_ratio:.2f}x)", flush=True)
    return row


if __name__ == "__main__":
    main()
