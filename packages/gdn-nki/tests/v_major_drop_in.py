"""gdn-nki's prefill drop-in as a kernel handed SGLang's V-major pool: ``chunk_gated_delta_rule`` with
``state_v_first=True`` (for ``gdn-spec check v_major_drop_in:chunk_v_first`` under the adapter's ``state=vk``)."""

from __future__ import annotations

from typing import Any

import gdn_nki.torch


def chunk_v_first(*args: Any, **kwargs: Any) -> Any:
    """``gdn_nki.torch.chunk_gated_delta_rule(..., state_v_first=True)``."""
    return gdn_nki.torch.chunk_gated_delta_rule(*args, state_v_first=True, **kwargs)
