"""Cost model of nki-cpu: hardware figures, per-instruction durations, list scheduling, lower bounds, reports and exporters.

The interpreter appends one :class:`InstructionRecord` per executed instruction to a :class:`Trace`;
:func:`estimate` turns the trace into a :class:`CostReport` for a target generation (Trn2 by default).
"""

from nki_cpu.cost.bounds import Floor, dependency_bound_ns, engine_bounds_ns, makespan_floor
from nki_cpu.cost.critical import PathStep, critical_path, path_summary
from nki_cpu.cost.durations import duration_ns
from nki_cpu.cost.figures import DEFAULT_TARGET, FIGURES, TRN1, TRN2, TRN3, Figures, get_figures
from nki_cpu.cost.record import Engine, InstructionRecord, Region, Trace
from nki_cpu.cost.report import CostReport, PeKind, PeKindTime, SiteTime, estimate, pe_breakdown, site_breakdown
from nki_cpu.cost.scheduler import Schedule, schedule
from nki_cpu.cost.trace_export import write_chrome_trace, write_png_timeline

__all__ = [
    "DEFAULT_TARGET",
    "FIGURES",
    "TRN1",
    "TRN2",
    "TRN3",
    "CostReport",
    "Engine",
    "Figures",
    "Floor",
    "InstructionRecord",
    "PathStep",
    "PeKind",
    "PeKindTime",
    "Region",
    "Schedule",
    "SiteTime",
    "Trace",
    "critical_path",
    "dependency_bound_ns",
    "duration_ns",
    "engine_bounds_ns",
    "estimate",
    "get_figures",
    "makespan_floor",
    "path_summary",
    "pe_breakdown",
    "schedule",
    "site_breakdown",
    "write_chrome_trace",
    "write_png_timeline",
]
