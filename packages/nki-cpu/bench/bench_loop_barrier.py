"""The compiled-loop barrier's fixed cost: the fit to the "NKI Dynamic Loops" page, and its example at the fitted
cost and at the ends of the plausible range.

Usage:
    python bench/bench_loop_barrier.py [--out DIR] [--smoke]

Runs the page's example body (a [128, 2048] fp32 tile loaded, ``activation``, ``tensor_scalar``, stored; 64
tiles) unrolled, as ``nl.fori_loop`` and as ``nl.fori_loop`` with four tiles an iteration (``nki_cpu.cost.loop_fit``),
prints the fitted ``loop_barrier_ns`` with each form's µs per tile and the ratios against the page's
1 : 2.39 : 1.36, then the three forms on Trn1 and Trn2 at a barrier of 0 (the drain alone), the fitted value and
the page's upper end (``loop_fit.PLAUSIBLE_NS``). Writes ``bench_loop_barrier.md`` to ``--out`` when given.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from nki_cpu.cost import TRN1, TRN2
from nki_cpu.cost.figures import LOOP_BARRIER_NS
from nki_cpu.cost.loop_fit import FORMS, PAGE_US, PLAUSIBLE_NS, fit, traces, us_per_tile


def fit_table() -> str:
    """The fit: per form the page's and the model's µs per tile (Trn1), and the ratios to the unrolled form."""
    result = fit()
    model, page = result.ratios(result.us_per_tile), result.ratios(result.page_us)
    lines = [
        f"Fitted barrier: {result.barrier_ns:,.0f} ns (figure: {LOOP_BARRIER_NS:,.0f} ns); each loop form alone: "
        + ", ".join(f"{form} {ns:,.0f} ns" for form, ns in result.alone_ns.items()),
        "",
        "| form (trn1, 64 tiles) | page µs per tile | model µs per tile | page ratio | model ratio |",
        "|---|---:|---:|---:|---:|",
    ]
    for k, form in enumerate(FORMS):
        lines.append(
            f"| {form} | {PAGE_US[form]:.1f} | {result.us_per_tile[form]:.2f} | {page[k]:.2f} | {model[k]:.2f} |"
        )
    return "\n".join(lines)


def range_table() -> str:
    """The three forms at a barrier of the plausible range's ends and the fitted value, on Trn1 and Trn2."""
    found = traces()
    barriers = (PLAUSIBLE_NS[0], LOOP_BARRIER_NS, PLAUSIBLE_NS[1])
    lines = [
        "| target | barrier ns | " + " | ".join(f"{form} µs per tile" for form in FORMS) + " |",
        "|---|---:|" + "---:|" * len(FORMS),
    ]
    for base in (TRN1, TRN2):
        for barrier in barriers:
            times = us_per_tile(found, dataclasses.replace(base, loop_barrier_ns=barrier))
            lines.append(
                f"| {base.name} | {barrier:,.0f} | " + " | ".join(f"{times[form]:.2f}" for form in FORMS) + " |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Print the fit and the range tables, and write them to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="directory for bench_loop_barrier.md")
    parser.add_argument(
        "--smoke", action="store_true", help="accepted for the CI smoke run: the bench is already small"
    )
    args = parser.parse_args(argv)
    text = fit_table() + "\n\n" + range_table()
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_loop_barrier.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
