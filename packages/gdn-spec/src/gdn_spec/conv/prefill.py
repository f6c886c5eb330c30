"""The conv family's prefill checks: what a conv kernel over packed sequences on a conv-state pool must do, on any
kernel with ``gdn_nki.conv_prefill_bucket``'s signature (directly or through ``prefill_adapters``).

A prefill kernel here is ``kernel(x, conv_pool, weight, bias, cu_seqlens, state_indices, *, activation="silu",
checkpoint_every=None, checkpoint_indices=None, read_indices=None) -> (out, conv_pool)``: x [tokens, C] packed
(vLLM's ``query_start_loc`` layout), a pool [P, C, L] updated in place, ``gdn_ref.conv.causal_conv1d_prefill_pool``'s
semantics. Checks, each from a seed, against the fp64 oracle (outputs within ``gdn_spec.metrics``' table, windows
bit for bit, every row not named keeping its bytes — rows no call names are NaN-poisoned):

| check | what it holds |
|---|---|
| ``prefill_numerics`` | packed sequences of random lengths (empty ones too) from their windows |
| ``prefill_rows`` | −1 rows (an empty window, nothing stored) and rows read that are not written (``read_indices``, declared ``read_rows``) |
| ``checkpoints`` | the window after every ``checkpoint_every`` tokens in its row, none past a sequence's end (declared ``checkpoints``) |
| ``prefill_batch_invariance`` | a sequence's outputs and final window keep every bit whatever shares the call |
| ``prefill_rejections`` | wrong widths, a window longer than the state, mismatched channels, rows out of range or repeated, bad bounds: an exception, the pool untouched (declared ``rejections``) |
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gdn_ref.conv import causal_conv1d_prefill_pool

from ..metrics import compare, describe
from .checks import DTYPES, POOL_ROWS, ConvCheckError, NotApplicableError, Report, expect_rejections, invalid_operands

PREFILL_CAPABILITIES_ATTR = "gdn_spec_conv_prefill_capabilities"
CHECKPOINT_EVERY = 128  # the recurrent bucket's chunk: the spacing both kinds of checkpoint share


@dataclass(frozen=True)
class PrefillCapabilities:
    """What a conv prefill kernel declares (``gdn_spec_conv_prefill_capabilities``, or its adapter's)."""

    name: str = "conv prefill kernel"
    checkpoints: bool = False
    read_rows: bool = False
    rejections: bool = False  # raises on invalid calls with the pool untouched (the api profile)
    channel_quantum: int = 16

    @classmethod
    def from_mapping(cls, declared: dict[str, Any] | None) -> PrefillCapabilities:
        return cls(**{k: v for k, v in (declared or {}).items() if k in cls.__dataclass_fields__})


Kernel = Callable[..., tuple[np.ndarray, np.ndarray]]


def _call(rng: np.random.Generator, caps: PrefillCapabilities, lengths: list[int], dtype: str = "float32",
          width: int = 4) -> dict[str, Any]:  # fmt: skip
    cd = DTYPES[dtype]
    channels = caps.channel_quantum * 2
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    pool = np.full((POOL_ROWS, channels, width - 1), np.nan, np.float32).astype(cd)
    return dict(
        x=rng.standard_normal((int(cu[-1]), channels)).astype(cd),
        pool=pool,
        weight=(0.5 * rng.standard_normal((channels, width))).astype(np.float32),
        bias=(0.1 * rng.standard_normal(channels)).astype(np.float32),
        cu=cu,
    )


def _fill(rng: np.random.Generator, pool: np.ndarray, *tables: Any) -> None:
    for table in tables:
        for row in np.unique(np.asarray(table)) if table is not None else ():
            if row >= 0:
                pool[row] = rng.standard_normal(pool.shape[1:]).astype(pool.dtype)


def _check(kernel: Kernel, call: dict[str, Any], rows: np.ndarray, dtype: str, what: str, **layout: Any) -> np.ndarray:
    before = call["pool"].copy()
    out, pool = kernel(call["x"], call["pool"], call["weight"], call["bias"], call["cu"], rows, **layout)
    ref_out, ref_pool = causal_conv1d_prefill_pool(
        call["x"], call["weight"], call["bias"], call["cu"], before, rows, "silu", layout.get("checkpoint_every"),
        layout.get("checkpoint_indices"), layout.get("read_indices"),
    )  # fmt: skip
    error = compare("out", np.asarray(out), ref_out, dtype)
    if not error.ok:
        raise ConvCheckError(f"{what}: {describe([error])}")
    want = ref_pool.astype(pool.dtype)
    bad = [r for r in range(pool.shape[0]) if np.asarray(pool)[r].tobytes() != want[r].tobytes()]
    if bad:
        raise ConvCheckError(f"{what}: pool rows {bad[:5]} differ from the oracle's (named rows hold the windows, "
                             "every other row keeps its bytes)")  # fmt: skip
    return np.asarray(out)


def check_prefill_numerics(kernel: Kernel, caps: PrefillCapabilities, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for dtype in DTYPES:
        lengths = [int(n) for n in rng.integers(0, 90, int(rng.integers(1, 6)))]
        lengths[0] = max(lengths[0], 1)
        call = _call(rng, caps, lengths, dtype)
        rows = rng.permutation(POOL_ROWS)[: len(lengths)].astype(np.int32)
        _fill(rng, call["pool"], rows)
        _check(kernel, call, rows, dtype, f"{dtype} lengths {lengths}")


def check_prefill_rows(kernel: Kernel, caps: PrefillCapabilities, seed: int) -> str | None:
    rng = np.random.default_rng(seed)
    lengths = [5, 2, 40, 0, 1]
    call = _call(rng, caps, lengths)
    rows = rng.permutation(POOL_ROWS)[:5].astype(np.int32)
    rows[[1, 4]] = -1
    _fill(rng, call["pool"], rows)
    _check(kernel, call, rows, "float32", "-1 rows (empty windows, nothing stored)")
    if not caps.read_rows:
        return "-1 rows only: the kernel does not declare read_rows (read_indices)"
    call = _call(rng, caps, lengths)
    spare = [r for r in range(POOL_ROWS) if r not in rows]
    reads = np.array([spare[0], -1, spare[1], spare[2], spare[0]], np.int32)  # rows may repeat (one cache row)
    _fill(rng, call["pool"], rows, reads)
    _check(kernel, call, rows, "float32", "read rows (a prefix-cache hit resumes from a row it does not write)",
           read_indices=reads)  # fmt: skip
    return None


def check_checkpoints(kernel: Kernel, caps: PrefillCapabilities, seed: int) -> None:
    if not caps.checkpoints:
        raise NotApplicableError("the kernel does not declare checkpoints")
    rng = np.random.default_rng(seed)
    lengths = [300, 128, 60, 0]
    call = _call(rng, caps, lengths)
    rows = np.array([0, 1, -1, 2], np.int32)
    table = np.array([[10, 11, 12], [13, 14, -1], [15, -1, -1], [16, 17, 18]], np.int32)
    _fill(rng, call["pool"], rows)
    _check(kernel, call, rows, "float32", "checkpoints every 128 tokens (300, 128, 60 and 0 tokens)",
           checkpoint_every=CHECKPOINT_EVERY, checkpoint_indices=table)  # fmt: skip


def check_prefill_batch_invariance(kernel: Kernel, caps: PrefillCapabilities, seed: int) -> None:
    rng = np.random.default_rng(seed)
    probe = _call(rng, caps, [37])
    window = rng.standard_normal(probe["pool"].shape[1:]).astype(probe["pool"].dtype)
    seen = set()
    for before in ([], [1, 1], [0, 70, 3], [2, 0, 0, 9]):
        lengths = [*before, 37]
        call = _call(rng, caps, lengths)
        at = len(before)
        call["x"][call["cu"][at] : call["cu"][at + 1]] = probe["x"]
        call.update(weight=probe["weight"], bias=probe["bias"])
        rows = (np.arange(len(lengths)) + 20).astype(np.int32)
        rows[at] = 3
        _fill(rng, call["pool"], rows)
        call["pool"][3] = window
        out, pool = kernel(call["x"], call["pool"], call["weight"], call["bias"], call["cu"], rows)
        seen.add((np.asarray(out)[call["cu"][at] : call["cu"][at + 1]].tobytes(), np.asarray(pool)[3].tobytes()))
    if len(seen) != 1:
        raise ConvCheckError("one sequence's outputs or final window changed with the other sequences of the call")


def check_prefill_rejections(kernel: Kernel, caps: PrefillCapabilities, seed: int) -> None:
    if not caps.rejections:
        raise NotApplicableError("the kernel does not declare rejections (the math profile: numbers only)")
    rng = np.random.default_rng(seed)
    base = _call(rng, caps, [5, 7])
    good = np.array([3, 7], np.int32)
    _fill(rng, base["pool"], good)

    def call(case: dict[str, Any]) -> None:
        kernel(case["x"], case["pool"], case["weight"], case["bias"], case["cu"], case["rows"])

    invalid = invalid_operands(base["x"].shape[1], base["pool"].dtype)
    invalid["cu_seqlens not ending at the tokens"] = dict(cu=np.array([0, 5, 9], np.int32))
    expect_rejections(call, {**base, "rows": good}, invalid)


PREFILL_CHECKS: dict[str, Callable[[Kernel, PrefillCapabilities, int], str | None]] = {
    "prefill_numerics": check_prefill_numerics,
    "prefill_rows": check_prefill_rows,
    "checkpoints": check_checkpoints,
    "prefill_batch_invariance": check_prefill_batch_invariance,
    "prefill_rejections": check_prefill_rejections,
}


def run_prefill(kernel: Kernel, caps: PrefillCapabilities | None = None, seed: int = 0) -> Report:
    """Every prefill check on ``kernel`` (capabilities from ``gdn_spec_conv_prefill_capabilities`` unless given)."""
    caps = caps or PrefillCapabilities.from_mapping(getattr(kernel, PREFILL_CAPABILITIES_ATTR, None))
    report = Report(caps.name)
    for name, check in PREFILL_CHECKS.items():
        try:
            note = check(kernel, caps, seed)
        except NotApplicableError as skip:
            report.verdicts[name] = f"skipped: {skip}"
        except ConvCheckError as failure:
            report.verdicts[name] = f"FAILED: {failure}"
        except Exception as crash:  # a kernel that raises where the call is valid fails that check, not the run
            report.verdicts[name] = f"FAILED: the kernel raised {type(crash).__name__}: {crash}"
        else:
            report.verdicts[name] = "passed" + (f" ({note})" if note else "")
    return report
