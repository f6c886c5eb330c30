"""vLLM's CUDA-graph padding of its speculative-decode metadata: tables longer than the batch a call covers.

vLLM pads a spec-decode batch to the captured graph's size B (vllm-project/vllm
``vllm/v1/attention/backends/gdn_attn.py``, ``GDNAttentionMetadataBuilder.build``): ``spec_query_start_loc`` gets
B + 1 entries (its tail repeats the last bound), ``num_accepted_tokens`` B (its tail 1), ``spec_state_indices_tensor``
[B, T] (its tail ``PAD_SLOT_ID``). Its GDN layer (``vllm/model_executor/layers/mamba/gdn_linear_attn.py``,
``_forward_core``) hands them on as they are beside ``conv_state_indices = spec_state_indices_tensor[:, 0]
[:num_spec_decodes]`` and ``cu_seqlens = spec_query_start_loc[:num_spec_decodes + 1]``, and vLLM's kernels take the
batch N from those, never reading the tables' tails. The drop-ins do the same: a table longer than N is read as its
first N rows (a view: nothing copied, nothing of the tail checked); a shorter one is left to the rules, which name it.
"""

from __future__ import annotations

from typing import Any


def first_rows(n: int, table: Any) -> Any:
    """``table``'s first ``n`` rows (a view) when it is an array or tensor of more; else ``table`` as it is."""
    shape = getattr(table, "shape", None)
    if shape is None or len(shape) == 0 or shape[0] <= n:
        return table
    return table[:n]


def requests_of(cu_seqlens: Any) -> int | None:
    """The requests a ``cu_seqlens`` [N + 1] bounds (shape only: no value read), or None without a 1-D one."""
    shape = getattr(cu_seqlens, "shape", None)
    return shape[0] - 1 if shape is not None and len(shape) == 1 and shape[0] >= 1 else None


def trimmed_to_requests(cu_seqlens: Any, *tables: Any) -> tuple[Any, ...]:
    """``tables`` read as the first N rows, N the requests ``cu_seqlens`` bounds (as they are without it)."""
    n = requests_of(cu_seqlens)
    return tables if n is None else tuple(first_rows(n, table) for table in tables)


def gates_of_tokens(q: Any, *gates: Any) -> tuple[Any, ...]:
    """Token-major gates [tokens, HV] read as q's B·T tokens: vLLM's spec path in a mixed batch passes the whole
    step's raw gates (spec tokens first) beside q of the spec tokens, and its kernel reads them at the offsets
    ``cu_seqlens`` gives (``gdn_linear_attn.py``, ``_forward_core``: ``a=a, b=b``). Others as they are."""
    shape = getattr(q, "shape", None)
    if shape is None or len(shape) != 4:
        return gates
    tokens = shape[0] * shape[1]
    return tuple(first_rows(tokens, g) if len(getattr(g, "shape", ())) == 2 else g for g in gates)
