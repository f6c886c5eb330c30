"""A rejection names the function the caller called (``names_entry_point``), keeps the contract's own form when no
entry point is named (what gdn-spec and the traced kernels print), and says which sequences broke a value rule."""

from __future__ import annotations

import traceback

import numpy as np
import pytest

from gdn_ref.contract import VALUE_SCANS, ContractError, Violation, names_entry_point, rejection_message

BETA = Violation("beta.dtype", "beta", "dtype float64", "beta must be float32", "pass beta.astype(np.float32)")


def test_without_an_entry_point_the_contract_heads_the_message() -> None:
    assert rejection_message([BETA]) == (
        "gdn_cte rejected the call (1 violation(s)); nothing was written:\n  - gdn_cte: `beta` dtype float64 violates "
        "[beta.dtype] beta must be float32. Fix: pass beta.astype(np.float32)"
    )


def test_the_outermost_entry_point_is_named_with_the_same_violations_and_traceback() -> None:
    def check() -> None:
        raise ContractError([BETA])

    inner = names_entry_point("pkg.inner")(check)
    outer = names_entry_point("pkg.outer")(lambda: inner())
    with pytest.raises(ContractError) as info:
        outer()
    assert info.value.entry_point == "pkg.outer" and info.value.violations == [BETA]
    assert str(info.value) == (
        "pkg.outer rejected the call (1 violation(s)); nothing was written:\n  - `beta` dtype float64 violates "
        "[beta.dtype] beta must be float32. Fix: pass beta.astype(np.float32)"
    )
    frames = [frame.name for frame in traceback.extract_tb(info.value.__traceback__)]
    assert frames[-1] == "check", frames  # where the rule broke, not only where it was renamed
    assert inner.__name__ == "check" and inner.__wrapped__ is check


def test_a_scan_of_a_window_gives_the_callers_index_and_the_sequence() -> None:
    key = np.zeros((1, 2, 10, 4), np.float32)
    key[0, 1, 7, 2] = np.nan
    violation = VALUE_SCANS["key.finite"].first(key[:, :, 6:10], origin=(0, 0, 6), sequence=3)
    assert violation.value == "value nan at index [0, 1, 7, 2] (sequence 3)" and violation.sequence == 3
    assert VALUE_SCANS["key.finite"].first(key[:, :, :6]) is None
    error = ContractError([violation, BETA, Violation("g_log.domain", "g_log", "", "", "", sequence=1)])
    assert error.sequences == [1, 3]
