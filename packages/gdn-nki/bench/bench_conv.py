"""Conv decode cost: makespan per launch from nki-cpu's cost model against the launch's HBM floor (issue 43).

Qwen3-Next's conv (q|k|v: 16 key heads × 128 × 2 + 32 value heads × 128 = 8192 channels, width 4, no bias: HF
transformers' ``Qwen3NextGatedDeltaNet`` builds ``nn.Conv1d(..., bias=False)`` and vLLM's Qwen3-Next layer its conv as
``ColumnParallelLinear(..., bias=False)``; ``--bias`` measures the biased form; SiLU),
bf16 inputs and a bf16 pool of windows [P, 8192, 3] (vLLM's and HF's dtype for the conv state), ``gdn_conv_step``
through ``gdn_nki.conv_decode_step``, for N requests in {8, 64, 256} and T in {1, 4} ([N] rows, and at T = 4
[N, T] rows keeping every token's window, and vLLM's in-row form: [N] rows with ``num_accepted_tokens``, rows of
W − 2 + T = 6 inputs read from offset a − 1, counts cycling 1..T; and vLLM's varlen form of it, x packed [N·T, C]
with ``query_start_loc`` through ``gdn_nki.conv_decode_step``: the same launch on the requests laid out as
[N, T, C], the layout's gathers outside the kernel and outside the model).

HBM floor: the bytes the launch must move — x and out (N·T·C), each window read once and written once per row
kept, the taps (and the bias, with ``--bias``) once, the indices — at one NeuronCore's share of Trn2's 2.9 TB/s (362.5 B/ns, as
``bench_decode.py``). The kernel's own byte count (nki-cpu's, every DMA) is reported beside it: they differ only by
what the kernel moves beyond the necessary (nothing, today). The model's DMA floor is those bytes at 16 engines ×
23 B/ns and each transfer's run efficiency. Each cell is judged against issue 43's target, within 1.3× the HBM
floor (PERFORMANCE.md, "Decode speed", says why N = 8 cannot meet it).

    python packages/gdn-nki/bench/bench_conv.py [--out DIR] [--quick] [--smoke] [--bias]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

import gdn_nki
import nki_cpu
from nki_cpu.cost import estimate

CHANNELS, WIDTH, STATE_LEN = 8192, 4, 3
REQUESTS = (8, 64, 256)
HBM_BYTES_PER_NS = 2.9e12 / 8 / 1e9  # one NeuronCore's share of Trn2's 2.9 TB/s (bench_decode.py)
TARGET = 1.3  # issue 43: conv decode within 1.3x its HBM floor


@dataclass
class Row:
    """One cell of the table."""

    requests: int
    tokens: int
    form: str
    makespan_us: float
    necessary_bytes: int
    bytes_moved: int
    model_floor_us: float
    binding: str
    instructions: int

    @property
    def hbm_floor_us(self) -> float:
        return self.necessary_bytes / HBM_BYTES_PER_NS / 1e3

    @property
    def hbm_ratio(self) -> float:
        return self.makespan_us / self.hbm_floor_us


def necessary_bytes(requests: int, tokens: int, kept: int, itemsize: int = 2, in_row: bool = False,
                    bias: bool = False) -> int:  # fmt: skip
    """What any conv decode launch must move (module docstring); ``in_row``: each row's W − 1 inputs from its
    offset read, its W − 2 + T written, and the counts; ``bias``: the bias read once beside the taps."""
    io = 2 * requests * tokens * CHANNELS * itemsize
    if in_row:
        windows = requests * (WIDTH - 1 + WIDTH - 2 + tokens) * CHANNELS * itemsize
    else:
        windows = requests * (1 + kept) * CHANNELS * STATE_LEN * itemsize
    constants = CHANNELS * (WIDTH + bias) * itemsize
    indices = requests * (2 if in_row else kept) * 4
    return io + windows + constants + indices


FORMS = {"[N]": "[N]", "[N, T]": "[N, T] (every token kept)", "in-row": "[N] in-row (vLLM, counts 1..T)",
         "varlen": "varlen in-row (vLLM query_start_loc, counts 1..T)"}  # fmt: skip


def measure(requests: int, tokens: int, form: str, seed: int = 0, row_extra: int = 0, bias: bool = False) -> Row:
    """One ``conv_decode_step`` launch at Qwen3-Next's shapes, estimated; ``form`` a key of ``FORMS``;
    ``row_extra``: the in-row forms' rows that many entries longer than vLLM's W − 2 + T (only the first W − 2 + T
    written, as vLLM's kernel: runs of W − 2 + T a channel instead of one run a partition); ``bias``: with a conv
    bias (Qwen3-Next has none)."""
    rng = np.random.default_rng(seed)
    bf16 = ml_dtypes.bfloat16
    in_row = form in ("in-row", "varlen")
    kept = tokens if form == "[N, T]" else 1
    x = rng.standard_normal((requests, tokens, CHANNELS)).astype(bf16)
    state_len = WIDTH - 2 + tokens + row_extra if in_row else STATE_LEN
    pool = np.zeros((requests * kept, CHANNELS, state_len), bf16)
    rows = np.arange(requests * kept, dtype=np.int32).reshape((requests, kept) if form == "[N, T]" else -1)
    accepted = (np.arange(requests, dtype=np.int32) % tokens + 1) if in_row else None
    weight = rng.standard_normal((CHANNELS, WIDTH)).astype(bf16)
    bias_values = rng.standard_normal(CHANNELS).astype(bf16)  # drawn either way: x, pool and taps stay the same
    bias = bias_values if bias else None
    if form == "varlen":  # every request at max_query_len: the (tokens, N) = (N·T, N) shape vLLM compiles
        bounds = np.arange(0, requests * tokens + 1, tokens, dtype=np.int32)
        gdn_nki.conv_decode_step(x.reshape(requests * tokens, CHANNELS), pool, weight, bias, rows, accepted,
                                 check_values=False, query_start_loc=bounds, max_query_len=tokens)  # fmt: skip
    else:
        gdn_nki.conv_decode_step(x, pool, weight, bias, rows, accepted, check_values=False)
    trace = nki_cpu.last_trace()
    report = estimate(trace)
    return Row(
        requests=requests,
        tokens=tokens,
        form=FORMS[form] + (f", rows of L = W − 2 + T + {row_extra}" if in_row and row_extra else ""),
        makespan_us=report.makespan_ns / 1e3,
        necessary_bytes=necessary_bytes(requests, tokens, kept, in_row=in_row, bias=bias is not None),
        bytes_moved=int(report.dma_bytes),
        model_floor_us=report.makespan_floor.parts["dma"] / 1e3,
        binding=report.makespan_floor.binding,
        instructions=len(trace.records),
    )


def table(rows: list[Row]) -> str:
    """The markdown table of the cells."""
    lines = [
        "| N | T | rows | makespan µs | µs per request | MiB necessary | MiB moved | HBM floor µs | × HBM floor | "
        f"≤ {TARGET}× | model DMA floor µs | binding floor | instructions run |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.requests} | {r.tokens} | {r.form} | {r.makespan_us:,.1f} | {r.makespan_us / r.requests:,.2f} | "
            f"{r.necessary_bytes / 2**20:,.2f} | {r.bytes_moved / 2**20:,.2f} | {r.hbm_floor_us:,.1f} | "
            f"{r.hbm_ratio:.2f} | {'met' if r.hbm_ratio <= TARGET else 'not met'} | {r.model_floor_us:,.1f} | "
            f"{r.binding} | {r.instructions} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Measure the cells, print the table, and write it to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="directory for bench_conv.md")
    parser.add_argument("--quick", action="store_true", help="N = 8 only")
    parser.add_argument("--smoke", action="store_true", help="N = 8, T = 1 only (seconds; for CI)")
    parser.add_argument("--forms", nargs="+", choices=sorted(FORMS), default=sorted(FORMS), help="T > 1 forms")
    parser.add_argument("--requests", nargs="+", type=int, choices=REQUESTS, help="these N only")
    parser.add_argument("--row-extra", type=int, default=0, help="in-row rows this much longer than W − 2 + T")
    parser.add_argument("--bias", action="store_true", help="with a conv bias (Qwen3-Next's conv has none)")
    args = parser.parse_args(argv)
    rows = []
    for requests in REQUESTS[:1] if args.quick or args.smoke else (args.requests or REQUESTS):
        for tokens in (1,) if args.smoke else (1, 4):
            for form in [f for f in FORMS if f in args.forms] if tokens > 1 else ["[N]"]:
                rows.append(measure(requests, tokens, form, row_extra=args.row_extra, bias=args.bias))
                print(f"N={requests} T={tokens} {rows[-1].form}: {rows[-1].makespan_us:,.1f} us", flush=True)
    text = f"Conv {'with' if args.bias else 'without'} a bias.\n\n" + table(rows)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_conv.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
