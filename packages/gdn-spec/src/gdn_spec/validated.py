"""The "kernels validated" table: ``gdn-spec check --json`` summaries rendered as markdown, written into a README.

``python -m gdn_spec.validated --readme README.md run1.json run2.json ...`` replaces what lies between the
``<!-- kernels-validated:begin -->`` and ``<!-- kernels-validated:end -->`` markers; the table is never typed.
Each summary may carry a ``label`` and the run's wall time (``seconds``) in its ``run`` block (the nox session
adds them).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .provenance import describe_kernel, describe_runtime

BEGIN = "<!-- kernels-validated:begin -->"
END = "<!-- kernels-validated:end -->"
_LISTED = 8  # failed tests named per kernel


def _cell(counts: dict[str, int] | None) -> str:
    """One area's verdict for one kernel: FAILED beats passed beats skipped (skipped is never shown as passed)."""
    if not counts:
        return "—"
    if counts.get("failed"):
        return f"**FAILED** {counts['failed']}/{sum(counts.values())}"
    if counts.get("passed"):
        skipped = counts.get("skipped", 0)
        return f"passed {counts['passed']}" + (f" (+{skipped} skipped)" if skipped else "")
    return f"skipped {counts.get('skipped', 0)}"


def _worst(summary: dict[str, Any]) -> str:
    worst = summary.get("worst") or {}
    if not worst:
        return "—"
    e = max(worst.values(), key=lambda x: x["ratio"])
    return f"{e['ratio']:.3g} ({e['dtype']} {e['output']}, {e['regime']}; rel-RMS {e['rel_rms']:.1e})"


def render(summaries: list[dict[str, Any]]) -> str:
    """Two markdown tables — the kernels (how each was called, profile, totals, worst error, time) and the
    verdict per contract area —, the failed tests of each kernel that has any, and what produced each run (the
    kernel's package and version, gdn-spec's and the runtime's versions) when its summary records it."""
    lines = [
        "| # | kernel | called via | profile | passed | failed | skipped | worst error / tolerance | time |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for i, s in enumerate(summaries, 1):
        run, totals = s.get("run", {}), s.get("totals", {})
        seconds = run.get("seconds")
        lines.append(
            f"| {i} | {run.get('label') or run.get('implementation', '?')} (`{run.get('spec', '?')}`) "
            f"| {run.get('via') or 'direct'} | {run.get('profile', '?')} | {totals.get('passed', 0)} "
            f"| {totals.get('failed', 0)} | {totals.get('skipped', 0)} | {_worst(s)} "
            f"| {'—' if seconds is None else f'{seconds:.0f} s'} |"
        )
    areas = sorted({a for s in summaries for a in s.get("areas", {})})
    lines += ["", "| area | " + " | ".join(f"#{i}" for i in range(1, len(summaries) + 1)) + " |"]
    lines.append("|---|" + "---|" * len(summaries))
    for area in areas:
        lines.append(f"| {area} | " + " | ".join(_cell(s.get("areas", {}).get(area)) for s in summaries) + " |")
    failing = [(i, s["failures"]) for i, s in enumerate(summaries, 1) if s.get("failures")]
    if failing:
        lines += ["", "Failed tests:", ""]
        for i, failures in failing:
            names = sorted(nodeid.split("::", 1)[-1] for nodeid in failures)
            more = f" and {len(names) - _LISTED} more" if len(names) > _LISTED else ""
            lines.append(f"- #{i}: " + ", ".join(f"`{n}`" for n in names[:_LISTED]) + more)
    produced = [(i, s["run"]) for i, s in enumerate(summaries, 1) if "kernel" in s.get("run", {})]
    if produced:  # summaries written before gdn-spec recorded versions have none to show
        lines += ["", "Produced by:", ""]
        for i, run in produced:
            runtime = f"; {describe_runtime(run['versions'])}" if "versions" in run else ""
            lines.append(f"- #{i}: {describe_kernel(run['kernel'])}{runtime}")
    return "\n".join(lines)


def write_section(readme: Path, table: str) -> None:
    """Replace the marked section of ``readme`` with ``table`` (the markers must exist, once each)."""
    text = readme.read_text()
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise SystemExit(f"{readme}: needs exactly one {BEGIN} ... {END} section")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    readme.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gdn_spec.validated", description=__doc__.splitlines()[0])
    parser.add_argument("summaries", nargs="+", type=Path, help="gdn-spec check --json files, in table order")
    parser.add_argument("--readme", type=Path, help="write the table into this file's marked section")
    args = parser.parse_args(argv)
    table = render([json.loads(p.read_text()) for p in args.summaries])
    if args.readme:
        write_section(args.readme, table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
