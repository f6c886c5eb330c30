"""Interpreter overhead of nki-cpu, and the cost report of a 4,096-instruction kernel.

Usage:
    python bench/bench_interpreter.py --out DIR [--repeats 7] [--per-kind 64] [--target trn2] [--smoke]

Measures, through ``nki_cpu.simulate``: the median wall time per instruction for a few instruction kinds on
128×512 tiles (a kernel with ``--per-kind`` copies of the instruction minus the same kernel without them), and the
wall time of a 4,096-instruction kernel. Prints a table and writes to ``--out`` (shared with the other packages'
benches, hence the prefix): ``bench_interpreter.json``, ``bench_interpreter.md``, the kernel's cost report
(``bench_interpreter_cost_report.txt``), its Chrome trace (``bench_interpreter_cost_trace.json``) and, when
matplotlib is installed, a PNG timeline (``bench_interpreter_cost_timeline.png``). ``--smoke`` (CI's check that
the script runs): one run of each kernel, two instructions per kind, a 64-instruction mixed kernel.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from nki_cpu import isa as nisa
from nki_cpu import language as nl
from nki_cpu import simulate, state
from nki_cpu.cost import Trace, estimate, write_chrome_trace, write_png_timeline

P, F = 128, 512  # one full tile: 128 partitions × 512 elements
LOOP_BODY = 8  # instructions per iteration of the mixed kernel
MIXED_ITERATIONS = 4096 // LOOP_BODY
SMOKE_MIXED_ITERATIONS = 64 // LOOP_BODY


@contextlib.contextmanager
def captured_traces() -> Iterator[list[Trace]]:
    """Collect the trace of every launch that records an instruction while the block runs."""
    traces: list[Trace] = []
    original = state.Launch.record

    def record(self: state.Launch, rec: Any) -> Any:
        if not any(t is self.trace for t in traces):
            traces.append(self.trace)
        return original(self, rec)

    state.Launch.record = record  # type: ignore[method-assign]
    try:
        yield traces
    finally:
        state.Launch.record = original  # type: ignore[method-assign]


def _load(src: Any, dtype: Any = None) -> Any:
    tile = nl.ndarray(src.shape, dtype=dtype or src.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=src)
    return tile


def _kind_body(kind: str, a: Any, b: Any, a_hbm: Any) -> Callable[[], None]:
    """One instruction of ``kind`` on 128×512 tiles (operands prepared by the caller)."""
    out = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
    acc = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.psum)
    bodies: dict[str, Callable[[], Any]] = {
        "tensor_tensor": lambda: nisa.tensor_tensor(dst=out, data1=a, data2=b, op=nl.add),
        "tensor_scalar": lambda: nisa.tensor_scalar(dst=out, data=a, op0=nl.multiply, operand0=2.0),
        "activation": lambda: nisa.activation(dst=out, op=nl.exp, data=a),
        "tensor_copy": lambda: nisa.tensor_copy(dst=out, src=a),
        "nc_matmul": lambda: nisa.nc_matmul(dst=acc, stationary=a[:, 0:P], moving=b),
        "dma_copy": lambda: nisa.dma_copy(dst=out, src=a_hbm),
    }
    return bodies[kind]


def make_kind_kernel(kind: str, count: int) -> Callable[..., Any]:
    """A kernel that loads two tiles and then runs ``count`` instructions of ``kind``."""

    def kernel(x: Any, y: Any) -> Any:
        a, b = _load(x), _load(y)
        body = _kind_body(kind, a, b, x)
        for _ in range(count):
            body()
        result = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=result, src=a)
        return result

    return kernel


def mixed_kernel(x: Any, w: Any, iterations: int = MIXED_ITERATIONS) -> Any:
    """``iterations`` × 8 instructions (4,096 by default): per iteration load, matmul, evict, activation,
    tensor_tensor, tensor_scalar, copy, store."""
    out = nl.ndarray((iterations, P, F), dtype=x.dtype, buffer=nl.shared_hbm)
    weights = _load(w)
    for i in range(iterations):
        tile = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=x[i % x.shape[0]])
        acc = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=weights, moving=tile)
        evicted = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=evicted, src=acc)
        activated = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=activated, op=nl.exp, data=evicted)
        summed = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=summed, data1=activated, data2=evicted, op=nl.add)
        nisa.tensor_scalar(dst=summed, data=summed, op0=nl.multiply, operand0=0.5)
        result = nl.ndarray((P, F), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=result, src=summed)
        nisa.dma_copy(dst=out[i], src=result)
    return out


def median_seconds(run: Callable[[], Any], repeats: int) -> float:
    """Median wall time of ``run`` over ``repeats`` calls (after one warm-up)."""
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_kinds(repeats: int, per_kind: int) -> dict[str, float]:
    """Median µs per instruction for each kind (kernel with ``per_kind`` copies minus kernel with none)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((P, F), dtype=np.float32)
    y = rng.standard_normal((P, F), dtype=np.float32)
    results = {}
    for kind in ("tensor_tensor", "tensor_scalar", "activation", "tensor_copy", "nc_matmul", "dma_copy"):
        full = simulate(make_kind_kernel(kind, per_kind))
        empty = simulate(make_kind_kernel(kind, 0))
        with_body = median_seconds(lambda k=full: k(x, y), repeats)
        without = median_seconds(lambda k=empty: k(x, y), repeats)
        results[kind] = max(0.0, with_body - without) / per_kind * 1e6
    return results


def bench_mixed(repeats: int, iterations: int = MIXED_ITERATIONS) -> tuple[float, Trace | None]:
    """Median seconds of the mixed kernel (4,096 instructions by default) and the trace of its last run."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, P, F), dtype=np.float32)
    w = rng.standard_normal((P, P), dtype=np.float32) / P
    kernel = simulate(mixed_kernel)
    seconds = median_seconds(lambda: kernel(x, w, iterations=iterations), repeats)
    with captured_traces() as traces:
        kernel(x, w, iterations=iterations)
    return seconds, (traces[-1] if traces else None)


def write_outputs(out: Path, per_kind: dict[str, float], mixed_s: float, trace: Trace | None, target: str) -> str:
    """Write the JSON summary and the cost report files; return the printed table."""
    lines = [f"{'instruction (128x512)':<24}{'us / instr':>12}"]
    lines += [f"{kind:<24}{us:>12.1f}" for kind, us in per_kind.items()]
    count = len(trace.records) if trace else 0
    lines.append(f"{'mixed kernel':<24}{mixed_s * 1e3:>10.1f} ms for {count} instructions")
    summary: dict[str, Any] = {"us_per_instruction": per_kind, "mixed_kernel_s": mixed_s, "instructions": count}
    if trace is not None:
        report = estimate(trace, target=target)
        (out / "bench_interpreter_cost_report.txt").write_text(str(report) + "\n")
        write_chrome_trace(report, out / "bench_interpreter_cost_trace.json")
        with contextlib.suppress(ImportError):
            write_png_timeline(report, out / "bench_interpreter_cost_timeline.png")
        summary["estimated_makespan_us"] = report.makespan_ns / 1000
        lines += ["", str(report)]
    (out / "bench_interpreter.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "bench_interpreter.md").write_text(_markdown(per_kind, mixed_s, count, lines[len(per_kind) + 2 :]))
    return "\n".join(lines)


def _markdown(per_kind: dict[str, float], mixed_s: float, count: int, report_lines: list[str]) -> str:
    """The results as a markdown page (table of µs per instruction, the mixed kernel, its cost report)."""
    rows = ["| instruction (128×512 fp32) | µs / instruction |", "|---|---:|"]
    rows += [f"| `{kind}` | {us:.1f} |" for kind, us in per_kind.items()]
    text = ["# nki-cpu interpreter benchmark", "", *rows, ""]
    per_instr = mixed_s / count * 1e6 if count else 0.0
    text.append(f"Mixed kernel: {mixed_s * 1e3:.1f} ms for {count} instructions ({per_instr:.1f} µs / instruction).")
    if report_lines:
        text += ["", "Cost report of the mixed kernel:", "", "```", *[line for line in report_lines if line], "```"]
    return "\n".join(text) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and write its outputs to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--per-kind", type=int, default=64)
    parser.add_argument("--target", default="trn2")
    parser.add_argument("--smoke", action="store_true", help="the smallest kernels, one run each (CI's check)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.smoke:
        args.repeats, args.per_kind = 1, 2
    per_kind = bench_kinds(args.repeats, args.per_kind)
    mixed_s, trace = bench_mixed(max(1, args.repeats // 2), SMOKE_MIXED_ITERATIONS if args.smoke else MIXED_ITERATIONS)
    print(write_outputs(args.out, per_kind, mixed_s, trace, args.target))


if __name__ == "__main__":
    main()
