"""``gdn-spec check module:callable``: run the conformance suite and print what passed, per contract area.

The suite runs through ``pytest.main`` with a collecting plugin; the summary is a table of contract area ×
passed/failed/skipped, the worst numerics error per dtype and algorithm (as a fraction of its tolerance), the
skip reasons and the failed tests. The exit code is non-zero on any failure, and when nothing ran.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from .impl import ImplementationError, resolve
from .suite._support import NUMERICS_PROPERTY

SUITE = "gdn_spec.suite"
_AREA_RE = re.compile(r"test_(\w+)\.py::")


def area_of(nodeid: str) -> str:
    """Contract area of a suite test id: its module name without ``test_``."""
    match = _AREA_RE.search(nodeid)
    return match.group(1) if match else "other"


@dataclass
class Summary:
    """Outcomes per test, skip reasons, failures, and the worst numerics error per (dtype, algorithm)."""

    outcomes: dict[str, str] = field(default_factory=dict)
    skip_reasons: Counter = field(default_factory=Counter)
    failures: dict[str, str] = field(default_factory=dict)
    worst: dict[str, dict[str, Any]] = field(default_factory=dict)

    def by_area(self) -> dict[str, Counter]:
        table: dict[str, Counter] = defaultdict(Counter)
        for nodeid, outcome in self.outcomes.items():
            table[area_of(nodeid)][outcome] += 1
        return dict(sorted(table.items()))

    def as_dict(self) -> dict[str, Any]:
        return {
            "areas": {a: dict(c) for a, c in self.by_area().items()},
            "totals": dict(Counter(self.outcomes.values())),
            "failures": self.failures,
            "skip_reasons": dict(self.skip_reasons),
            "worst": self.worst,
        }


class Collector:
    """pytest plugin recording each test's final outcome and its numerics properties (works under xdist)."""

    def __init__(self) -> None:
        self.summary = Summary()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        s = self.summary
        if report.failed:
            s.outcomes[report.nodeid] = "failed"
            s.failures.setdefault(report.nodeid, _short(report.longreprtext))
        elif report.skipped and report.when in ("setup", "call"):
            s.outcomes[report.nodeid] = "skipped"
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            s.skip_reasons[reason.removeprefix("Skipped: ")] += 1
        elif report.when == "call" and report.passed:
            s.outcomes.setdefault(report.nodeid, "passed")
        for name, value in report.user_properties:
            if str(name).startswith(NUMERICS_PROPERTY):
                self._record(json.loads(value))

    def _record(self, entry: dict[str, Any]) -> None:
        key = f"{entry['dtype']}/{entry['algorithm']}/{entry['output']}"
        if key not in self.summary.worst or self.summary.worst[key]["ratio"] < entry["ratio"]:
            self.summary.worst[key] = entry


def _short(text: str, limit: int = 400) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    tail = lines[-1] if lines else ""
    return tail[:limit]


def format_summary(summary: Summary, title: str) -> str:
    """The human-readable report: area table, worst errors, skip reasons, failures."""
    lines = [f"gdn-spec conformance: {title}", "", f"{'area':<18}{'passed':>8}{'failed':>8}{'skipped':>9}"]
    totals: Counter = Counter()
    for area, counts in summary.by_area().items():
        totals.update(counts)
        lines.append(f"{area:<18}{counts['passed']:>8}{counts['failed']:>8}{counts['skipped']:>9}")
    lines.append(f"{'total':<18}{totals['passed']:>8}{totals['failed']:>8}{totals['skipped']:>9}")
    if summary.worst:
        lines += ["", "worst numerics error vs the float64 oracle (ratio = error / tolerance, must be <= 1):"]
        lines.append(
            f"{'dtype':<10}{'algorithm':<10}{'output':<7}{'rel_rms':>10}{'tol':>9}{'max_abs':>11}"
            f"{'max_rel':>10}{'tol':>9}{'ratio':>10}  regime"
        )
        for _, e in sorted(summary.worst.items()):
            lines.append(
                f"{e['dtype']:<10}{e['algorithm']:<10}{e['output']:<7}{e['rel_rms']:>10.2e}{e['tol_rel_rms']:>9.1e}"
                f"{e['max_abs']:>11.2e}{e['max_rel']:>10.2e}{e['tol_max_rel']:>9.1e}{e['ratio']:>10.3g}  {e['regime']}"
            )
    if summary.skip_reasons:
        lines += ["", "skipped (reason × tests):"]
        lines += [f"  {n:>4} × {reason}" for reason, n in summary.skip_reasons.most_common()]
    if summary.failures:
        lines += ["", "FAILED:"]
        lines += [f"  {nodeid.split('::', 1)[-1]}: {msg}" for nodeid, msg in sorted(summary.failures.items())]
    return "\n".join(lines)


def build_pytest_args(args: argparse.Namespace) -> list[str]:
    """pytest command line for a ``check`` invocation."""
    targets = [f"{SUITE}.test_{area}" for area in args.area] if args.area else [SUITE]
    argv = ["--pyargs", *targets, "--gdn-impl", args.impl, "--gdn-algorithm", args.algorithm]
    argv += ["-p", "no:cacheprovider", "-q", "--no-header", "-rN", f"--hypothesis-profile={args.profile}"]
    # The CLI imported gdn_spec (and so Hypothesis) before pytest could rewrite asserts in them: harmless.
    argv += ["-W", "ignore::pytest.PytestAssertRewriteWarning"]
    if args.workers not in (None, "0"):
        argv += ["-n", args.workers]
    if args.junit:
        argv += [f"--junitxml={args.junit}", "-o", "junit_family=xunit2"]
    if args.keyword:
        argv += ["-k", args.keyword]
    return argv + list(args.pytest_args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gdn-spec", description="Conformance suite for gdn_cte GDN kernels.")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="run the suite against an implementation")
    check.add_argument("impl", help="module:callable (or a registered gdn_spec.implementations name)")
    check.add_argument("--algorithm", default="all", choices=("schur", "neumann", "all"))
    check.add_argument("--junit", metavar="FILE", help="also write a JUnit XML report")
    check.add_argument("-n", dest="workers", default=None, help="pytest-xdist workers (e.g. auto, 2; 0 = none)")
    check.add_argument("--profile", default="ci", help="Hypothesis profile: ci (default), dev or quick")
    check.add_argument("--area", action="append", help="run only this contract area (repeatable), e.g. numerics")
    check.add_argument("-k", dest="keyword", help="pytest -k expression to select tests")
    check.add_argument("--json", metavar="FILE", help="also write the summary as JSON")
    check.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gdn-spec`` console script; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        impl = resolve(args.impl)
    except ImplementationError as exc:
        print(f"gdn-spec: {exc}", file=sys.stderr)
        return 2
    collector = Collector()
    code = int(pytest.main(build_pytest_args(args), plugins=[collector]))
    summary = collector.summary
    title = f"{impl.capabilities.name} ({args.impl})" if impl else args.impl
    print("\n" + format_summary(summary, title))
    if args.json:
        Path(args.json).write_text(json.dumps(summary.as_dict(), indent=2))
    if code == 0 and not summary.outcomes:
        return 5
    return code


if __name__ == "__main__":
    sys.exit(main())
