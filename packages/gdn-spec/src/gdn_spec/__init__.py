"""gdn-spec: the documented gdn_cte contract, executable, and a reusable conformance suite for GDN kernels.

Modules: ``contract`` (rules + violation builders), ``regimes`` (input regimes), ``metrics`` (errors and the
tolerance table), ``core`` (the implementation under test as values: capabilities, errors), ``impl`` (resolving
the implementation under test), ``profiles`` (the api / math contract profiles), ``adapters`` (kernels of other
conventions: seq-first, torch, raw NKI), ``suite`` (the pytest modules), ``plugin`` (pytest11 options and
fixtures), ``cli`` (``gdn-spec check``), ``provenance`` (the versions a report names), ``validated`` (the
README's kernels-validated table).
"""

from __future__ import annotations

__version__ = "0.1.0"
