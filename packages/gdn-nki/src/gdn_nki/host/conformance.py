"""gdn-nki as one gdn-spec implementation for both of its launch paths: dense calls and packed sequences."""

from __future__ import annotations

from typing import Any

import numpy as np

from gdn_ref.constants import DEFAULT_ALGORITHM, DEFAULT_GROUP_SIZE
from gdn_ref.contract import names_entry_point

from ..common.backend import BACKEND_NAME
from .decode import decode_step
from .prefill import prefill_varlen, simulate


@names_entry_point("gdn_nki.conformance.simulate_with_varlen")
def simulate_with_varlen(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    g_log: np.ndarray,
    beta: np.ndarray,
    scale: float = 1.0,
    algorithm: str = DEFAULT_ALGORITHM,
    mask_pack: np.ndarray | None = None,
    group_size: int = DEFAULT_GROUP_SIZE,
    recurrent_state: np.ndarray | None = None,
    cu_seqlens: np.ndarray | None = None,
    state_indices: np.ndarray | None = None,
    bucket: tuple[int, int] | None = None,
    checkpoint_every: int | None = None,
    checkpoint_indices: np.ndarray | None = None,
    read_indices: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``simulate`` (``gdn_cte``), or with ``cu_seqlens`` ``prefill_varlen`` (one launch of ``gdn_cte_varlen``, or
    with ``bucket`` / ``checkpoint_every`` of the bucket's program ``gdn_cte_bucket``).

    Dimensions:
        As ``simulate``; with ``cu_seqlens`` [N + 1], B = 1 and the sequences packed along S (any lengths).

    Args:
        query, key, value, g_log, beta, scale, algorithm, mask_pack, group_size, recurrent_state: as ``simulate``;
            with ``cu_seqlens``, ``recurrent_state`` is [N, Hv, Dk, Dv] (row i = sequence i), as ``prefill_varlen``.
        cu_seqlens: None (a dense call), or int [N + 1] sequence offsets, 0 = cu_seqlens[0] < ... = S.
        state_indices, bucket, checkpoint_every, checkpoint_indices, read_indices: with ``cu_seqlens``, as
            ``prefill_varlen``: pool rows (−1 = none, bucketed form), the bucket (T, N), prefix-cache checkpoints
            into pool rows, the rows sequences start from (−1 = zero).

    Returns:
        tuple: (out, final state) of the path taken; a supplied state is that array, updated in place.

    Notes:
        gdn-spec's ``varlen`` area calls gdn_cte's signature with ``cu_seqlens``: ``simulate`` takes none, so
        registered alone the varlen kernel went unchecked by ``nox -s conformance``. This callable runs every
        other area through ``simulate`` unchanged and the varlen area through ``prefill_varlen``, whose serving
        checks (declared below: ``bucket``, ``state_pool``, ``checkpoints``, ``read_rows``) pass a bucket on every
        call: −1 pool rows, empty sequences and read rows are the bucketed form's (the trace-time form refuses
        them).
    """
    if cu_seqlens is None:
        return simulate(query, key, value, g_log, beta, scale, algorithm, mask_pack, group_size, recurrent_state)
    return prefill_varlen(
        query, key, value, g_log, beta, cu_seqlens, scale, algorithm, mask_pack, group_size, recurrent_state,
        state_indices, bucket=bucket, checkpoint_every=checkpoint_every, checkpoint_indices=checkpoint_indices,
        read_indices=read_indices,
    )  # fmt: skip


simulate_with_varlen.gdn_spec_capabilities = {  # read by gdn-spec's conformance suite
    **simulate.gdn_spec_capabilities,
    "name": f"gdn-nki ({BACKEND_NAME}; simulate, prefill_varlen with cu_seqlens)",
    "varlen": True,
    "state_pool": True,
    "bucket": True,
    "checkpoints": True,
    "read_rows": True,
}


@names_entry_point("gdn_nki.conformance.decode_step_on_two_programs")
def decode_step_on_two_programs(*args: Any, **kwargs: Any) -> tuple[np.ndarray, np.ndarray]:
    """``decode_step`` launched as ``gdn_step[2]``: the requests split over two programs, each a compiled loop of
    request groups once it holds more than a group — the configuration of Trainium2's logical NeuronCore (LNC = 2)
    that the decode family checks here (``nox -s conformance``).

    Args and Returns:
        As ``decode_step``, without ``grid``.
    """
    return decode_step(*args, grid=2, **kwargs)


decode_step_on_two_programs.gdn_spec_decode_capabilities = {
    **decode_step.gdn_spec_decode_capabilities,
    "name": "gdn-nki decode_step at launch grid 2",
}
