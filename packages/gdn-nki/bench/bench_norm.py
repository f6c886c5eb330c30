"""Gated RMSNorm cost: makespan per launch from nki-cpu's cost model against the launch's HBM floor (issue 43 item 4).

Qwen3-Next's output stage: y = rmsnorm(o) · weight · silu(z) over head_v_dim = 128 for 32 value heads, o and z as
[tokens, 32, 128] (the recurrence's output and the z projection), the weight fp32, through
``gdn_nki.gated_rms_norm`` (``gdn_gated_rms_norm``). Prefill: 8192 and 32768 packed tokens; decode: N requests of
one token (N·32 rows), N in {8, 64, 256}; bf16 and fp32 I/O.

HBM floor: the bytes any launch must move — o and z read, y written, the weight — at one NeuronCore's share of
Trn2's 2.9 TB/s (362.5 B/ns, as ``bench_decode.py`` and ``bench_conv.py``). The model's DMA floor is the bytes the
kernel moves at 16 engines × 23 B/ns and each transfer's run efficiency. Per-engine busy times are reported for
the fusion estimate in PERFORMANCE.md ("Gated RMSNorm").

    python packages/gdn-nki/bench/bench_norm.py [--out DIR] [--quick] [--smoke]
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
    """Measure the cells, print the table, and write it to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="directory for bench_norm.md")
    parser.add_argument("--quick", action="store_true", help="8192 tokens and N = 8, 64 only")
    parser.add_argument("--smoke", action="store_true", help="128 tokens and N = 8, bf16 only (seconds; for CI)")
    args = parser.parse_args(argv)
    if args.smoke:
        cells = [("prefill", 128, "bfloat16"), ("decode", 8, "bfloat16")]
    else:
        prefill = PREFILL_TOKENS[:1] if args.quick else PREFILL_TOKENS
        decode = DECODE_REQUESTS[:2] if args.quick else DECODE_REQUESTS
        cells = [("prefill", t, d) for t in prefill for d in DTYPES] + [
            ("decode", n, d) for n in decode for d in DTYPES
        ]
    rows = []
    for form, tokens, dtype in cells:
        rows.append(measure(form, tokens, dtype))
        print(f"{form} {tokens} {dtype}: {rows[-1].makespan_us:,.1f} us ({rows[-1].hbm_ratio:.2f}x)", flush=True)
    text = table(rows)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_norm.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
