"""The kernels at the compiled-loop barrier's fitted cost and at the ends of its plausible range.

nki-cpu ends every compiled-loop iteration, and enters and leaves every loop, with a drain and a barrier across all
engines; the barrier's fixed cost ``Figures.loop_barrier_ns`` is fitted to the "NKI Dynamic Loops" page's example
(3.97 µs, ``nki_cpu.cost.loop_fit``), within what the page's figures allow (``loop_fit.PLAUSIBLE_NS``: nothing
beyond the drain, up to 10.4 µs). Each published launch (one lane, Qwen3-Next's heads, the bucketed prefill,
decode, conv decode) runs once through the interpreter; its trace is scheduled (Trn2 figures, the kernel's program
order) at a barrier of 0, the range's low end, the fitted value and the range's high end. The overhead is the
fitted makespan's excess over the same program at a barrier of 0; a row above ``OVERHEAD_TARGET`` is marked. The
loop-boundary count (barriers the slowest program pays), static and dynamic instruction counts and a digest of the
launch's outputs (their raw bytes: a re-tune must leave it unchanged) come with each row.

    python packages/gdn-nki/bench/bench_barrier.py [--out DIR] [--smoke] [--rows NAME ...]

``--smoke`` (CI's check that the script runs end to end) runs ``SMOKE_ROWS``: short launches, a second or so each,
one of them a compiled loop. Without it every row of ``ROWS`` runs (about an hour on the 2-core dev VM, most of it
Qwen3-Next's heads at S = 32768: 15-20 minutes each dtype). ``--out`` gets ``bench_barrier.md`` and ``bench_barrier.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

import gdn_nki
import nki_cpu
from gdn_spec.regimes import Geometry, make_case
from nki_cpu.cost import TRN2, estimate
from nki_cpu.cost.figures import LOOP_BARRIER_NS
from nki_cpu.cost.loop_fit import PLAUSIBLE_NS
from nki_cpu.cost.scheduler import loop_barriers

PREFIX = "bench_barrier"  # every file this script writes starts with it (--out is shared by all benches)
HEAD_DIM = 128
# The barrier costs each row is scheduled at (ns): none, the plausible range's ends and the fitted figure.
BARRIERS = {"0": 0.0, "low": PLAUSIBLE_NS[0], "fitted": LOOP_BARRIER_NS, "high": PLAUSIBLE_NS[1]}
OVERHEAD_TARGET = 0.05  # the fitted barrier's cost over the same program at 0 that a published row may carry
VARLEN_LENGTHS = (37, 512, 1000, 2900, 130)  # bench_kernel's vLLM-like batch
CHECKPOINT_SEQ_LEN, CHECKPOINT_EVERY = 8192, 256  # bench_kernel's checkpoint row (Hk / Hv 2 / 4)

Arrays = list[np.ndarray]


def prefill(geometry: Geometry, dtype: str = "bfloat16", algorithm: str = "schur", group_size: int = 8) -> Arrays:
    """``gdn_nki.simulate`` of the bench's random case at ``geometry`` (bench_kernel's seed: S)."""
    c = make_case("random", geometry, dtype, seed=geometry.S)
    pack = gdn_nki.build_mask_pack() if algorithm == "schur" else None
    out, state = gdn_nki.simulate(**c.kernel, scale=c.scale, algorithm=algorithm, mask_pack=pack,
                                  group_size=group_size)  # fmt: skip
    return [out, state]


def _packed(lengths: tuple[int, ...], key_heads: int, value_heads: int) -> tuple[dict[str, np.ndarray], float]:
    """The sequences of ``lengths`` (bench_kernel's cases, seed = length) packed along the token axis."""
    cases = [
        make_case("random", Geometry(B=1, Hk=key_heads, Hv=value_heads, S=n, Dk=HEAD_DIM, Dv=HEAD_DIM), "bfloat16", n)
        for n in lengths
    ]
    names = ("query", "key", "value", "g_log", "beta")
    return {name: np.concatenate([c.kernel[name] for c in cases], axis=2) for name in names}, cases[0].scale


def bucket_batch(lengths: tuple[int, ...], key_heads: int, value_heads: int) -> Arrays:
    """``prefill_bucket`` of the packed batch in its own bucket (its padded tokens, one slot per sequence)."""
    packed, scale = _packed(lengths, key_heads, value_heads)
    tokens = sum(-(-n // gdn_nki.CHUNK) * gdn_nki.CHUNK for n in lengths)
    cu = np.cumsum((0, *lengths))
    return list(gdn_nki.prefill_bucket(**packed, cu_seqlens=cu, bucket=(tokens, len(lengths)), scale=scale))


def one_sequence(seq_len: int, key_heads: int, value_heads: int, form: str) -> Arrays:
    """One sequence through ``gdn_cte`` (``form`` "cte"), the bucket of its size ("bucket") or that bucket with a
    checkpoint every ``CHECKPOINT_EVERY`` tokens ("checkpoints"), as bench_kernel's checkpoint row."""
    tensors, scale = _packed((seq_len,), key_heads, value_heads)
    if form == "cte":
        return list(gdn_nki.prefill(**tensors, scale=scale))
    count = seq_len // CHECKPOINT_EVERY
    extra = {}
    if form == "checkpoints":
        extra = {"checkpoint_every": CHECKPOINT_EVERY,
                 "checkpoint_indices": np.arange(1, count + 1, dtype=np.int32)[None]}  # fmt: skip
    pool = np.zeros((count + 1, value_heads, HEAD_DIM, HEAD_DIM), np.float32)
    out = gdn_nki.prefill_bucket(**tensors, cu_seqlens=np.array([0, seq_len]), bucket=(seq_len, 1), scale=scale,
                                 recurrent_state=pool, state_indices=np.array([0], np.int32), **extra)  # fmt: skip
    return [*out, pool]


def decode(requests: int, tokens: int = 1, key_heads: int = 16, value_heads: int = 32) -> Arrays:
    """``decode_step`` of ``requests`` requests at Qwen3-Next's heads, fused gating and l2norm (bench_decode's
    launch, seed 0)."""
    rng = np.random.default_rng(0)
    bf16, f32 = ml_dtypes.bfloat16, np.float32
    q = rng.standard_normal((requests, tokens, key_heads, HEAD_DIM)).astype(bf16)
    k = rng.standard_normal((requests, tokens, key_heads, HEAD_DIM)).astype(bf16)
    v = rng.standard_normal((requests, tokens, value_heads, HEAD_DIM)).astype(bf16)
    a, b = rng.standard_normal((2, requests, tokens, value_heads)).astype(f32)
    zeros = np.zeros(value_heads, f32)
    pool = np.zeros((requests, value_heads, HEAD_DIM, HEAD_DIM), f32)
    out, _ = gdn_nki.decode_step(q, k, v, pool, np.arange(requests, dtype=np.int32), a=a, b=b, A_log=zeros,
                              dt_bias=zeros, use_qk_l2norm=True, check_values=False)  # fmt: skip
    return [out, pool]


def conv_decode(requests: int, tokens: int = 1, keep_every_token: bool = False) -> Arrays:
    """``conv_decode_step`` of ``requests`` requests at Qwen3-Next's conv (8192 channels, width 4, bias, SiLU), bf16
    x and pool, ``tokens`` new tokens, [N] rows or [N, T] rows keeping every token's window."""
    rng = np.random.default_rng(requests * 10 + tokens)
    channels, width, state_len, bf16 = 8192, 4, 3, ml_dtypes.bfloat16
    x = rng.standard_normal((requests, tokens, channels)).astype(bf16)
    kept = tokens if keep_every_token else 1
    pool = rng.standard_normal((requests * kept + 1, channels, state_len)).astype(bf16)
    weight, bias = rng.standard_normal((channels, width)).astype(bf16), rng.standard_normal(channels).astype(bf16)
    rows = np.arange(requests * kept, dtype=np.int32).reshape((requests, kept) if keep_every_token else -1)
    accepted = np.ones(requests, np.int32) if keep_every_token else None
    out, _ = gdn_nki.conv_decode_step(x, pool, weight, bias, rows, accepted, check_values=False)
    return [out, pool]


def _lanes(seq_len: int, key_heads: int = 1, value_heads: int = 1) -> Geometry:
    return Geometry(B=1, Hk=key_heads, Hv=value_heads, S=seq_len, Dk=HEAD_DIM, Dv=HEAD_DIM)


# The published rows (README, PERFORMANCE.md): name -> launch.
ROWS: dict[str, Callable[[], Arrays]] = {
    "one lane bf16 S=2048": lambda: prefill(_lanes(2048)),
    "one lane bf16 S=8192": lambda: prefill(_lanes(8192)),
    "one lane bf16 S=32768": lambda: prefill(_lanes(32768)),
    "one lane fp32 S=2048": lambda: prefill(_lanes(2048), "float32"),
    "one lane fp32 S=8192": lambda: prefill(_lanes(8192), "float32"),
    "one lane fp32 S=32768": lambda: prefill(_lanes(32768), "float32"),
    "one lane neumann bf16 S=2048": lambda: prefill(_lanes(2048), algorithm="neumann"),
    "one lane neumann bf16 S=8192": lambda: prefill(_lanes(8192), algorithm="neumann"),
    "one lane neumann bf16 S=32768": lambda: prefill(_lanes(32768), algorithm="neumann"),
    "Qwen3-Next heads 16/32 bf16 S=128": lambda: prefill(_lanes(128, 16, 32)),
    "Qwen3-Next heads 16/32 bf16 S=2048": lambda: prefill(_lanes(2048, 16, 32)),
    "Qwen3-Next heads 16/32 bf16 S=8192": lambda: prefill(_lanes(8192, 16, 32)),
    "Qwen3-Next heads 16/32 bf16 S=32768": lambda: prefill(_lanes(32768, 16, 32)),
    "Qwen3-Next heads 16/32 fp32 S=8192": lambda: prefill(_lanes(8192, 16, 32), "float32"),
    "Qwen3-Next heads 16/32 fp32 S=32768": lambda: prefill(_lanes(32768, 16, 32), "float32"),
    "bucket, vLLM-like batch, 2/4": lambda: bucket_batch(VARLEN_LENGTHS, 2, 4),
    "bucket, vLLM-like batch, 16/32": lambda: bucket_batch(VARLEN_LENGTHS, 16, 32),
    "S=8192 2/4 gdn_cte": lambda: one_sequence(CHECKPOINT_SEQ_LEN, 2, 4, "cte"),
    "S=8192 2/4 bucket": lambda: one_sequence(CHECKPOINT_SEQ_LEN, 2, 4, "bucket"),
    "S=8192 2/4 bucket, checkpoints every 256": lambda: one_sequence(CHECKPOINT_SEQ_LEN, 2, 4, "checkpoints"),
    "decode N=8 T=1": lambda: decode(8),
    "decode N=64 T=1": lambda: decode(64),
    "decode N=256 T=1": lambda: decode(256),
    "conv decode N=64 T=1": lambda: conv_decode(64),
    "conv decode N=256 T=1": lambda: conv_decode(256),
    "conv decode N=256 T=4": lambda: conv_decode(256, 4),
    "conv decode N=256 T=4, every token kept": lambda: conv_decode(256, 4, keep_every_token=True),
}
# ``--smoke``: short launches, one a compiled loop (decode's requests loop past 16), each a second or so.
SMOKE_ROWS: dict[str, Callable[[], Arrays]] = {
    "one lane bf16 S=512": lambda: prefill(_lanes(512)),
    "bucket, 3 sequences, 1/1": lambda: bucket_batch((37, 300, 130), 1, 1),
    "decode N=20 T=1, 1/1 heads": lambda: decode(20, key_heads=1, value_heads=1),
}


@dataclass
class Row:
    """One launch at every barrier of ``BARRIERS``."""

    name: str
    makespan_us: dict[str, float]
    boundaries: int
    static_instructions: int
    instructions: int
    digest: str
    wall_s: float

    @property
    def overhead(self) -> float:
        """The fitted barrier's cost over the same program at a barrier of 0."""
        return self.makespan_us["fitted"] / self.makespan_us["0"] - 1.0


def digest(arrays: Arrays) -> str:
    """The first 12 hex digits of the SHA-256 of the arrays' raw bytes, in order."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:12]


def measure(name: str, launch: Callable[[], Arrays]) -> Row:
    """Run ``launch`` once and schedule its traces at every barrier; a launch grid takes its slowest program."""
    start = time.perf_counter()
    arrays = launch()
    wall = time.perf_counter() - start
    traces = nki_cpu.last_traces()
    makespans = {}
    for label, barrier in BARRIERS.items():
        figures = dataclasses.replace(TRN2, loop_barrier_ns=barrier)
        makespans[label] = max(estimate(trace, figures=figures).makespan_ns for trace in traces) / 1e3
    slowest = max(traces, key=lambda trace: estimate(trace).makespan_ns) if len(traces) > 1 else traces[0]
    return Row(name, makespans, sum(loop_barriers(slowest).values()), slowest.static_instructions,
               len(slowest.records), digest(arrays), wall)  # fmt: skip


def table(rows: list[Row]) -> str:
    """The markdown table: µs at each barrier, the fitted overhead (marked above the target) and the counts."""
    ns = " / ".join(f"{label} {value / 1e3:.2f}" for label, value in BARRIERS.items())
    lines = [
        f"Barrier (µs): {ns}. Trn2 figures, program order; overhead: fitted over 0; ! above {OVERHEAD_TARGET:.0%}.",
        "",
        "| launch | boundaries | "
        + " | ".join(f"{label} µs" for label in BARRIERS)
        + " | overhead | static | dynamic | outputs | interpreted s |",
        "|---|---:|" + "---:|" * len(BARRIERS) + "---:|---:|---:|---|---:|",
    ]
    for r in rows:
        mark = " !" if r.overhead > OVERHEAD_TARGET else ""
        cells = " | ".join(f"{r.makespan_us[label]:,.1f}" for label in BARRIERS)
        lines.append(f"| {r.name} | {r.boundaries} | {cells} | {r.overhead:+.1%}{mark} | {r.static_instructions:,} "
                     f"| {r.instructions:,} | {r.digest} | {r.wall_s:.0f} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Measure the rows asked for, print the table and write it to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="directory for bench_barrier.md and bench_barrier.json")
    parser.add_argument("--smoke", action="store_true", help="SMOKE_ROWS only (CI's check that it runs)")
    parser.add_argument("--rows", nargs="+", metavar="NAME", help="only the rows whose name contains one of these")
    args = parser.parse_args(argv)
    plan = SMOKE_ROWS if args.smoke else ROWS
    if args.rows:
        plan = {name: launch for name, launch in plan.items() if any(part in name for part in args.rows)}
    rows = []
    for name, launch in plan.items():
        rows.append(measure(name, launch))
        r = rows[-1]
        print(f"  {name}: {r.makespan_us['0']:.1f} / {r.makespan_us['fitted']:.1f} us ({r.overhead:+.1%}), "
              f"{r.boundaries} boundaries, {r.wall_s:.0f} s", flush=True)  # fmt: skip
    text = table(rows)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{PREFIX}.md").write_text(text + "\n")
        payload = [{**dataclasses.asdict(r), "overhead": r.overhead} for r in rows]
        (args.out / f"{PREFIX}.json").write_text(json.dumps({"barrier_ns": BARRIERS, "rows": payload}, indent=2) + "\n")


if __name__ == "__main__":
    main()
