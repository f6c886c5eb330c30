"""Cost of the contract's element scan (``gdn_ref.contract.check_values``) at one Qwen3-Next GDN layer's size.

Usage: ``python bench_value_scan.py [--out DIR] [--repeats N] [--smoke]``. Prints the median scan time per compute
dtype and the bytes read, and with ``--out`` writes ``bench_value_scan.json`` there. Not a timed test: the figures
depend on the machine and its load (recorded with them). ``--smoke`` (CI's check that the script runs): a small
shape, one scan.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import ml_dtypes
import numpy as np

from gdn_ref.contract import check_values

# One Qwen3-Next GDN layer's prefill over 8K tokens (Hk = 16, Hv = 32, D = 128), with a supplied state.
SHAPE = dict(B=1, Hk=16, Hv=32, S=8192, D=128)
# CI's smoke run (``--smoke``): the same scan at a shape that takes milliseconds, once per dtype
SMOKE_SHAPE = dict(B=1, Hk=1, Hv=2, S=256, D=32)
DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float32": np.float32}


def _inputs(dtype: type, shape: dict[str, int]) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(0)
    B, Hk, Hv, S, D = (shape[k] for k in ("B", "Hk", "Hv", "S", "D"))
    query = rng.standard_normal((B, Hk, S, D), dtype=np.float32).astype(dtype)
    value = rng.standard_normal((B, Hv, S, D), dtype=np.float32).astype(dtype)
    g_log = -rng.uniform(0.0, 1.0, (B, Hv, S)).astype(np.float32)
    beta = rng.uniform(0.0, 1.0, (B, Hv, S)).astype(np.float32)
    state = rng.standard_normal((B, Hv, D, D), dtype=np.float32)
    return query, query.copy(), value, g_log, beta, state


def main(argv: list[str] | None = None) -> None:
    """Time the scan per dtype, print the medians and write them to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="directory for bench_value_scan.json")
    parser.add_argument("--repeats", type=int, default=7, help="scans per dtype (the median is reported)")
    parser.add_argument("--smoke", action="store_true", help="a small shape, one scan (CI's check that it runs)")
    args = parser.parse_args(argv)
    shape, repeats = (SMOKE_SHAPE, 1) if args.smoke else (SHAPE, args.repeats)
    rows = []
    for name, dtype in DTYPES.items():
        tensors = _inputs(dtype, shape)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            found = check_values(*tensors)
            times.append(time.perf_counter() - start)
        assert not found, found  # the inputs are valid by construction
        nbytes = sum(t.nbytes for t in tensors)
        median = statistics.median(times)
        rows.append(
            {"dtype": name, "median_ms": median * 1e3, "mbytes": nbytes / 1e6, "gbytes_per_s": nbytes / median / 1e9}
        )
        print(
            f"{name:9s} scan of {nbytes / 1e6:6.0f} MB: median {median * 1e3:6.1f} ms ({nbytes / median / 1e9:.1f} GB/s)"
        )
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"shape {shape}, load average {load:.2f}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_value_scan.json").write_text(
            json.dumps({"shape": shape, "load": load, "rows": rows}, indent=2)
        )


if __name__ == "__main__":
    main()
