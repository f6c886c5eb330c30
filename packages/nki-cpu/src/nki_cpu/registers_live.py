"""Live scalar registers per engine sequencer: the hardware check of rule ``live_registers``.

"Each engine sequencer (Tensor/Scalar/Vector/GpSimd/Sync Engine) within a NeuronCore maintains its own set of
physical registers for scalar operations (64x 32-bit registers per engine sequencer in NeuronCore v2-v4)", and
the compiler allocates them "based on the dynamic program flow" (``nki.isa.register_alloc``, SDK 2.29.1 and
latest). A kernel that keeps more run-time values live on one sequencer than it has registers cannot be allocated,
so nki-cpu counts them from the launch's records:

- a register is a ``Region`` of buffer ``"register"`` (``isa.registers``): written by the ``scalar_load`` /
  ``register_load`` that fills it, read by every instruction addressed by a value computed from it (``nl.ds``,
  ``.ap(scalar_offset=)``) or storing it;
- it occupies a register of the sequencer of the engine that loads it (GpSimd: known unknown 25) from the load to
  its last use by any instruction (a DMA addressed at run time is issued with the value the loading sequencer
  holds, and another engine gets it from there: known unknown 31), and a register of every other compute engine
  that reads it, from that engine's first read of it to its last;
- the count is the largest number of such intervals covering one instruction, per sequencer.

A compiled loop's body loads its values every iteration into fresh registers that die within the iteration, so a
body counts once, as the program's registers do.
"""

from __future__ import annotations

from dataclasses import dataclass

from nki_cpu.cost.record import Engine, Trace, site_label
from nki_cpu.isa.registers import REGISTER_ENGINE

REGISTERS_PER_SEQUENCER = 64  # "nki.isa.register_alloc", SDK 2.29.1 and latest: NeuronCore v2-v4
PAGE = (
    "'nki.isa.register_alloc' (SDK 2.29.1 and latest): '64x 32-bit registers per engine sequencer in NeuronCore v2-v4'"
)
LOADER = REGISTER_ENGINE  # the engine nki-cpu charges register loads to (GpSimd)


@dataclass(frozen=True)
class Peak:
    """The most registers live at once on one engine sequencer, and the first instruction where that happens."""

    engine: str
    count: int
    position: int


def live_register_peaks(trace: Trace) -> dict[str, Peak]:
    """Per engine sequencer, the most scalar registers live at once (module docstring), from a launch's trace.

    Args:
        trace: a launch's ``Trace`` (``nki_cpu.last_trace()``).

    Returns:
        dict[str, Peak]: by engine name ("gpsimd", "vector", ...); engines that hold no register are absent.
    """
    spans: dict[tuple[int, Engine], list[int]] = {}  # (register, sequencer) -> [first, last]
    for position, record in enumerate(trace.records):
        for region in (*record.reads, *record.writes):
            if region.buffer != "register":
                continue
            holders = (LOADER,) if record.engine in (Engine.DMA, LOADER) else (LOADER, record.engine)
            for holder in holders:
                span = spans.setdefault((region.storage_id, holder), [position, position])
                span[1] = position
    starts: dict[Engine, dict[int, int]] = {}
    for (_, holder), (first, last) in spans.items():
        changes = starts.setdefault(holder, {})
        changes[first] = changes.get(first, 0) + 1
        changes[last + 1] = changes.get(last + 1, 0) - 1
    peaks = {}
    for holder, changes in starts.items():
        live, best = 0, Peak(holder.value, 0, 0)
        for position in sorted(changes):
            live += changes[position]
            if live > best.count:
                best = Peak(holder.value, live, position)
        peaks[holder.value] = best
    return peaks


def over_the_limit(trace: Trace, limit: int = REGISTERS_PER_SEQUENCER) -> str | None:
    """The message of rule ``live_registers`` for the first sequencer holding more than ``limit`` registers at
    once, or None when every sequencer stays within it."""
    for peak in live_register_peaks(trace).values():
        if peak.count > limit:
            where = site_label(trace.records[peak.position])
            return (
                f"{peak.count} scalar registers live at once on the {peak.engine} engine sequencer (at instruction "
                f"{peak.position}, {trace.records[peak.position].opcode} from {where}); the limit is {limit} "
                f"32-bit registers per engine sequencer: {PAGE}. Fix: load a run-time value (scalar_load / "
                "register_load) right before the instructions that use it instead of holding it across others, "
                "or spread the loads over fewer values at once (a compiled loop's body holds one iteration's)"
            )
    return None


__all__ = ["PAGE", "REGISTERS_PER_SEQUENCER", "Peak", "live_register_peaks", "over_the_limit"]
