"""Benchmark of the gdn-ref references: chunked-vs-oracle error per precision, and run times at Qwen3-Next size.

Usage: ``python bench_reference.py [--out DIR] [--repeats N] [--skip-oracle] [--smoke]``. Prints two tables and, with
``--out``, writes ``bench_reference.json`` and ``bench_reference.md`` there. Not a timed test: the figures depend
on the machine and on whatever else shares its cores (the load average is recorded with them).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from gdn_ref import ALGORITHMS, chunked, recurrent

PRECISIONS = {"fp64": (np.float64, False), "fp32": (np.float32, False), "bf16-operands": (np.float32, True)}
# Error shape: moderate, with a partial last chunk for both algorithms (1000 = 7·128 + 104 = 15·64 + 40).
ERROR_SHAPE = dict(B=1, Hk=2, Hv=4, S=1000, Dk=64, Dv=64)
# Timing shape: one Qwen3-Next GDN layer's prefill (Hk=16, Hv=32, D=128) over 8K tokens.
TIMING_SHAPE = dict(B=1, Hk=16, Hv=32, S=8192, Dk=128, Dv=128)
# CI's smoke run (``--smoke``): both tables at shapes that take a fraction of a second (a partial last chunk kept)
SMOKE_ERROR_SHAPE = dict(B=1, Hk=1, Hv=2, S=200, Dk=16, Dv=16)
SMOKE_TIMING_SHAPE = dict(B=1, Hk=1, Hv=2, S=256, Dk=32, Dv=32)


def make_inputs(seed: int, B: int, Hk: int, Hv: int, S: int, Dk: int, Dv: int, regime: str) -> tuple:
    """Seeded inputs: unit q/k, N(0,1) values, a random initial state.

    regime "moderate": Gaussian keys, g ∈ [−0.3, 0], β ∈ [0.05, 0.95]. "ill-conditioned": near-collinear keys,
    g = 0, β ∈ [0.97, 0.999], the regime where neumann's doubling powers grow.
    """
    rng = np.random.default_rng(seed)

    def unit(x: np.ndarray) -> np.ndarray:
        return (x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + 1e-6)).astype(np.float32)

    query = unit(rng.standard_normal((B, Hk, S, Dk)))
    if regime == "ill-conditioned":
        key = unit(rng.standard_normal((B, Hk, 1, Dk)) + 0.01 * rng.standard_normal((B, Hk, S, Dk)))
        g_log = np.zeros((B, Hv, S), np.float32)
        beta = rng.uniform(0.97, 0.999, (B, Hv, S)).astype(np.float32)
    else:
        key = unit(rng.standard_normal((B, Hk, S, Dk)))
        g_log = -rng.uniform(0.0, 0.3, (B, Hv, S)).astype(np.float32)
        beta = rng.uniform(0.05, 0.95, (B, Hv, S)).astype(np.float32)
    value = rng.standard_normal((B, Hv, S, Dv)).astype(np.float32)
    state = rng.standard_normal((B, Hv, Dk, Dv)).astype(np.float32)
    return query, key, value, g_log, beta, Dk**-0.5, state


def rel_rms(actual: np.ndarray, reference: np.ndarray) -> float:
    diff = np.asarray(actual, np.float64) - reference
    return float(np.sqrt(np.mean(diff**2) / np.mean(reference**2)))


def max_abs(actual: np.ndarray, reference: np.ndarray) -> float:
    return float(np.max(np.abs(np.asarray(actual, np.float64) - reference)))


def error_table(shape: dict[str, int]) -> list[dict]:
    rows = []
    for regime in ("moderate", "ill-conditioned"):
        args = make_inputs(0, **shape, regime=regime)
        out_ref, state_ref = recurrent(*args)
        for algorithm in ALGORITHMS:
            for name, (dtype, bf16) in PRECISIONS.items():
                with np.errstate(over="ignore", invalid="ignore"):  # bf16 neumann overflows when ill-conditioned
                    out, state = chunked(*args, algorithm=algorithm, compute_dtype=dtype, bf16_operands=bf16)
                rows.append(
                    dict(
                        regime=regime,
                        algorithm=algorithm,
                        precision=name,
                        out_rel_rms=rel_rms(out, out_ref),
                        out_max_abs=max_abs(out, out_ref),
                        state_rel_rms=rel_rms(state, state_ref),
                        state_max_abs=max_abs(state, state_ref),
                    )
                )
    return rows


def timing_table(shape: dict[str, int], repeats: int, skip_oracle: bool) -> list[dict]:
    args = make_inputs(1, **shape, regime="moderate")
    rows = []
    for algorithm in ALGORITHMS:
        chunked(*args, algorithm=algorithm)  # warm-up: BLAS threads, allocator
        runs = []
        for _ in range(repeats):
            start = time.perf_counter()
            chunked(*args, algorithm=algorithm)
            runs.append(time.perf_counter() - start)
        rows.append(dict(what=f"chunked {algorithm} fp32", median_s=statistics.median(runs), runs_s=runs))
    if not skip_oracle:
        start = time.perf_counter()
        recurrent(*args)
        elapsed = time.perf_counter() - start
        rows.append(dict(what="recurrent oracle fp64", median_s=elapsed, runs_s=[elapsed]))
    return rows


def machine_note() -> dict:
    return dict(
        python=platform.python_version(),
        numpy=np.__version__,
        processor=platform.processor() or platform.machine(),
        cpus=os.cpu_count(),
        load_average_1_5_15=os.getloadavg(),
        blas_threads_env={k: os.environ[k] for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS") if k in os.environ},
    )


def markdown(errors: list[dict], timings: list[dict], machine: dict, shapes: tuple[dict, dict]) -> str:
    """The two tables (``shapes``: the error table's and the timing table's) and the machine note."""
    error_shape, timing_shape = shapes
    lines = [
        f"## chunked vs fp64 oracle (B, Hk, Hv, S, Dk, Dv = {tuple(error_shape.values())})",
        "",
        "| regime | algorithm | precision | out rel-RMS | out max-abs | state rel-RMS | state max-abs |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in errors:
        lines.append(
            f"| {r['regime']} | {r['algorithm']} | {r['precision']} | {r['out_rel_rms']:.2e} | "
            f"{r['out_max_abs']:.2e} | {r['state_rel_rms']:.2e} | {r['state_max_abs']:.2e} |"
        )
    lines += [
        "",
        f"## run time (B, Hk, Hv, S, Dk, Dv = {tuple(timing_shape.values())})",
        "",
        "| what | median s | runs s |",
        "|---|---|---|",
    ]
    for t in timings:
        lines.append(f"| {t['what']} | {t['median_s']:.3f} | {', '.join(f'{x:.3f}' for x in t['runs_s'])} |")
    lines += ["", f"machine: {json.dumps(machine)}", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Measure both tables, print them and write them to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="directory for bench_reference.json and bench_reference.md")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each chunked algorithm (median)")
    parser.add_argument("--skip-oracle", action="store_true", help="do not time the (slow) token-by-token oracle")
    parser.add_argument("--smoke", action="store_true", help="small shapes, one timed run (CI's check that it runs)")
    options = parser.parse_args(argv)

    shapes = (SMOKE_ERROR_SHAPE, SMOKE_TIMING_SHAPE) if options.smoke else (ERROR_SHAPE, TIMING_SHAPE)
    errors = error_table(shapes[0])
    timings = timing_table(shapes[1], 1 if options.smoke else options.repeats, options.skip_oracle)
    machine = machine_note()
    report = markdown(errors, timings, machine, shapes)
    print(report)
    if options.out:
        options.out.mkdir(parents=True, exist_ok=True)
        (options.out / "bench_reference.md").write_text(report)
        payload = dict(errors=errors, timings=timings, machine=machine)
        (options.out / "bench_reference.json").write_text(json.dumps(payload, indent=2))


if __name__ == "__main__":
    main()
