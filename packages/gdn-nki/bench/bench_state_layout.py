"""What a V-major state pool ([P, Hv, Dv, Dk], ``state_v_first``) costs beside the K-major one, in nki-cpu's Trn2
cost model.

The kernels compute on the same [Dk, Dv] tiles in both layouts; only how a state reaches them differs
(``gdn_nki.common.state_layout``): a K-major row moves in runs of the tile's row (2 KiB a partition in decode,
``rows`` Dk rows of Dv fp32; a [Dk, Dv] head's Dv·4 bytes in prefill), a V-major one as it lies (runs of Dk·4 =
512 bytes) and is transposed on chip: decode's tiles by the tensor engine (``tkg.pipeline.turn_state_tile``),
prefill's by the DMA engines in SBUF. The cost model prices a DMA by its contiguous run
(``nki_cpu.cost.durations.dma_efficiency``, the DMA bandwidth guide's curve), so the shorter runs and the
transposes are the V-major price. Measured at Qwen3-Next's heads (Hk = 16, Hv = 32, Dk = Dv =
128), bf16 I/O, through the host entry points with ``check_values=False`` (the launch alone):

- decode: ``gdn_nki.decode_step`` (fused gating, in-kernel l2norm), N requests of T = 1 on [N] rows;
- prefill, one lane: ``gdn_nki.prefill_varlen`` of one sequence on one value head (Hk = Hv = 1) starting from and
  ending in a pool row: the state read once and written once per lane, so its share is small; both the trace-time
  form (``gdn_cte_varlen``) and the bucket's program (``gdn_cte_bucket``, the serving form).

    python packages/gdn-nki/bench/bench_state_layout.py [--out DIR] [--smoke]

With ``--out`` the table goes to ``DIR/bench_state_layout.md`` and the figures to ``DIR/bench_state_layout.json``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

import gdn_nki
import nki_cpu
from nki_cpu.cost import estimate

KEY_HEADS, VALUE_HEADS, HEAD_DIM = 16, 32, 128
PREFIX = "bench_state_layout"
DECODE_REQUESTS, SMOKE_DECODE_REQUESTS = (1, 8), (1,)
PREFILL_TOKENS, SMOKE_PREFILL_TOKENS = (1024,), (128,)


@dataclass
class Row:
    """One cell: ``kernel`` at ``size`` (requests or tokens), both layouts' makespans (µs) and the state DMAs'."""

    kernel: str
    size: int
    k_major_us: float
    v_major_us: float
    k_major_dma_floor_us: float
    v_major_dma_floor_us: float

    @property
    def ratio(self) -> float:
        return self.v_major_us / self.k_major_us


def _estimated() -> tuple[float, float]:
    """(makespan, the model's DMA floor) of the last launch in µs."""
    report = estimate(nki_cpu.last_trace())
    return report.makespan_ns / 1e3, report.makespan_floor.parts["dma"] / 1e3


def _transposed(pool: np.ndarray, v_first: bool) -> np.ndarray:
    return np.ascontiguousarray(np.swapaxes(pool, -1, -2)) if v_first else pool


def decode(requests: int, v_first: bool, seed: int = 0) -> tuple[float, float]:
    """One ``decode_step`` (T = 1) at Qwen3-Next's heads on a pool in the given layout."""
    rng = np.random.default_rng(seed)
    bf16, f32 = ml_dtypes.bfloat16, np.float32
    q, k = (rng.standard_normal((requests, 1, KEY_HEADS, HEAD_DIM)).astype(bf16) for _ in range(2))
    v = rng.standard_normal((requests, 1, VALUE_HEADS, HEAD_DIM)).astype(bf16)
    a, b = rng.standard_normal((2, requests, 1, VALUE_HEADS)).astype(f32)
    zeros = np.zeros(VALUE_HEADS, f32)
    pool = _transposed(np.zeros((requests, VALUE_HEADS, HEAD_DIM, HEAD_DIM), f32), v_first)
    gdn_nki.decode_step(q, k, v, pool, np.arange(requests, dtype=np.int32), a=a, b=b, A_log=zeros, dt_bias=zeros,
                        use_qk_l2norm=True, check_values=False, state_v_first=v_first)  # fmt: skip
    return _estimated()


def prefill_lane(tokens: int, v_first: bool, seed: int = 0, bucket: bool = False) -> tuple[float, float]:
    """One sequence of ``tokens`` on one value head, from and to pool row 1 of 2, in the given layout (``bucket``:
    through the bucket's program, ``gdn_cte_bucket``, the serving form)."""
    rng = np.random.default_rng(seed)
    bf16, f32 = ml_dtypes.bfloat16, np.float32
    q = rng.standard_normal((1, 1, tokens, HEAD_DIM)).astype(bf16)
    k = rng.standard_normal((1, 1, tokens, HEAD_DIM))
    k = (k / np.linalg.norm(k, axis=-1, keepdims=True)).astype(bf16)
    v = rng.standard_normal((1, 1, tokens, HEAD_DIM)).astype(bf16)
    g = (-rng.uniform(0.01, 0.3, (1, 1, tokens))).astype(f32)
    beta = rng.uniform(0.05, 1.0, (1, 1, tokens)).astype(f32)
    pool = _transposed((0.1 * rng.standard_normal((2, 1, HEAD_DIM, HEAD_DIM))).astype(f32), v_first)
    gdn_nki.prefill_varlen(q, k, v, g, beta, np.array([0, tokens]), scale=HEAD_DIM**-0.5, recurrent_state=pool,
                           state_indices=np.array([1]), check_values=False, state_v_first=v_first,
                           bucket=(tokens, 1) if bucket else None)  # fmt: skip
    return _estimated()


def measure(kernel: str, size: int) -> Row:
    run = {"decode": decode, "prefill": prefill_lane,
           "bucket": lambda n, v_first: prefill_lane(n, v_first, bucket=True)}[kernel]  # fmt: skip
    (k_us, k_floor), (v_us, v_floor) = run(size, False), run(size, True)
    return Row(kernel, size, k_us, v_us, k_floor, v_floor)


def table(rows: list[Row]) -> str:
    lines = [
        "| kernel | N / T | K-major µs | V-major µs | V / K | K-major DMA floor µs | V-major DMA floor µs |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        what = {"decode": "decode_step, T = 1", "prefill": "prefill_varlen, one lane",
                "bucket": "prefill_varlen, one lane, bucketed"}[r.kernel]  # fmt: skip
        lines.append(f"| {what} | {r.size} | {r.k_major_us:,.1f} | {r.v_major_us:,.1f} | {r.ratio:.2f} | "
                     f"{r.k_major_dma_floor_us:,.1f} | {r.v_major_dma_floor_us:,.1f} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Measure the cells, print the table, and write it (markdown and JSON) to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="directory for bench_state_layout.md and .json")
    parser.add_argument("--smoke", action="store_true", help="the smallest cells only (CI's check that it runs)")
    args = parser.parse_args(argv)
    requests = SMOKE_DECODE_REQUESTS if args.smoke else DECODE_REQUESTS
    tokens = SMOKE_PREFILL_TOKENS if args.smoke else PREFILL_TOKENS
    rows = [measure("decode", n) for n in requests]
    rows += [measure(kernel, t) for kernel in ("prefill", "bucket") for t in tokens]
    text = table(rows)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{PREFIX}.md").write_text(text + "\n")
        cells = [{**asdict(r), "ratio": r.ratio} for r in rows]
        (args.out / f"{PREFIX}.json").write_text(json.dumps(cells, indent=2) + "\n")
        print(f"wrote {args.out / (PREFIX + '.md')}, {args.out / (PREFIX + '.json')}")


if __name__ == "__main__":
    main()
