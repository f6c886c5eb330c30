"""The launch grid a host entry point passes to a kernel (``kernel[grid]``): the logical-NeuronCore degrees a
Trn2/Trn3 kernel may use, and the check every entry point makes of ``grid`` before it stages or launches anything."""

from __future__ import annotations

from gdn_ref.contract import ContractError, Violation, is_integer, plain_int

# Launch grids a Trn2/Trn3 kernel may use: the SDK's LNC degrees (LNC page, v2.33.1).
LNC_DEGREES = (1, 2)


def check_grid(grid: object) -> int | None:
    """``grid`` is None or a positive int (numpy's too; no silent conversion of "2", 2.7 or True) that is an LNC
    degree; returned as a Python int (or None), the launch grid the entry point passes the kernel."""
    if grid is None:
        return None
    if not (is_integer(grid) and grid >= 1):
        rule, fix = (
            "must be a positive int: the number of programs of the launch gdn_cte[grid]",
            "pass grid=2, say, or None for one program",
        )
    elif grid not in LNC_DEGREES:
        rule, fix = (
            "the launch grid is the logical-NeuronCore degree: 1 or 2 on Trn2/Trn3 (docs/nki-sources.md §1.3)",
            "pass grid=None, 1 or 2; the kernel splits the lanes over the programs itself",
        )
    else:
        return plain_int(grid)
    raise ContractError([Violation("launch.grid", "grid", f"value {grid!r}", rule, fix)])
