"""``python -m gdn_spec.conv MODULE:CALLABLE [--adapter hf-conv|hf-conv-fn|vllm-conv] [--seed N]``: the conv family on a
kernel (its prefill checks for a kernel declaring ``gdn_spec_conv_prefill_capabilities``), its verdicts as a
table; exit status 1 when a check fails."""

from __future__ import annotations

import argparse
import importlib
import sys

from .adapters import ADAPTERS
from .checks import run
from .prefill import PREFILL_CAPABILITIES_ATTR, run_prefill


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernel", help="MODULE:CALLABLE")
    parser.add_argument("--adapter", choices=sorted(ADAPTERS), help="call the kernel through an adapter")
    parser.add_argument("--device", default=None, help="torch device for the torch adapters")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    module, _, name = args.kernel.partition(":")
    fn = getattr(importlib.import_module(module), name)
    kernel = ADAPTERS[args.adapter](fn, args.device) if args.adapter else fn
    # A kernel declaring prefill capabilities (or adapted as one) gets the prefill checks, else the decode checks.
    prefill = getattr(kernel, PREFILL_CAPABILITIES_ATTR, None) is not None
    report = run_prefill(kernel, seed=args.seed) if prefill else run(kernel, seed=args.seed)
    print(report.table())
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
