"""Context-parallel prefill over gloo process groups of 2 and 4 CPU processes (gdn-spec's context-parallel check,
which spawns them): outputs and final states equal the single-rank prefill of the whole batch and the float64
oracle — GQA, sequences spanning every rank and inside one, boundaries on rank edges, −inf resets on both sides of
a rank boundary, at one and inside a spanned rank, a huge gate, a pool with −1 rows (a spanning sequence's too),
FLA's per-sequence states, bf16 over 2 and 4 ranks, tensor × context parallel 2 × 2 —; bad input (a short slice,
other cu_seqlens, a gate only one rank's kernel sees, tokens split for another group size, a context built on the
wrong group) is a ContractError on every rank, a failure injected part-way on one rank (in its second kernel
launch, in its correction) or a rank that never arrives fails every rank, each with no pool row written; the bytes
each rank sends do not grow with the tokens; and the check rejects two wrong CP kernels."""

from __future__ import annotations

import dataclasses
import datetime
import socket
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("torch", reason="torch is not installed (pip install 'gdn-nki[torch]'; nox -s integration)")

from gdn_ref.contract import ContractError
from gdn_spec.context_parallel import ABSENT_RANK, CASES, REJECTIONS, CpCase, judge, launch

KERNEL = "gdn_nki.torch:chunk_gated_delta_rule"  # FLA's cp_context keyword
CONTEXT = "gdn_nki.torch:build_cp_context"
# Rank 1 continues sequence 1 (tokens 50-350 of 512 over 2 ranks), and rank 0 writes sequence 0's row: a rank
# that commits early would show in rank 0's pool.
PART_WAY = CpCase("injected", lengths=(50, 300, 162), world=2, rows=(5, 2, 3), fail_rank=1, fail="injected")


@pytest.mark.parametrize("case", [*CASES, *REJECTIONS, ABSENT_RANK], ids=lambda c: c.name)
def test_context_parallel_equals_the_single_rank_prefill(case: CpCase) -> None:
    problems = judge(case, launch(case, KERNEL, CONTEXT), KERNEL)
    assert not problems, "\n".join(problems)


def test_sent_bytes_do_not_grow_with_the_tokens() -> None:
    short = launch(CpCase("short", lengths=(128,), world=2, rows=(1,)), KERNEL, CONTEXT)
    long = launch(CpCase("long", lengths=(1024,), world=2, rows=(1,)), KERNEL, CONTEXT)
    sent = [r["sent"] for r in short]
    assert sent == [r["sent"] for r in long]
    hv, dk, dv = 2, 32, 16
    assert 0 < sent[0] <= hv * dk * (dk + dv) * 4 + 64  # one carry, a header (48 B) and two votes (8 B each)


def test_a_kernel_without_states_runs_as_fla_would_call_it() -> None:
    """FLA's convention without states (its own kernel refuses them under context parallelism)."""
    case = dataclasses.replace(CASES[0], rows=())
    problems = judge(case, launch(case, KERNEL, CONTEXT), KERNEL)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("kernel", ["cp_faults:failing_in_pass_b", "cp_faults:failing_in_correction"])
def test_a_rank_failing_part_way_fails_every_rank_with_no_row_written(kernel: str) -> None:
    results = launch(PART_WAY, kernel, CONTEXT)
    problems = judge(PART_WAY, results, kernel)
    assert not problems, "\n".join(problems)
    assert all("injected failure" in r["error"] for r in results)  # the failing rank's own error, on every rank


@pytest.mark.parametrize(
    ("kernel", "found"),
    [("cp_faults:no_carry", "against the single-rank call"), ("cp_faults:writes_every_rank", "not where it ends")],
    ids=["no-carry", "writes-every-rank"],
)
def test_check_cp_rejects_a_wrong_cp_kernel(kernel: str, found: str, capsys: pytest.CaptureFixture) -> None:
    """``gdn-spec check-cp`` on another CP kernel (here two wrong ones), one case: it fails, saying why."""
    from gdn_spec import cli

    code = cli.main(["check-cp", kernel, "--context", CONTEXT, "--case", CASES[0].name])
    printed = capsys.readouterr().out
    assert code == 1 and f"FAIL {CASES[0].name}" in printed and found in printed, printed


@pytest.fixture(scope="module")
def solo_group() -> Iterator[Any]:
    """A gloo group of this process alone: a context-parallel call's own checks run in-process, no spawn."""
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))  # fmt: skip
    yield dist.group.WORLD
    dist.destroy_process_group()


def _solo_call(group: Any, **changes: Any) -> tuple[Any, Any]:
    """A two-sequence call on a group of one, with ``changes`` to its context or arguments; returns (pool before,
    pool after or the error)."""
    import torch

    from gdn_nki.torch import build_cp_context, chunk_gated_delta_rule

    rng = torch.Generator().manual_seed(0)
    tokens, pool_rows = 64, 8
    q, k = (torch.nn.functional.normalize(torch.randn(1, tokens, 1, 32, generator=rng), dim=-1) for _ in range(2))
    v = torch.randn(1, tokens, 2, 16, generator=rng)
    g, beta = -torch.rand(1, tokens, 2, generator=rng) * 0.1, torch.rand(1, tokens, 2, generator=rng)
    context = build_cp_context(torch.tensor([0, 30, tokens]), group)
    context = dataclasses.replace(context, **changes.pop("context", {}))
    pool = torch.randn(pool_rows, 2, 32, 16, generator=rng)
    before = pool.clone()
    states = {"initial_state": pool, "initial_state_indices": torch.tensor([5, 2]), "output_final_state": True}
    if "rows" in changes:
        states["initial_state_indices"] = torch.tensor(changes["rows"])
    if "per_sequence" in changes:  # states one per sequence, without rows
        states.update(initial_state=torch.zeros(changes["per_sequence"], 2, 32, 16), initial_state_indices=None)
    try:
        chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=context.cu_seqlens, cp_context=context, **states)
    except Exception as error:
        return before, (pool, error)
    return before, (pool, None)


@pytest.mark.parametrize(
    ("changes", "argument"),
    [
        ({"rows": [5, 8]}, "state_indices"),
        ({"rows": [5, -2]}, "state_indices"),
        ({"rows": [5, 5]}, "state_indices"),
        ({"rows": [5]}, "state_indices"),
        ({"per_sequence": 3}, "initial_state"),
        ({"context": {"world": 2}}, "cp_context"),
    ],
    ids=["row-past-pool", "row-below-minus-one", "row-twice", "rows-short", "states-per-sequence-count", "world"],
)
def test_bad_states_or_a_context_for_another_group_are_rejected_before_anything_runs(
    solo_group: Any, changes: dict[str, Any], argument: str
) -> None:
    import torch

    before, (pool, error) = _solo_call(solo_group, **changes)
    assert isinstance(error, ContractError), error
    assert f"`{argument}`" in str(error) and "on rank 0" in str(error), str(error)
    assert torch.equal(pool, before)


def test_the_solo_call_itself_runs(solo_group: Any) -> None:
    """The fixture's call, unchanged, completes and writes its rows: the rejections above are the changes'."""
    import torch

    before, (pool, error) = _solo_call(solo_group)
    assert error is None
    assert not torch.equal(pool[5], before[5]) and torch.equal(pool[0], before[0])
