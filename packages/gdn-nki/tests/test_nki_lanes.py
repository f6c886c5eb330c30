"""The issue plan: how lanes' chunks are cut into units (gdn_nki.lanes)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gdn_nki.lanes import lane_units, prepare_depth


def _lane(name: str, n_chunks: int, chunk: int = 128) -> SimpleNamespace:
    return SimpleNamespace(name=name, chunk=chunk, n_chunks=n_chunks)


def _plan(units):
    return [[(seg.lane.name, seg.first, seg.width, seg.starts_lane, seg.ends_lane) for seg in unit] for unit in units]


def test_units_span_lanes_and_are_full_but_the_last():
    lanes = [_lane("a", 3), _lane("b", 3), _lane("c", 3)]
    assert _plan(lane_units(lanes, 4)) == [
        [("a", 0, 3, True, True), ("b", 0, 1, True, False)],
        [("b", 1, 2, False, True), ("c", 0, 2, True, False)],
        [("c", 2, 1, False, True)],
    ]


@pytest.mark.parametrize("group_size", [1, 3, 8, 16])
def test_every_chunk_of_every_lane_is_in_exactly_one_unit_in_order(group_size: int):
    lanes = [_lane("a", 9), _lane("b", 1), _lane("c", 17, chunk=64)]
    units = lane_units(lanes, group_size)
    assert all(sum(seg.width for seg in unit) == group_size for unit in units[:-1])
    assert 0 < sum(seg.width for seg in units[-1]) <= group_size
    seen = [(seg.lane.name, seg.first + j) for unit in units for seg in unit for j in range(seg.width)]
    assert seen == [(lane.name, j) for lane in lanes for j in range(lane.n_chunks)]


def test_two_units_prepare_at_once_only_while_their_inverse_accumulators_fit_psum():
    assert prepare_depth(8) == 2
    assert prepare_depth(16) == 1
