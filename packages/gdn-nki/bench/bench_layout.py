"""The layout copy a device prefill pays: FLA's seq-first tensors to the kernel's head-major rows and back, as NKI
DMAs in nki-cpu's Trn2 cost model, beside the prefill kernel's own time.

The prefill kernels read head-major [1, H, T, D] rows; model code holds FLA's seq-first [B, T, H, D]. On a device
the drop-ins' packing gather writes its result head-major (``gdn_nki.torch.device``): the transposition is that
copy, which packing each sequence to its chunk multiple needs anyway. Its cost is modelled here as what it is, a
strided HBM-to-HBM copy per head — q and k [T, Hk, D], v [T, Hv, D], g and β [T, Hv] in, ``out`` [Hv, T, D] back
to [T, Hv, D] — one ``dma_copy`` per head and tensor (each token's D elements one contiguous run, the token stride
H·D), inputs and output as two launches. The prefill: ``gdn_cte`` at the same shape (Qwen3-Next's 16 key / 32 value
heads, D 128, bf16).

    python packages/gdn-nki/bench/bench_layout.py [--out DIR] [--smoke]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
from bench_context_parallel import measure as prefill_us  # gdn_cte's makespan at a shape (a sibling script)

import nki_cpu
from gdn_nki.common.backend import nisa, nki, nl
from nki_cpu.cost import estimate

KEY_HEADS, VALUE_HEADS, HEAD_DIM = 16, 32, 128
SEQ_LENS = (2048, 8192)


@nki.jit
def to_head_major(q: Any, k: Any, v: Any, g: Any, beta: Any) -> tuple[Any, ...]:
    """The prefill's inputs from seq-first to head-major: q, k, v [T, H, D], g and β [T, Hv] to [H, T, ·], one
    strided ``dma_copy`` per head and tensor, HBM to HBM."""
    copies = []
    for x in (q, k, v, g, beta):
        y = nl.ndarray((x.shape[1], x.shape[0], *x.shape[2:]), dtype=x.dtype, buffer=nl.shared_hbm)
        for h in range(x.shape[1]):
            nisa.dma_copy(dst=y[h], src=x[:, h])
        copies.append(y)
    return tuple(copies)


@nki.jit
def to_seq_first(out: Any) -> Any:
    """The prefill's output back: [Hv, T, D] to seq-first [T, Hv, D], one strided ``dma_copy`` per head."""
    back = nl.ndarray((out.shape[1], out.shape[0], out.shape[2]), dtype=out.dtype, buffer=nl.shared_hbm)
    for h in range(out.shape[0]):
        nisa.dma_copy(dst=back[:, h], src=out[h])
    return back


def copy_us(tokens: int, key_heads: int, value_heads: int, head_dim: int) -> tuple[float, float]:
    """The layout copies' makespans (µs) in nki-cpu's Trn2 model: (inputs in, output back)."""
    bf16, rng = ml_dtypes.bfloat16, np.random.default_rng(0)
    q, k = (rng.standard_normal((tokens, key_heads, head_dim)).astype(bf16) for _ in range(2))
    v = rng.standard_normal((tokens, value_heads, head_dim)).astype(bf16)
    g, beta = (rng.standard_normal((tokens, value_heads)).astype(np.float32) for _ in range(2))
    out = rng.standard_normal((value_heads, tokens, head_dim)).astype(bf16)
    times = []
    for kernel, args in ((to_head_major, (q, k, v, g, beta)), (to_seq_first, (out,))):
        nki_cpu.simulate(kernel)(*args)
        times.append(max(estimate(trace).makespan_ns for trace in nki_cpu.last_traces()) / 1e3)
    return times[0], times[1]


def main(argv: list[str] | None = None) -> None:
    """Measure, print the table, and write it to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="directory for bench_layout.md")
    parser.add_argument("--smoke", action="store_true", help="2 / 4 heads, 256 tokens (seconds; for CI)")
    args = parser.parse_args(argv)
    heads = (2, 4) if args.smoke else (KEY_HEADS, VALUE_HEADS)
    lines = [
        "| S | Hk/Hv | inputs to head-major µs | output back µs | prefill µs | copies / prefill |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for tokens in (256,) if args.smoke else SEQ_LENS:
        (into, back), prefill = copy_us(tokens, *heads, HEAD_DIM), prefill_us(tokens, *heads, HEAD_DIM)
        lines.append(f"| {tokens} | {heads[0]}/{heads[1]} | {into:,.1f} | {back:,.1f} | {prefill:,.1f} | "
                     f"{(into + back) / prefill:.2f} |")  # fmt: skip
        print(lines[-1], flush=True)
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_layout.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
