"""``python -m gdn_spec.conv MODULE:CALLABLE [--adapter hf-conv|hf-conv-fn|vllm-conv] [--seed N]``: the conv family on a
kernel (its prefill checks for a kernel declaring ``gdn_spec_conv_prefill_capabilities``), its verdicts as a
table; exit status 1 when a check fails. ``gdn-spec check --family conv`` runs the same checks and writes the
summary the README's validated table is made from."""

from __future__ import annotations

import argparse
import sys

from .adapters import ADAPTERS
from .runner import load_kernel, run_kernel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernel", help="MODULE:CALLABLE")
    parser.add_argument("--adapter", choices=sorted(ADAPTERS), help="call the kernel through an adapter")
    parser.add_argument("--device", default=None, help="torch device for the torch adapters")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    _, report = run_kernel(load_kernel(args.kernel, args.adapter, args.device), seed=args.seed)
    print(report.table())
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
