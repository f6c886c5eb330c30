"""The state pool: updated in place at exactly the rows the live requests name, every other row bit-identical,
and padding requests (-1) reading and writing nothing — whatever the addressing form.

A kernel indexing the pool with -1 as a Python index reads and writes the pool's last row: the cases leave the
last row unnamed (its bytes must not change) or give it to a live request (whose results must then be exact).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from gdn_spec.decode.cases import Addressing, errors_vs_oracle, make_decode_case
from gdn_spec.impl import Implementation

from ._decode_support import (
    base_geometry,
    call_of,
    caps_of,
    require,
    run_decode,
    unsupported_call,
    untouched_rows_changed,
)
from ._support import assert_close

FORMS = {
    "per_request": (1, Addressing()),
    "per_request_T3": (3, Addressing()),
    "per_token": (3, Addressing(per_token=True)),
    "per_token_accepted": (3, Addressing(per_token=True, accepted=True)),
}
PADDED = {
    "one_padding": (1, Addressing(padding=1)),
    "padding_last_row_live": (1, Addressing(padding=1, last_row_live=True)),
    "padding_per_token": (3, Addressing(per_token=True, accepted=True, padding=1)),
    "padding_per_token_last_row_live": (2, Addressing(per_token=True, padding=1, last_row_live=True)),
}

# A serving step's batch: more requests than a kernel may run in one fixed-size group (gdn-nki's compiled request
# loop runs 16 an iteration: here a full iteration and a partial one), with padding requests among them.
# Enough requests that a kernel issuing them as a compiled loop of fixed-size groups runs several iterations even
# when it splits them over two programs (gdn-nki's groups of 16 at launch grid 2: a program takes 20 of 40).
MANY_REQUESTS, MANY_PADDING = 40, 3


def _pool_case(
    gdn_impl: Implementation,
    gdn_dtype: str,
    tokens: int,
    addressing: Addressing,
    seed: int,
    requests: int | None = None,
):
    caps = caps_of(gdn_impl)
    require(caps.lacks("state_in_place"), caps.lacks("gating", "precomputed"))
    geometry = base_geometry(caps, tokens) if requests is None else base_geometry(caps, tokens, requests)
    require(unsupported_call(caps, geometry, addressing))
    return make_decode_case("random", geometry, gdn_dtype, seed, addressing=addressing)


def _check_rows(gdn_impl: Implementation, case) -> None:
    out, pool = run_decode(gdn_impl, call_of(case))
    touched = untouched_rows_changed(case, pool)
    assert not touched, (
        f"{case.describe()}: pool rows {touched} named by no live request changed (written rows: "
        f"{sorted(case.written_rows().tolist())}; -1 is padding, not the last row)"
    )
    assert_close(errors_vs_oracle(case, out, pool), case.describe())


@pytest.mark.parametrize("form", list(FORMS))
def test_updates_named_rows_only(gdn_impl: Implementation, gdn_dtype: str, form: str) -> None:
    tokens, addressing = FORMS[form]
    _check_rows(gdn_impl, _pool_case(gdn_impl, gdn_dtype, tokens, addressing, seed=101))


@pytest.mark.parametrize("form", list(PADDED))
def test_padding_reads_and_writes_nothing(gdn_impl: Implementation, gdn_dtype: str, form: str) -> None:
    require(caps_of(gdn_impl).lacks("padding"))
    tokens, addressing = PADDED[form]
    _check_rows(gdn_impl, _pool_case(gdn_impl, gdn_dtype, tokens, addressing, seed=103))


def test_a_batch_of_many_requests(gdn_impl: Implementation, gdn_dtype: str) -> None:
    """``MANY_REQUESTS`` requests of two tokens in one call (at most the declared ``max_requests``), per-token rows
    with ``num_accepted_tokens`` where declared and ``MANY_PADDING`` padding requests where declared: every live
    request's rows against the oracle, every other row bit-identical, however the kernel groups the requests."""
    caps = caps_of(gdn_impl)
    per_token = caps.per_token_states
    addressing = Addressing(per_token=per_token, accepted=per_token and caps.num_accepted_tokens)
    if caps.padding:  # one live request kept under a declared max_requests
        addressing = replace(addressing, padding=min(MANY_PADDING, (caps.max_requests or MANY_REQUESTS) - 1))
    case = _pool_case(gdn_impl, gdn_dtype, 2, addressing, seed=109, requests=MANY_REQUESTS)
    _check_rows(gdn_impl, case)


def test_an_all_padding_call_changes_nothing(gdn_impl: Implementation) -> None:
    require(caps_of(gdn_impl).lacks("padding"))
    case = _pool_case(gdn_impl, "float32", 1, Addressing(padding=3), seed=107)
    _, pool = run_decode(gdn_impl, call_of(case))
    assert np.asarray(pool).tobytes() == case.pool_before.tobytes(), "a call of padding requests changed the pool"
