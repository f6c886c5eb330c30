"""Exporters of a cost report: Chrome-trace JSON (opens in Perfetto / chrome://tracing) and a PNG timeline.

Notes:
    The PNG needs matplotlib, an optional extra (``pip install nki-cpu[plot]``); it is imported only when called.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nki_cpu.cost.durations import opcode_name
from nki_cpu.cost.record import Engine, InstructionRecord, site_label
from nki_cpu.cost.report import CostReport, _track_order

PROCESS_ID = 1
NS_PER_US = 1000.0


def _event_args(record: InstructionRecord, waited_on: int, issue_ns: float) -> dict[str, Any]:
    args: dict[str, Any] = {
        "index": record.index,
        "partitions": record.partitions,
        "free_elems": record.free_elems,
        "dtypes": list(record.dtypes),
        "nbytes": record.nbytes,
    }
    if record.site:
        args["site"] = site_label(record)
    if waited_on >= 0:
        args["waited_on"] = waited_on
    if record.engine is Engine.DMA:
        args["issue_us"] = issue_ns / NS_PER_US
    args.update(
        {
            key: value if isinstance(value, (int, float, str, bool)) else str(value)
            for key, value in record.attrs.items()
        }
    )
    return args


def chrome_trace_events(report: CostReport) -> list[dict[str, Any]]:
    """Trace events of a report: one thread (track) per used engine / DMA queue, one complete event per instruction.

    Returns:
        Metadata events naming the process and threads, then ``"ph": "X"`` events in µs.
    """
    placed = report.schedule
    tracks = sorted(set(placed.track), key=_track_order)
    tids = {name: tid for tid, name in enumerate(tracks, start=1)}
    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": PROCESS_ID, "name": "process_name", "args": {"name": f"NeuronCore ({report.target})"}}
    ]
    for name, tid in tids.items():
        events.append({"ph": "M", "pid": PROCESS_ID, "tid": tid, "name": "thread_name", "args": {"name": name}})
        events.append(
            {"ph": "M", "pid": PROCESS_ID, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}}
        )
    for record in report.trace.records:
        i = record.index
        events.append(
            {
                "ph": "X",
                "pid": PROCESS_ID,
                "tid": tids[placed.track[i]],
                "name": opcode_name(record),
                "ts": placed.start_ns[i] / NS_PER_US,
                "dur": (placed.end_ns[i] - placed.start_ns[i]) / NS_PER_US,
                "args": _event_args(record, placed.waited_on[i], placed.issue_ns[i]),
            }
        )
    return events


def write_chrome_trace(report: CostReport, path: str | Path) -> Path:
    """Write the report's schedule as Chrome-trace JSON.

    Args:
        report: an :func:`~nki_cpu.cost.estimate` result.
        path: output file (conventionally ``*.json``); parent directories are created.

    Returns:
        The written path.
    """
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    document = {"traceEvents": chrome_trace_events(report), "displayTimeUnit": "ns"}
    out.write_text(json.dumps(document))
    return out


def write_png_timeline(report: CostReport, path: str | Path, max_events: int = 20000, title: str | None = None) -> Path:
    """Draw the schedule as one horizontal lane per track and save it as PNG.

    Args:
        report: an :func:`~nki_cpu.cost.estimate` result.
        path: output file; parent directories are created.
        max_events: bars drawn per track at most (the first ones), to keep huge traces drawable.
        title: what the kernel launch was (a first title line); the makespan line is always drawn.

    Returns:
        The written path.

    Notes:
        Requires matplotlib (``nki-cpu[plot]``); raises ``ImportError`` with that hint otherwise.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError("write_png_timeline needs matplotlib: pip install 'nki-cpu[plot]'") from error
    placed = report.schedule
    tracks = sorted(set(placed.track), key=_track_order)
    lanes: dict[str, list[tuple[float, float]]] = {name: [] for name in tracks}
    for start, end, track in zip(placed.start_ns, placed.end_ns, placed.track, strict=True):
        if len(lanes[track]) < max_events:
            lanes[track].append((start / NS_PER_US, (end - start) / NS_PER_US))
    figure, axes = plt.subplots(figsize=(12, 0.5 * len(tracks) + 1.5))
    for row, name in enumerate(tracks):
        axes.broken_barh(lanes[name], (row - 0.4, 0.8), color=f"C{row % 10}")
    axes.set_yticks(range(len(tracks)), labels=tracks)
    axes.invert_yaxis()
    axes.set_xlabel("time (us)")
    heading = f"{report.target}: makespan {report.makespan_ns / NS_PER_US:.3f} us"
    axes.set_title(heading if title is None else f"{title}\n{heading}")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(out, dpi=100)
    plt.close(figure)
    return out
