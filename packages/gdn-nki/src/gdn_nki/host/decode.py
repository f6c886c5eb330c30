"""Host entry points of the decode kernels: validate everything, launch, and leave buffers untouched on failure."""

from __future__ import annotations

from typing import Any

import numpy as np

from gdn_ref.activations import beta_from_logit
from gdn_ref.contract import (
    STEP,
    ContractError,
    Violation,
    is_integer,
    names_entry_point,
    plain_int,
    validate_step,
    validate_tkg,
)
from gdn_ref.packed import pool_row_violations

from ..common import backend
from ..tkg.fused import gdn_tkg
from ..tkg.step import gdn_step, step_tensors
from .launch_grid import LNC_DEGREES, check_grid
from .overflow import largest_strength, refuse_overflow
from .pool_layout import kmajor, layout_violations, v_first_flag
from .pool_span import numpy_span, span_violations


@names_entry_point("gdn_nki.tkg_simulate")
def tkg_simulate(
    *args: Any, check_values: bool = True, grid: int | None = None, **kwargs: Any
) -> tuple[np.ndarray, np.ndarray]:
    """Run ``gdn_tkg`` on the CPU with numpy arrays after checking the whole contract.

    Args:
        args, kwargs: ``gdn_tkg``'s (q, k, v, b, a, A_log, dt_bias, z, norm_weight, state_in).
        check_values (bool): also scan the values (finite inputs, fused g <= 0 and not NaN); default on.
        grid (int): launches ``gdn_tkg[grid]`` (its batch rows split over the programs); None: one program.

    Returns:
        tuple: (out [BH, V] in q's dtype, state [BH, K, V] fp32, a new array: ``state_in`` is only read).
    """
    grid = check_grid(grid)
    violations = validate_tkg(*args, host=check_values, **kwargs)
    if violations:
        raise ContractError(violations)
    return backend.simulate(gdn_tkg if grid is None else gdn_tkg[grid])(*args, **kwargs)


@names_entry_point("gdn_nki.decode_step")
def decode_step(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    state_pool: np.ndarray,
    state_indices: np.ndarray,
    num_accepted_tokens: np.ndarray | None = None,
    *,
    g_log: np.ndarray | None = None,
    beta: np.ndarray | None = None,
    a: np.ndarray | None = None,
    b: np.ndarray | None = None,
    A_log: np.ndarray | None = None,
    dt_bias: np.ndarray | None = None,
    scale: float | None = None,
    use_qk_l2norm: bool = False,
    grid: int | None = None,
    check_values: bool = True,
    state_v_first: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Run ``gdn_step`` (N requests × T tokens on a state pool) with every rule checked first.

    Dimensions and Args:
        As ``gdn_step``; ``scale`` defaults to Dk**-0.5. ``grid`` launches ``gdn_step[grid]`` (requests split over
        the programs). ``check_values`` scans the inputs and the pool rows the call reads (finite; gates in
        their domains); the index values are always checked (range, padding rows, distinct live rows,
        num_accepted_tokens in [1, T]): they address the pool. ``state_v_first``: the pool is V-major
        [P, Hv, Dv, Dk] (SGLang's, vLLM's newer fused-gating kernel's): the kernel reads and writes it in place
        (``common.state_layout``); with K != V a pool of the other shape is refused naming the flag
        (``host.pool_layout``); with K = V the layout is the caller's word.

    Returns:
        tuple: (out [N, T, Hv, Dv] in query's dtype, ``state_pool`` itself, updated in place).

    Notes:
        A rejected call raises ``ContractError`` before launching. The rows the call will write are saved first
        and put back if the launch fails part-way, so a call completes or leaves the pool as it was; the cost is
        the rows touched, never the pool. With ``check_values``, a non-finite output or written row (the
        recurrence overflowed: β·‖k‖² > 2, ``host/overflow.py``) is refused the same way, naming ``key``.
    """
    if grid is not None and not (is_integer(grid) and grid in LNC_DEGREES):
        raise ContractError([Violation("launch.grid", "grid", f"= {grid!r}", "the launch grid is the "
                                       f"logical-NeuronCore degree: one of {LNC_DEGREES}",
                                       "pass grid=None, 1 or 2; the kernel splits the requests itself", STEP)])  # fmt: skip
    grid = plain_int(grid)
    scale = _resolved_scale(scale, query)
    writes = check_decode_step(query, key, value, state_pool, state_indices, num_accepted_tokens, g_log=g_log,
                               beta=beta, a=a, b=b, A_log=A_log, dt_bias=dt_bias, scale=scale,
                               use_qk_l2norm=use_qk_l2norm, check_values=check_values,
                               state_v_first=state_v_first)  # fmt: skip
    saved = np.array(state_pool[writes], copy=True)

    def strength() -> float:
        return largest_strength(key, beta_from_logit(b) if beta is None else beta, 2, use_qk_l2norm)

    kernel = gdn_step if grid is None else gdn_step[grid]
    span, row_stride = numpy_span(state_pool)  # a row-strided pool is addressed in place (``host.pool_span``)
    try:
        out, _ = backend.simulate(kernel)(
            query, key, value, span, state_indices, num_accepted_tokens, g_log=g_log, beta=beta, a=a, b=b,
            A_log=A_log, dt_bias=dt_bias, scale=scale, use_qk_l2norm=use_qk_l2norm,
            state_v_first=v_first_flag(state_v_first, "state_v_first", STEP), state_row_stride=row_stride,
        )  # fmt: skip
        if check_values:  # finite inputs must give finite results: else the recurrence overflowed (put back below)
            written = {f"state_pool row {r}": state_pool[r] for r in writes}
            refuse_overflow({"out": out, **written}, strength, STEP)
    except BaseException:
        state_pool[writes] = saved  # a launch that failed part-way, or overflowed: the pool as it was
        raise
    return out, state_pool


def check_decode_step(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    state_pool: np.ndarray,
    state_indices: np.ndarray,
    num_accepted_tokens: np.ndarray | None = None,
    *,
    g_log: np.ndarray | None = None,
    beta: np.ndarray | None = None,
    a: np.ndarray | None = None,
    b: np.ndarray | None = None,
    A_log: np.ndarray | None = None,
    dt_bias: np.ndarray | None = None,
    scale: float | None = None,
    use_qk_l2norm: bool = False,
    check_values: bool = True,
    state_v_first: bool = False,
) -> list[int]:
    """Every rule ``decode_step`` checks before its launch, without launching: a caller that splits one call into
    several steps (FLA's decode drop-in, one step per sequence length) checks all of them before it runs any.

    Args:
        As ``decode_step``'s.

    Returns:
        list[int]: the pool rows a launch of this call writes.

    Raises:
        ContractError: every broken rule; with ``check_values``, every request holding a bad value (its inputs'
            and its state row's), ordered by request.
    """
    scale = _resolved_scale(scale, query)
    v_first = v_first_flag(state_v_first, "state_v_first", STEP)
    dk, dv = (np.shape(x)[-1] if np.ndim(x) == 4 else None for x in (key, value))
    violations = layout_violations(state_pool, v_first, dk, dv, "state_pool", STEP)
    if violations:
        raise ContractError(violations)
    pool = kmajor(state_pool, v_first)  # the K-major view every rule and scan reads; the kernel gets the pool itself
    tensors = step_tensors(query, key, value, pool, state_indices, num_accepted_tokens, g_log, beta, a, b,
                           A_log, dt_bias)  # fmt: skip
    violations = validate_step(tensors, scale, use_qk_l2norm, values=False)
    if not violations and not state_pool.flags.writeable:
        violations = [Violation("state_pool.writable", "state_pool", "a read-only array",
                                "the state pool is updated IN PLACE, so it must be writable",
                                "pass a writable array", STEP)]  # fmt: skip
    _, row_stride = numpy_span(state_pool)
    if not violations and row_stride is not None:
        violations = span_violations(state_pool.shape[0], row_stride, "state_pool", STEP)
    if violations:  # the rows below are read from the indices: only once their rules hold
        raise ContractError(violations)
    live, reads, writes = _rows(state_indices, num_accepted_tokens)
    if check_values:  # every request with a bad value, its inputs' and its state row's, in one error
        violations = validate_step(tensors, scale, use_qk_l2norm)  # the layout holds: only values can break now
        rows_read = np.ascontiguousarray(pool[reads])
        violations += [_as_step(v) for v in pool_row_violations(rows_read, reads, live)]
        if violations:
            raise ContractError(sorted(violations, key=lambda v: -1 if v.sequence is None else v.sequence))
    return writes


decode_step.gdn_spec_decode_capabilities = {  # read by gdn-spec's decode family (gdn_spec.decode)
    "name": "gdn-nki decode_step",
    "example_scale": 0.5,  # each call is traced and interpreted by nki-cpu: half the profile's examples
}


def _resolved_scale(scale: float | None, query: np.ndarray) -> Any:
    """``scale``, or its default Dk**-0.5 (1.0 for a query of the wrong rank, which the rules then name)."""
    if scale is None:
        return float(np.shape(query)[-1]) ** -0.5 if len(np.shape(query)) == 4 else 1.0
    return scale


def _rows(state_indices: np.ndarray, num_accepted_tokens: np.ndarray | None) -> tuple[list[int], list[int], list[int]]:
    """The live requests, the pool rows a valid call reads (one per live request) and writes (every index of a
    live request)."""
    rows = np.asarray(state_indices).astype(np.int64)
    rows = rows.reshape(rows.shape[0], -1)
    live = np.flatnonzero(rows[:, 0] >= 0)
    if num_accepted_tokens is None:
        reads = rows[live, 0]
    else:
        accepted = np.clip(np.asarray(num_accepted_tokens).astype(np.int64), 1, rows.shape[1])
        reads = rows[live, accepted[live] - 1]
    return [int(n) for n in live], [int(r) for r in reads], [int(r) for r in rows[live].reshape(-1)]


def _as_step(v: Violation) -> Violation:
    return Violation(v.rule_id, "state_pool", v.value, v.rule, v.fix, STEP, v.sequence)
