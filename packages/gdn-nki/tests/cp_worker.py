"""One rank of a context-parallel test launch (spawned by ``test_context_parallel.py``): the batch made from the
case's seed on every rank alike, this rank's slice run through ``context_parallel_chunk_gated_delta_rule`` over a
gloo group, the results saved for the parent to judge."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist


@dataclass(frozen=True)
class CpCase:
    """A packed batch and how it is split: ``tp`` tensor-parallel shards of the heads × ``world // tp`` CP ranks."""

    name: str
    lengths: tuple[int, ...]
    world: int
    tp: int = 1
    dtype: str = "float32"
    key_heads: int = 1
    value_heads: int = 2
    dk: int = 32
    dv: int = 16
    resets: tuple[int, ...] = ()  # global token positions whose gate is −inf (a document boundary)
    rows: tuple[int, ...] = ()  # pool rows of the sequences (−1: none); () = no pool
    seed: int = 0
    # log-decay drawn from −U(gate_max / 40, gate_max) and β from U(beta_min, beta_max); small gates and β keep a
    # state's memory across a whole rank's slice, so the carries' composition shows in the results
    gate_max: float = 0.4
    beta_min: float = 0.05
    beta_max: float = 1.0
    fail_rank: int | None = None  # this rank passes a malformed slice (the all-ranks-raise test)
    options: dict = field(default_factory=lambda: {"use_qk_l2norm_in_kernel": True})


POOL_ROWS = 8


def batch(case: CpCase) -> dict[str, torch.Tensor]:
    """The whole batch, seq-first [1, T, H, D], the same on every rank (made from the seed)."""
    rng = np.random.default_rng(case.seed)
    total = sum(case.lengths)
    dtype = getattr(torch, case.dtype)
    g = -rng.uniform(case.gate_max / 40, case.gate_max, (1, total, case.value_heads))
    g[:, list(case.resets)] = -np.inf
    return {
        "q": torch.tensor(rng.standard_normal((1, total, case.key_heads, case.dk)), dtype=dtype),
        "k": torch.tensor(rng.standard_normal((1, total, case.key_heads, case.dk)), dtype=dtype),
        "v": torch.tensor(rng.standard_normal((1, total, case.value_heads, case.dv)), dtype=dtype),
        "g": torch.tensor(g, dtype=torch.float32),
        "beta": torch.tensor(
            rng.uniform(case.beta_min, case.beta_max, (1, total, case.value_heads)), dtype=torch.float32
        ),
        "pool": torch.tensor(rng.standard_normal((POOL_ROWS, case.value_heads, case.dk, case.dv)), dtype=torch.float32),
        "cu_seqlens": torch.tensor(np.concatenate([[0], np.cumsum(case.lengths)]), dtype=torch.int64),
    }


def heads_of(case: CpCase, tp_rank: int) -> tuple[slice, slice]:
    """The key and value heads tensor-parallel shard ``tp_rank`` holds."""
    hk, hv = case.key_heads // case.tp, case.value_heads // case.tp
    return slice(tp_rank * hk, (tp_rank + 1) * hk), slice(tp_rank * hv, (tp_rank + 1) * hv)


def run_rank(rank: int, case: CpCase, port: int, out_dir: str) -> None:
    """Rank ``rank`` of the launch: groups, its slice, the call; saves (o, states, pool, sent bytes) or the error."""
    from gdn_nki.torch.context_parallel import build_cp_context, context_parallel_chunk_gated_delta_rule

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=case.world, timeout=datetime.timedelta(seconds=60))
    try:
        cp_size = case.world // case.tp
        tp_rank, cp_rank = rank % case.tp, rank // case.tp
        groups = [dist.new_group([t + case.tp * c for c in range(cp_size)]) for t in range(case.tp)]
        data = batch(case)
        context = build_cp_context(data["cu_seqlens"], groups[tp_rank])
        assert dist.get_rank(context.group) == cp_rank
        tokens = slice(cp_rank * context.tokens_per_rank, (cp_rank + 1) * context.tokens_per_rank)
        key_heads, value_heads = heads_of(case, tp_rank)
        q, k = (data[n][:, tokens, key_heads] for n in ("q", "k"))
        v, g, beta = (data[n][:, tokens, value_heads] for n in ("v", "g", "beta"))
        if case.fail_rank == rank:
            q = q[:, 1:]
        pool = data["pool"][:, value_heads].contiguous()
        rows = torch.tensor(case.rows) if case.rows else None
        result: dict = {}
        try:
            o, states = context_parallel_chunk_gated_delta_rule(
                q, k, v, g, beta, context, initial_state=pool if rows is not None else None,
                output_final_state=True, state_indices=rows, **case.options,
            )  # fmt: skip
            result = {"o": o, "states": states, "pool": pool, "sent": context.sent_bytes}
        except Exception as error:  # the parent asserts every rank raised, and what
            result = {"error": f"{type(error).__name__}: {error}", "pool": pool}
        torch.save(result, Path(out_dir) / f"{rank}.pt")
    finally:
        dist.destroy_process_group()
