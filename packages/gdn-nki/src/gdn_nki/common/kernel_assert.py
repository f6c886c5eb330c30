"""The kernel's own argument check, in the one form the NKI tracer accepts inside ``@nki.jit``: an ``assert``.

The tracer rejects ``raise`` in a kernel body, so AWS's kernels validate their inputs with an assert-based helper
(nki-library ``nkilib/core/utils/kernel_assert.py``; docs/nki-sources.md §1.5). ``gdn_cte`` does the same with the
contract's full rejection text, so the message still names each argument, its value, the rule and the fix. The host
entry points (``simulate``, ``prefill``) check the whole contract before launching and raise ``ContractError``; this
check is for direct launches of the kernel.
"""

from __future__ import annotations

from gdn_ref.contract import Violation, rejection_message


def kernel_assert(condition: bool, message: str) -> None:
    """Stop the trace with ``message`` unless ``condition`` holds (an ``AssertionError``, as in AWS's kernels)."""
    assert condition, message  # noqa: S101 - the tracer's only way to stop a kernel; see the module docstring


def assert_valid_call(violations: list[Violation], kernel: str | None = None) -> None:
    """Stop the trace when the call broke any contract rule, listing every violation; ``kernel`` names the kernel
    launched when its rules are another's (the packed kernels check gdn_cte's), else the rules' own contract."""
    kernel_assert(not violations, rejection_message(violations, kernel))
