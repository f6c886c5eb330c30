"""``python -m gdn_spec.conv MODULE:CALLABLE [--adapter hf-conv] [--seed N]``: the conv family on a kernel, its
verdicts as a table; exit status 1 when a check fails."""

from __future__ import annotations

import argparse
import importlib
import sys

from .adapters import ADAPTERS
from .checks import run


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
    report = run(kernel, seed=args.seed)
    print(report.table())
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
