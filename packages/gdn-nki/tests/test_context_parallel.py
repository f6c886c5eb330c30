"""Context-parallel prefill over gloo process groups of 2 and 4 CPU processes (spawned here): outputs and final
states equal the single-rank prefill of the whole batch — GQA, sequences spanning every rank and inside one, −inf
resets across a rank boundary, a pool with −1 rows, bf16, tensor × context parallel 2 × 2 — and the bytes each rank
sends do not grow with the tokens."""

from __future__ import annotations

import socket
import tempfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'gdn-nki[torch]'; nox -s integration)")

from cp_worker import POOL_ROWS, CpCase, batch, heads_of, run_rank  # noqa: E402
from gdn_nki.torch import chunk_gated_delta_rule  # noqa: E402
from gdn_spec.metrics import compare, describe  # noqa: E402


def _launch(case: CpCase) -> list[dict]:
    """Every rank's saved result."""
    with socket.socket() as probe:  # a free loopback port for the group's rendezvous
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory() as out_dir:
        torch.multiprocessing.spawn(run_rank, args=(case, port, out_dir), nprocs=case.world, join=True)
        return [torch.load(Path(out_dir) / f"{rank}.pt", weights_only=False) for rank in range(case.world)]


def _single_rank(case: CpCase) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole batch in one call: (o [1, T, Hv, V], the final states [N, Hv, K, V]), each sequence from its pool
    row (−1 or no pool: zeros)."""
    data = batch(case)
    initial = torch.zeros(len(case.lengths), *data["pool"].shape[1:])
    for i, row in enumerate(case.rows):
        if row >= 0:
            initial[i] = data["pool"][row]
    o, final = chunk_gated_delta_rule(
        data["q"], data["k"], data["v"], data["g"], data["beta"], initial_state=initial, output_final_state=True,
        cu_seqlens=data["cu_seqlens"], **case.options,
    )  # fmt: skip
    return o, final


def _rel_rms(got: torch.Tensor, want: torch.Tensor) -> float:
    want64 = want.double()
    return float((got.double() - want64).pow(2).mean().sqrt() / want64.pow(2).mean().sqrt().clamp_min(1e-30))


def _judge(case: CpCase, results: list[dict]) -> None:
    """Each CP group's outputs (its ranks' slices in order) and states against the single-rank call on its heads;
    a pool row written on the rank where its sequence ends, and on no other."""
    want_o, want_final = _single_rank(case)
    data = batch(case)
    cu = data["cu_seqlens"].tolist()
    cp_size = case.world // case.tp
    part = cu[-1] // cp_size
    for tp_rank in range(case.tp):
        _, heads = heads_of(case, tp_rank)
        ranks = [tp_rank + case.tp * c for c in range(cp_size)]
        for i, row in enumerate(case.rows):
            end_rank = ranks[(cu[i + 1] - 1) // part]
            for r in ranks:
                if r != end_rank and row >= 0:
                    assert torch.equal(results[r]["pool"][row], data["pool"][row, heads]), (case.name, i, r)
        o = torch.cat([results[r]["o"] for r in ranks], dim=1)
        want = want_o[:, :, heads]
        if case.dtype == "float32":
            assert _rel_rms(o, want) <= 1e-5, f"{case.name}: out rel-RMS {_rel_rms(o, want):.2e} against one rank"
        else:
            error = compare("out", o.float().numpy(), want.float().numpy(), case.dtype)
            assert error.ok, describe([error])
        for i in range(len(cu) - 1):
            end_rank = ranks[(cu[i + 1] - 1) // part]
            got = results[end_rank]["pool"][case.rows[i]] if case.rows else None
            if not case.rows:  # the state after the sequence's last piece, on the rank where it ends
                local = results[end_rank]["states"]
                got = local[-1] if cu[i + 1] == part * (ranks.index(end_rank) + 1) else None
                if got is None:
                    continue
            elif case.rows[i] < 0:
                continue
            want_state = want_final[i, heads]
            assert _rel_rms(got, want_state) <= (1e-5 if case.dtype == "float32" else 1e-2), (case.name, i)


CASES = [
    # one sequence over every rank, with shorter ones inside single ranks, GQA 1:2, a pool with a −1 row
    CpCase("spans-2", lengths=(300, 50, 162), world=2, rows=(5, -1, 2)),
    CpCase("spans-4", lengths=(40, 600, 24, 104), world=4, rows=(1, 6, -1, 3), seed=1, gate_max=0.005, beta_max=0.1),
    # −inf resets inside a spanning sequence, before a rank boundary and after it, no pool
    CpCase("resets", lengths=(70, 442), world=2, resets=(200, 300), seed=2, gate_max=0.01),
    CpCase("reset-at-boundary", lengths=(512,), world=2, resets=(256,), seed=5),
    CpCase("bf16", lengths=(512,), world=2, dtype="bfloat16", rows=(4,), seed=3),
    CpCase("tp2-cp2", lengths=(200, 312), world=4, tp=2, key_heads=2, value_heads=4, rows=(0, 7), seed=4),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_context_parallel_equals_the_single_rank_prefill(case: CpCase) -> None:
    results = _launch(case)
    assert not [r["error"] for r in results if "error" in r]
    _judge(case, results)


def test_sent_bytes_do_not_grow_with_the_tokens() -> None:
    short = _launch(CpCase("short", lengths=(128,), world=2, rows=(1,)))
    long = _launch(CpCase("long", lengths=(1024,), world=2, rows=(1,)))
    sent = [r["sent"] for r in short]
    assert sent == [r["sent"] for r in long]
    hv, dk, dv = 2, 32, 16
    assert sent[0] <= hv * dk * (dk + dv) * 4 + 64  # one carry, a header and a status


def test_a_bad_rank_fails_every_rank_and_writes_no_pool_row() -> None:
    case = CpCase("bad-rank", lengths=(300, 212), world=2, rows=(5, 2), fail_rank=1)
    results = _launch(case)
    assert all("error" in r for r in results)
    assert all("rank 1" in r["error"] and "ContractError" in r["error"] for r in results)
    untouched = batch(case)["pool"][:, : case.value_heads]
    for r in results:
        assert torch.equal(r["pool"], untouched)
    assert POOL_ROWS > max(case.rows)
