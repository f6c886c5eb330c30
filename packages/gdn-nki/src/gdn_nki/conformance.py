"""``gdn_nki.conformance:simulate_with_varlen`` and ``:decode_step_on_two_programs``, specs ``nox -s conformance``
checks (``host/conformance.py``)."""

from .host.conformance import decode_step_on_two_programs, simulate_with_varlen

__all__ = ["decode_step_on_two_programs", "simulate_with_varlen"]
