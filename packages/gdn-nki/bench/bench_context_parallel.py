"""Context-parallel prefill at scale, on paper: time to first token per GDN layer over 1–16 ranks, against one core.

A model, not a measurement of hardware. Per rank: the kernel's time from nki-cpu's Trn2 cost model, plus the
collective's time from the documented interconnect bandwidth, plus the output correction's matmul at the
tensor engine's documented rate.

- Kernel: one NeuronCore prefilling Qwen3-Next's heads (16 key / 32 value heads, Dk = Dv = 128, bf16, schur) is
  measured (``gdn_nki.simulate``, nki-cpu's estimate) at two lengths and fitted as t(S) = a + b·S: the kernel's
  steady state is one compiled loop per lane, linear in S. One long prompt split over R ranks: rank 0 prefills its
  S/R tokens once (pass A); every later rank continues the prompt, so it also runs its slice with zero values
  from the identity state (pass B: its transition and read-out; Dv = Dk = 128, the same kernel time). The ranks
  run at once: the slowest rank's kernel time is 2·t(S/R) for R > 1.
- Collective: one ``all_gather`` of a carry of Hv·Dk·(Dk + Dv)·4 bytes per rank (4 MiB at Qwen3-Next's heads),
  a ring of R − 1 steps each moving one carry over the link. Bandwidths from "Amazon EC2 Trn2 Architecture"
  (Neuron docs, about-neuron/arch/neuron-hardware/trn2-arch, SDK 2.33): intra-instance NeuronLink-v3
  1,024 GiB/s per chip, shared here by the chip's 4 logical NeuronCores (LNC = 2), so 256 GiB/s per rank; across
  instances, 3.2 Tbps of network per instance ("Network bandwidth"), shared by its 64 logical cores when every
  core runs a rank. No page states a collective's fixed latency: it is a known unknown, shown at 5 µs and 50 µs
  per ring step.
- Correction: o += p S₀ on the continued slice, [S/R, Dk] × [Dk, Dv] per value head at 79 bf16 TFLOPS per core
  ("Trainium2 Architecture Guide for NKI", docs/nki-sources.md §4: dense bf16 per NeuronCore).

    python packages/gdn-nki/bench/bench_context_parallel.py [--out DIR] [--smoke]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

import gdn_nki
import nki_cpu
from nki_cpu.cost import estimate

KEY_HEADS, VALUE_HEADS, HEAD_DIM = 16, 32, 128
FIT_LENGTHS = (2048, 4096)  # the two measured lengths the linear fit goes through
PROMPTS = (32768, 131072, 262144)
RANKS = (1, 2, 4, 8, 16)
LNC_CORES_PER_CHIP = 4  # Trn2: 8 physical NeuronCores, LNC = 2 (the logical-NeuronCore page)
NEURONLINK_BYTES_PER_US = 1024 * 2**30 / 1e6 / LNC_CORES_PER_CHIP  # one rank's share of a chip's link
NETWORK_BYTES_PER_US = 3.2e12 / 8 / 1e6 / 64  # an instance's network over its 64 logical cores
PE_FLOPS_PER_US = 79e12 / 1e6  # dense bf16 per NeuronCore
STEP_LATENCIES_US = (5.0, 50.0)  # a ring step's fixed cost: undocumented, shown at both ends


@dataclass
class Fit:
    """t(S) = fixed + per_token · S, µs, from two measured launches."""

    fixed_us: float
    per_token_us: float
    measured: tuple[tuple[int, float], ...]

    def time(self, tokens: int) -> float:
        return self.fixed_us + self.per_token_us * tokens


def measure(seq_len: int, key_heads: int, value_heads: int, head_dim: int) -> float:
    """One prefill launch's makespan (µs) in nki-cpu's Trn2 model, Qwen3-Next's layout, bf16."""
    rng = np.random.default_rng(0)
    bf16 = ml_dtypes.bfloat16

    def unit(shape: tuple[int, ...]) -> np.ndarray:
        x = rng.standard_normal(shape)
        return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(bf16)

    q, k = unit((1, key_heads, seq_len, head_dim)), unit((1, key_heads, seq_len, head_dim))
    v = rng.standard_normal((1, value_heads, seq_len, head_dim)).astype(bf16)
    g = -rng.uniform(0.01, 0.1, (1, value_heads, seq_len)).astype(np.float32)
    beta = rng.uniform(0.1, 0.9, (1, value_heads, seq_len)).astype(np.float32)
    gdn_nki.simulate(q, k, v, g, beta, scale=head_dim**-0.5, mask_pack=gdn_nki.build_mask_pack(), check_values=False)
    return max(estimate(trace).makespan_ns for trace in nki_cpu.last_traces()) / 1e3


def fit(lengths: tuple[int, int], key_heads: int, value_heads: int, head_dim: int) -> Fit:
    """The linear fit through two measured launches."""
    points = []
    for length in lengths:
        start = time.perf_counter()
        points.append((length, measure(length, key_heads, value_heads, head_dim)))
        print(f"S={length}: {points[-1][1]:,.1f} us (interpreted in {time.perf_counter() - start:.0f} s)", flush=True)
    (s0, t0), (s1, t1) = points
    per_token = (t1 - t0) / (s1 - s0)
    return Fit(fixed_us=t0 - per_token * s0, per_token_us=per_token, measured=tuple(points))


def carry_bytes(value_heads: int, head_dim: int) -> int:
    """What one rank sends: its carry, Hv·Dk·(Dk + Dv) fp32."""
    return value_heads * head_dim * 2 * head_dim * 4


def collective_us(ranks: int, nbytes: int, bytes_per_us: float, step_latency_us: float) -> float:
    """A ring all_gather: R − 1 steps, each one carry over the link plus the step's fixed cost."""
    return (ranks - 1) * (nbytes / bytes_per_us + step_latency_us)


def correction_us(tokens: int, value_heads: int, head_dim: int) -> float:
    """o += p S₀ on a continued slice: 2·Dk·Dv flops per token and value head on the tensor engine."""
    return 2 * tokens * value_heads * head_dim * head_dim / PE_FLOPS_PER_US


def table(kernel: Fit, value_heads: int, head_dim: int, prompts: tuple[int, ...], ranks: tuple[int, ...]) -> str:
    """Time to first token per GDN layer (µs) by prompt and rank count, intra-instance and across instances."""
    nbytes = carry_bytes(value_heads, head_dim)
    lines = [
        "| prompt | ranks | one core (µs) | kernel per rank (µs) | collective, NeuronLink (µs) | correction (µs) "
        "| TTFT NeuronLink (µs) | speedup | collective across instances (µs) | TTFT across instances (µs) "
        "| collective share |",
        "|---:|---:|---:|---:|---|---:|---|---|---|---|---|",
    ]
    for prompt in prompts:
        one = kernel.time(prompt)
        for r in ranks:
            slice_tokens = prompt // r
            per_rank = kernel.time(slice_tokens) * (2 if r > 1 else 1)
            fix = correction_us(slice_tokens, value_heads, head_dim) if r > 1 else 0.0
            link = [collective_us(r, nbytes, NEURONLINK_BYTES_PER_US, lat) for lat in STEP_LATENCIES_US]
            net = [collective_us(r, nbytes, NETWORK_BYTES_PER_US, lat) for lat in STEP_LATENCIES_US]
            ttft = [per_rank + fix + c for c in link]
            ttft_net = [per_rank + fix + c for c in net]
            share = max(link[-1], net[-1]) / (per_rank + fix + max(link[-1], net[-1]))
            lines.append(
                f"| {prompt:,} | {r} | {one:,.0f} | {per_rank:,.0f} | {_span(link)} | {fix:,.0f} | {_span(ttft)} | "
                f"{_span([one / t for t in ttft[::-1]], '.2f', '×')} | {_span(net)} | {_span(ttft_net)} | "
                f"{share:.0%} |"
            )
    return "\n".join(lines)


def _span(values: list[float], fmt: str = ",.0f", unit: str = "") -> str:
    low, high = min(values), max(values)
    return f"{low:{fmt}}{unit}" if f"{low:{fmt}}" == f"{high:{fmt}}" else f"{low:{fmt}}–{high:{fmt}}{unit}"


def main(argv: list[str] | None = None) -> None:
    """Fit the kernel, print the table, and write it to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="a directory: the table is written to bench_context_parallel.md there")
    parser.add_argument("--smoke", action="store_true", help="one lane at two short lengths (seconds; for CI)")
    args = parser.parse_args(argv)
    if args.smoke:
        kernel = fit((128, 256), key_heads=1, value_heads=1, head_dim=HEAD_DIM)
        text = table(kernel, 1, HEAD_DIM, prompts=(4096,), ranks=(1, 2))
    else:
        kernel = fit(FIT_LENGTHS, KEY_HEADS, VALUE_HEADS, HEAD_DIM)
        text = table(kernel, VALUE_HEADS, HEAD_DIM, PROMPTS, RANKS)
    header = (
        f"Kernel fit: t(S) = {kernel.fixed_us:,.1f} µs + {kernel.per_token_us * 1e3:,.2f} ns · S "
        f"(measured: {', '.join(f'S={s}: {t:,.1f} µs' for s, t in kernel.measured)}); a model, not hardware.\n"
    )
    print(header + text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_context_parallel.md").write_text(header + "\n" + text + "\n")


if __name__ == "__main__":
    main()
