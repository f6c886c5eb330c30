"""The target NeuronCore generation (``nisa.nc_version`` / ``nisa.get_nc_version``; ISA enum pages, v2.33.0).

A leaf module: the checks of every layer ask it which generation's limits apply.
"""

from __future__ import annotations

import enum
import os


class nc_version(enum.Enum):  # noqa: N801
    """NeuronCore generation."""

    gen2 = 2
    gen3 = 3
    gen4 = 4


_TARGETS = {"trn1": 2, "inf2": 2, "gen2": 2, "trn2": 3, "gen3": 3, "trn3": 4, "gen4": 4}


def get_nc_version() -> nc_version:
    """Target generation from ``NEURON_PLATFORM_TARGET_OVERRIDE`` (default Trn2 = gen3; README)."""
    target = os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2").lower()
    return nc_version(_TARGETS.get(target, 3))


def get_nc_sub_version() -> int:
    """Silicon revision (always 0 here)."""
    return 0
