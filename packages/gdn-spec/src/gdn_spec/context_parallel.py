"""The context-parallel check: a kernel run over a ``torch.distributed`` group equals its single-rank result.

Any kernel with FLA's context-parallel convention can be checked: ``kernel(q, k, v, g, beta, scale=None,
cu_seqlens=ctx.cu_seqlens, cp_context=ctx, **options)`` on each rank's contiguous, equal slice of a packed batch,
with ``ctx = context(cu_seqlens, group)`` (FLA's ``build_cp_context`` or a twin). With ``states=True`` the kernel
also takes initial states from a pool (``initial_state=pool, initial_state_indices=rows``, −1: none) and writes a
sequence's final state into its row on the rank where the sequence ends (FLA refuses states under context
parallelism: check it with ``states=False``). A case with ``dense=True`` passes the states FLA's way instead, one
row per sequence (``initial_state`` [N, Hv, K, V], ``output_final_state=True``): the kernel returns, per rank, the
state after each of its pieces, and a sequence's final state is judged on the rank where it ends.

What the kernel's context object needs: ``cu_seqlens`` (this rank's boundaries); ``sent_bytes`` (bytes this rank
sent in its last call) is read when present. A kernel is checked by naming it and its context builder
(``module:callable``; ``gdn-spec check-cp``, or ``check`` / ``launch`` + ``judge`` from a test suite), and both
must be importable in the spawned processes (they inherit the caller's ``sys.path``).

Each case is launched as ``world`` processes over gloo on the loopback interface (spawned here); every rank makes
the batch from the case's seed, calls the kernel on its slice and saves what it returned. The judge concatenates
the ranks' outputs and holds them to the float64 oracle (``gdn_ref.recurrent``, each sequence from its initial
state) under the suite's tolerance table, and to the kernel's own single-rank call on the whole batch: fp32 within
1e-5 relative RMS. A pool row must be written on the rank where its sequence ends and on no other. A case with a
malformed call must raise on every rank — a ``ContractError`` naming the rank at fault for bad input (a short
slice, a context from other ``cu_seqlens``, the global ``cu_seqlens`` passed as one rank's own, a value only that
rank's kernel sees, tokens split for another group size, pool rows outside the pool), an error
naming the rank for a failure injected part-way (``fail="injected"``: the kernel spec itself fails), and the group's
timeout for a rank that never calls — and leave every rank's pool as it was.

    gdn-spec check-cp gdn_nki.torch:chunk_gated_delta_rule --context gdn_nki.torch:build_cp_context
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import os
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from gdn_ref.recurrent import recurrent

from .metrics import Error, compare

POOL_ROWS = 8
SINGLE_RANK_BOUND = 1e-5  # fp32: the CP result against the kernel's own single-rank call, relative RMS


@dataclasses.dataclass(frozen=True)
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
    huge: tuple[int, ...] = ()  # global token positions whose gate is a huge finite −1e4 (exp underflows to 0)
    rows: tuple[int, ...] = ()  # pool rows of the sequences (−1: none); () = no pool (states=False kernels)
    dense: bool = False  # states one row per sequence (the pool's rows, zero for −1), returned per rank: no pool
    seed: int = 0
    # log-decay −U(gate_max / 40, gate_max) and β ~ U(beta_min, beta_max): small gates and β keep a state's memory
    # across a whole rank's slice, so the composition of the ranks' carries shows in the results
    gate_max: float = 0.4
    beta_min: float = 0.05
    beta_max: float = 1.0
    fail_rank: int | None = None  # this rank passes a bad call (or, for "split" / "group", is named): every rank raises
    # What goes wrong: "short" (fail_rank's slice one token short), "layout" (its cu_seqlens other), "value" (a gate
    # > 0 in its slice: a contract violation only its kernel sees), "split" (every rank holds a slice for twice the
    # group's ranks), "group" (every context built on the whole world, the tokens split over TP's CP groups),
    # "rows" (a pool row outside the pool, on every rank: sequence 2's, read and written on the last rank),
    # "cu_seqlens" (fail_rank passes the global cu_seqlens as its rank-local ones),
    # "absent" (fail_rank never calls), "injected" (the kernel spec fails part-way on fail_rank by itself)
    fail: str = "short"


# The standard cases: sequences spanning every rank and inside one, GQA, a pool with a −1 row, −inf resets on both
# sides of a rank boundary and at one, bf16, tensor × context parallel 2 × 2.
CASES = (
    CpCase("spans-2", lengths=(300, 50, 162), world=2, rows=(5, -1, 2)),
    CpCase("spans-4", lengths=(40, 600, 24, 104), world=4, rows=(1, 6, -1, 3), seed=1, gate_max=0.005, beta_max=0.1),
    CpCase("resets", lengths=(70, 442), world=2, resets=(200, 300), seed=2, gate_max=0.01),
    CpCase("reset-at-boundary", lengths=(512,), world=2, resets=(256,), seed=5),
    CpCase("bf16", lengths=(512,), world=2, dtype="bfloat16", rows=(4,), seed=3),
    CpCase("tp2-cp2", lengths=(200, 312), world=4, tp=2, key_heads=2, value_heads=4, rows=(0, 7), seed=4),
    # Boundaries on rank edges (sequence 0 fills rank 0; sequence 1 starts at rank 1's first token from its row and
    # spans ranks 1–3, rank 2 wholly inside it), a reset inside that spanned rank (its M is zero) and a huge gate
    # on rank 3's first token.
    CpCase(
        "edges-4",
        (192, 400, 120, 56),
        4,
        rows=(3, 5, -1, 0),
        resets=(450,),
        huge=(576,),
        seed=6,
        gate_max=0.005,
        beta_max=0.1,
    ),
    CpCase("minus-one-spans", lengths=(100, 300, 112), world=2, rows=(2, -1, 7), seed=7, gate_max=0.01),
    CpCase("dense-2", lengths=(100, 300, 112), world=2, rows=(2, -1, 7), dense=True, seed=8, gate_max=0.01),
    CpCase("bf16-4", lengths=(96, 800, 128), world=4, dtype="bfloat16", rows=(1, 2, -1), seed=9, gate_max=0.01),
)
BAD_RANK = CpCase("bad-rank", lengths=(300, 212), world=2, rows=(5, 2), fail_rank=1)
ABSENT_RANK = CpCase("absent-rank", lengths=(300, 212), world=2, rows=(5, 2), fail_rank=1, fail="absent")
BAD_LAYOUT = CpCase("bad-layout", lengths=(300, 212), world=2, rows=(5, 2), fail_rank=1, fail="layout")
BAD_VALUE = CpCase("bad-value", lengths=(50, 300, 162), world=2, rows=(5, 2, 3), fail_rank=1, fail="value")
WRONG_SPLIT = CpCase("wrong-split", lengths=(50, 300, 162), world=2, rows=(5, 2, 3), fail_rank=0, fail="split")
WRONG_GROUP = CpCase("wrong-group", lengths=(200, 312), world=4, tp=2, key_heads=2, value_heads=4, rows=(0, 7),
                     fail_rank=0, fail="group")  # fmt: skip
BAD_CU_SEQLENS = CpCase("bad-cu-seqlens", lengths=(50, 300, 162), world=2, rows=(5, 2, 3), fail_rank=1,
                        fail="cu_seqlens")  # fmt: skip
BAD_ROWS = CpCase("bad-rows", lengths=(50, 300, 162), world=2, rows=(5, 2, POOL_ROWS), fail_rank=0, fail="rows")
REJECTIONS = (
    BAD_RANK,
    BAD_LAYOUT,
    BAD_VALUE,
    WRONG_SPLIT,
    WRONG_GROUP,
    BAD_CU_SEQLENS,
    BAD_ROWS,
)  # a ContractError on every rank
CONTRACT_FAILS = frozenset({"short", "layout", "value", "split", "group", "cu_seqlens", "rows"})


def without_states(case: CpCase) -> CpCase:
    """The case for a kernel that takes no states under context parallelism (FLA's)."""
    return dataclasses.replace(case, rows=(), dense=False)


def batch(case: CpCase) -> dict[str, Any]:
    """The whole batch, seq-first torch tensors [1, T, H, D], the same on every rank (made from the seed)."""
    import torch

    rng = np.random.default_rng(case.seed)
    total = sum(case.lengths)
    dtype = getattr(torch, case.dtype)
    g = -rng.uniform(case.gate_max / 40, case.gate_max, (1, total, case.value_heads))
    g[:, list(case.resets)] = -np.inf
    g[:, list(case.huge)] = -1e4
    k = rng.standard_normal((1, total, case.key_heads, case.dk))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    q = rng.standard_normal((1, total, case.key_heads, case.dk))
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    return {
        "q": torch.tensor(q, dtype=dtype),
        "k": torch.tensor(k, dtype=dtype),
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


def resolve(spec: str) -> Callable[..., Any]:
    """``module:callable`` → the callable."""
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def dense_states(pool: Any, rows: tuple[int, ...]) -> Any:
    """[N, Hv, K, V]: each sequence's initial state, its pool row's (zero for −1)."""
    import torch

    states = torch.zeros(len(rows), *pool.shape[1:])
    for i, row in enumerate(rows):
        if row >= 0:
            states[i] = pool[row]
    return states


def _call(kernel: Callable[..., Any], tensors: dict[str, Any], context: Any, pool: Any, rows: Any,
          dense: bool, cu_seqlens: Any) -> tuple:  # fmt: skip
    """One call in FLA's context-parallel convention (states through a pool when the case has rows, or one row per
    sequence when ``dense``)."""
    if rows is None:
        states = {}
    elif dense:
        states = {"initial_state": dense_states(pool, tuple(rows.tolist())), "output_final_state": True}
    else:
        states = {"initial_state": pool, "initial_state_indices": rows, "output_final_state": True}
    return kernel(*(tensors[n] for n in ("q", "k", "v", "g", "beta")), cu_seqlens=cu_seqlens, cp_context=context,
                  **states)  # fmt: skip


def run_rank(rank: int, case: CpCase, port: int, out_dir: str, kernel_spec: str, context_spec: str) -> None:
    """Rank ``rank`` of a launch: its groups, its slice, the call; saves (o, pool, sent bytes) or the error."""
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    timeout = datetime.timedelta(seconds=3 if case.fail == "absent" else 120)
    dist.init_process_group("gloo", rank=rank, world_size=case.world, timeout=timeout)
    try:
        kernel, build_context = resolve(kernel_spec), resolve(context_spec)
        cp_size = case.world // case.tp
        tp_rank, cp_rank = rank % case.tp, rank // case.tp
        groups = [dist.new_group([t + case.tp * c for c in range(cp_size)]) for t in range(case.tp)]
        data = batch(case)
        cu_seqlens = data["cu_seqlens"]
        if case.fail_rank == rank and case.fail == "layout":  # the same tokens per rank, a boundary moved by one
            cu_seqlens = cu_seqlens.clone()
            cu_seqlens[1] += 1
        context = build_context(cu_seqlens, dist.group.WORLD if case.fail == "group" else groups[tp_rank])
        part = sum(case.lengths) // cp_size
        if case.fail == "split":  # every rank holds a slice for twice the ranks: a layout for another group size
            part //= 2
        tokens = slice(cp_rank * part, (cp_rank + 1) * part)
        key_heads, value_heads = heads_of(case, tp_rank)
        tensors = {n: data[n][:, tokens, key_heads] for n in ("q", "k")}
        tensors.update({n: data[n][:, tokens, value_heads] for n in ("v", "g", "beta")})
        if case.fail_rank == rank and case.fail == "short":
            tensors["q"] = tensors["q"][:, 1:]
        if case.fail_rank == rank and case.fail == "value":  # g_log > 0 mid-slice: valid shapes, a broken domain
            tensors["g"] = tensors["g"].clone()
            tensors["g"][:, part // 2] = 0.5
        pool = data["pool"][:, value_heads].contiguous()
        rows = torch.tensor(case.rows) if case.rows else None
        if case.fail_rank == rank and case.fail == "absent":  # never calls: the others must time out, not hang
            time.sleep(6)
            torch.save({"absent": True, "pool": pool}, Path(out_dir) / f"{rank}.pt")
            return
        try:
            # "cu_seqlens": the global boundaries where the rank-local ones belong, on fail_rank alone
            local = data["cu_seqlens"] if case.fail_rank == rank and case.fail == "cu_seqlens" else context.cu_seqlens
            o, final = _call(kernel, tensors, context, pool, rows, case.dense, local)
            result = {"o": o, "pool": pool, "sent": getattr(context, "sent_bytes", None)}
            if case.dense:
                result["final"] = final
        except Exception as error:  # the judge asserts every rank raised
            result = {"error": f"{type(error).__name__}: {error}", "pool": pool}
        torch.save(result, Path(out_dir) / f"{rank}.pt")
    finally:
        dist.destroy_process_group()


def launch(case: CpCase, kernel_spec: str, context_spec: str) -> list[dict[str, Any]]:
    """Every rank's result of one case (``world`` spawned processes over gloo on the loopback interface)."""
    import torch

    with socket.socket() as probe:  # a free loopback port for the group's rendezvous
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory() as out_dir:
        torch.multiprocessing.spawn(
            run_rank, args=(case, port, out_dir, kernel_spec, context_spec), nprocs=case.world, join=True
        )
        return [torch.load(Path(out_dir) / f"{rank}.pt", weights_only=False) for rank in range(case.world)]


def single_rank(case: CpCase, kernel_spec: str) -> tuple[Any, Any]:
    """The kernel's own call on the whole batch, without context parallelism: (o, the final states [N, Hv, K, V])."""
    import torch

    data = batch(case)
    initial = torch.zeros(len(case.lengths), *data["pool"].shape[1:])
    for i, row in enumerate(case.rows):
        if row >= 0:
            initial[i] = data["pool"][row]
    states = {"initial_state": initial} if case.rows else {}
    o, final = resolve(kernel_spec)(*(data[n] for n in ("q", "k", "v", "g", "beta")),
                                    cu_seqlens=data["cu_seqlens"], output_final_state=True, **states)  # fmt: skip
    return o, final


def oracle(case: CpCase) -> tuple[np.ndarray, list[np.ndarray]]:
    """float64 ``recurrent`` per sequence from its initial state: (o [1, T, Hv, V], final state per sequence)."""
    data = batch(case)
    cu = data["cu_seqlens"].tolist()
    as64 = {n: data[n].double().numpy() for n in ("q", "k", "v", "g", "beta")}
    outs, finals = [], []
    for i in range(len(cu) - 1):
        piece = slice(cu[i], cu[i + 1])
        head_major = [np.moveaxis(as64[n][0, piece], 0, 1)[None] for n in ("q", "k", "v")]
        gates = [as64[n][0, piece].T[None] for n in ("g", "beta")]
        start = data["pool"][case.rows[i]].double().numpy()[None] if case.rows and case.rows[i] >= 0 else None
        out, final = recurrent(*head_major, *gates, scale=case.dk**-0.5, initial_state=start)
        outs.append(np.moveaxis(out[0], 0, 1))
        finals.append(final[0])
    return np.concatenate(outs)[None], finals


def judge(case: CpCase, results: list[dict[str, Any]], kernel_spec: str) -> list[str]:
    """What is wrong with a launch's results (empty: the kernel passes the case)."""
    import torch

    data = batch(case)
    if case.fail_rank is not None:
        return _judge_rejection(case, results, data)
    raised = [f"rank {r}: {res['error']}" for r, res in enumerate(results) if "error" in res]
    if raised:
        return raised
    problems = []
    want_o, want_final = single_rank(case, kernel_spec)
    ref_o, ref_finals = oracle(case)
    cu = data["cu_seqlens"].tolist()
    cp_size = case.world // case.tp
    part = cu[-1] // cp_size
    for tp_rank in range(case.tp):
        _, heads = heads_of(case, tp_rank)
        ranks = [tp_rank + case.tp * c for c in range(cp_size)]
        o = torch.cat([results[r]["o"] for r in ranks], dim=1).float().numpy()
        problems += _errors(f"out (TP shard {tp_rank})", o, ref_o[:, :, heads], case.dtype)
        if case.dtype == "float32":
            own = _rel_rms(o, want_o[:, :, heads].float().numpy())
            if own > SINGLE_RANK_BOUND:
                problems.append(f"out (TP shard {tp_rank}): rel-RMS {own:.2e} against the single-rank call")
        if case.dense:
            problems += _dense_errors(case, results, ranks, heads, ref_finals, want_final, cu, part)
            continue
        for i, row in enumerate(case.rows):
            end_rank = ranks[(cu[i + 1] - 1) // part]
            for r in ranks:
                got = results[r]["pool"][row].numpy() if row >= 0 else None
                if got is None:
                    continue
                if r != end_rank and not np.array_equal(got, data["pool"][row, heads].numpy()):
                    problems.append(f"sequence {i}: pool row {row} written on rank {r}, not where it ends ({end_rank})")
                elif r == end_rank:
                    problems += _state_errors(f"state of sequence {i} (row {row})", got, ref_finals[i][heads],
                                              want_final[i, heads].numpy(), case.dtype)  # fmt: skip
    return problems


def _dense_errors(case: CpCase, results: list[dict[str, Any]], ranks: list[int], heads: slice,
                  ref_finals: list[np.ndarray], want_final: Any, cu: list[int], part: int) -> list[str]:  # fmt: skip
    """States returned one row per piece: each sequence's final state is the row of its last piece on the rank
    where it ends, and each rank returns one row per piece it holds."""
    problems = []
    first = [max(i for i in range(len(cu) - 1) if cu[i] <= c * part) for c in range(len(ranks))]
    for c, r in enumerate(ranks):
        pieces = min(i for i in range(1, len(cu)) if cu[i] >= (c + 1) * part) - first[c]
        final = results[r].get("final")
        if final is None or tuple(final.shape[:1]) != (pieces,):
            problems.append(
                f"rank {r}: final states {None if final is None else tuple(final.shape)}, want {pieces} rows"
            )
    if problems:
        return problems
    for i in range(len(cu) - 1):
        c = (cu[i + 1] - 1) // part
        got = results[ranks[c]]["final"][i - first[c]].numpy()
        problems += _state_errors(f"final state of sequence {i} (rank {ranks[c]})", got, ref_finals[i][heads],
                                  want_final[i, heads].numpy(), case.dtype)  # fmt: skip
    return problems


def _state_errors(label: str, got: np.ndarray, ref: np.ndarray, single_rank: np.ndarray, dtype: str) -> list[str]:
    """A sequence's final state against the oracle (the tolerance table) and, in fp32, the single-rank call."""
    problems = _errors(label, got[None], ref[None], dtype, output="state")
    if dtype == "float32":
        own = _rel_rms(got, single_rank)
        if own > SINGLE_RANK_BOUND:
            problems.append(f"{label}: rel-RMS {own:.2e} against the single-rank call")
    return problems


def _judge_rejection(case: CpCase, results: list[dict[str, Any]], data: dict[str, Any]) -> list[str]:
    """A bad call (or a rank that never came): every rank raises — a ContractError for bad input — naming the rank
    at fault (or, when one never came, the timeout: no rank can know which), and no rank's pool changed."""
    called = [(r, res) for r, res in enumerate(results) if "absent" not in res]
    problems = [f"rank {r} did not raise" for r, res in called if "error" not in res]
    named = "timeout" if case.fail == "absent" else f"rank {case.fail_rank}"
    problems += [f"rank {r}'s error does not name {named}: {res['error'][:200]}" for r, res in called
                 if named not in res.get("error", named)]  # fmt: skip
    if case.fail in CONTRACT_FAILS:
        problems += [f"rank {r} raised no ContractError: {res['error'][:200]}" for r, res in called
                     if not res.get("error", "ContractError").startswith("ContractError")]  # fmt: skip
    for r, res in enumerate(results):
        _, heads = heads_of(case, r % case.tp)
        if not np.array_equal(res["pool"].numpy(), data["pool"][:, heads].numpy()):
            problems.append(f"rank {r}'s pool changed")
    return problems


def _errors(label: str, got: np.ndarray, ref: np.ndarray, dtype: str, output: str = "out") -> list[str]:
    error: Error = compare(output, got, ref, dtype)
    return [] if error.ok else [f"{label}: {error}"]


def _rel_rms(got: np.ndarray, want: np.ndarray) -> float:
    want64 = np.asarray(want, np.float64)
    scale = max(float(np.sqrt(np.mean(want64**2))), 1e-30)
    return float(np.sqrt(np.mean((np.asarray(got, np.float64) - want64) ** 2)) / scale)


def check(
    kernel_spec: str,
    context_spec: str,
    states: bool = True,
    worlds: tuple[int, ...] = (2, 4),
    names: list[str] | None = None,
) -> dict:
    """Every standard case (states dropped for a kernel without them) and the rejections, or the ``names`` among
    them: name → problems."""
    known = [c.name for c in (*CASES, *REJECTIONS)]
    unknown = sorted(set(names or ()) - set(known))
    if unknown:
        raise ValueError(f"no context-parallel case named {', '.join(unknown)}; the cases: {', '.join(known)}")
    cases = [c if states else without_states(c) for c in (*CASES, *REJECTIONS)
             if c.world in worlds and (states or c.fail != "rows") and (not names or c.name in names)]  # fmt: skip
    return {case.name: judge(case, launch(case, kernel_spec, context_spec), kernel_spec) for case in cases}
