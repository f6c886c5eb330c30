"""The layout copy a device prefill pays: FLA's seq-first tensors to the kernel's head-major rows and back, as NKI
DMAs in nki-cpu's Trn2 cost model, beside the prefill kernel's own time.

The prefill kernels read head-major [1, H, T, D] rows; model code holds FLA's seq-first [B, T, H, D]. On a device
the drop-ins' packing gather writes its result head-major (``gdn_nki.torch.device``): the transposition is that
copy, which packing each sequence to its chunk multiple needs anyway. Its cost is modelled here as what it is, a
strided HBM-to-HBM copy per head — q and k [T, Hk, D], v [T, Hv, D], g and β [T, Hv] in, ``out`` [Hv, T, D] back
to [T, Hv, D] — one ``dma_copy`` per head and tensor (each token's D elements one contiguous run, the token stride
H·D), inputs and output as two launches. The prefill: ``gdn_cte`` at the same shape (Qwen3-Next's 16 key / 32 value
heads, D 128, bf16).

The conv prefill's one copy (``gdn_nki.torch.conv_device``): x [tokens, C] zero-padded to the bucket's T (a multiple
of 128) when the token count is not one already, modelled as ``dma_copy`` transfers of x's rows in ``PAD_PIECES`` blocks
(spread over the DMA queues) and of the zero rows, beside ``gdn_conv_bucket`` at the same shape (Qwen3-Next's conv
dim 8192, width 4, bf16, one sequence).

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
from gdn_nki.host.conv import conv_prefill_bucket
from nki_cpu.cost import estimate

KEY_HEADS, VALUE_HEADS, HEAD_DIM = 16, 32, 128
SEQ_LENS = (2048, 8192)
CONV_CHANNELS, CONV_WIDTH, CONV_TOKENS = 8192, 4, (1000, 2000)
PAD_PIECES = (1, 16, 64)  # x's rows in this many dma_copy blocks: one transfer, one per engine, four per engine


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


@nki.jit
def pad_tokens(x: Any, zeros: Any, pieces: int) -> Any:
    """x [tokens, C] and the zero rows [T − tokens, C] into one [T, C] tensor, HBM to HBM: x's rows in ``pieces``
    ``dma_copy`` blocks, the zeros in one."""
    tokens, channels = x.shape
    padded = nl.ndarray((tokens + zeros.shape[0], channels), dtype=x.dtype, buffer=nl.shared_hbm)
    step = -(-tokens // pieces)
    for start in range(0, tokens, step):
        stop = min(tokens, start + step)
        nisa.dma_copy(dst=padded[start:stop], src=x[start:stop])
    nisa.dma_copy(dst=padded[tokens : tokens + zeros.shape[0]], src=zeros)
    return padded


def conv_pad_us(tokens: int, channels: int) -> tuple[list[float], float]:
    """The conv prefill's padding copy at each of ``PAD_PIECES`` (µs) and ``gdn_conv_bucket``'s makespan (µs) on the
    padded bucket, in nki-cpu's Trn2 model."""
    bf16, rng = ml_dtypes.bfloat16, np.random.default_rng(0)
    total = -(-tokens // 128) * 128
    x = rng.standard_normal((tokens, channels)).astype(bf16)
    zeros = np.zeros((total - tokens, channels), bf16)
    copies = []
    for pieces in PAD_PIECES:
        padded = nki_cpu.simulate(pad_tokens)(x, zeros, pieces)
        assert np.array_equal(np.asarray(padded)[:tokens], x)  # the copy modelled is the copy made
        copies.append(max(estimate(trace).makespan_ns for trace in nki_cpu.last_traces()) / 1e3)
    pool = rng.standard_normal((2, channels, CONV_WIDTH - 1)).astype(bf16)
    weight, bias = rng.standard_normal((channels, CONV_WIDTH)).astype(bf16), rng.standard_normal(channels).astype(bf16)
    conv_prefill_bucket(x, pool, weight, bias, np.array([0, tokens], np.int32), np.array([1], np.int32),
                        bucket=(total, 1), check_values=False)  # fmt: skip
    return copies, max(estimate(trace).makespan_ns for trace in nki_cpu.last_traces()) / 1e3


def conv_table(smoke: bool) -> list[str]:
    """The conv prefill's padding copy against the kernel, one row per token count."""
    channels = 256 if smoke else CONV_CHANNELS
    lines = [
        "| tokens -> bucket | C | " + " | ".join(f"pad copy, {n} block(s) µs" for n in PAD_PIECES)
        + " | `gdn_conv_bucket` µs | best copy / kernel |",
        "|---|---:|" + "---:|" * len(PAD_PIECES) + "---:|---:|",
    ]  # fmt: skip
    for tokens in (200,) if smoke else CONV_TOKENS:
        copies, kernel = conv_pad_us(tokens, channels)
        lines.append(f"| {tokens} -> {-(-tokens // 128) * 128} | {channels} | "
                     + " | ".join(f"{c:,.1f}" for c in copies) + f" | {kernel:,.1f} | {min(copies) / kernel:.2f} |")  # fmt: skip
        print(lines[-1], flush=True)
    return lines


def main(argv: list[str] | None = None) -> None:
    """Measure, print the tables, and write them to ``--out``."""
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
    text = "\n".join([*lines, "", *conv_table(args.smoke)])
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_layout.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
