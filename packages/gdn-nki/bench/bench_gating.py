"""Prefill gates on device: ``gdn_gating`` (vLLM's ``fused_gdn_gating`` as an NKI kernel) per launch from nki-cpu's
cost model, against the launch's HBM floor (issue 43 item 4).

Qwen3-Next's gates: a and b [tokens, 32] in bf16 (the layer's ``ba`` projection per value head), A_log and
dt_bias fp32 [32]; g [1, tokens, 32] fp32 and β [1, tokens, 32] bf16 out, through
``gdn_nki.host.gating.fused_gdn_gating``. Prefill: 8192 and 32768 packed tokens.

HBM floor: the bytes any launch must move — a and b read, g and β written — at one NeuronCore's share of Trn2's
2.9 TB/s (362.5 B/ns, as ``bench_norm.py``). PERFORMANCE.md ("Prefill gates on device") sets these beside
``gdn_cte``'s makespan at the same tokens: what computing the gates inside ``gdn_cte`` could save at most.

    python packages/gdn-nki/bench/bench_gating.py [--out DIR] [--smoke]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import ml_dtypes
import numpy as np

import nki_cpu
from gdn_nki.host.gating import fused_gdn_gating
from nki_cpu.cost import estimate

HEADS = 32
HBM_BYTES_PER_NS = 2.9e12 / 8 / 1e9  # one NeuronCore's share of Trn2's 2.9 TB/s (bench_norm.py)
TOKENS = (8192, 32768)


def measure(tokens: int, seed: int = 0) -> dict[str, float]:
    """One launch over [tokens, 32] bf16 a and b, estimated: makespan, bytes, floors and busy times."""
    rng = np.random.default_rng(seed)
    a = (4.0 * rng.standard_normal((tokens, HEADS))).astype(ml_dtypes.bfloat16)
    b = (4.0 * rng.standard_normal((tokens, HEADS))).astype(ml_dtypes.bfloat16)
    a_log = rng.uniform(-4.0, 2.0, HEADS).astype(np.float32)
    dt_bias = rng.uniform(-2.0, 2.0, HEADS).astype(np.float32)
    g, beta = fused_gdn_gating(a_log, a, b, dt_bias, check_values=False)
    trace = nki_cpu.last_trace()
    report = estimate(trace)
    necessary = a.nbytes + b.nbytes + g.nbytes + beta.nbytes
    busy = report.engine_busy_ns
    return {
        "tokens": tokens,
        "makespan_us": report.makespan_ns / 1e3,
        "mib": report.dma_bytes / 2**20,
        "floor_us": necessary / HBM_BYTES_PER_NS / 1e3,
        "binding": report.makespan_floor.binding,
        "busy": " / ".join(f"{busy.get(e, 0.0) / 1e3:,.1f}" for e in ("vector", "scalar", "gpsimd")),
        "instructions": len(trace.records),
    }


def table(rows: list[dict[str, float]]) -> str:
    """The markdown table of the cells."""
    lines = [
        "| tokens × heads | makespan µs | MiB moved | HBM floor µs | × HBM floor | binding floor | "
        "vector / scalar / GpSimd busy µs | instructions |",
        "|---|---:|---:|---:|---:|---|---|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['tokens']:,} × {HEADS} | {r['makespan_us']:,.1f} | {r['mib']:,.2f} | {r['floor_us']:,.1f} | "
            f"{r['makespan_us'] / r['floor_us']:.2f} | {r['binding']} | {r['busy']} | {r['instructions']:,} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Measure the cells, print the table, and write it to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="directory for bench_gating.md")
    parser.add_argument("--smoke", action="store_true", help="128 tokens (seconds; for CI)")
    args = parser.parse_args(argv)
    rows = [measure(t) for t in ((128,) if args.smoke else TOKENS)]
    text = table(rows)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_gating.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
