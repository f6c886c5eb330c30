"""On-chip memory is bounded by the pipeline, not by the launch: SBUF and PSUM high-water do not grow with S or lanes.

The pipeline (``gdn_nki.cte.lanes.run_lanes``) has at most ``depth`` units between their loads and their chain, each
in its own slot set, and once a launch is a few units long its high-water is that of
every longer launch, within ``SLACK``: the order in which the engine balancer interleaves the first units can
leave one more small tile alive at the peak. Small head dims and one-chunk units keep it fast; the production
shapes (D = 128, every group size, Qwen3-Next's head count up to S = 32768) are in ``nox -s bench``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import gdn_nki
import nki_cpu
from gdn_nki.common.tiles import FP32
from gdn_nki.cte import lanes
from gdn_spec.regimes import Geometry
from nki_inputs import case, run

pytestmark = pytest.mark.nki_cpu_only  # reads nki-cpu's trace high-water

HEAD_DIM = 16
# One [P, 128] fp32 tile per partition: what the fill order may add at the peak (measured: 0 or 512 bytes).
SLACK = 128 * 4


def high_water(algorithm: str, dtype: str, lanes: int, seq_len: int, group_size: int) -> tuple[int, int]:
    """(SBUF, PSUM) high-water in bytes per partition of one launch."""
    geometry = Geometry(B=1, Hk=lanes, Hv=lanes, S=seq_len, Dk=HEAD_DIM, Dv=HEAD_DIM)
    run(case(dtype, geometry, seed=0), algorithm, group_size=group_size)
    trace = nki_cpu.last_trace()
    return trace.sbuf_high_water, trace.psum_high_water


def assert_same_high_water(got: tuple[int, int], want: tuple[int, int], what: str) -> None:
    assert all(abs(g - w) <= SLACK for g, w in zip(got, want, strict=True)), (
        f"{what}: (SBUF, PSUM) high-water {got} vs {want} bytes per partition (slack {SLACK})"
    )


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_schur_high_water_is_the_same_for_1_or_8_lanes_and_for_a_2x_longer_sequence(dtype: str):
    group_size = 1  # one-chunk units: the pipeline fills within a few chunks
    in_flight = lanes.PIPELINE_DEPTH  # units in stage 1, in the inverse and in the chain
    base_len = 3 * in_flight * gdn_nki.CHUNK_BY_ALGORITHM["schur"]
    base_len += -base_len % 512
    base = high_water("schur", dtype, 1, base_len, group_size)
    assert_same_high_water(high_water("schur", dtype, 1, 2 * base_len, group_size), base, "S vs 2S")
    assert_same_high_water(high_water("schur", dtype, 8, base_len // 4, group_size), base, "8 lanes x S/4 vs 1 x S")


@pytest.mark.usefixtures("loop_every_steady_run")  # each lane loops, as long lanes do at the default
def test_neumann_high_water_is_the_same_for_1_or_4_lanes():
    # neumann's units are 8 chunks of 64 tokens whatever group_size says: 4 × 5 or 20 units, and each lane has
    # enough for an iteration of the compiled loop (whose state rings are allocated once per launch)
    unit = 8 * gdn_nki.CHUNK_BY_ALGORITHM["neumann"]
    per_lane = (2 * lanes.PIPELINE_DEPTH - 1) * unit
    base = high_water("neumann", "bfloat16", 1, 4 * per_lane, gdn_nki.DEFAULT_GROUP_SIZE)
    got = high_water("neumann", "bfloat16", 4, per_lane, gdn_nki.DEFAULT_GROUP_SIZE)
    assert_same_high_water(got, base, "4 lanes")


@pytest.mark.parametrize("depth", [3, 2])
def test_the_contracts_largest_footprint_fits_on_chip(depth: int):
    """fp32, Dk = Dv = 128, the largest group that runs each pipeline depth (``lanes.pipeline_depth``: three slot
    sets up to group 11, two above), the pipeline full (8 units): the most on-chip memory a valid call holds
    (measured 176,700 and 181,824 of 212,984 bytes per partition). It fits, so no valid call is rejected for
    capacity; a change that grows the footprint fails here, not in a user's launch."""
    lane = SimpleNamespace(chunk=gdn_nki.CHUNK, key=SimpleNamespace(shape=(1, 1, 1, gdn_nki.MAX_HEAD_DIM)))
    lane.value, lane.dtype, lane.system_dtype = lane.key, FP32, FP32
    groups = [g for g in range(1, gdn_nki.MAX_GROUP_SIZE + 1) if lanes.pipeline_depth(lane, g) == depth]
    group_size = max(groups)
    seq_len = 8 * group_size * gdn_nki.CHUNK_BY_ALGORITHM["schur"]
    geometry = Geometry(B=1, Hk=1, Hv=1, S=seq_len, Dk=gdn_nki.MAX_HEAD_DIM, Dv=gdn_nki.MAX_HEAD_DIM)
    run(case("float32", geometry, seed=0), "schur", group_size=group_size)  # capacity is checked per allocation
    trace = nki_cpu.last_trace()
    assert trace.sbuf_high_water <= 212_984 and trace.psum_high_water <= 16_384
