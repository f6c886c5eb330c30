"""Host conveniences around the kernel: run it on numpy arrays, and prefill sequences of any length."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gdn_ref.constants import CHUNK_BY_ALGORITHM, DEFAULT_ALGORITHM, DEFAULT_GROUP_SIZE
from gdn_ref.contract import Arguments, ContractError, names_entry_point, plain_int
from gdn_ref.masks import default_mask_pack
from gdn_ref.packed import (
    cu_seqlens_violations,
    layout_violations,
    packed_token_count,
    sequence_value_violations,
    state_indices_violations,
    tensor_violations,
)

from ..common import backend
from ..cte.kernel import gdn_cte
from ..cte.plan import TOKEN_ARGUMENTS, packed_plan, pad_tokens
from ..cte.varlen import gdn_cte_varlen
from . import buckets
from .launch_grid import check_grid
from .overflow import largest_strength, refuse_overflow
from .pool_layout import checked_layout, kmajor
from .staging import commit, stage
from .torch_io import accepts_torch


@accepts_torch
@names_entry_point("gdn_nki.simulate")
def simulate(
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
    *,
    grid: int | None = None,
    check_values: bool = True,
    on_commit: Callable[[], None] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Run ``gdn_cte`` on the CPU with numpy arrays (``nki.simulate`` when installed, nki-cpu otherwise).

    Dimensions and Args:
        As ``gdn_cte``; arrays are numpy (bfloat16 via ml_dtypes) or CPU torch tensors (then the outputs are
        torch too, and a torch ``recurrent_state`` is updated in place and returned). ``grid`` launches
        ``gdn_cte[grid]`` (lanes split over programs): the logical-NeuronCore degree, 1 or 2 (``launch_grid.LNC_DEGREES``).
        ``check_values`` scans every input element first (``gdn_ref.contract.check_values``: g_log <= 0 and not
        NaN, everything else finite; g_log = -inf is a reset and accepted); default on, pass False only when the
        caller guarantees its data. ``on_commit`` is called once the launch has completed, right before a
        supplied ``recurrent_state`` is written: an exception it raises propagates with the state as it was (the
        torch entry points record the in-place write on the autograd graph there, where torch may refuse it).

    Returns:
        tuple: (out [B, Hv, S, Dv] in query's dtype, final state [B, Hv, Dk, Dv] fp32). When ``recurrent_state``
        is supplied, the second output IS that array, updated in place.

    Notes:
        The whole contract, including the host-only rules (mask pack contents, writable state, the value
        scans), is checked before the kernel runs, so a rejected call changes no buffer. A supplied state is also
        all or nothing: the kernel updates a private copy, which is copied into the caller's buffer only once the
        launch has completed — a launch that fails part-way (after some lanes stored their state) leaves it as
        it was. With ``check_values``, the outputs and final state are scanned before that commit: finite inputs
        giving a NaN/±Inf mean the recurrence overflowed (β·‖k‖² > 2: un-normalised keys), refused naming ``key``
        (``host/overflow.py``).
    """
    grid, group_size = check_grid(grid), plain_int(group_size)
    call = Arguments(query, key, value, g_log, beta, scale, algorithm, mask_pack, group_size, recurrent_state)
    violations = call.violations(values=check_values)
    if violations:
        raise ContractError(violations)
    return _launch(call, gdn_cte if grid is None else gdn_cte[grid], check_values, on_commit)


def _launch(
    call: Arguments,
    kernel: object,
    check_result: bool,
    on_commit: Callable[[], None] | None,
    extra: dict | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``simulate``'s launch of a checked call (``extra``: the kernel's keywords beyond ``gdn_cte``'s): the kernel on
    a staged state, the results refused when not finite (``check_result``), then the state committed."""
    staged = stage(call.recurrent_state, ...)
    out, final_state = backend.simulate(kernel)(**call.replace(recurrent_state=staged).as_kwargs(), **(extra or {}))
    if check_result:
        refuse_overflow({"out": out, "final state": final_state}, lambda: largest_strength(call.key, call.beta, 1))
    if call.recurrent_state is None:
        return out, final_state
    commit(call.recurrent_state, ..., staged, on_commit)
    return out, call.recurrent_state


simulate.gdn_spec_capabilities = {  # read by gdn-spec's conformance suite
    "name": f"gdn-nki ({backend.BACKEND_NAME})",
    "algorithms": ("schur", "neumann"),
    "dtypes": ("float32", "bfloat16"),
}


@accepts_torch
@names_entry_point("gdn_nki.prefill")
def prefill(
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
    *,
    check_values: bool = True,
    on_commit: Callable[[], None] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``simulate`` for any sequence length: pad to the algorithm's chunk multiple, return the real tokens.

    Args:
        As ``simulate``; S may be any positive length. ``mask_pack`` defaults to ``build_mask_pack()`` for schur.

    Returns:
        tuple: (out [B, Hv, S, Dv], final state), as ``simulate``.

    Notes:
        Padding tokens carry g = 0 and β = 0 (q, k, v = 0): they neither decay nor write the state, so the final
        state and the real tokens' outputs are exactly those of the unpadded sequence. The caller's arguments are
        checked before padding (every rule but the sequence-length one), so an error reports the caller's sizes.
    """
    mask_pack = default_mask_pack(mask_pack, algorithm)
    call = Arguments(query, key, value, g_log, beta, scale, algorithm, mask_pack, group_size, recurrent_state)
    violations = [v for v in call.violations(values=check_values) if v.rule_id != "seq.divisible"]
    if violations:
        raise ContractError(violations)
    seq_len = query.shape[2]
    pad = -seq_len % CHUNK_BY_ALGORITHM[algorithm]
    if pad:
        call = call.replace(**{name: pad_tokens(getattr(call, name), pad) for name in TOKEN_ARGUMENTS})
    # the caller's values were scanned above; the padding is zeros (its outputs, cut below, are zeros too)
    out, state = _launch(call, gdn_cte, check_values, on_commit)
    return out[:, :, :seq_len], state


@names_entry_point("gdn_nki.prefill_varlen")
def prefill_varlen(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    g_log: np.ndarray,
    beta: np.ndarray,
    cu_seqlens: np.ndarray,
    scale: float = 1.0,
    algorithm: str = DEFAULT_ALGORITHM,
    mask_pack: np.ndarray | None = None,
    group_size: int = DEFAULT_GROUP_SIZE,
    recurrent_state: np.ndarray | None = None,
    state_indices: np.ndarray | None = None,
    *,
    grid: int | None = None,
    check_values: bool = True,
    on_commit: Callable[[], None] | None = None,
    bucket: tuple[int, int] | None = None,
    checkpoint_every: int | None = None,
    checkpoint_indices: np.ndarray | None = None,
    read_indices: np.ndarray | None = None,
    state_v_first: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Packed sequences of any lengths in ONE kernel launch (``gdn_cte_varlen``), each from its own state.

    Dimensions:
        T: packed tokens (sequence i is ``cu_seqlens[i]:cu_seqlens[i+1]``). N: sequences. P: state pool rows.

    Args:
        query, key: [1, Hk, T, Dk]; value: [1, Hv, T, Dv]; g_log, beta: [1, Hv, T] fp32 — head-major like
            ``simulate``, the sequences back to back with no padding.
        cu_seqlens: [N + 1] integers, 0 = cu_seqlens[0] < cu_seqlens[1] < ... < cu_seqlens[N] = T.
        scale, algorithm, mask_pack, group_size: as ``prefill`` (mask_pack defaults to ``build_mask_pack()``).
        recurrent_state: optional fp32 state, updated IN PLACE: [N, Hv, Dk, Dv] (row i = sequence i), or with
            ``state_indices`` a pool [P, Hv, Dk, Dv] of which only the named rows are read and written.
        state_indices: optional [N] distinct pool rows, one per sequence.
        grid: launch ``gdn_cte_varlen[grid]``: the logical-NeuronCore degree, 1 or 2 (``launch_grid.LNC_DEGREES``).
        check_values: scan every element first, as ``simulate`` does (default on).
        on_commit: called once the launch has completed, right before the named rows are written, as
            ``simulate``'s.
        bucket: (T, N): run the bucket's one compiled program instead (``buckets.prefill_bucket``: the layout
            and the pool rows are device data, empty sequences and -1 rows allowed, ``out`` as here; T counts each
            sequence padded to its chunk multiple: ``buckets.padded_tokens``). Omitted:
            the smallest bucket of ``buckets.configure_buckets`` holding the batch; with none configured, the
            trace-time form (one program per batch layout, no padding beyond each sequence's chunk multiple: the
            better choice for one-off calls).
        checkpoint_every, checkpoint_indices, read_indices: prefix-cache checkpoints, and rows to start from
            other than the rows written (bucketed form only; without a bucket the batch's own size is used): see
            ``buckets.prefill_bucket``.
        state_v_first: states are V-major, [.., Hv, Dv, Dk] (FLA's ``state_v_first``, SGLang's pool): the
            kernel reads and writes them in place (``common.state_layout``), a new final state is V-major too;
            with K != V a state of the other shape is refused naming the flag (``host.pool_layout``).

    Returns:
        tuple: (out [1, Hv, T, Dv] in query's dtype, final states): the supplied state/pool itself, updated, or a
        new [N, Hv, Dk, Dv] fp32 array.

    Notes:
        Each sequence is padded exactly (g = 0, β = 0, zero q/k/v) to its own chunk multiple, never to the longest.
        Every rule is checked before anything runs (the values of the named pool rows only: the rest of a pool is
        never read; every sequence holding a bad value is named in the one error, ``ContractError.sequences``),
        and the kernel updates a staged copy of the named rows that is committed at the end, so a call either
        completes or changes nothing. With ``check_values``, a non-finite output or final state (the recurrence
        overflowed: β·‖k‖² > 2, ``host/overflow.py``) is refused before the commit, naming ``key``.
    """
    grid, group_size = check_grid(grid), plain_int(group_size)
    serving = (bucket, checkpoint_every, checkpoint_indices, read_indices)
    if any(x is not None for x in serving) or buckets.configured_buckets():
        return buckets.prefill_bucket(
            query, key, value, g_log, beta, cu_seqlens, bucket, scale, algorithm, mask_pack, group_size,
            recurrent_state, state_indices, checkpoint_every, checkpoint_indices, read_indices, grid=grid,
            check_values=check_values, on_commit=on_commit, state_v_first=state_v_first,
        )  # fmt: skip
    v_first = checked_layout(query, value, recurrent_state, state_v_first)
    mask_pack = default_mask_pack(mask_pack, algorithm)
    states = kmajor(recurrent_state, v_first)  # what the rules and scans read; the kernel gets the caller's layout
    call = Arguments(query, key, value, g_log, beta, scale, algorithm, mask_pack, group_size, states)
    # The tensors' own rules first: cu_seqlens is judged against their token count, which a wrong layout
    # (seq-first tensors, a 3-D query) makes meaningless; then the packed layout; then, once all hold, the values.
    violations = tensor_violations(call, padded=False, values=False)
    tokens = packed_token_count(query, violations)
    if tokens is not None:
        violations += cu_seqlens_violations(cu_seqlens, query.shape[0], tokens)
    violations += state_indices_violations(state_indices)
    if violations or tokens is None:
        raise ContractError(violations)
    rows = None if state_indices is None else tuple(int(s) for s in np.asarray(state_indices))
    plan = packed_plan(np.diff(np.asarray(cu_seqlens)), CHUNK_BY_ALGORITHM[algorithm])
    violations = layout_violations(query, value, algorithm, states, plan.seq_chunks, rows, padded=False)
    if violations:
        raise ContractError(violations)
    # The kernel reads and writes a private [N, Hv, Dk, Dv] copy of the named rows, committed to the caller's state
    # only once the launch has completed. Copying rows (not the pool) keeps the cost at what the call touches.
    state_rows = list(rows if rows is not None else range(len(plan.seq_chunks)))
    staged = stage(recurrent_state, state_rows)
    if check_values:  # every sequence with a bad value, its inputs' and its state's, in one error (a server drops them)
        violations = sequence_value_violations(call, cu_seqlens, kmajor(staged, v_first), rows)
        if violations:
            raise ContractError(violations)
    packed = call.replace(**{name: plan.pack(getattr(call, name)) for name in TOKEN_ARGUMENTS}, recurrent_state=staged)
    kernel = gdn_cte_varlen if grid is None else gdn_cte_varlen[grid]
    out, final_state = backend.simulate(kernel)(**packed.as_kwargs(), seq_chunks=plan.seq_chunks, state_rows=None,
                                                state_v_first=v_first)  # fmt: skip
    out = plan.unpack(out)
    if check_values:
        refuse_overflow({"out": out, "final state": final_state}, lambda: largest_strength(key, beta, 1))
    if recurrent_state is None:
        return out, final_state
    commit(recurrent_state, state_rows, staged, on_commit)
    return out, recurrent_state
