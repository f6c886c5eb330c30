"""Program size: each lane's steady state is one compiled loop (``nl.fori_loop``), so the program a launch holds
does not grow with S, and the loop computes exactly what the unrolled periods compute.

nki-cpu counts a compiled loop's body once (``Trace.static_instructions``) and checks that running it per
iteration is what the traced-once body computes (nki-cpu README, "compiled loop bodies"). Small head dims and
groups of 4 chunks keep the launches to a few seconds; production shapes are in ``nox -s bench``. At such shapes
the default unrolls a lane's steady periods whole (``loop_plan``), so the module's tests loop one unit group
per iteration (the ``loop_every_steady_run`` fixture) unless they say otherwise.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import nki_cpu
from gdn_nki.common.loop_plan import loop_plan
from gdn_nki.cte import lanes, schur
from gdn_spec.regimes import Geometry
from nki_inputs import assert_matches_oracle, case, run

pytestmark = [pytest.mark.nki_cpu_only, pytest.mark.usefixtures("loop_every_steady_run")]  # reads nki-cpu's trace

GROUP = 4  # chunks per unit
DEFAULT_STEADY_GROUPS = lanes.STEADY_GROUPS  # read before the fixture sets it to 1
# Units per lane for a loop of one iteration: the first depth - 1 periods fill the pipeline, then one iteration of
# depth periods (lanes.steady_states)
ONE_ITERATION = 2 * lanes.PIPELINE_DEPTH - 1
TWO_ITERATIONS = ONE_ITERATION + lanes.PIPELINE_DEPTH


def _geometry(lanes_: int, seq_len: int, key_heads: int = 1) -> Geometry:
    return Geometry(B=1, Hk=key_heads, Hv=lanes_, S=seq_len, Dk=32, Dv=16)


def _counts(algorithm: str, lanes_: int, seq_len: int) -> tuple[int, int]:
    """(static, dynamic) instruction counts of one launch."""
    run(case("bfloat16", _geometry(lanes_, seq_len, key_heads=lanes_), seed=0), algorithm, group_size=GROUP)
    trace = nki_cpu.last_trace()
    return trace.static_instructions, len(trace.records)


@pytest.mark.parametrize(("algorithm", "chunk"), [("schur", 128), ("neumann", 64)])
@pytest.mark.parametrize("lanes_", [1, 2])
def test_the_program_does_not_grow_with_the_sequence(algorithm: str, chunk: int, lanes_: int) -> None:
    """At one unit group per iteration (a fixed body: ``lanes.STEADY_GROUPS`` = 1) the program is the same at S and
    at S plus three iterations."""
    unit = (GROUP if algorithm == "schur" else 8) * chunk  # neumann's units are 8 chunks whatever group_size says
    short = ONE_ITERATION * unit  # the loop runs once
    long = short + 3 * lanes.PIPELINE_DEPTH * unit  # four times, and as many periods left over (none)
    static_short, dynamic_short = _counts(algorithm, lanes_, short)
    static_long, dynamic_long = _counts(algorithm, lanes_, long)
    assert static_long == static_short, "the program grew with S"
    assert dynamic_long > 2 * dynamic_short, "every chunk still runs"


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("group_size", [GROUP, 5])  # 5: an odd unit, whose state ring is not a plain rotation
def test_the_compiled_steady_state_matches_the_oracle(dtype: str, group_size: int) -> None:
    """Two lanes (GQA) of two iterations' units and one more each, from a supplied state: each lane loops twice,
    the lanes' state rings alternate, and the lane ends, the period left over and the step between the lanes are
    unrolled."""
    c = case(dtype, _geometry(2, (TWO_ITERATIONS + 1) * group_size * 128), seed=3, regime="initial_state")
    out, state = run(c, "schur", group_size=group_size)
    trace = nki_cpu.last_trace()
    assert trace.static_instructions < len(trace.records), "no compiled loop ran"
    assert_matches_oracle(c, out, state, f"group {group_size}")


def test_compiled_loops_of_every_batch_row_and_head_read_their_own_tokens() -> None:
    """Batch row 1 and value head 1 (key head 0, GQA) loop too: the loop's run-time loads address row b, head h of
    the [B, H, S, D] arguments from an offset written out in the kernel (``hbm._chunk_major``), which a B = 1
    launch cannot check."""
    c = case("bfloat16", Geometry(B=2, Hk=1, Hv=2, S=TWO_ITERATIONS * GROUP * 128, Dk=32, Dv=16), seed=5,
             regime="initial_state")  # fmt: skip
    out, state = run(c, "schur", group_size=GROUP)
    trace = nki_cpu.last_trace()
    assert trace.static_instructions < len(trace.records), "no compiled loop ran"
    assert_matches_oracle(c, out, state, "B = 2, Hv = 2")


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_loop_gives_the_bits_of_the_unrolled_periods(monkeypatch: pytest.MonkeyPatch, dtype: str) -> None:
    """The loop body loads q and k token-major and transposes them on the tensor engine (a DMA transpose from a
    run-time start is not a documented form) where the unrolled periods transpose them on the load: both are
    exact, in bf16 and in fp32."""
    c = case(dtype, _geometry(2, (TWO_ITERATIONS + 1) * GROUP * 128), seed=4, regime="initial_state")
    looped = run(c, "schur", group_size=GROUP)
    assert nki_cpu.last_trace().static_instructions < len(nki_cpu.last_trace().records)
    monkeypatch.setattr(lanes, "steady_states", lambda *plan: [])
    unrolled = run(c, "schur", group_size=GROUP)
    trace = nki_cpu.last_trace()
    assert trace.static_instructions == len(trace.records)
    for got, want in zip(looped, unrolled, strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_long_run_loops_over_several_groups_per_iteration(monkeypatch: pytest.MonkeyPatch, dtype: str) -> None:
    """Four iterations' worth of steady periods at one group each, in a program with room for three groups
    (``lanes.STEADY_GROUPS`` = 3): ``loop_plan`` puts two groups in each iteration (two iterations, none left
    over), the program holds the two-group body once, and the bits are those of one group per iteration."""
    steady = 4 * lanes.PIPELINE_DEPTH  # periods
    assert loop_plan(steady, lanes.PIPELINE_DEPTH, 3 * lanes.PIPELINE_DEPTH - 1) == 2, "re-size the test"
    c = case(dtype, _geometry(1, (ONE_ITERATION + steady - lanes.PIPELINE_DEPTH) * GROUP * 128), seed=6,
             regime="initial_state")  # fmt: skip
    narrow = run(c, "schur", group_size=GROUP)
    narrow_static = nki_cpu.last_trace().static_instructions
    monkeypatch.setattr(lanes, "STEADY_GROUPS", 3)
    wide = run(c, "schur", group_size=GROUP)
    trace = nki_cpu.last_trace()
    assert trace.static_instructions < len(trace.records), "no compiled loop ran"
    assert narrow_static < trace.static_instructions, "the body did not widen"
    for got, want in zip(wide, narrow, strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_run_the_program_can_hold_is_unrolled_whole(monkeypatch: pytest.MonkeyPatch, dtype: str) -> None:
    """Two iterations' worth of steady periods (one lane S = 8192's six at group 8) at the default room: no
    compiled loop at all (no barrier to pay), and the bits of the loop."""
    c = case(dtype, _geometry(1, TWO_ITERATIONS * GROUP * 128), seed=8, regime="initial_state")
    looped = run(c, "schur", group_size=GROUP)
    assert nki_cpu.last_trace().static_instructions < len(nki_cpu.last_trace().records), "no compiled loop ran"
    monkeypatch.setattr(lanes, "STEADY_GROUPS", DEFAULT_STEADY_GROUPS)
    whole = run(c, "schur", group_size=GROUP)
    trace = nki_cpu.last_trace()
    assert trace.static_instructions == len(trace.records), "the run still loops"
    assert not trace.boundaries, "a loop boundary in an unrolled launch"
    for got, want in zip(whole, looped, strict=True):
        np.testing.assert_array_equal(got, want)


def test_the_loop_plan_pays_the_fewest_barriers_the_program_has_room_for() -> None:
    """Runs the room holds are unrolled; longer ones take the body leaving the fewest iterations whose body and
    leftover fit the room, the smaller program among equals (one lane bf16 at group 8: S = 8192 six steady
    periods, S = 32768 thirty); without room for any body, one group per iteration."""
    depth = lanes.PIPELINE_DEPTH
    room = depth * DEFAULT_STEADY_GROUPS - 1
    assert loop_plan(6, depth, room) == 0  # S = 8192: unrolled
    assert loop_plan(room, depth, room) == 0
    assert loop_plan(30, depth, room) == 5  # S = 32768: two iterations of five groups
    assert loop_plan(room + 1, depth, room) == 3  # two iterations of three groups, none left over
    assert loop_plan(26, depth, room) == 4  # two iterations either way: 12 + 2 periods held, not 9 + 8
    assert loop_plan(2, depth, depth - 1) == 0
    assert all(loop_plan(n, depth, depth - 1) == 1 for n in range(depth, 40))
    for d in (1, 2, 3):
        room = d * DEFAULT_STEADY_GROUPS - 1
        for n in range(room + 1, 200):
            u = loop_plan(n, d, room)
            body, iterations = d * u, n // (d * u)
            assert body + n % body <= room and iterations >= 2, (d, n, u)
            better = [v for v in range(1, n // d + 1) if d * v + n % (d * v) <= room
                      and (n // (d * v), d * v + n % (d * v)) < (iterations, body + n % body)]  # fmt: skip
            assert not better, (d, n, u, better)


def _assert_same_bits_when_patched(
    c: object, monkeypatch: pytest.MonkeyPatch, target: object, name: str, value: object
) -> None:
    """Run ``c`` (schur, group ``GROUP``) as it is, then with ``target.name`` set to ``value``: the same bits, and
    the patched launch runs its compiled loop."""
    default = run(c, "schur", group_size=GROUP)
    monkeypatch.setattr(target, name, value)
    patched = run(c, "schur", group_size=GROUP)
    trace = nki_cpu.last_trace()
    assert trace.static_instructions < len(trace.records), "no compiled loop ran"
    for got, want in zip(patched, default, strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_both_pipeline_depths_give_the_same_bits(monkeypatch: pytest.MonkeyPatch, dtype: str) -> None:
    """The two-stage pipeline (what a launch whose three slot sets would not fit runs, ``lanes.pipeline_depth``)
    issues the same instructions on the same values as the three-stage one, in another order: the same bits, and
    its compiled loop runs too."""
    c = case(dtype, _geometry(2, (TWO_ITERATIONS + 1) * GROUP * 128), seed=5, regime="initial_state")
    _assert_same_bits_when_patched(c, monkeypatch, lanes, "pipeline_depth", lambda lane, group_size, initial=False: 2)


@pytest.mark.parametrize("idle_rounds", [0, 2])
def test_operand_idle_rounds_change_only_the_order(monkeypatch: pytest.MonkeyPatch, idle_rounds: int) -> None:
    """Rounds the operand stage sits out (``schur.OPERAND_IDLE_ROUNDS``) reorder the issued instructions only: the
    same bits as the default, with the compiled loop running."""
    c = case("bfloat16", _geometry(2, (TWO_ITERATIONS + 1) * GROUP * 128), seed=7, regime="initial_state")
    assert schur.OPERAND_IDLE_ROUNDS not in (0, 2), "pick other values to compare against"
    _assert_same_bits_when_patched(c, monkeypatch, schur, "OPERAND_IDLE_ROUNDS", idle_rounds)


def test_a_lane_starting_partway_through_a_unit_matches_the_oracle() -> None:
    """Hv = 2 lanes of 29 chunks in units of 4: lane 1 starts at chunk 1 of a unit (29 % 4), and after the unit it
    shares with lane 0 it has six whole units of its own — enough for a loop, but one that would not start at a
    unit boundary of the lane, so its state would not start in its ring's tile 0 (``lanes.steady_states``). Lane 0
    loops (one iteration); lane 1 must stay unrolled, and both must match the oracle."""
    first, second = (SimpleNamespace(n_chunks=29, chunk=128, offset=0) for _ in range(2))
    units = lanes.lane_units([first, second], GROUP)
    whole = [unit[0].begin for unit in units if len(unit) == 1 and unit[0].lane is second and unit[0].width == GROUP]
    assert whole[0] % GROUP and len(whole) >= 2 * lanes.PIPELINE_DEPTH, "lane 1 has units enough for a loop"
    assert [run.lane for run in lanes.steady_states(units, GROUP)] == [first], "only the boundary check decides"
    c = case("float32", _geometry(2, 29 * 128), seed=6, regime="initial_state")
    out, state = run(c, "schur", group_size=GROUP)  # lane 0's loop runs one iteration: as many records as static
    assert_matches_oracle(c, out, state, "a lane starting mid-unit")
