"""``gdn_nki.conformance:simulate_with_varlen``, the spec ``nox -s conformance`` checks (``host/conformance.py``)."""

from .host.conformance import simulate_with_varlen

__all__ = ["simulate_with_varlen"]
