"""Context-parallel prefill over gloo process groups of 2 and 4 CPU processes (gdn-spec's context-parallel check,
which spawns them): outputs and final states equal the single-rank prefill of the whole batch and the float64
oracle — GQA, sequences spanning every rank and inside one, −inf resets on both sides of a rank boundary and at
one, a pool with −1 rows, bf16, tensor × context parallel 2 × 2 —, a bad slice or other cu_seqlens on one rank fails
every rank with no pool row written, and the bytes each rank sends do not grow with the tokens."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("torch", reason="torch is not installed (pip install 'gdn-nki[torch]'; nox -s integration)")

from gdn_spec.context_parallel import ABSENT_RANK, BAD_LAYOUT, BAD_RANK, CASES, CpCase, judge, launch

KERNEL = "gdn_nki.torch:chunk_gated_delta_rule"  # FLA's cp_context keyword
CONTEXT = "gdn_nki.torch:build_cp_context"


@pytest.mark.parametrize("case", [*CASES, BAD_RANK, BAD_LAYOUT, ABSENT_RANK], ids=lambda c: c.name)
def test_context_parallel_equals_the_single_rank_prefill(case: CpCase) -> None:
    problems = judge(case, launch(case, KERNEL, CONTEXT), KERNEL)
    assert not problems, "\n".join(problems)


def test_sent_bytes_do_not_grow_with_the_tokens() -> None:
    short = launch(CpCase("short", lengths=(128,), world=2, rows=(1,)), KERNEL, CONTEXT)
    long = launch(CpCase("long", lengths=(1024,), world=2, rows=(1,)), KERNEL, CONTEXT)
    sent = [r["sent"] for r in short]
    assert sent == [r["sent"] for r in long]
    hv, dk, dv = 2, 32, 16
    assert 0 < sent[0] <= hv * dk * (dk + dv) * 4 + 64  # one carry, a header and a status


def test_a_kernel_without_states_runs_as_fla_would_call_it() -> None:
    """FLA's convention without states (its own kernel refuses them under context parallelism)."""
    case = dataclasses.replace(CASES[0], rows=())
    problems = judge(case, launch(case, KERNEL, CONTEXT), KERNEL)
    assert not problems, "\n".join(problems)
