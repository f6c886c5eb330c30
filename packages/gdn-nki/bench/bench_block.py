"""Fused decode block cost: ``gdn_block_step`` (one launch: in_proj, conv, recurrence, gated norm) against the same
layer step as separate kernels, and against the HBM floors, from nki-cpu's Trn2 cost model (issue 43 item 3).

Qwen3-Next's shapes: hidden 2048, Hk 16, Hv 32, Dk = Dv = 128, conv dim 8192, width 4, bf16 activations, weights
and conv windows, the recurrent pool fp32 (as ``bench_decode.py`` runs it). Decode: T = 1, [N] rows; verify: T = 4,
[N, T] rows (every token's states kept) with ``num_accepted_tokens``.

- fused: ``gdn_nki.block_decode_step``'s makespan, its bytes moved and the model's DMA floor of them;
- separate kernels, each measured alone: the in_proj stage (``block.in_proj`` as its own launch: all four
  projections), ``conv_decode_step``, ``decode_step`` (fused gating, in-kernel l2norm) and ``gated_rms_norm``
  (``gdn_gated_rms_norm``, the kernel the block calls for its norm); beside them PERFORMANCE.md's baseline, the
  sum of the parts with the in_proj and the norm at their HBM floors (the in_proj's weights, 139.6 µs; the norm's
  o and z read and its output written) and the conv and the decode measured;
- HBM floor of the fused launch: the bytes it moves at one NeuronCore's share of Trn2's 2.9 TB/s (362.5 B/ns, as
  ``bench_decode.py``).

    python packages/gdn-nki/bench/bench_block.py [--out DIR] [--quick | --smoke] [--tokens T]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

import gdn_nki
import nki_cpu
from gdn_nki.block.in_proj import HiddenTiles, project_all
from gdn_nki.common.backend import nki, nl
from nki_cpu.cost import estimate

HIDDEN, KEY_HEADS, VALUE_HEADS, HEAD_DIM, WIDTH, WINDOW = 2048, 16, 32, 128, 4, 3
CHANNELS = 2 * KEY_HEADS * HEAD_DIM + VALUE_HEADS * HEAD_DIM
REQUESTS = (1, 8, 64)
HBM_BYTES_PER_NS = 2.9e12 / 8 / 1e9
IN_PROJ_FLOOR_US = 139.6  # PERFORMANCE.md: the in_proj weights' 48.25 MiB at 362.5 B/ns


@dataclass
class Row:
    """One N of the table (µs, MiB)."""

    requests: int
    tokens: int
    fused_us: float
    fused_mib: float
    fused_model_floor_us: float
    in_proj_us: float
    conv_us: float
    decode_us: float
    norm_us: float

    @property
    def separate_us(self) -> float:
        return self.in_proj_us + self.conv_us + self.decode_us + self.norm_us

    @property
    def norm_floor_us(self) -> float:
        """The gated norm's HBM floor: o and z read, out written (bf16)."""
        return 3 * self.requests * self.tokens * VALUE_HEADS * HEAD_DIM * 2 / HBM_BYTES_PER_NS / 1e3

    @property
    def baseline_us(self) -> float:
        """PERFORMANCE.md's sum: the in_proj and the norm at their HBM floors, the conv and the decode measured."""
        return IN_PROJ_FLOOR_US + self.conv_us + self.decode_us + self.norm_floor_us

    @property
    def hbm_floor_us(self) -> float:
        return self.fused_mib * 2**20 / HBM_BYTES_PER_NS / 1e3


@nki.jit
def _in_proj_alone(hidden: Any, w_qkv: Any, w_z: Any, w_b: Any, w_a: Any) -> tuple[Any, ...]:
    """The fused block's in_proj stage as a launch of its own (the separate kernel the block replaces)."""
    rows = hidden.shape[0] * hidden.shape[1]
    weights = (w_qkv, w_z, w_b, w_a)  # the block's order (``block.step``)
    outs = [nl.ndarray((rows, w.shape[1]), dtype=hidden.dtype, buffer=nl.shared_hbm) for w in weights]
    project_all(HiddenTiles(hidden.reshape((rows, hidden.shape[2]))), list(zip(weights, outs, strict=True)))
    return tuple(outs)


def _makespan_us() -> float:
    return estimate(nki_cpu.last_trace()).makespan_ns / 1e3


def measure(requests: int, tokens: int = 1, seed: int = 0) -> Row:
    """Every launch at one N and T, estimated (T > 1: [N, T] rows, each request resuming from its second row)."""
    rng = np.random.default_rng(seed)
    bf16, f32 = ml_dtypes.bfloat16, np.float32
    r = rng.standard_normal
    hidden = r((requests, tokens, HIDDEN)).astype(bf16)
    w_qkv, w_z, w_b, w_a = ((r((HIDDEN, c)) * 0.02).astype(bf16) for c in
                            (CHANNELS, VALUE_HEADS * HEAD_DIM, VALUE_HEADS, VALUE_HEADS))  # fmt: skip
    taps = (r((CHANNELS, WIDTH)) * 0.5).astype(bf16)
    a_log, dt_bias, norm_weight = (r(VALUE_HEADS) * 0.3).astype(f32), np.zeros(VALUE_HEADS, f32), np.ones(HEAD_DIM, f32)
    rows = np.arange(requests * tokens, dtype=np.int32).reshape((requests, tokens) if tokens > 1 else (requests,))
    accepted = np.full(requests, min(2, tokens), np.int32) if tokens > 1 else None

    def pools() -> tuple[np.ndarray, np.ndarray]:
        return (np.zeros((requests * tokens, CHANNELS, WINDOW), bf16),
                np.zeros((requests * tokens, VALUE_HEADS, HEAD_DIM, HEAD_DIM), f32))  # fmt: skip

    conv_pool, state_pool = pools()
    gdn_nki.block_decode_step(hidden, w_qkv, w_z, w_b, w_a, taps, None, a_log, dt_bias, norm_weight, conv_pool,
                              state_pool, rows, accepted, check_values=False)  # fmt: skip
    report = estimate(nki_cpu.last_trace())
    fused = (report.makespan_ns / 1e3, report.dma_bytes / 2**20, report.makespan_floor.parts["dma"] / 1e3)

    nki_cpu.simulate(_in_proj_alone)(hidden, w_qkv, w_z, w_b, w_a)
    in_proj = _makespan_us()
    conv_pool, state_pool = pools()
    mixed = r((requests, tokens, CHANNELS)).astype(bf16)
    gdn_nki.conv_decode_step(mixed, conv_pool, taps, None, rows, accepted, check_values=False)
    conv = _makespan_us()
    q, k = (r((requests, tokens, KEY_HEADS, HEAD_DIM)).astype(bf16) for _ in range(2))
    v = r((requests, tokens, VALUE_HEADS, HEAD_DIM)).astype(bf16)
    a, b = r((2, requests, tokens, VALUE_HEADS)).astype(f32)
    gdn_nki.decode_step(q, k, v, state_pool, rows, accepted, a=a, b=b, A_log=a_log, dt_bias=dt_bias,
                        use_qk_l2norm=True, check_values=False)  # fmt: skip
    decode = _makespan_us()
    o, z = (r((requests * tokens * VALUE_HEADS, HEAD_DIM)).astype(bf16) for _ in range(2))
    gdn_nki.gated_rms_norm(o, z, norm_weight, eps=1e-6, check_values=False)
    norm = _makespan_us()
    return Row(requests, tokens, *fused, in_proj, conv, decode, norm)


def table(rows: list[Row]) -> str:
    """The markdown table."""
    lines = [
        "| N | T | fused µs | fused MiB moved | fused HBM floor µs | fused model DMA floor µs | in_proj alone µs | "
        "conv µs | decode µs | norm alone µs | separate kernels measured µs | baseline (in_proj, norm at floor) µs | "
        "fused / separate | fused / baseline |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.requests} | {r.tokens} | {r.fused_us:,.1f} | {r.fused_mib:,.2f} | {r.hbm_floor_us:,.1f} | "
            f"{r.fused_model_floor_us:,.1f} | {r.in_proj_us:,.1f} | {r.conv_us:,.1f} | {r.decode_us:,.1f} | "
            f"{r.norm_us:,.1f} | {r.separate_us:,.1f} | {r.baseline_us:,.1f} | {r.fused_us / r.separate_us:.3f} | "
            f"{r.fused_us / r.baseline_us:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Measure, print the table, and write it to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="directory for bench_block.md")
    parser.add_argument("--quick", action="store_true", help="N = 1 and 8 only")
    parser.add_argument("--smoke", action="store_true", help="N = 1 only (seconds; for CI)")
    parser.add_argument("--tokens", type=int, default=1, help="T: 1 decode, > 1 verify with [N, T] rows")
    args = parser.parse_args(argv)
    counts = REQUESTS[:1] if args.smoke else REQUESTS[:2] if args.quick else REQUESTS
    rows = []
    for requests in counts:
        rows.append(measure(requests, args.tokens))
        row = rows[-1]
        print(f"N={requests} T={args.tokens}: fused {row.fused_us:,.1f} us, separate {row.separate_us:,.1f} us",
              flush=True)  # fmt: skip
    text = table(rows)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        name = "bench_block.md" if args.tokens == 1 else f"bench_block_t{args.tokens}.md"
        (args.out / name).write_text(text + "\n")


if __name__ == "__main__":
    main()
