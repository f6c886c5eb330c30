"""The conv family's power: the oracle as a kernel passes every check, HF's torch update passes the checks it
declares, and each planted bug is caught by the check that names it."""

from __future__ import annotations

import numpy as np
import pytest

from gdn_ref.contract import ContractError
from gdn_ref.conv import causal_conv1d_decode_pool
from gdn_spec.conv import (
    CAPABILITIES_ATTR,
    PREFILL_CAPABILITIES_ATTR,
    ConvCapabilities,
    PrefillCapabilities,
    run,
    run_prefill,
)
from gdn_spec.conv.adapters import hf_conv_fn, hf_update, reference, reference_prefill


def test_the_oracle_passes_every_check() -> None:
    report = run(reference())
    assert not report.failed, report.table()
    assert set(report.verdicts.values()) == {"passed"}


def test_hf_update_through_pool_glue() -> None:
    modeling = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    fn = getattr(modeling, "causal_conv1d_update", None) or modeling.torch_causal_conv1d_update
    report = run(hf_update(fn))
    assert not report.failed, report.table()
    assert report.verdicts["rollback"].startswith("skipped") and report.verdicts["numerics"] == "passed"


def _mutant(change):
    """The oracle kernel with one planted bug: ``change(args) -> args`` before the oracle, or a post-hook."""
    good = reference()

    def kernel(x, conv_pool, weight, bias, state_indices, num_accepted_tokens=None, *, activation="silu"):
        return change(good, x, conv_pool, weight, bias, state_indices, num_accepted_tokens, activation)

    setattr(kernel, CAPABILITIES_ATTR, getattr(good, CAPABILITIES_ATTR))
    return kernel


def _first_window_entries(good, x, pool, w, b, rows, acc, act):
    """Reads the window's first W - 1 entries instead of its last (vLLM's non-speculative reading of a longer row)."""
    width = w.shape[1]
    shifted = pool.copy()
    shifted[..., pool.shape[2] - (width - 1) :] = pool[..., : width - 1]
    out, _ = causal_conv1d_decode_pool(x, w, b, shifted, rows, acc, act)
    _, after = causal_conv1d_decode_pool(x, w, b, pool, rows, acc, act)
    pool[...] = after.astype(pool.dtype)
    return out.astype(x.dtype), pool


def _padding_not_skipped(good, x, pool, w, b, rows, acc, act):
    out, pool = good(x, pool, w, b, rows, acc, activation=act)
    flat = np.asarray(rows).reshape(len(rows), -1)
    if (flat[:, 0] < 0).any():
        pool[-1] = 0  # a -1 request's window lands in the pool's last row (-1 read as an index from the end)
    return out, pool


def _no_rollback(good, x, pool, w, b, rows, acc, act):
    return good(x, pool, w, b, rows, None, activation=act)  # always resumes from row [n, 0]


def _in_row_from_offset_0(good, x, pool, w, b, rows, acc, act):
    if acc is not None and np.ndim(rows) == 1:
        acc = np.ones_like(acc)  # vLLM's in-row form read from the row's start whatever the count
    return good(x, pool, w, b, rows, acc, activation=act)


def _in_row_window_at_the_end(good, x, pool, w, b, rows, acc, act):
    """Reads the in-row window from offset a − 2 (off by one; a count of 1 still from 0)."""
    if acc is not None and np.ndim(rows) == 1:
        acc = np.maximum(acc - 1, 1)
    return good(x, pool, w, b, rows, acc, activation=act)


def _in_row_whole_row_written(good, x, pool, w, b, rows, acc, act):
    """A longer in-row row rewritten whole, R[o + 1 .. o + L − T] ++ the tokens (gdn-nki's behaviour before it
    followed vLLM's kernel, which writes only the first W − 2 + T entries)."""
    before = pool.copy()
    out, pool = good(x, pool, w, b, rows, acc, activation=act)
    if acc is not None and np.ndim(rows) == 1:
        tokens = x.shape[1]
        for n, row in enumerate(rows):
            if row >= 0:
                o = int(acc[n]) - 1
                pool[row, :, : pool.shape[2] - tokens] = before[row, :, o + 1 : o + 1 + pool.shape[2] - tokens]
    return out, pool


def _no_checks(good, x, pool, w, b, rows, acc, act):
    try:
        return good(x, pool, w, b, rows, acc, activation=act)
    except Exception:
        pool[...] = 0  # accepts invalid calls (and writes)
        return np.zeros(np.shape(x)), pool


def _stray_write(good, x, pool, w, b, rows, acc, act):
    out, pool = good(x, pool, w, b, rows, acc, activation=act)
    named = set(np.asarray(rows).reshape(-1).tolist())
    stray = next(r for r in range(pool.shape[0]) if r not in named)
    pool[stray] = 0
    return out, pool


def _batch_dependent(good, x, pool, w, b, rows, acc, act):
    out, pool = good(x, pool, w, b, rows, acc, activation=act)
    return (out * (1 + 1e-3 * (len(rows) > 4))).astype(x.dtype), pool


MUTANTS = {
    "window offset": (_first_window_entries, {"numerics", "pool"}),
    "-1 row not skipped": (_padding_not_skipped, {"padding"}),
    "no rollback": (_no_rollback, {"rollback"}),
    "in-row offset ignored": (_in_row_from_offset_0, {"in_row"}),
    "in-row offset one short": (_in_row_window_at_the_end, {"in_row"}),
    "in-row longer row rewritten whole": (_in_row_whole_row_written, {"in_row"}),
    "no rejections": (_no_checks, {"rejections"}),
    "a row not named written": (_stray_write, {"pool", "padding"}),
    "batch dependent": (_batch_dependent, {"batch_invariance"}),
}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_each_planted_bug_is_caught_by_its_check(name: str) -> None:
    change, checks = MUTANTS[name]
    report = run(_mutant(change), ConvCapabilities(name=name, per_token_rows=True, in_row=True, rejections=True))
    assert set(report.failed) & checks, report.table()


# --- the prefill checks -----------------------------------------------------------------------------------------


def test_the_prefill_oracle_passes_every_prefill_check() -> None:
    report = run_prefill(reference_prefill())
    assert not report.failed, report.table()
    assert report.verdicts["prefill_rejections"].startswith("skipped"), "the oracle checks nothing: math profile"


def test_hf_causal_conv1d_fn_through_its_cache_glue() -> None:
    modeling = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    if not hasattr(modeling, "causal_conv1d_fn"):
        pytest.skip("this transformers has no causal_conv1d_fn")
    report = run_prefill(hf_conv_fn(modeling.causal_conv1d_fn))
    assert not report.failed, report.table()
    assert report.verdicts["checkpoints"].startswith("skipped")


def _prefill_mutant(change):
    good = reference_prefill()

    def kernel(x, pool, weight, bias, cu, rows, *, activation="silu", checkpoint_every=None, checkpoint_indices=None,
               read_indices=None):  # fmt: skip
        layout = dict(checkpoint_every=checkpoint_every, checkpoint_indices=checkpoint_indices,
                      read_indices=read_indices)  # fmt: skip
        return change(good, x, pool, weight, bias, cu, rows, layout)

    setattr(kernel, PREFILL_CAPABILITIES_ATTR, getattr(good, PREFILL_CAPABILITIES_ATTR))
    return kernel


def _checkpoint_a_token_late(good, x, pool, w, b, cu, rows, layout):
    if layout["checkpoint_every"]:
        before = pool.copy()
        out, pool = good(x, pool, w, b, cu, rows, **layout)
        late = before.copy()
        good(x, late, w, b, cu, rows, **dict(layout, checkpoint_every=layout["checkpoint_every"] + 1))
        for row in np.asarray(layout["checkpoint_indices"]).reshape(-1):
            if row >= 0:
                pool[row] = late[row]
        return out, pool
    return good(x, pool, w, b, cu, rows, **layout)


def _minus_one_read_as_last_row(good, x, pool, w, b, cu, rows, layout):
    reads = np.asarray(rows if layout["read_indices"] is None else layout["read_indices"])
    fixed = np.where(reads < 0, pool.shape[0] - 1, reads).astype(np.int32)  # a -1 read as "the last row"
    pool[-1] = np.where(np.isnan(pool[-1].astype(np.float32)), 0, pool[-1]).astype(pool.dtype)
    return good(x, pool, w, b, cu, rows, **dict(layout, read_indices=fixed))


def _prefill_batch_dependent(good, x, pool, w, b, cu, rows, layout):
    out, pool = good(x, pool, w, b, cu, rows, **layout)
    return (out * (1 + 1e-3 * (len(rows) > 2))).astype(x.dtype), pool


PREFILL_MUTANTS = {
    "checkpoint a token late": (_checkpoint_a_token_late, {"checkpoints"}),
    "-1 read as a row": (_minus_one_read_as_last_row, {"prefill_rows", "prefill_numerics"}),
    "batch dependent": (_prefill_batch_dependent, {"prefill_batch_invariance"}),
}


@pytest.mark.parametrize("name", sorted(PREFILL_MUTANTS))
def test_each_planted_prefill_bug_is_caught(name: str) -> None:
    change, checks = PREFILL_MUTANTS[name]
    report = run_prefill(_prefill_mutant(change))
    assert set(report.failed) & checks, report.table()


def test_a_prefill_kernel_accepting_invalid_calls_fails_the_rejections() -> None:
    caps = PrefillCapabilities(name="accepts all", checkpoints=True, read_rows=True, rejections=True)
    report = run_prefill(reference_prefill(), caps)
    assert report.failed == ["prefill_rejections"], report.table()


# --- the varlen check ---------------------------------------------------------------------------------------------


def _varlen_mutant(change):
    """The oracle kernel with one planted bug in its varlen form, ``change(good, args, options) -> (out, pool)``."""
    good = reference()

    def kernel(x, conv_pool, weight, bias, rows, accepted=None, *, activation="silu", query_start_loc=None,
               max_query_len=-1):  # fmt: skip
        args = (x, conv_pool, weight, bias, rows, accepted)
        if query_start_loc is None:
            return good(*args, activation=activation)
        return change(good, args, dict(activation=activation, query_start_loc=query_start_loc,
                                       max_query_len=max_query_len))  # fmt: skip

    setattr(kernel, CAPABILITIES_ATTR, getattr(good, CAPABILITIES_ATTR))
    return kernel


def _whole_rows_written(good, args, options):
    """A short request's row past its W − 2 + len entries zeroed (a kernel padding the requests to max_query_len
    without keeping the row's tail)."""
    _, _, weight, _, rows, _ = args
    bounds = np.asarray(options["query_start_loc"])
    out, pool = good(*args, **options)
    for n, row in enumerate(rows):
        if row >= 0 and bounds[n + 1] > bounds[n]:
            pool[row, :, weight.shape[1] - 2 + bounds[n + 1] - bounds[n] :] = 0
    return out, pool


def _bounds_unchecked(good, args, options):
    """Accepts bad bounds: a rejected call answered with zeros instead."""
    try:
        return good(*args, **options)
    except ContractError:
        return np.zeros(np.shape(args[0]), args[0].dtype), args[1]


@pytest.mark.parametrize("change", [_whole_rows_written, _bounds_unchecked], ids=["tail overwritten", "no checks"])
def test_each_planted_varlen_bug_fails_the_varlen_check(change) -> None:
    report = run(_varlen_mutant(change), ConvCapabilities(name="mutant", in_row=True, varlen=True, rejections=True))
    assert "varlen" in report.failed, report.table()


def test_a_kernel_without_varlen_skips_it() -> None:
    report = run(reference(), ConvCapabilities(name="no varlen", in_row=True))
    assert report.verdicts["varlen"].startswith("skipped"), report.table()
