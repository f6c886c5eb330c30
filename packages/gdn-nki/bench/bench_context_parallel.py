"""Context-parallel prefill at scale, on paper: how a rank finishes, and time to first token per GDN layer over
1–16 ranks against one core.

A model, not a measurement of hardware. Per rank: the kernel's time from nki-cpu's Trn2 cost model, plus the
collective's time from the documented interconnect bandwidth, plus the finishing step's time in the same cost model.

- Kernel: one NeuronCore prefilling Qwen3-Next's heads (16 key / 32 value heads, Dk = Dv = 128, bf16, schur),
  measured (``gdn_nki.simulate``, nki-cpu's estimate) at three slice lengths and interpolated linearly between them
  (beyond the longest, along its last segment: from S = 8192 on the kernel runs one compiled loop per lane, linear
  in S). One long prompt split over R ranks: every rank prefills its S/R tokens from zero (pass A); every rank that
  continues the prompt also runs its slice with zero values from the identity state (pass B: its transition M and
  read-out p; Dv = Dk = 128, the same kernel time). The ranks run at once.
- Finishing a continued rank once the scan gave its true entry state S₀, two ways, both measured here:
  (a) the output correction the implementation does — o += p S₀ on the slice and the state M S₀ + L. In
  ``gdn_nki.torch.context_parallel`` it runs on the host (a torch einsum in fp32), so it is modelled as the NKI
  kernel it needs (``output_correction`` below: per value head, blocks of up to 16 consecutive tokens on each
  of 128 partitions — 4 KiB runs, the DMA's full rate in nki-cpu — loaded, each token column transposed on the
  tensor engine and multiplied against S₀'s bf16 high and low halves, o added, stored; M S₀ as one fp32 matmul), its result checked against numpy on every run; (b) a second full prefill from the true S₀ (the kernel
  again: pass A and B are still needed for the scan's M and L). The slowest rank: pass A + pass B + the finish.
- Collective: one ``all_gather`` of a carry of Hv·Dk·(Dk + Dv)·4 bytes per rank (4 MiB at Qwen3-Next's heads),
  a ring of R − 1 steps each moving one carry over the link. Bandwidths from "Amazon EC2 Trn2 Architecture"
  (Neuron docs, about-neuron/arch/neuron-hardware/trn2-arch, SDK 2.33): intra-instance NeuronLink-v3
  1,024 GiB/s per chip, shared here by the chip's 4 logical NeuronCores (LNC = 2), so 256 GiB/s per rank; across
  instances, 3.2 Tbps of network per instance ("Network bandwidth"), shared by its 64 logical cores when every
  core runs a rank. No page states a collective's fixed latency: it is a known unknown, shown at 5 µs and 50 µs
  per ring step.

    python packages/gdn-nki/bench/bench_context_parallel.py [--out DIR] [--smoke]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

import gdn_nki
import nki_cpu
from gdn_nki.common import engines, tiles
from gdn_nki.common.backend import nisa, nki, nl
from gdn_nki.cte.state import split_block
from nki_cpu.cost import estimate

KEY_HEADS, VALUE_HEADS, HEAD_DIM = 16, 32, 128
SLICES = (2048, 8192, 16384)  # per-rank slice lengths measured (the table's slices run 2k to 128k)
PROMPTS = (32768, 131072, 262144)
RANKS = (1, 2, 4, 8, 16)
PARTITIONS = 128  # tokens per correction matmul: its output rows (the stationary's free size)
MAX_PER_PARTITION = 16  # consecutive tokens a partition holds per load: 16 · 256 B runs = 4 KiB, the DMA's full rate
LNC_CORES_PER_CHIP = 4  # Trn2: 8 physical NeuronCores, LNC = 2 (the logical-NeuronCore page)
NEURONLINK_BYTES_PER_US = 1024 * 2**30 / 1e6 / LNC_CORES_PER_CHIP  # one rank's share of a chip's link
NETWORK_BYTES_PER_US = 3.2e12 / 8 / 1e6 / 64  # an instance's network over its 64 logical cores
STEP_LATENCIES_US = (5.0, 50.0)  # a ring step's fixed cost: undocumented, shown at both ends


@dataclass
class Curve:
    """t(S) in µs, linear between measured points and along the end segments beyond them."""

    measured: tuple[tuple[int, float], ...]

    def time(self, tokens: int) -> float:
        points = self.measured
        if len(points) == 1:
            return points[0][1] * tokens / points[0][0]
        index = next((i for i in range(1, len(points) - 1) if tokens <= points[i][0]), len(points) - 1)
        (s0, t0), (s1, t1) = points[index - 1], points[index]
        return t0 + (t1 - t0) * (tokens - s0) / (s1 - s0)


@nki.jit
def output_correction(readout: Any, out: Any, entry: Any, transition: Any, local: Any) -> tuple[Any, Any]:
    """A continued slice finished from its true entry state: o + p S₀ per token and M S₀ + L, per value head.

    Dimensions:
        H: value heads. T: the slice's tokens, a multiple of 128 (blocks of 128 partitions × up to 16 tokens). K: key dim (≤ 128). V: value dim (≤ 512).

    Args:
        readout: [H, T, K] in the compute dtype, pass B's outputs (p) in the kernel's head-major layout.
        out: [H, T, V] in the compute dtype, pass A's outputs from a zero entry state.
        entry: [H, K, V] fp32, the true entry state S₀ (from the scan).
        transition: [H, K, K] fp32, the slice's transition M (pass B's final state).
        local: [H, K, V] fp32, the slice's state from zero L (pass A's final state).

    Returns:
        tuple: the corrected outputs [H, T, V] in out's dtype, the slice's true final state [H, K, V] fp32.

    Notes:
        S₀ enters the bf16 matmuls as two bf16 halves summing to it (``split_block``, as the prefill's state
        products), accumulated in fp32 PSUM with o added before the one rounding to out's dtype.
    """
    heads, tokens, dk = readout.shape
    dv = out.shape[2]
    per_partition = tokens_per_partition(tokens)
    corrected = nl.ndarray(out.shape, dtype=out.dtype, buffer=nl.shared_hbm)
    state = nl.ndarray(local.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    with engines.balancing(engines.Balancer()):
        for h in range(heads):
            s0 = tiles.sbuf((dk, dv), tiles.FP32)
            nisa.dma_copy(dst=s0, src=entry[h])
            m = tiles.sbuf((dk, dk), tiles.FP32)
            nisa.dma_copy(dst=m, src=transition[h])
            ell = tiles.sbuf((dk, dv), tiles.FP32)
            nisa.dma_copy(dst=ell, src=local[h])
            m_t = tiles.evacuate(tiles.transpose(m), tiles.FP32)
            final = tiles.combine(tiles.sbuf((dk, dv), tiles.FP32), tiles.matmul(m_t, s0), ell, nl.add)
            nisa.dma_copy(dst=state[h], src=final)
            parts = split_block(s0, out.dtype)
            for block in range(tokens // (PARTITIONS * per_partition)):
                rows = nl.ds(block * PARTITIONS * per_partition, PARTITIONS * per_partition)
                p = tiles.sbuf((PARTITIONS, per_partition * dk), readout.dtype)
                nisa.dma_copy(dst=p, src=readout[h, rows, :].reshape((PARTITIONS, per_partition * dk)))
                o = tiles.sbuf((PARTITIONS, per_partition * dv), out.dtype)
                nisa.dma_copy(dst=o, src=out[h, rows, :].reshape((PARTITIONS, per_partition * dv)))
                fixed = tiles.sbuf((PARTITIONS, per_partition * dv), out.dtype)
                for j in range(per_partition):  # the block's tokens j, j + n, j + 2n, ... (one per partition)
                    p_t = tiles.evacuate(tiles.transpose(p[:, j * dk : (j + 1) * dk]), readout.dtype)
                    product = tiles.psum((PARTITIONS, dv))
                    for k, part in enumerate(parts):
                        tiles.matmul(p_t, part, dst=product, accumulate=k > 0)
                    columns = slice(j * dv, (j + 1) * dv)
                    tiles.combine(fixed[:, columns], product, o[:, columns], nl.add)
                nisa.dma_copy(dst=corrected[h, rows, :].reshape((PARTITIONS, per_partition * dv)), src=fixed)
    return corrected, state


def tokens_per_partition(tokens: int) -> int:
    """How many consecutive tokens each partition holds in one correction block: the most, up to 16, that divide
    the slice into whole blocks of 128 partitions (longer contiguous runs per partition move at a higher DMA rate:
    nki-cpu's efficiency curve, COST_MODEL.md)."""
    if tokens % PARTITIONS:
        raise ValueError(f"output_correction takes a multiple of {PARTITIONS} tokens, not {tokens}")
    per_partition = MAX_PER_PARTITION
    while (tokens // PARTITIONS) % per_partition:
        per_partition //= 2
    return per_partition


def correction_inputs(seq_len: int, value_heads: int, head_dim: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    """``output_correction``'s operands at a shape: bf16 p and o, fp32 S₀, M and L of realistic sizes."""
    rng = np.random.default_rng(seed)
    bf16 = ml_dtypes.bfloat16
    readout = (rng.standard_normal((value_heads, seq_len, head_dim)) * 0.1).astype(bf16)
    out = rng.standard_normal((value_heads, seq_len, head_dim)).astype(bf16)
    entry, local = (rng.standard_normal((value_heads, head_dim, head_dim)).astype(np.float32) for _ in range(2))
    transition = (rng.standard_normal((value_heads, head_dim, head_dim)) / head_dim).astype(np.float32)
    return readout, out, entry, transition, local


def correction_reference(readout, out, entry, transition, local) -> tuple[np.ndarray, np.ndarray]:
    """``output_correction`` in float64: (o + p S₀, M S₀ + L)."""
    as64 = [np.asarray(x, np.float64) for x in (readout, out, entry, transition, local)]
    return as64[1] + as64[0] @ as64[2], as64[3] @ as64[2] + as64[4]


def measure_correction(seq_len: int, value_heads: int, head_dim: int) -> float:
    """``output_correction``'s makespan (µs) in nki-cpu's Trn2 model, its result checked against float64 first."""
    operands = correction_inputs(seq_len, value_heads, head_dim)
    corrected, state = nki_cpu.simulate(output_correction)(*operands)
    want_out, want_state = correction_reference(*operands)
    out_error = np.abs(np.asarray(corrected, np.float64) - want_out).max() / np.abs(want_out).max()
    state_error = np.abs(np.asarray(state, np.float64) - want_state).max() / np.abs(want_state).max()
    if out_error > 2**-7 or state_error > 1e-5:  # one bf16 rounding of the output; fp32 products for the state
        raise AssertionError(f"output_correction is wrong at S={seq_len}: out {out_error:.2e}, state {state_error:.2e}")
    return max(estimate(trace).makespan_ns for trace in nki_cpu.last_traces()) / 1e3


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


def measured(what: str, lengths: tuple[int, ...], run: Any) -> Curve:
    """A curve through ``run(length)`` at each length, each measurement printed as it lands."""
    points = []
    for length in lengths:
        start = time.perf_counter()
        points.append((length, run(length)))
        print(f"{what} S={length}: {points[-1][1]:,.1f} us (interpreted in {time.perf_counter() - start:.0f} s)",
              flush=True)  # fmt: skip
    return Curve(tuple(points))


def finishing(kernel: Curve, correction: Curve, lengths: tuple[int, ...]) -> str:
    """The two ways to finish a continued rank, per slice length: what each costs and which is cheaper."""
    lines = [
        "| slice S/R | pass A (µs) | pass B (µs) | (a) correction, modelled (µs) | (b) second pass (µs) "
        "| rank total (a) (µs) | rank total (b) (µs) | (b) / (a) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for length in lengths:
        t, fix = kernel.time(length), correction.time(length)
        lines.append(f"| {length:,} | {t:,.1f} | {t:,.1f} | {fix:,.1f} | {t:,.1f} | {2 * t + fix:,.1f} | "
                     f"{3 * t:,.1f} | {3 * t / (2 * t + fix):.2f}× |")  # fmt: skip
    return "\n".join(lines)


def carry_bytes(value_heads: int, head_dim: int) -> int:
    """What one rank sends: its carry, Hv·Dk·(Dk + Dv) fp32."""
    return value_heads * head_dim * 2 * head_dim * 4


def collective_us(ranks: int, nbytes: int, bytes_per_us: float, step_latency_us: float) -> float:
    """A ring all_gather: R − 1 steps, each one carry over the link plus the step's fixed cost."""
    return (ranks - 1) * (nbytes / bytes_per_us + step_latency_us)


def table(kernel: Curve, correction: Curve, value_heads: int, head_dim: int, prompts: tuple[int, ...],
          ranks: tuple[int, ...]) -> str:  # fmt: skip
    """Time to first token per GDN layer (µs) by prompt and rank count, intra-instance and across instances, with
    the implemented finish (a)."""
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
            fix = correction.time(slice_tokens) if r > 1 else 0.0
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
    """Measure the kernel and the correction, print both tables, and write them to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="a directory: the tables are written to bench_context_parallel.md")
    parser.add_argument("--smoke", action="store_true", help="one lane at three short lengths (seconds; for CI)")
    args = parser.parse_args(argv)
    if args.smoke:
        heads, lengths, prompts, ranks = (1, 1), (128, 256, 512), (4096,), (1, 2)
    else:
        heads, lengths, prompts, ranks = (KEY_HEADS, VALUE_HEADS), SLICES, PROMPTS, RANKS
    kernel = measured("prefill", lengths, lambda s: measure(s, *heads, HEAD_DIM))
    correction = measured("correction", lengths, lambda s: measure_correction(s, heads[1], HEAD_DIM))
    text = (
        f"Prefill per rank (pass A; pass B the same at Dv = Dk), measured: "
        f"{', '.join(f'S={s}: {t:,.1f} µs' for s, t in kernel.measured)}; the correction kernel (a), measured: "
        f"{', '.join(f'S={s}: {t:,.1f} µs' for s, t in correction.measured)}. "
        f"Hk = {heads[0]}, Hv = {heads[1]}, D = {HEAD_DIM}, bf16; nki-cpu's Trn2 model, not hardware.\n\n"
        f"How a continued rank finishes:\n\n{finishing(kernel, correction, lengths)}\n\n"
        f"Time to first token per GDN layer, finishing by (a) (a model):\n\n"
        f"{table(kernel, correction, heads[1], HEAD_DIM, prompts, ranks)}\n"
    )
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_context_parallel.md").write_text(text)


if __name__ == "__main__":
    main()
