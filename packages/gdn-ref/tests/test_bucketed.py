"""The rules of a bucketed serving launch's layout (``gdn_ref.bucketed``): what is valid (empty sequences, -1 rows,
a row repeated by empty sequences), and each broken rule named by its id and the argument to fix."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gdn_ref.bucketed import bucket_violations, padded_tokens

C = 128
POOL = 10
# A valid layout: 3 sequences (one empty) in a bucket of 4 chunks and 4 slots; the empty one repeats row 1.
VALID: dict[str, Any] = {
    "cu_seqlens": np.array([0, 40, 40, 170]),
    "tokens": 170,
    "chunk": C,
    "bucket": (4 * C, 4),
    "pool_rows": POOL,
    "state_indices": np.array([1, 1, -1]),
}


def _violations(**change: Any) -> list:
    return bucket_violations(**{**VALID, **change})


def test_empty_sequences_minus_one_rows_and_checkpoints_are_valid() -> None:
    assert _violations() == []
    assert _violations(checkpoint_every=C, checkpoint_indices=np.array([[4], [-1], [5]])) == []
    assert _violations(bucket=None) == []  # not chosen yet: every other rule still holds


@pytest.mark.parametrize(
    ("change", "rule", "argument"),
    [
        ({"cu_seqlens": np.array([0, 40, 30, 170])}, "bucket.cu_seqlens_order", "cu_seqlens"),
        ({"cu_seqlens": np.array([1, 40, 40, 170])}, "bucket.cu_seqlens_start", "cu_seqlens"),
        ({"tokens": 171}, "bucket.cu_seqlens_end", "cu_seqlens"),
        ({"bucket": (4 * C + 1, 4)}, "bucket.tokens", "bucket"),
        ({"bucket": (2 * C, 4)}, "bucket.holds_tokens", "bucket"),
        ({"bucket": (4 * C, 2)}, "bucket.holds_sequences", "bucket"),
        ({"bucket": (4 * C,)}, "bucket.form", "bucket"),
        ({"state_indices": np.array([1, 1, POOL])}, "bucket.state_indices_range", "state_indices"),
        ({"state_indices": np.array([1, 1, -2])}, "bucket.state_indices_range", "state_indices"),
        ({"state_indices": np.array([1, 2, 1])}, "bucket.rows_distinct", "state_indices"),
        ({"state_indices": np.array([1, 2])}, "bucket.state_indices", "state_indices"),
        ({"checkpoint_every": C + 1, "checkpoint_indices": np.full((3, 1), -1)}, "bucket.checkpoint_every",
         "checkpoint_every"),
        ({"checkpoint_indices": np.full((3, 1), -1)}, "bucket.checkpoint_every", "checkpoint_every"),
        ({"checkpoint_every": C, "checkpoint_indices": np.full((2, 1), -1)}, "bucket.checkpoint_indices",
         "checkpoint_indices"),
        ({"checkpoint_every": C, "checkpoint_indices": np.array([[POOL], [-1], [-1]])},
         "bucket.checkpoint_indices_range", "checkpoint_indices"),
        ({"checkpoint_every": C, "checkpoint_indices": np.array([[4, 4], [-1, -1], [-1, -1]])}, "bucket.rows_distinct",
         "checkpoint_indices"),
        ({"checkpoint_every": C, "checkpoint_indices": np.array([[1], [-1], [-1]])}, "bucket.rows_distinct",
         "checkpoint_indices"),
    ],
)  # fmt: skip
def test_each_broken_rule_names_the_argument_to_fix(change: dict, rule: str, argument: str) -> None:
    """A checkpoint row repeating another checkpoint's, or a live sequence's state row, names checkpoint_indices
    (the argument whose row is the second); a state row shared by two live sequences names state_indices; rows of
    checkpoints without checkpoint_every are refused, not ignored."""
    found = {(v.rule_id, v.argument) for v in _violations(**change)}
    assert (rule, argument) in found, found


def test_padded_tokens_pads_each_sequence_to_its_own_chunk_multiple() -> None:
    assert padded_tokens([40, 0, 130], C) == 3 * C
    assert padded_tokens([C, 1], C) == 2 * C
