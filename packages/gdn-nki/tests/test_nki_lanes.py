"""The issue plan: how lanes' chunks are cut into units, which periods become a compiled loop, and the order of
a looping lane's state tiles (gdn_nki.cte.lanes)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from gdn_nki.cte.lanes import PIPELINE_DEPTH, STATE_RING, lane_units, state_ring_order, steady_states
from gdn_nki.cte.plan import packed_plan


def _lane(name: str, n_chunks: int, chunk: int = 128) -> SimpleNamespace:
    return SimpleNamespace(name=name, chunk=chunk, n_chunks=n_chunks, offset=0)


def _plan(units):
    return [[(seg.lane.name, seg.begin, seg.width, seg.starts_lane, seg.ends_lane) for seg in unit] for unit in units]


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
    seen = [(seg.lane.name, seg.begin + j) for unit in units for seg in unit for j in range(seg.width)]
    assert seen == [(lane.name, j) for lane in lanes for j in range(lane.n_chunks)]


def _loops(lanes, group_size, depth=PIPELINE_DEPTH):
    units = lane_units(lanes, group_size)
    return [(run.lane.name, run.first_period, run.last_period) for run in steady_states(units, group_size, depth)]


@pytest.mark.parametrize(
    ("depth", "loops"),
    [
        # a: units 0..5 -> steady periods 2..5, one iteration of three; b: units 6..9 -> periods 8..9, too few
        (3, [("a", 2, 4)]),
        # a: periods 1..5, two iterations of two; b: periods 7..9, one
        (2, [("a", 1, 4), ("b", 7, 8)]),
    ],
)
def test_each_lane_loops_over_whole_iterations_of_its_whole_units(depth: int, loops: list):
    """Period p issues stage 1 of unit p and the chain of unit p - depth + 1: a lane's loop runs while all units in
    between are whole units of it, in whole iterations of ``depth`` periods (the rest stays unrolled)."""
    lanes = [_lane("a", 24), _lane("b", 16), _lane("c", 5), _lane("d", 27)]
    # units 0-5 are a's, 6-9 b's, then c's first four chunks, c's last with d's first three, then six whole units of
    # d starting at its chunk 3
    plan = _plan(lane_units(lanes, 4))
    assert plan[10:13] == [
        [("c", 0, 4, True, False)],
        [("c", 4, 1, False, True), ("d", 0, 3, True, False)],
        [("d", 3, 4, False, False)],
    ]
    assert plan[12:] == [[("d", first, 4, False, first == 23)] for first in range(3, 27, 4)]
    # c starts whole but its second unit is shared; d has whole units enough for a loop at either depth, but they do
    # not start at a unit boundary of d (its first unit is shared), so only that check keeps d unrolled
    assert _loops(lanes, 4, depth) == loops


@pytest.mark.parametrize("group_size", [1, 2])
def test_groups_too_small_for_a_state_ring_stay_unrolled(group_size: int):
    assert state_ring_order(group_size) is None
    assert _loops([_lane("a", 8 * group_size)], group_size) == []


@pytest.mark.parametrize("group_size", range(3, 17))
def test_the_state_ring_never_overwrites_a_state_still_read(group_size: int):
    """The chain writes the state after chunk j+1 while the output of chunk j-1 still reads the state before chunk
    j, and every unit starts and ends in tile 0 (so every loop iteration is the same)."""
    order = state_ring_order(group_size)
    assert order is not None and len(order) == group_size + 1
    assert order[0] == order[-1] == 0 and set(order) <= set(range(STATE_RING))
    for j in range(1, group_size):
        assert order[j + 1] not in (order[j], order[j - 1]), (group_size, j, order)


def test_packed_plan_pads_each_sequence_to_its_own_chunk_multiple_and_unpacks_exactly() -> None:
    plan = packed_plan([37, 128, 1, 130], 64)
    assert plan.seq_chunks == (1, 2, 1, 3) and plan.starts == (0, 64, 192, 256) and plan.padded_len == 448
    assert [(s.offset, s.n_chunks, s.state_row) for s in plan.spans([5, 0, 2, 1])] == [
        (0, 1, 5), (64, 2, 0), (192, 1, 2), (256, 3, 1),
    ]  # fmt: skip
    tokens = np.arange(1, 297, dtype=np.float32).reshape(1, 1, 296)
    packed = plan.pack(tokens)
    assert packed.shape == (1, 1, 448) and packed[0, 0, 37:64].tolist() == [0.0] * 27 and packed[0, 0, 64] == 38
    np.testing.assert_array_equal(plan.unpack(packed), tokens)
    kernel_view = packed_plan([n * 64 for n in plan.seq_chunks], 64)  # what the kernel rebuilds from seq_chunks
    assert (kernel_view.seq_chunks, kernel_view.starts) == (plan.seq_chunks, plan.starts)
