"""gdn-nki's conv decode step passes gdn-spec's conv family (``python -m gdn_spec.conv gdn_nki:conv_decode_step``)."""

from __future__ import annotations

import gdn_nki
from gdn_spec.conv import run, run_prefill


def test_conv_decode_step_passes_the_conv_family() -> None:
    report = run(gdn_nki.conv_decode_step)
    assert not report.failed, report.table()
    assert set(report.verdicts.values()) == {"passed"}, report.table()


def test_conv_prefill_bucket_passes_the_conv_family() -> None:
    report = run_prefill(gdn_nki.conv_prefill_bucket)
    assert set(report.verdicts.values()) == {"passed"}, report.table()
