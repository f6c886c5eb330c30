"""gdn-spec: the documented gdn_cte contract, executable, and a reusable conformance suite for GDN kernels.

Modules: ``contract`` (rules + violation builders), ``regimes`` (input regimes), ``metrics`` (errors and the
tolerance table), ``impl`` (resolving the implementation under test), ``suite`` (the pytest modules),
``plugin`` (pytest11 options and fixtures), ``cli`` (``gdn-spec check``).
"""

from __future__ import annotations

__version__ = "0.1.0"
