"""The conv family: what any causal depthwise conv1d kernel on a conv-state pool must do, as checks that run on any
kernel with ``gdn_nki.conv_decode_step``'s signature (directly, or through an adapter: ``adapters.py``).

A conv kernel here is ``kernel(x, conv_pool, weight, bias, state_indices, num_accepted_tokens=None, *,
activation="silu") -> (out, conv_pool)`` (declaring ``varlen``: also the keywords ``query_start_loc`` [N + 1] and
``max_query_len``, x then [tokens, C]): x [N, T, C], a pool [P, C, L] of windows updated in place, [N] or [N, T]
rows (−1 = padding), ``gdn_ref.conv.causal_conv1d_decode_pool``'s semantics. Each check draws its cases from a seed
(numpy data; shapes from the seed too), runs the kernel, and compares with the fp64 oracle: outputs within
``gdn_spec.metrics``' tolerance table, windows bit for bit (a window holds inputs, so any kernel stores them
exactly), rows not named bit-identical.

| check | what it holds |
|---|---|
| ``numerics`` | outputs against the oracle (widths, window lengths, bias or none, SiLU or none, fp32 and bf16) |
| ``pool`` | the named rows hold the oracle's windows; every other row keeps its bytes (NaN-poisoned: never read) |
| ``padding`` | a −1 request reads and writes nothing of the pool (and, where declared, outputs zeros) |
| ``rollback`` | [N, T] rows with ``num_accepted_tokens``: verify, resume from the accepted token's row = decoding the accepted tokens one by one, bit for bit (declared ``per_token_rows``) |
| ``in_row`` | vLLM's in-row form, [N] rows with ``num_accepted_tokens``: rows of W − 2 + T inputs (and one longer, of which only the first W − 2 + T may change, as vLLM's kernel writes) read from offset a − 1 for every a in 1..T, −1 rows, fp32 and bf16 against the oracle, rows bit for bit; verify then resume = decoding the accepted tokens one by one on a plain pool; a count outside 1..T or a row shorter than W − 2 + T rejected with the pool untouched (declared ``in_row``; the rejections with ``rejections``) |
| ``varlen`` | vLLM's varlen speculative form (``query_start_loc`` / ``max_query_len`` keywords, x [tokens, C] packed, [N] rows with ``num_accepted_tokens``, rows of W − 2 + max_query_len and a longer one): requests of 1 .. max_query_len tokens and none, −1 rows, every accepted count, fp32 and bf16 against ``gdn_ref.conv.causal_conv1d_update_varlen``, rows bit for bit (a request's row past its W − 2 + len entries kept); bounds not from 0, decreasing, of the wrong length or not ending at the tokens rejected with the pool untouched (declared ``varlen``; the rejections with ``rejections``) |
| ``rejections`` | wrong widths, a window longer than the state, mismatched channels, rows out of range or repeated: an exception, the pool untouched (declared ``rejections``) |
| ``batch_invariance`` | a request's outputs and window keep every bit whatever else shares the call and wherever it sits |
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from gdn_ref.conv import causal_conv1d_decode_pool, causal_conv1d_update_varlen

from ..metrics import compare, describe

CAPABILITIES_ATTR = "gdn_spec_conv_capabilities"
DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}
POOL_ROWS = 40


class ConvCheckError(AssertionError):
    """A conv kernel broke a rule of the family; the message says which and how."""


@dataclass(frozen=True)
class ConvCapabilities:
    """What a conv kernel declares (``gdn_spec_conv_capabilities`` on the callable, or its adapter's)."""

    name: str = "conv kernel"
    per_token_rows: bool = False  # [N, T] rows and num_accepted_tokens
    in_row: bool = False  # vLLM's in-row form: [N] rows with num_accepted_tokens, rows of L >= W − 2 + T
    varlen: bool = False  # vLLM's varlen speculative form: the query_start_loc and max_query_len keywords
    rejections: bool = False  # raises on invalid calls with the pool untouched (the api profile)
    padding_zeros: bool = True  # a −1 request's outputs are zeros
    widths: tuple[int, ...] = (2, 3, 4, 5)
    channel_quantum: int = 16  # channel counts the kernel takes are multiples of this
    window_extra: tuple[int, ...] = (0, 1)  # L − (W − 1) the kernel takes: 0, and HF's L = W

    @classmethod
    def from_mapping(cls, declared: dict[str, Any] | None) -> ConvCapabilities:
        known = {k: v for k, v in (declared or {}).items() if k in cls.__dataclass_fields__}
        for key in ("widths", "window_extra"):
            if key in known:
                known[key] = tuple(known[key])
        return cls(**known)


@dataclass
class Report:
    """Each check's verdict: "passed", "skipped: why", or the failure's message."""

    kernel: str
    verdicts: dict[str, str] = field(default_factory=dict)

    @property
    def failed(self) -> list[str]:
        return [name for name, verdict in self.verdicts.items() if not verdict.startswith(("passed", "skipped"))]

    def table(self) -> str:
        lines = [f"| check | {self.kernel} |", "|---|---|"]
        lines += [f"| {name} | {verdict.splitlines()[0]} |" for name, verdict in self.verdicts.items()]
        return "\n".join(lines)


Kernel = Callable[..., tuple[np.ndarray, np.ndarray]]


def _case(rng: np.random.Generator, caps: ConvCapabilities, n: int, tokens: int, dtype: str = "float32",
          width: int = 4, extra: int = 0, channels: int | None = None) -> dict[str, Any]:  # fmt: skip
    """One call's tensors from a seed: x, a NaN-poisoned pool (rows a call names get finite windows), taps, bias."""
    cd = DTYPES[dtype]
    channels = channels or caps.channel_quantum * int(rng.integers(1, 3))
    pool = np.full((POOL_ROWS, channels, width - 1 + extra), np.nan, np.float32).astype(cd)
    return dict(
        x=rng.standard_normal((n, tokens, channels)).astype(cd),
        pool=pool,
        weight=(0.5 * rng.standard_normal((channels, width))).astype(np.float32),
        bias=(0.1 * rng.standard_normal(channels)).astype(np.float32),
    )


def _fill(rng: np.random.Generator, pool: np.ndarray, rows: np.ndarray) -> None:
    """Finite windows in the rows a call names (every other row stays NaN: a kernel reading one is caught)."""
    for row in np.unique(np.asarray(rows)):
        if row >= 0:
            pool[row] = rng.standard_normal(pool.shape[1:]).astype(pool.dtype)


def _run(kernel: Kernel, call: dict[str, Any], rows: np.ndarray, accepted: np.ndarray | None = None,
         activation: str | None = "silu", bias: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """The kernel's (out, pool after) and the oracle's, from the same pool."""
    before = call["pool"].copy()
    b = call["bias"] if bias else None
    out, pool = kernel(call["x"], call["pool"], call["weight"], b, rows, accepted, activation=activation)
    ref_out, ref_pool = causal_conv1d_decode_pool(call["x"], call["weight"], b, before, rows, accepted, activation)
    return np.asarray(out), np.asarray(pool), ref_out, ref_pool


def _same_rows(got: np.ndarray, ref: np.ndarray, what: str) -> None:
    """Every row bit for bit (NaN rows compared as bits: untouched)."""
    want = ref.astype(got.dtype)
    bad = [r for r in range(got.shape[0]) if got[r].tobytes() != want[r].tobytes()]
    if bad:
        raise ConvCheckError(f"{what}: pool rows {bad[:5]} differ from the oracle's (named rows hold the windows, "
                               "every other row keeps its bytes)")  # fmt: skip


def check_numerics(kernel: Kernel, caps: ConvCapabilities, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for dtype in DTYPES:
        for width in caps.widths:
            extra = caps.window_extra[int(rng.integers(len(caps.window_extra)))]
            n, tokens = int(rng.integers(1, 10)), int(rng.integers(1, 4))
            call = _case(rng, caps, n, tokens, dtype, width, extra)
            rows = rng.permutation(POOL_ROWS)[:n].astype(np.int32)
            _fill(rng, call["pool"], rows)
            activation = ("silu", None)[int(rng.integers(2))]
            bias = bool(rng.integers(2))
            out, _, ref_out, _ = _run(kernel, call, rows, activation=activation, bias=bias)
            error = compare("out", out, ref_out, dtype)
            if not error.ok:
                raise ConvCheckError(f"{dtype} W={width} L={width - 1 + extra} N={n} T={tokens} activation="
                                       f"{activation} bias={bias}: {describe([error])}")  # fmt: skip


def check_pool(kernel: Kernel, caps: ConvCapabilities, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for n, tokens in ((6, 1), (30, 3)):  # 30: past a few groups of requests, where kernels loop
        call = _case(rng, caps, n, tokens)
        rows = rng.permutation(POOL_ROWS)[:n].astype(np.int32)
        _fill(rng, call["pool"], rows)
        _, pool, _, ref_pool = _run(kernel, call, rows)
        _same_rows(pool, ref_pool, f"[N] rows, T={tokens}")


def check_padding(kernel: Kernel, caps: ConvCapabilities, seed: int) -> None:
    rng = np.random.default_rng(seed)
    call = _case(rng, caps, 5, 2)
    rows = rng.permutation(POOL_ROWS)[:5].astype(np.int32)
    rows[[1, 3]] = -1
    _fill(rng, call["pool"], rows)
    out, pool, _, ref_pool = _run(kernel, call, rows)
    _same_rows(pool, ref_pool, "with -1 requests")
    if caps.padding_zeros and np.asarray(out[[1, 3]], dtype=np.float64).any():
        raise ConvCheckError("a -1 request's outputs must be zeros")


def check_rollback(kernel: Kernel, caps: ConvCapabilities, seed: int) -> None:
    if not caps.per_token_rows:
        raise NotApplicableError("the kernel does not declare per_token_rows ([N, T] rows, num_accepted_tokens)")
    rng = np.random.default_rng(seed)
    n, tokens = 4, 3
    call = _case(rng, caps, n, tokens)
    rows = rng.permutation(POOL_ROWS)[: n * tokens].reshape(n, tokens).astype(np.int32)
    _fill(rng, call["pool"], rows)
    start = call["pool"].copy()
    _, pool, _, ref_pool = _run(kernel, call, rows)
    _same_rows(pool, ref_pool, "[N, T] rows: the window after every token")
    accepted = rng.integers(1, tokens + 1, n).astype(np.int32)
    nxt = dict(call, x=rng.standard_normal((n, tokens, call["x"].shape[2])).astype(call["x"].dtype), pool=pool)
    out, _, _, _ = _run(kernel, nxt, rows, accepted)
    for i in range(n):
        one = dict(call, pool=start.copy())
        row = rows[i, :1].copy()
        for t in range(accepted[i]):
            kernel(call["x"][i : i + 1, t : t + 1], one["pool"], call["weight"], call["bias"], row, activation="silu")
        ref, _ = kernel(nxt["x"][i : i + 1, :1], one["pool"], call["weight"], call["bias"], row, activation="silu")
        if np.asarray(out)[i, 0].tobytes() != np.asarray(ref)[0, 0].tobytes():
            raise ConvCheckError(f"request {i}: resuming after {accepted[i]} accepted tokens differs from decoding "
                                   "them one by one (the window must roll back as the recurrent state does)")  # fmt: skip


def check_in_row(kernel: Kernel, caps: ConvCapabilities, seed: int) -> None:
    if not caps.in_row:
        raise NotApplicableError("the kernel does not declare in_row (vLLM's [N] rows with num_accepted_tokens)")
    rng = np.random.default_rng(seed)
    width = 4 if 4 in caps.widths else caps.widths[-1]
    for dtype, n, tokens, extra in (("float32", 7, 3, 0), ("bfloat16", 11, 4, 0), ("float32", 5, 2, 1)):
        call = _case(rng, caps, n, tokens, dtype, width, tokens - 1 + extra)  # L = W − 2 + T (+ extra)
        rows = rng.permutation(POOL_ROWS)[:n].astype(np.int32)
        rows[int(rng.integers(n))] = -1
        _fill(rng, call["pool"], rows)
        accepted = (rng.permutation(n) % tokens + 1).astype(np.int32)  # every count 1..T
        out, pool, ref_out, ref_pool = _run(kernel, call, rows, accepted)
        what = f"{dtype} N={n} T={tokens} L={call['pool'].shape[2]} counts {accepted.tolist()}"
        error = compare("out", out, ref_out, dtype)
        if not error.ok:
            raise ConvCheckError(f"in-row {what}: {describe([error])}")
        _same_rows(pool, ref_pool, f"in-row {what}")
    _in_row_resume(kernel, caps, rng, width)
    if caps.rejections:
        call = _case(rng, caps, 2, 2, width=width, extra=1)
        call["rows"] = np.array([3, 7], np.int32)
        _fill(rng, call["pool"], call["rows"])

        def run_in_row(case: dict[str, Any]) -> None:
            kernel(case["x"], case["pool"], case["weight"], case["bias"], case["rows"], case["accepted"],
                   activation="silu")  # fmt: skip

        expect_rejections(run_in_row, {**call, "accepted": np.array([1, 2], np.int32)},
                          {"an accepted count past T": dict(accepted=np.array([1, 3], np.int32)),
                           "an accepted count of 0": dict(accepted=np.array([0, 1], np.int32)),
                           "a row shorter than W - 2 + T": dict(pool=call["pool"][:, :, 1:].copy())})  # fmt: skip


def _in_row_resume(kernel: Kernel, caps: ConvCapabilities, rng: np.random.Generator, width: int) -> None:
    """Verify T = 3 from offset 0, resume from offset a − 1: the outputs equal decoding the a accepted tokens one
    by one on a plain pool (L = W − 1) from the same window, bit for bit."""
    n, tokens = 4, 3
    call = _case(rng, caps, n, tokens, width=width, extra=tokens - 1)
    rows = rng.permutation(POOL_ROWS)[:n].astype(np.int32)
    _fill(rng, call["pool"], rows)
    plain = call["pool"][:, :, : width - 1].copy()
    kernel(call["x"], call["pool"], call["weight"], call["bias"], rows, np.ones(n, np.int32), activation="silu")
    accepted = rng.integers(1, tokens + 1, n).astype(np.int32)
    nxt = rng.standard_normal(call["x"].shape).astype(call["x"].dtype)
    out, _ = kernel(nxt, call["pool"], call["weight"], call["bias"], rows, accepted, activation="silu")
    for i in range(n):
        row = rows[i : i + 1].copy()
        for t in range(accepted[i]):
            kernel(call["x"][i : i + 1, t : t + 1], plain, call["weight"], call["bias"], row, activation="silu")
        ref, _ = kernel(nxt[i : i + 1, :1], plain, call["weight"], call["bias"], row, activation="silu")
        if np.asarray(out)[i, 0].tobytes() != np.asarray(ref)[0, 0].tobytes():
            raise ConvCheckError(f"in-row request {i}: resuming at offset {accepted[i] - 1} differs from decoding "
                                 f"the {accepted[i]} accepted tokens one by one")  # fmt: skip


VARLEN_LENGTHS = (1, 4, 0, 2, 4, 3, 1, 4, 2)  # max_query_len 4: a request of one token, of four, of none


def check_varlen(kernel: Kernel, caps: ConvCapabilities, seed: int) -> None:
    if not caps.varlen:
        raise NotApplicableError("the kernel does not declare varlen (vLLM's query_start_loc speculative form)")
    rng = np.random.default_rng(seed)
    width, tokens = (4 if 4 in caps.widths else caps.widths[-1]), max(VARLEN_LENGTHS)
    bounds = np.concatenate([[0], np.cumsum(VARLEN_LENGTHS)]).astype(np.int32)
    n = len(VARLEN_LENGTHS)

    def varlen(case: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        return kernel(case["x"], case["pool"], case["weight"], case["bias"], case["rows"], case["accepted"],
                      activation="silu", query_start_loc=case["bounds"], max_query_len=tokens)  # fmt: skip

    for dtype, extra in (("float32", 0), ("bfloat16", 0), ("float32", 2)):
        call = _case(rng, caps, 1, 1, dtype, width, tokens - 1 + extra)  # L = W − 2 + max_query_len (+ extra)
        call["x"] = rng.standard_normal((int(bounds[-1]), call["x"].shape[2])).astype(call["x"].dtype)
        rows = rng.permutation(POOL_ROWS)[:n].astype(np.int32)
        rows[int(rng.integers(n))] = -1
        _fill(rng, call["pool"], rows)
        accepted = (rng.permutation(n) % tokens + 1).astype(np.int32)
        before = call["pool"].copy()
        out, pool = varlen({**call, "rows": rows, "accepted": accepted, "bounds": bounds})
        ref_out, ref_pool = causal_conv1d_update_varlen(call["x"], call["weight"], call["bias"], before, bounds, rows,
                                                        accepted, tokens, "silu")  # fmt: skip
        what = f"varlen {dtype} L={call['pool'].shape[2]} lengths {list(VARLEN_LENGTHS)} counts {accepted.tolist()}"
        error = compare("out", np.asarray(out)[np.repeat(rows >= 0, VARLEN_LENGTHS)],
                        ref_out[np.repeat(rows >= 0, VARLEN_LENGTHS)], dtype)  # fmt: skip
        if not error.ok:
            raise ConvCheckError(f"{what}: {describe([error])}")
        _same_rows(np.asarray(pool), ref_pool, what)
    if caps.rejections:
        call["pool"] = before
        valid = {**call, "rows": rows, "accepted": accepted, "bounds": bounds}
        expect_rejections(varlen, valid, {
            "query_start_loc not from 0": dict(bounds=bounds + 1),
            "query_start_loc decreasing": dict(bounds=np.concatenate([bounds[:2], bounds[1:2] - 1, bounds[3:]])),
            "query_start_loc of the wrong length": dict(bounds=bounds[:-1].copy()),
            "query_start_loc not ending at the tokens": dict(bounds=np.concatenate([bounds[:-1], bounds[-1:] - 1])),
        })  # fmt: skip


def check_rejections(kernel: Kernel, caps: ConvCapabilities, seed: int) -> None:
    if not caps.rejections:
        raise NotApplicableError("the kernel does not declare rejections (the math profile: numbers only)")
    rng = np.random.default_rng(seed)
    base = _case(rng, caps, 2, 1, channels=caps.channel_quantum)
    good = np.array([3, 7], np.int32)
    _fill(rng, base["pool"], good)

    def call(case: dict[str, Any]) -> None:
        kernel(case["x"], case["pool"], case["weight"], case["bias"], case["rows"], activation="silu")

    expect_rejections(call, {**base, "rows": good}, invalid_operands(base["x"].shape[-1], base["pool"].dtype))


def invalid_operands(channels: int, pool_dtype: Any) -> dict[str, dict[str, Any]]:
    """The invalid calls every conv kernel must reject, as changes to a valid call's operands (``rows`` [2]:
    3 and 7 in the valid call)."""
    return {
        "a width outside 2..5": dict(weight=np.zeros((channels, 6), np.float32)),
        "a window longer than the state": dict(weight=np.zeros((channels, 5), np.float32)),
        "mismatched channels (weight)": dict(weight=np.zeros((channels + 16, 4), np.float32)),
        "mismatched channels (pool)": dict(pool=np.zeros((POOL_ROWS, channels + 16, 3), pool_dtype)),
        "a row out of range": dict(rows=np.array([3, POOL_ROWS], np.int32)),
        "a repeated row": dict(rows=np.array([3, 3], np.int32)),
    }


def expect_rejections(call: Callable[[dict[str, Any]], None], valid: dict[str, Any],
                      invalid: dict[str, dict[str, Any]]) -> None:  # fmt: skip
    """Each invalid change to ``valid`` must raise (any error) and leave the pool's bytes as they were."""
    for what, change in invalid.items():
        case = {**valid, **change}
        case["pool"] = case["pool"].copy()
        before = case["pool"].tobytes()
        try:
            call(case)
        except Exception:  # any error rejects; the pool is what is checked
            if case["pool"].tobytes() != before:
                raise ConvCheckError(f"{what}: rejected, but the pool was modified") from None
            continue
        raise ConvCheckError(f"{what}: the call was accepted")


def check_batch_invariance(kernel: Kernel, caps: ConvCapabilities, seed: int) -> None:
    rng = np.random.default_rng(seed)
    probe = _case(rng, caps, 1, 2, channels=caps.channel_quantum)
    window = rng.standard_normal(probe["pool"].shape[1:]).astype(probe["pool"].dtype)
    seen = set()
    for n, at in ((1, 0), (5, 3), (11, 10), (9, 0)):
        call = dict(probe, x=rng.standard_normal((n, 2, probe["x"].shape[2])).astype(probe["x"].dtype))
        call["x"][at] = probe["x"][0]
        call["pool"] = probe["pool"].copy()
        rows = rng.permutation(POOL_ROWS)[:n].astype(np.int32)
        _fill(rng, call["pool"], rows)
        call["pool"][rows[at]] = window
        out, pool = kernel(call["x"], call["pool"], call["weight"], call["bias"], rows, activation="silu")
        seen.add((np.asarray(out)[at].tobytes(), np.asarray(pool)[rows[at]].tobytes()))
    if len(seen) != 1:
        raise ConvCheckError("one request's outputs or window changed with the other requests of the call")


class NotApplicableError(Exception):
    """A check that does not apply to the kernel (its reason)."""


CHECKS: dict[str, Callable[[Kernel, ConvCapabilities, int], None]] = {
    "numerics": check_numerics,
    "pool": check_pool,
    "padding": check_padding,
    "rollback": check_rollback,
    "in_row": check_in_row,
    "varlen": check_varlen,
    "rejections": check_rejections,
    "batch_invariance": check_batch_invariance,
}


def run(kernel: Kernel, caps: ConvCapabilities | None = None, seed: int = 0) -> Report:
    """Every check of the family on ``kernel`` (capabilities from its ``gdn_spec_conv_capabilities`` unless given).

    Returns:
        Report: each check's verdict; ``report.failed`` names the failures.
    """
    caps = caps or ConvCapabilities.from_mapping(getattr(kernel, CAPABILITIES_ATTR, None))
    report = Report(caps.name)
    for name, check in CHECKS.items():
        try:
            check(kernel, caps, seed)
        except NotApplicableError as skip:
            report.verdicts[name] = f"skipped: {skip}"
        except ConvCheckError as failure:
            report.verdicts[name] = f"FAILED: {failure}"
        except Exception as crash:  # a kernel that raises where the call is valid fails that check, not the run
            report.verdicts[name] = f"FAILED: the kernel raised {type(crash).__name__}: {crash}"
        else:
            report.verdicts[name] = "passed"
    return report
