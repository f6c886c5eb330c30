"""Hand-made instruction records shared by the cost-model tests."""

from __future__ import annotations

import dataclasses

from nki_cpu.cost import TRN2, Engine, InstructionRecord, Region

FP32 = "float32"
# Latencies off: start times then equal exactly the ends of the instructions waited for.
NO_LATENCY = dataclasses.replace(
    TRN2,
    dependency_latency_cycles=dict.fromkeys(Engine, 0),
    dma_fixed_latency_ns=0.0,
)


def box(sid: int, lo: int = 0, hi: int = 1024, parts: tuple[int, int] = (0, 128)) -> Region:
    return Region(sid, "sbuf", parts, (lo, hi))


def op(engine: Engine, reads=(), writes=(), n: int = 512, queue: int = 0, partitions: int = 128) -> InstructionRecord:
    opcode = "dma_copy" if engine is Engine.DMA else "tensor_copy"
    return InstructionRecord(
        opcode=opcode,
        engine=engine,
        partitions=partitions,
        free_elems=n,
        dtypes=(FP32, FP32),
        nbytes=partitions * n * 4,
        reads=tuple(reads),
        writes=tuple(writes),
        queue=queue,
        attrs={"contiguous_bytes": n * 4},
    )
