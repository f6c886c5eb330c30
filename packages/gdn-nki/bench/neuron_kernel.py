"""gdn_cte on the real Neuron SDK: compile both algorithms at Qwen3-Next shapes and, on a Neuron device, benchmark
them with ``nki.benchmark``; results go to ``neuron_kernel.md`` / ``.json`` beside the cost-model table.

Run by ``nox -s neuron`` (README, "Running on Trainium"). Without the Neuron SDK it prints
"skipped: Neuron SDK not installed" and exits 0. Shapes: B = 1, Hk = 16, Hv = 32, Dk = Dv = 128, bf16,
S in {128, 2048, 8192} (Qwen3-Next's linear-attention layer, one NeuronCore, LNC = 1).

``nki.benchmark`` (API page, v2.33) compiles the kernel to a NEFF and runs it under ``neuron-bench`` on one
NeuronCore; it needs a Trn/Inf instance with ``aws-neuronx-tools``. Its result object is read defensively (the
attribute path of the latency statistics is not stated on the 2.33 page); anything unreadable is reported as such,
with the console output ``neuron-bench`` printed kept in the log.
"""

from __future__ import annotations

import argparse
import json
import traceback
from pathlib import Path
from typing import Any

import gdn_nki
from gdn_nki.common import backend
from gdn_spec.regimes import Geometry, make_case

QWEN3_NEXT = {"B": 1, "Hk": 16, "Hv": 32, "Dk": 128, "Dv": 128}
SEQ_LENS = (128, 2048, 8192)
PREFIX = "neuron_kernel"


def neuron_device_present() -> bool:
    """A NeuronDevice is attached (the driver exposes /dev/neuron<N>)."""
    return any(Path("/dev").glob("neuron[0-9]*"))


def _latency_us(result: Any, percentile: int) -> float | None:
    """p``percentile`` device latency in µs from an ``nki.benchmark`` result, when its statistics are readable."""
    stats = getattr(getattr(result, "benchmark_result", None), "nc_latency", None)
    getter = getattr(stats, "get_latency_percentile", None)
    if getter is None:
        return None
    try:
        return float(getter(percentile))
    except Exception:  # an unreadable statistic is reported, not fatal
        return None


def run_one(algorithm: str, seq_len: int, out_dir: Path, warmup: int, iters: int) -> dict[str, Any]:
    """Compile (and with a device, benchmark) one algorithm at one sequence length."""
    geometry = Geometry(S=seq_len, **QWEN3_NEXT)
    c = make_case("random", geometry, "bfloat16", seed=seq_len)
    kwargs = dict(c.kernel, scale=c.scale, algorithm=algorithm, group_size=gdn_nki.DEFAULT_GROUP_SIZE)
    kwargs["mask_pack"] = gdn_nki.build_mask_pack() if algorithm == "schur" else None
    row: dict[str, Any] = {"algorithm": algorithm, "S": seq_len, **QWEN3_NEXT, "dtype": "bfloat16"}
    if not neuron_device_present():
        row["status"] = "not compiled: no Neuron device (nki.benchmark compiles and runs on one)"
        return row
    neff = out_dir / f"{PREFIX}_{algorithm}_S{seq_len}.neff"
    try:
        bench = backend.nki.benchmark(warmup=warmup, iters=iters, save_neff_name=str(neff))(gdn_nki.gdn_cte)
        bench(**kwargs)
    except Exception as exc:  # one failing shape must not hide the others
        row["status"] = f"failed: {type(exc).__name__}: {exc}"
        row["traceback"] = traceback.format_exc()
        return row
    row["status"] = "benchmarked"
    row["neff"] = neff.name
    row["p50_us"], row["p99_us"] = _latency_us(bench, 50), _latency_us(bench, 99)
    return row


def cost_model_rows(out_dir: Path) -> dict[tuple[str, int], float]:
    """Cost-model estimates (µs) from bench_kernel.json in the same directory, by (algorithm, S), if present."""
    path = out_dir / "bench_kernel.json"
    if not path.exists():
        return {}
    rows = json.loads(path.read_text()).get("rows", [])
    return {(r["algorithm"], r["seq_len"]): r["time_us"] for r in rows if r.get("layout") == "1 lane"}


def markdown(rows: list[dict[str, Any]], estimates: dict[tuple[str, int], float]) -> str:
    lines = [
        "# gdn_cte on the Neuron SDK",
        "",
        f"Backend {backend.BACKEND_NAME}; Qwen3-Next shapes B=1, Hk=16, Hv=32, Dk=Dv=128, bf16, one NeuronCore. "
        "Device latency from nki.benchmark (neuron-bench); cost-model column: nki-cpu's one-lane estimate at the "
        "same S (bench_kernel.json, when present; one lane of the 32, so multiply by lanes for a rough total).",
        "",
        "| algorithm | S | status | p50 (µs) | p99 (µs) | cost model, 1 lane (µs) |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        est = estimates.get((r["algorithm"], r["S"]))

        def fmt(x: float | None) -> str:
            return "" if x is None else f"{x:.1f}"

        lines.append(
            f"| {r['algorithm']} | {r['S']} | {r['status'].splitlines()[0]} | {fmt(r.get('p50_us'))} | "
            f"{fmt(r.get('p99_us'))} | {fmt(est)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.add_argument("--seq-lens", type=int, nargs="+", default=list(SEQ_LENS))
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args(argv)
    if not backend.USING_REAL_NKI:
        print("skipped: Neuron SDK not installed")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [
        run_one(algorithm, seq_len, args.out, args.warmup, args.iters)
        for algorithm in ("schur", "neumann")
        for seq_len in args.seq_lens
    ]
    (args.out / f"{PREFIX}.json").write_text(json.dumps({"backend": backend.BACKEND_NAME, "rows": rows}, indent=2))
    text = markdown(rows, cost_model_rows(args.out))
    (args.out / f"{PREFIX}.md").write_text(text)
    print(text)
    return 1 if any(r["status"].startswith("failed") for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
