"""``nisa`` enums and handle classes (ISA enum pages, v2.33.0; docs/nki-sources.md §1.2): engines, reduce commands, DGE modes, versions."""

from __future__ import annotations

import enum
from typing import Any

# Re-exported as ``nisa.*`` (their homes are the leaf modules ``checks`` and ``target``).
from nki_cpu.checks import NkiValidationError as NkiValidationError
from nki_cpu.scalar import VirtualRegister as VirtualRegister
from nki_cpu.target import get_nc_sub_version as get_nc_sub_version
from nki_cpu.target import get_nc_version as get_nc_version
from nki_cpu.target import nc_version as nc_version


class engine(enum.Enum):  # noqa: N801 - the NKI name
    """Compute/DMA engines an instruction may be pinned to (``engine=`` arguments)."""

    unknown = 0
    tensor = 1
    scalar = 2
    gpsimd = 3
    dma = 4
    vector = 5
    sync = 6


tensor_engine = engine.tensor
vector_engine = engine.vector
scalar_engine = engine.scalar
gpsimd_engine = engine.gpsimd
unknown_engine = engine.unknown


class reduce_cmd(enum.Enum):  # noqa: N801
    """What an instruction does with the engine's per-lane accumulator registers."""

    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4


class dge_mode(enum.Enum):  # noqa: N801
    """Descriptor-generation mode of a DMA (no numeric effect)."""

    unknown = 0
    swdge = 1
    hwdge = 2
    none = 3


class oob_mode(enum.Enum):  # noqa: N801
    """Out-of-bounds behaviour of indirect DMAs."""

    error = 0
    skip = 1


class matmul_perf_mode(str, enum.Enum):  # noqa: N801
    """``nc_matmul`` performance mode; the values are the plain strings real kernels also pass."""

    none = "none"
    double_row = "double_row"


class dma_engine(enum.Enum):  # noqa: N801
    """DMA engine selector for ``sendrecv``."""

    dma = 1
    gpsimd_dma = 2


class NkiInstruction:
    """Handle returned by every instruction; ``depends_on`` is accepted and ignored (eager execution)."""

    def __init__(self, opcode: str, index: int) -> None:
        self.opcode = opcode
        self.index = index

    def depends_on(self, *producers: Any) -> NkiInstruction:
        """Scheduling hint; no effect in an eager interpreter."""
        return self

    def __repr__(self) -> str:
        return f"NkiInstruction({self.opcode}#{self.index})"
