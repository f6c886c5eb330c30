"""``gdn_nki.traces``: the launch recorder model code and the serving example use (``host/traces.py``)."""

from .host.traces import Launch, recording_launches, trace_counts

__all__ = ["Launch", "recording_launches", "trace_counts"]
