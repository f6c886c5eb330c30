"""Context-parallel prefill, device-ready: the call on 2-rank gloo groups of spawned CPU processes, each rank
holding a sequence that spans both ranks, a −1 pool row and a sequence inside one rank (gdn-spec's ``spans-2``):

- under ``torch.compile(backend="aot_eager")`` the call is one graph (``torch._dynamo.explain``: zero graph
  breaks; both passes are ``gdn_nki`` op nodes, the exchanges functional collectives) and gives eager's bits, the
  outputs and the pool;
- on meta tensors (no value to read: a ``.tolist()`` or ``.item()`` raises) the call runs to its end, and the pool
  rows reach the op as tensors;
- the device path run on CPU tensors (``context_parallel.on_device`` forced) gives the host path's bits with
  ``Tensor.tolist`` / ``Tensor.item`` made to fail for the call's duration, per-sequence states too; and with rank
  0's slice short, rank 0 raises its ContractError after both exchanges while rank 1 (where both rows would be
  written) writes no row and returns NaN outputs (the ranks agree on a violation before any write, as data).

Skipped without torch."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import socket
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'gdn-nki[torch]'; nox -s integration)")

from gdn_spec.context_parallel import CASES, batch  # noqa: E402

CASE = CASES[0]  # spans-2: lengths (300, 50, 162) over 2 ranks, rows (5, -1, 2)
WORLD = 2


def _slice(rank: int) -> dict[str, Any]:
    """This rank's tokens of the case's batch, the pool, the rows and the global boundaries."""
    data = batch(CASE)
    part = sum(CASE.lengths) // WORLD
    here = slice(rank * part, (rank + 1) * part)
    tensors = {n: data[n][:, here].contiguous() for n in ("q", "k", "v", "g", "beta")}
    return {"tensors": tensors, "pool": data["pool"], "rows": torch.tensor(CASE.rows), "cu": data["cu_seqlens"]}


def _call(tensors: dict[str, Any], context: Any, pool: Any, rows: Any) -> tuple[Any, Any]:
    from gdn_nki.torch import chunk_gated_delta_rule

    return chunk_gated_delta_rule(*(tensors[n] for n in ("q", "k", "v", "g", "beta")), cu_seqlens=context.cu_seqlens,
                                  cp_context=context, initial_state=pool, initial_state_indices=rows,
                                  output_final_state=True)  # fmt: skip


@contextlib.contextmanager
def _no_host_reads() -> Iterator[list[str]]:
    """``Tensor.tolist`` and ``Tensor.item`` failing (and recorded) for the block's duration."""
    reads: list[str] = []
    saved = torch.Tensor.tolist, torch.Tensor.item

    def refuse(name: str) -> Callable[..., Any]:
        def read(self: Any, *args: Any, **kwargs: Any) -> Any:
            reads.append(f"{name} on {tuple(self.shape)}")
            raise RuntimeError(f"a host read: Tensor.{name}")

        return read

    torch.Tensor.tolist, torch.Tensor.item = refuse("tolist"), refuse("item")
    try:
        yield reads
    finally:
        torch.Tensor.tolist, torch.Tensor.item = saved


@contextlib.contextmanager
def _device_path() -> Iterator[None]:
    """The device path on CPU tensors (what a Neuron tensor or a trace takes)."""
    from gdn_nki.torch import context_parallel

    saved = context_parallel.on_device
    context_parallel.on_device = lambda *tensors: True
    try:
        yield
    finally:
        context_parallel.on_device = saved


def _compiled(rank: int, context: Any) -> dict[str, Any]:
    """Eager (the host path), then explain and aot_eager on fresh pools."""
    given = _slice(rank)
    tensors, rows = given["tensors"], given["rows"]
    eager_pool = given["pool"].clone()
    eager_o, _ = _call(tensors, context, eager_pool, rows)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(_call)(tensors, context, given["pool"].clone(), rows)
    torch._dynamo.reset()
    compiled_pool = given["pool"].clone()
    compiled_o, _ = torch.compile(_call, backend="aot_eager", fullgraph=True)(tensors, context, compiled_pool, rows)
    ops = sorted({str(node.target) for graph in explained.graphs for node in graph.graph.nodes
                  if node.op == "call_function" and "gdn_nki" in str(node.target)})  # fmt: skip
    return {
        "breaks": explained.graph_break_count,
        "reasons": [str(r.reason)[:200] for r in explained.break_reasons],
        "ops": ops,
        "o_equal": torch.equal(compiled_o, eager_o),
        "pool_equal": torch.equal(compiled_pool, eager_pool),
        "rows_written": [bool((eager_pool[r] != given["pool"][r]).any()) for r in range(eager_pool.shape[0])],
    }


def _meta(rank: int, context: Any) -> dict[str, Any]:
    """The call with every tensor on meta."""
    given = _slice(rank)
    meta = {n: x.to("meta") for n, x in given["tensors"].items()}
    on_meta = dataclasses.replace(context, cu_seqlens=context.cu_seqlens.to("meta"))
    o, pool = _call(meta, on_meta, given["pool"].to("meta"), given["rows"].to("meta"))
    return {"o": (str(o.device), tuple(o.shape)), "pool": str(pool.device)}


def _forced(rank: int, context: Any) -> dict[str, Any]:
    """The device path on CPU tensors against the host path: pool rows and per-sequence states."""
    from gdn_nki.torch import chunk_gated_delta_rule

    given = _slice(rank)
    tensors, rows = given["tensors"], given["rows"]
    host_pool, device_pool = given["pool"].clone(), given["pool"].clone()
    host_o, _ = _call(tensors, context, host_pool, rows)
    dense = torch.stack([given["pool"][r] if r >= 0 else torch.zeros_like(given["pool"][0]) for r in CASE.rows])
    args = [tensors[n] for n in ("q", "k", "v", "g", "beta")]
    host_dense = chunk_gated_delta_rule(*args, cu_seqlens=context.cu_seqlens, cp_context=context,
                                        initial_state=dense, output_final_state=True)  # fmt: skip
    with _device_path(), _no_host_reads() as reads:
        device_o, _ = _call(tensors, context, device_pool, rows)
        device_dense = chunk_gated_delta_rule(*args, cu_seqlens=context.cu_seqlens, cp_context=context,
                                              initial_state=dense, output_final_state=True)  # fmt: skip
    return {
        "reads": reads,
        "o_equal": torch.equal(device_o, host_o),
        "pool_equal": torch.equal(device_pool, host_pool),
        "dense_equal": all(torch.equal(a, b) for a, b in zip(device_dense, host_dense, strict=True)),
    }


def _disagreeing(rank: int, context: Any) -> dict[str, Any]:
    """The device path with rank 0's slice one token short (rank 1 writes both rows when the call is sound)."""
    given = _slice(rank)
    tensors = dict(given["tensors"])
    if rank == 0:
        tensors = {n: x[:, 1:] if n == "q" else x for n, x in tensors.items()}
    pool = given["pool"].clone()
    try:
        with _device_path():
            o, _ = _call(tensors, context, pool, given["rows"])
    except Exception as error:
        return {"error": f"{type(error).__name__}: {error}", "pool_kept": torch.equal(pool, given["pool"])}
    return {"nan": bool(o.isnan().all()), "pool_kept": torch.equal(pool, given["pool"])}


CHECKS = {"compiled": _compiled, "meta": _meta, "forced": _forced, "disagreeing": _disagreeing}


def _rank(rank: int, port: int, out_dir: str, check: str) -> None:
    import torch.distributed as dist

    from gdn_nki.torch import build_cp_context

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=60))
    try:
        context = build_cp_context(batch(CASE)["cu_seqlens"], dist.group.WORLD)
        try:
            result = CHECKS[check](rank, context)
        except Exception as error:  # the parent reports it
            result = {"failed": f"{type(error).__name__}: {error}"}
        torch.save(result, Path(out_dir) / f"{rank}.pt")
    finally:
        dist.destroy_process_group()


def _launch(check: str) -> list[dict[str, Any]]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory() as out_dir:
        torch.multiprocessing.spawn(_rank, args=(port, out_dir, check), nprocs=WORLD, join=True)
        return [torch.load(Path(out_dir) / f"{r}.pt", weights_only=False) for r in range(WORLD)]


def test_compiled_call_is_one_graph_with_eagers_bits() -> None:
    results = _launch("compiled")
    for rank, result in enumerate(results):
        assert "failed" not in result, f"rank {rank}: {result}"
        assert result["breaks"] == 0, f"rank {rank}: {result['reasons']}"
        assert result["ops"], f"rank {rank}: no gdn_nki op in the graph"
        assert result["o_equal"] and result["pool_equal"], f"rank {rank}: {result}"
    # the eager call wrote sequence 0's row (5) on rank 1, where it ends, and sequence 2's (2): not on rank 0
    assert results[1]["rows_written"][5] and results[1]["rows_written"][2]
    assert not any(results[0]["rows_written"])


def test_call_on_meta_tensors_reads_no_value() -> None:
    results = _launch("meta")
    part = sum(CASE.lengths) // WORLD
    for rank, result in enumerate(results):
        assert "failed" not in result, f"rank {rank}: {result}"
        assert result == {"o": ("meta", (1, part, CASE.value_heads, CASE.dv)), "pool": "meta"}, result


def test_device_path_gives_the_host_paths_bits_without_host_reads() -> None:
    for rank, result in enumerate(_launch("forced")):
        assert "failed" not in result, f"rank {rank}: {result}"
        assert result["reads"] == [], f"rank {rank}: {result['reads']}"
        assert result["o_equal"] and result["pool_equal"] and result["dense_equal"], f"rank {rank}: {result}"


def test_device_path_agrees_on_a_bad_rank_before_any_write() -> None:
    bad, good = _launch("disagreeing")
    assert "failed" not in good and "failed" not in bad
    assert bad["error"].startswith("ContractError") and "on rank 0" in bad["error"], bad
    assert good.get("nan") is True, good
    assert good["pool_kept"] and bad["pool_kept"]
