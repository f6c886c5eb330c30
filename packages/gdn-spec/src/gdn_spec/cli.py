"""``gdn-spec check module:callable``: run the conformance suite and print what passed, per contract area.

The suite runs through ``pytest.main`` with a collecting plugin; the summary names the implementation, the
adapter it was called through and the contract profile, then a table of contract area × passed/failed/skipped,
the worst numerics error per dtype and algorithm (as a fraction of its tolerance), the skip reasons, the tests run
at other head dims than they name (a head-dim-limited kernel's nearest supported pair), what ``--area`` / ``-k``
/ ``--algorithm`` / ``-x`` left out, and each failure's message. The exit code is non-zero on any failure, and
when nothing was verified (no test passed or failed: all skipped or deselected; 5, pytest's "no tests"). Arguments the CLI does not know (``-x``, ``--maxfail=3``, ...) go to pytest,
with or without a ``--`` before them.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gdn_ref.constants import ALGORITHMS

from . import context_parallel
from .adapters import ADAPTERS
from .conv.adapters import ADAPTERS as CONV_ADAPTERS
from .conv.runner import declares_conv, load_kernel, run_kernel
from .decode.adapters import DECODE_ADAPTERS
from .decode.impl import FAMILIES, is_decode, resolve_family
from .failures import failure_message
from .impl import Implementation, ImplementationError, registered
from .plugin import PROFILE_PURPOSES, SUBSTITUTION_PROPERTY
from .plugin import PROFILES as HYPOTHESIS_PROFILES
from .profiles import DECODE_PROFILE_DOCS, PROFILE_DOCS, PROFILES
from .provenance import describe_kernel, describe_runtime, kernel_provenance, runtime_versions
from .suite._support import NUMERICS_PROPERTY

SUITE = "gdn_spec.suite"
SUITE_DIR = Path(__file__).parent / "suite"
# Contract areas: one suite module each (test_<area>.py).
AREAS = tuple(sorted(p.stem.removeprefix("test_") for p in SUITE_DIR.glob("test_*.py")))
_AREA_RE = re.compile(r"test_(\w+)\.py::")


def test_id(report: pytest.TestReport) -> str:
    """The report's test id, always with its module: run from outside the repository (a user's own project),
    pytest ids a ``--pyargs`` module's tests by name only ("::test_x"), which names no area and can repeat
    across areas; the module then comes from the report's location."""
    if report.nodeid.startswith("::"):
        return Path(report.location[0]).name + report.nodeid
    return report.nodeid


def area_of(nodeid: str) -> str:
    """Contract area of a suite test id: its module name without ``test_``."""
    match = _AREA_RE.search(nodeid)
    return match.group(1) if match else "other"


@dataclass
class Summary:
    """Outcomes per test, skip reasons, failures, the worst numerics error per (dtype, algorithm), the head-dim
    substitutions of tests that ran (note -> tests), and the run's identity (implementation, adapter, profile) and
    restrictions (what was left out)."""

    outcomes: dict[str, str] = field(default_factory=dict)
    skip_reasons: Counter = field(default_factory=Counter)
    failures: dict[str, str] = field(default_factory=dict)
    worst: dict[str, dict[str, Any]] = field(default_factory=dict)
    collected: int = 0
    deselected: int = 0
    run: dict[str, Any] = field(default_factory=dict)
    left_out: list[str] = field(default_factory=list)
    substituted: Counter = field(default_factory=Counter)
    collect_only: bool = False

    def by_area(self) -> dict[str, Counter]:
        table: dict[str, Counter] = defaultdict(Counter)
        for nodeid, outcome in self.outcomes.items():
            table[area_of(nodeid)][outcome] += 1
        return dict(sorted(table.items()))

    def verdicts(self) -> dict[str, str]:
        """Per area: "failed" if any test failed, "passed" if any passed, else "skipped" (never passed)."""
        return {
            area: "failed" if c["failed"] else "passed" if c["passed"] else "skipped"
            for area, c in self.by_area().items()
        }

    def not_run(self) -> str | None:
        """How many collected tests did not run, and why (listed by ``--collect-only``, or after ``-x`` /
        ``--maxfail`` stopped the run), or None when every collected test ran."""
        count = self.collected - len(self.outcomes)
        if count <= 0:
            return None
        why = "--collect-only: listed, not run" if self.collect_only else "stopped early: -x / --maxfail"
        return f"{count} collected tests did not run ({why})"

    def as_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "areas": {a: dict(c) for a, c in self.by_area().items()},
            "verdicts": self.verdicts(),
            "totals": dict(Counter(self.outcomes.values())),
            "failures": self.failures,
            "skip_reasons": dict(self.skip_reasons),
            "worst": self.worst,
            "left_out": self.left_out,
            "substituted": dict(self.substituted),
            "outcomes": dict(sorted(self.outcomes.items())),
        }


class Collector:
    """pytest plugin recording each test's final outcome and its numerics properties (works under xdist)."""

    def __init__(self) -> None:
        self.summary = Summary()

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.summary.collected = max(self.summary.collected, len(session.items))
        self.summary.collect_only = bool(session.config.getoption("collectonly", False))

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        self.summary.collected = max(self.summary.collected, len(ids))

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        self.summary.deselected += len(items)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        s = self.summary
        nodeid = test_id(report)
        if report.failed:
            s.outcomes[nodeid] = "failed"
            s.failures.setdefault(nodeid, failure_message(report))
        elif report.skipped and report.when in ("setup", "call"):
            s.outcomes[nodeid] = "skipped"
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            s.skip_reasons[reason.removeprefix("Skipped: ")] += 1
        elif report.when == "call" and report.passed:
            s.outcomes.setdefault(nodeid, "passed")
        for name, value in report.user_properties:
            if str(name).startswith(NUMERICS_PROPERTY):
                self._record(json.loads(value))
            elif name == SUBSTITUTION_PROPERTY and not report.skipped:  # tests that ran, at other head dims
                s.substituted[value] += 1

    def _record(self, entry: dict[str, Any]) -> None:
        key = f"{entry['dtype']}/{entry['algorithm']}/{entry['output']}"
        if key not in self.summary.worst or self.summary.worst[key]["ratio"] < entry["ratio"]:
            self.summary.worst[key] = entry


def format_summary(summary: Summary, title: str) -> str:
    """The human-readable report: the run, area table, worst errors, skip reasons, what was left out, failures."""
    lines = [f"gdn-spec conformance: {title}"]
    run = summary.run
    if run:
        if "kernel" in run:
            lines.append(f"  kernel:  {describe_kernel(run['kernel'])}")
        adapter = f" (--adapter {run['adapter']})" if run.get("adapter") else ""
        family = run.get("family")
        signature = {"decode": "decode_step", "conv": "conv_decode_step / conv_prefill_bucket"}.get(family, "gdn_cte")
        lines.append(f"  via:     {run.get('via') or f'called directly ({signature} signature, numpy)'}{adapter}")
        docs = {"decode": DECODE_PROFILE_DOCS, "conv": CONV_PROFILE_DOCS}.get(family, PROFILE_DOCS)
        lines.append(f"  profile: {run['profile']} ({docs[run['profile']]})")
        if "hypothesis" in run:
            lines.append(
                f"  examples: Hypothesis profile {run['hypothesis']} ({describe_hypothesis(run['hypothesis'])})"
            )
        if "versions" in run:
            lines.append(f"  suite:   {describe_runtime(run['versions'])}")
    lines += ["", f"{'area':<18}{'passed':>8}{'failed':>8}{'skipped':>9}"]
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
    if summary.substituted:
        lines += ["", "run at other sizes than the test names, within the declared support (sizes × tests):"]
        lines += [f"  {n:>4} × {note}" for note, n in summary.substituted.most_common()]
    left_out = list(summary.left_out)
    not_run = summary.not_run()
    if not_run:
        left_out.append(not_run)
    if left_out:
        lines += ["", "left out of this run (not verified):"]
        lines += [f"  {item}" for item in left_out]
    if summary.failures:
        lines += ["", "FAILED:"]
        lines += [f"  {nodeid.split('::', 1)[-1]}: {msg}" for nodeid, msg in sorted(summary.failures.items())]
    return "\n".join(lines)


# The conv family's one profile: the checks a kernel declares (gdn_spec.conv).
CONV_PROFILE_DOCS = {
    "conv": "gdn-spec's conv family: numerics against the fp64 conv oracle, pool rows, -1 padding, rollback, "
    "vLLM's in-row form, "
    "rejections with the pool untouched and batch invariance, each as far as the kernel declares"
}


def nothing_verified(summary: Summary) -> str | None:
    """Why a run verified nothing — no test passed and none failed — or None when it verified something.

    Args:
        summary (Summary): the finished run.

    Returns:
        str | None: one line for the user: how many tests were skipped, with the most common reason; or how many
        were collected and did not run, and why (``--collect-only``); or that all were deselected, or none
        collected.

    Notes:
        A run whose every test was skipped (a kernel without varlen run with ``--area varlen``) exits 0 under
        pytest; reported as a pass it would claim a conformance nothing checked.
    """
    counts = Counter(summary.outcomes.values())
    if counts["passed"] or counts["failed"]:
        return None
    if counts["skipped"]:
        top = [f"{n} × {reason}; " for reason, n in summary.skip_reasons.most_common(1)]
        return f"nothing was verified: all {counts['skipped']} tests were skipped ({''.join(top)}the reasons are above)"
    not_run = summary.not_run()
    if not_run:  # collected and never run: "no test was collected" would send the user looking for a wrong path
        more = f"; {summary.deselected} more were deselected" if summary.deselected else ""
        return f"nothing was verified: {not_run}{more}"
    if summary.deselected:
        return f"nothing was verified: no test ran (all {summary.deselected} were deselected, see above)"
    return "nothing was verified: no test was collected"


def build_pytest_args(args: argparse.Namespace) -> list[str]:
    """pytest command line for a ``check`` invocation."""
    targets = [f"{SUITE}.test_{area}" for area in args.area] if args.area else [SUITE]
    argv = ["--pyargs", *targets, "--gdn-impl", args.impl, "--gdn-algorithm", args.algorithm]
    argv += ["--gdn-family", args.family]
    if args.adapter:
        argv += ["--gdn-adapter", args.adapter]
    if args.device:
        argv += ["--gdn-device", args.device]
    if args.profile:
        argv += ["--gdn-profile", args.profile]
    argv += ["-p", "no:cacheprovider", "-q", "--no-header", "-rN", "--tb=short"]
    argv += [f"--hypothesis-profile={args.hypothesis}"]
    # The CLI imported gdn_spec (and so Hypothesis) before pytest could rewrite asserts in them: harmless.
    argv += ["-W", "ignore::pytest.PytestAssertRewriteWarning"]
    if args.workers not in (None, "0"):
        argv += ["-n", args.workers]
    if args.junit:
        argv += [f"--junitxml={args.junit}", "-o", "junit_family=xunit2"]
    if args.keyword:
        argv += ["-k", args.keyword]
    return argv + list(args.pytest_args)


def _left_out(args: argparse.Namespace, decode: bool = False) -> list[str]:
    """What the run's restrictions leave out of the run's family's areas, said in the summary."""
    items = []
    if args.area:
        rest = [a for a in AREAS if a not in args.area and a.startswith("decode_") == decode]
        if rest:
            items.append(f"--area: {', '.join(rest)}")
    if args.algorithm != "all":
        items.append(f"--algorithm {args.algorithm}: the other algorithm's tests")
    return items


def _epilog() -> str:
    try:
        names = ", ".join(f"{n} ({spec})" for n, spec in sorted(registered().items())) or "none"
    except Exception as exc:  # a broken entry point must not break --help
        names = f"unreadable ({exc})"
    adapters = "\n".join(
        f"  {name:<10} {kind.doc} [default profile {kind.default_profile}]" for name, kind in ADAPTERS.items()
    )
    profiles = "\n".join(f"  {name:<10} {doc}" for name, doc in PROFILE_DOCS.items())
    decode_adapters = "\n".join(
        f"  {name:<12} {kind.doc} [default profile math]" for name, kind in DECODE_ADAPTERS.items()
    )
    return (
        f"areas (--area):\n  {', '.join(AREAS)}\n"
        f"contract profiles (--profile):\n{profiles}\n"
        f"adapters (--adapter NAME[:key=value,...]):\n{adapters}\n"
        "  seq-first options: scale=argument|internal|caller, gqa=native|repeat, state=kv|vk, varlen=no|yes\n"
        f"decode adapters (a decode kernel, --family decode):\n{decode_adapters}\n"
        f"registered implementations (gdn_spec.implementations): {names}\n"
        "A kernel in a module of the current directory: PYTHONPATH=. gdn-spec check my_kernel:gdn_cte (the current\n"
        "directory is not on sys.path for console scripts).\n"
        "Any other argument goes to pytest, e.g. -x or --maxfail=3 (a '--' before them is accepted)."
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gdn-spec", description="Conformance suite for gdn_cte GDN kernels.")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser(
        "check",
        help="run the suite against an implementation",
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check.add_argument("impl", help="module:callable (or a registered gdn_spec.implementations name)")
    check.add_argument("--adapter", metavar="NAME[:OPTS]", help="call the kernel through an adapter (list below)")
    check.add_argument("--device", help="torch device for the torch adapters (default: cuda when torch sees one)")
    check.add_argument(
        "--family",
        default="auto",
        choices=(*FAMILIES, "conv"),
        help="prefill (gdn_cte's signature), decode (decode_step's: the decode_* areas) or conv (the conv family: "
        "conv_decode_step's or conv_prefill_bucket's signature, areas conv_decode / conv_prefill); default auto: "
        "decode when the callable declares gdn_spec_decode_capabilities or --adapter is a decode adapter, conv when "
        "it declares the conv family's capabilities or --adapter is a conv adapter",
    )
    check.add_argument("--profile", choices=tuple(PROFILES), help="contract profile (default: the adapter's; api)")
    check.add_argument("--algorithm", default="all", choices=(*ALGORITHMS, "all"))
    check.add_argument("--junit", metavar="FILE", help="also write a JUnit XML report")
    check.add_argument("-n", dest="workers", default=None, help="pytest-xdist workers (e.g. auto, 2; 0 = none)")
    check.add_argument(
        "--hypothesis", default="ci", choices=tuple(HYPOTHESIS_PROFILES), help="Hypothesis profile (default ci)"
    )
    check.add_argument("--area", action="append", choices=AREAS, metavar="AREA", help="run only this area (repeatable)")
    check.add_argument("-k", dest="keyword", help="pytest -k expression to select tests")
    check.add_argument("--json", metavar="FILE", help="also write the summary as JSON")
    check.add_argument("--label", help="display name of the kernel in the summary and the JSON")
    cp = sub.add_parser(
        "check-cp",
        help="run a context-parallel kernel over 2 and 4 spawned gloo processes against its single-rank result",
        description=context_parallel.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cp.add_argument("impl", help="module:callable taking FLA's cp_context convention")
    cp.add_argument("--context", required=True, help="module:callable building the context (FLA's build_cp_context)")
    cp.add_argument("--no-states", action="store_true", help="the kernel takes no initial or final states under CP")
    cp.add_argument("--world", type=int, action="append", choices=(2, 4), help="group sizes to run (default: 2 and 4)")
    cp.add_argument("--case", action="append", metavar="NAME", help="run only this case (repeatable; default: all)")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The ``check`` arguments; anything unknown (``-x``, ``--maxfail=2``, after ``--`` or not) goes to pytest."""
    args, extra = _parser().parse_known_args(argv)
    args.pytest_args = [a for a in extra if a != "--"]
    return args


def describe_hypothesis(profile: str) -> str:
    """What a run under the Hypothesis ``profile`` is worth: its examples per drawn test and its purpose."""
    return f"{HYPOTHESIS_PROFILES[profile]['max_examples']} examples per drawn test: {PROFILE_PURPOSES[profile]}"


def _title(impl: Implementation | None, spec: str) -> str:
    return f"{impl.capabilities.name} ({spec})" if impl else spec


def check_cp(args: argparse.Namespace) -> int:
    """``gdn-spec check-cp``: each context-parallel case's verdict, then the exit code (1: a case failed)."""
    worlds = tuple(args.world or (2, 4))
    verdicts = context_parallel.check(args.impl, args.context, states=not args.no_states, worlds=worlds,
                                      names=args.case)  # fmt: skip
    for name, problems in verdicts.items():
        print(f"{'PASS' if not problems else 'FAIL'} {name}" + "".join(f"\n    {p}" for p in problems))
    failed = sum(1 for problems in verdicts.values() if problems)
    print(f"{len(verdicts) - failed} passed, {failed} failed")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gdn-spec`` console script; returns the exit code."""
    args = parse_args(argv)
    if args.command == "check-cp":
        return check_cp(args)
    if _is_conv(args):
        return check_conv(args)
    try:
        impl = resolve_family(args.impl, adapter=args.adapter, device=args.device, family=args.family)
    except ImplementationError as exc:
        print(f"gdn-spec: {exc}", file=sys.stderr)
        return 2
    collector = Collector()
    summary = collector.summary
    profile = args.profile or (impl.default_profile if impl else "api")
    summary.run = {
        "implementation": _title(impl, args.impl),
        "spec": args.impl,
        "kernel": kernel_provenance(impl.spec if impl else args.impl),
        "adapter": args.adapter or "",
        "via": impl.via if impl else "",
        "family": "decode" if is_decode(impl) or args.family == "decode" else "prefill",
        "profile": profile,
        "label": args.label or "",
        "hypothesis": args.hypothesis,
    }
    summary.left_out = _left_out(args, summary.run["family"] == "decode")
    started = time.perf_counter()
    code = int(pytest.main(build_pytest_args(args), plugins=[collector]))
    summary.run["seconds"] = round(time.perf_counter() - started, 1)
    summary.run["versions"] = runtime_versions()  # after the run: torch is named only if the run imported it
    if summary.deselected:
        by = " and ".join(
            x for x, on in ((f"-k {args.keyword!r}", args.keyword), ("--algorithm", args.algorithm != "all")) if on
        )
        summary.left_out.append(f"{summary.deselected} tests deselected by {by or 'pytest options'}")
    print("\n" + format_summary(summary, args.label or summary.run["implementation"]))
    print(f"({summary.run['seconds']:.1f} s)")
    unverified = nothing_verified(summary) if code in (0, 5) else None
    if unverified:
        print(f"gdn-spec: {unverified}; exit code 5", file=sys.stderr)
        code = 5  # pytest's "no tests collected": a run that checked nothing must not read as a pass
    summary.run["exit_code"] = code
    summary.run["nothing_verified"] = unverified or ""
    if args.json:
        Path(args.json).write_text(json.dumps(summary.as_dict(), indent=2))
    return code


def _is_conv(args: argparse.Namespace) -> bool:
    """``--family conv``, or auto with a conv adapter or a callable declaring the conv family's capabilities."""
    if args.family == "conv":
        return True
    if args.family != "auto":
        return False
    if args.adapter:
        return args.adapter.split(":", 1)[0] in CONV_ADAPTERS
    try:
        return declares_conv(load_kernel(args.impl))
    except Exception:  # not importable here: the prefill / decode resolver reports it properly
        return False


def check_conv(args: argparse.Namespace) -> int:
    """``gdn-spec check --family conv``: the conv family's checks on the kernel (``gdn_spec.conv.runner``), each a
    test of the area ``conv_decode`` or ``conv_prefill``, printed and written (``--json``) as the suite's summary is,
    so the README's validated table shows conv rows."""
    adapter = args.adapter.split(":", 1)[0] if args.adapter else None
    if adapter is not None and adapter not in CONV_ADAPTERS:
        print(f"gdn-spec: --adapter {args.adapter} is not a conv adapter ({', '.join(sorted(CONV_ADAPTERS))})",
              file=sys.stderr)  # fmt: skip
        return 2
    started = time.perf_counter()
    try:
        kernel = load_kernel(args.impl, adapter, args.device)
    except (ImportError, AttributeError, ValueError) as exc:
        print(f"gdn-spec: cannot load {args.impl}: {exc}", file=sys.stderr)
        return 2
    area, report = run_kernel(kernel)
    summary = Summary()
    summary.run = {
        "implementation": f"{report.kernel} ({args.impl})",
        "spec": args.impl,
        "kernel": kernel_provenance(args.impl),
        "adapter": args.adapter or "",
        "via": f"gdn_spec.conv.adapters {adapter}" if adapter else "",
        "family": "conv",
        "profile": "conv",
        "label": args.label or "",
    }
    for name, verdict in report.verdicts.items():
        nodeid = f"test_{area}.py::{name}"
        outcome = "passed" if verdict == "passed" else "skipped" if verdict.startswith("skipped") else "failed"
        summary.outcomes[nodeid] = outcome
        if outcome == "skipped":
            summary.skip_reasons[verdict.removeprefix("skipped: ")] += 1
        elif outcome == "failed":
            summary.failures[nodeid] = verdict.removeprefix("FAILED: ")
    summary.collected = len(summary.outcomes)
    summary.run["seconds"] = round(time.perf_counter() - started, 1)
    summary.run["versions"] = runtime_versions()
    print("\n" + format_summary(summary, args.label or summary.run["implementation"]))
    print(f"({summary.run['seconds']:.1f} s)")
    code = 1 if summary.failures else 0
    unverified = nothing_verified(summary)
    if unverified:
        print(f"gdn-spec: {unverified}; exit code 5", file=sys.stderr)
        code = 5
    summary.run["exit_code"] = code
    summary.run["nothing_verified"] = unverified or ""
    if args.json:
        Path(args.json).write_text(json.dumps(summary.as_dict(), indent=2))
    return code


if __name__ == "__main__":
    sys.exit(main())
