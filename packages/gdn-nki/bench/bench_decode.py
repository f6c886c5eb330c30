"""Decode step cost: makespan per step from nki-cpu's cost model, bytes moved, and the HBM-bandwidth floor.

Qwen3-Next's heads (Hk = 16 key heads, Hv = 32 value heads, Dk = Dv = 128), bf16 I/O, fused gating and in-kernel
q/k l2norm (what a Qwen3-Next layer calls), ``gdn_step`` through ``gdn_nki.decode_step``, for N requests in
{1, 8, 64, 256} and T new tokens in {1, 4}; T = 4 is run in both pool forms: [N] indices (the state after the
4 tokens written back) and vLLM's [N, T] (the state after every token kept, 4 writes per request).

Makespan in the kernel's own program order, and in the order a reordering compiler would issue the same
instructions (nki-cpu's ``estimate(trace, order="critical_path")``, as ``bench_kernel.py`` reports it).

Floors:

- HBM: the bytes the launch moves (nki-cpu's count of every DMA: states read and written, q/k/v/z/out, gates,
  indices) at one NeuronCore's share of the device's HBM bandwidth: 2.9 TB/s for 8 NeuronCore-v3 ("Trainium2
  Architecture Guide for NKI", Neuron docs, latest (SDK 2.33): "4 HBM stacks with a total device memory capacity
  of 96GiB and bandwidth of 2.9TB/s", "8 NeuronCores (v3)"), i.e. 362.5 B/ns;
- the cost model's own DMA floor (``CostReport.makespan_floor``: bytes at 16 DMA engines × 23 B/ns, nki-cpu's Trn2
  figure, and the efficiency of each transfer's contiguous runs). The state moves in 2 KiB runs per partition
  (``gdn_nki.tkg.state_tiles``), which the model's efficiency curve puts at 90 % of that 368 B/ns peak: 331 B/ns,
  just below the HBM share, so the model's floor sits slightly above the HBM floor.

A second table runs AWS's ``gdn_tkg`` (one token, GQA-expanded inputs, gated RMSNorm folded in) through
``gdn_nki.tkg_simulate`` at the same heads, B batch rows, on one program and on a launch grid of 2 beside
``decode_step`` on the same grid: a grid's makespan is its slowest program's (nki-cpu estimates each program
alone), its bytes both programs', and its HBM floor those bytes at the grid's share (two NeuronCores' on a grid
of 2: a logical NeuronCore of LNC = 2 is two physical ones).

    python packages/gdn-nki/bench/bench_decode.py [--out DIR] [--quick | --smoke]

With ``--out`` the table goes to ``DIR/bench_decode.md`` and every figure to ``DIR/bench_decode.json`` (the
directory is shared with the other benches, hence the prefix).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

import gdn_nki
import nki_cpu
from nki_cpu.cost import estimate

KEY_HEADS, VALUE_HEADS, HEAD_DIM = 16, 32, 128
PREFIX = "bench_decode"  # every file this script writes starts with it (--out is shared by all benches)
REQUESTS = (1, 8, 64, 256)
TOKENS = (1, 4)
QUICK_REQUESTS = (1, 8)
# CI's smoke run (``--smoke``): every code path of the script (both pool forms) at the smallest cells, in seconds
SMOKE_REQUESTS, SMOKE_TOKENS = (1,), (1, 2)
# gdn_tkg's cells: (batch rows, launch grid); the smoke run keeps the grid's split at the smallest batch
TKG_CELLS, SMOKE_TKG_CELLS = ((8, 1), (8, 2), (64, 2)), ((2, 2),)
HBM_BYTES_PER_NS = 2.9e12 / 8 / 1e9  # one NeuronCore's share of Trn2's 2.9 TB/s (module docstring)
# The order a reordering compiler would issue the same instructions in, beside the kernel's own program order (as
# bench_kernel.py reports it): neuronx-cc reorders independent instructions by default (docs/nki-sources.md §4.6).
COMPILER_ORDER = "critical_path"


@dataclass
class Row:
    """One cell of the table."""

    requests: int
    tokens: int
    form: str
    makespan_us: float
    compiler_order_us: float
    bytes_moved: int
    hbm_floor_us: float
    model_floor_us: float
    binding: str
    instructions: int
    wall_s: float

    @property
    def hbm_ratio(self) -> float:
        return self.makespan_us / self.hbm_floor_us

    @property
    def model_ratio(self) -> float:
        return self.makespan_us / self.model_floor_us


def measure(requests: int, tokens: int, keep_every_token: bool, seed: int = 0, grid: int | None = None) -> Row:
    """One ``decode_step`` launch at Qwen3-Next's heads, estimated (program 0's trace on a grid)."""
    rng = np.random.default_rng(seed)
    bf16, f32 = ml_dtypes.bfloat16, np.float32
    q = rng.standard_normal((requests, tokens, KEY_HEADS, HEAD_DIM)).astype(bf16)
    k = rng.standard_normal((requests, tokens, KEY_HEADS, HEAD_DIM)).astype(bf16)
    v = rng.standard_normal((requests, tokens, VALUE_HEADS, HEAD_DIM)).astype(bf16)
    a, b = rng.standard_normal((2, requests, tokens, VALUE_HEADS)).astype(f32)
    a_log, dt_bias = np.zeros(VALUE_HEADS, f32), np.zeros(VALUE_HEADS, f32)
    width = tokens if keep_every_token else 1
    pool = np.zeros((requests * width, VALUE_HEADS, HEAD_DIM, HEAD_DIM), f32)
    indices = np.arange(requests * width, dtype=np.int32).reshape((requests, width) if keep_every_token else -1)
    start = time.perf_counter()
    gdn_nki.decode_step(q, k, v, pool, indices, a=a, b=b, A_log=a_log, dt_bias=dt_bias, use_qk_l2norm=True,
                        grid=grid, check_values=False)  # fmt: skip
    wall = time.perf_counter() - start
    trace = nki_cpu.last_trace()
    report = estimate(trace)
    floor = report.makespan_floor
    return Row(
        requests=requests,
        tokens=tokens,
        form="[N, T] (every token kept)" if keep_every_token else "[N]",
        makespan_us=report.makespan_ns / 1e3,
        compiler_order_us=estimate(trace, order=COMPILER_ORDER).makespan_ns / 1e3,
        bytes_moved=int(report.dma_bytes),
        hbm_floor_us=report.dma_bytes / HBM_BYTES_PER_NS / 1e3,
        model_floor_us=floor.parts["dma"] / 1e3,
        binding=floor.binding,
        instructions=len(trace.records),
        wall_s=wall,
    )


@dataclass
class GridRow:
    """One cell of the launch-grid table: ``kernel`` on ``grid`` programs."""

    kernel: str
    requests: int
    grid: int
    makespan_us: float
    bytes_moved: int
    binding: str

    @property
    def hbm_floor_us(self) -> float:
        return self.bytes_moved / (self.grid * HBM_BYTES_PER_NS) / 1e3

    @property
    def hbm_ratio(self) -> float:
        return self.makespan_us / self.hbm_floor_us


def _tkg_inputs(batch: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """``gdn_tkg``'s arguments at Qwen3-Next's value heads (q, k GQA-expanded), bf16 I/O."""
    bh, bf16, f32 = batch * VALUE_HEADS, ml_dtypes.bfloat16, np.float32
    q, k, v, z = (rng.standard_normal((bh, HEAD_DIM)).astype(bf16) for _ in range(4))
    b, a = (rng.standard_normal(bh).astype(f32) for _ in range(2))
    state = (0.1 * rng.standard_normal((bh, HEAD_DIM, HEAD_DIM))).astype(f32)
    zeros = np.zeros(VALUE_HEADS, f32)
    return q, k, v, b, a, zeros, zeros, z, np.ones(HEAD_DIM, f32), state


def measure_grid(kernel: str, requests: int, grid: int, seed: int = 0) -> GridRow:
    """One ``gdn_tkg`` (``kernel="gdn_tkg"``) or ``decode_step`` (T = 1, [N]) launch on ``grid`` programs."""
    rng = np.random.default_rng(seed)
    if kernel == "gdn_tkg":
        gdn_nki.tkg_simulate(*_tkg_inputs(requests, rng), check_values=False, grid=grid)
    else:
        measure(requests, 1, keep_every_token=False, seed=seed, grid=grid)
    reports = [estimate(trace) for trace in nki_cpu.last_traces() if trace.records]
    slowest = max(reports, key=lambda r: r.makespan_ns)
    return GridRow(kernel=kernel, requests=requests, grid=grid, makespan_us=slowest.makespan_ns / 1e3,
                   bytes_moved=int(sum(r.dma_bytes for r in reports)),
                   binding=slowest.makespan_floor.binding)  # fmt: skip


def grid_table(rows: list[GridRow]) -> str:
    """The markdown table of the launch-grid cells."""
    lines = [
        "| kernel | B | grid | makespan µs (slowest program) | µs per request | MiB moved | HBM floor µs | × HBM floor "
        "| binding floor |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.kernel} | {r.requests} | {r.grid} | {r.makespan_us:,.1f} | {r.makespan_us / r.requests:,.1f} | "
            f"{r.bytes_moved / 2**20:,.1f} | {r.hbm_floor_us:,.1f} | {r.hbm_ratio:.2f} | {r.binding} |"
        )
    return "\n".join(lines)


def table(rows: list[Row]) -> str:
    """The markdown table of the cells."""
    lines = [
        "| N | T | indices | makespan µs | µs per request | compiler order µs | MiB moved | HBM floor µs | × HBM floor "
        "(program / compiler order) | model DMA floor µs | × model DMA floor | binding floor |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.requests} | {r.tokens} | {r.form} | {r.makespan_us:,.1f} | {r.makespan_us / r.requests:,.1f} | "
            f"{r.compiler_order_us:,.1f} | {r.bytes_moved / 2**20:,.1f} | {r.hbm_floor_us:,.1f} | {r.hbm_ratio:.2f} / "
            f"{r.compiler_order_us / r.hbm_floor_us:.2f} | {r.model_floor_us:,.1f} | {r.model_ratio:.2f} | {r.binding} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Measure the cells, print the table, and write it (markdown and JSON) to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="directory for bench_decode.md and bench_decode.json")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help=f"N in {set(QUICK_REQUESTS)} only")
    size.add_argument("--smoke", action="store_true", help="the smallest cells only (CI's check that the script runs)")
    args = parser.parse_args(argv)
    requests, tokens = (SMOKE_REQUESTS, SMOKE_TOKENS) if args.smoke else (REQUESTS, TOKENS)
    if args.quick:
        requests = QUICK_REQUESTS
    rows = []
    for n in requests:
        for t in tokens:
            for keep in (False, True) if t > 1 else (False,):
                rows.append(measure(n, t, keep))
                r = rows[-1]
                print(f"N={n} T={t} {r.form}: {r.makespan_us:,.1f} us ({r.instructions} instr, {r.wall_s:.1f} s)",
                      flush=True)  # fmt: skip
    grid_rows = []
    for n, grid in SMOKE_TKG_CELLS if args.smoke else TKG_CELLS:
        for kernel in ("gdn_tkg", "decode_step"):
            grid_rows.append(measure_grid(kernel, n, grid))
    text = table(rows) + "\n\n" + grid_table(grid_rows)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{PREFIX}.md").write_text(text + "\n")
        cells = [{**asdict(r), "hbm_ratio": r.hbm_ratio, "model_ratio": r.model_ratio} for r in rows]
        cells += [{**asdict(r), "hbm_floor_us": r.hbm_floor_us, "hbm_ratio": r.hbm_ratio} for r in grid_rows]
        (args.out / f"{PREFIX}.json").write_text(json.dumps(cells, indent=2) + "\n")
        print(f"wrote {args.out / (PREFIX + '.md')}, {args.out / (PREFIX + '.json')}")


if __name__ == "__main__":
    main()
