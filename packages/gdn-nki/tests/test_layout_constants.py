"""The decode kernels' per-launch 0/1 tiles (``tkg.state_tiles.LayoutConstants``), made on GpSimd by compares
against constant columns, equal their definitions element for element."""

from __future__ import annotations

import numpy as np
import pytest

import gdn_nki
from gdn_nki.tkg.state_tiles import LayoutConstants, chunk_form_fits, tile_layout

# (Dk, Dv, Hv, T): Qwen3-Next's heads verifying 4 drafts (8 tiles, two groups of products), a small layout with
# several blocks (chunk form), and decode (T = 1: no write mask)
LAYOUTS = [(128, 128, 32, 4), (64, 16, 6, 2), (32, 32, 8, 1)]


def _expected(layout, tokens: int) -> dict[str, np.ndarray]:
    dk, rows, g, h, parts = layout.dk, layout.rows, layout.parts_per_head, layout.heads, layout.partitions
    block, per_block, dv = layout.block_heads, layout.tiles_per_block, layout.dv
    p = np.arange(parts)
    head_of, dk_hi = p // g, p % g
    in_head = (head_of[:, None] == np.arange(h)[None, :]).astype(np.float32)  # [P, H]
    select = np.zeros((dk, rows, parts), np.float32)
    for lo in range(rows):
        select[dk_hi * rows + lo, lo, p] = 1.0
    pick = np.zeros((block, per_block, h), np.float32)
    for t in range(per_block):
        pick[t * h + np.arange(h), t, np.arange(h)] = 1.0
    expected = {
        "select": select,
        "signed_mask": np.stack([-in_head, -in_head, in_head], axis=1),
        "spread": in_head.T.copy(),
        "pick": pick,
        "identity": np.eye(block, dtype=np.float32),
        "value_identity": np.eye(dv, dtype=np.float32),
        "partition_identity": np.eye(parts, dtype=np.float32),
    }
    if chunk_form_fits(tokens, layout):  # row (t, tile, h') × p: [p in head h''s block]
        expected["write_mask"] = np.tile(in_head.T, (tokens * layout.tiles, 1))
    return expected


@pytest.mark.parametrize(("dk", "dv", "hv", "tokens"), LAYOUTS)
def test_the_layout_tiles_are_their_definitions(dk: int, dv: int, hv: int, tokens: int) -> None:
    if gdn_nki.common.backend.USING_REAL_NKI:
        pytest.skip("reads the launch's constant tiles back through nki-cpu")
    import nki_cpu
    from nki_cpu import isa as nisa
    from nki_cpu import language as nl

    layout = tile_layout(dk, dv, hv)
    expected = _expected(layout, tokens)

    @nki_cpu.jit
    def constants():
        made = LayoutConstants(layout, tokens)
        found = []
        for name, want in expected.items():
            tile = getattr(made, name)
            out = nl.ndarray(want.shape, dtype=nl.float32, buffer=nl.shared_hbm)
            nisa.dma_copy(dst=out, src=tile)
            found.append(out)
        return tuple(found)

    found = nki_cpu.simulate(constants)()
    for (name, want), got in zip(expected.items(), found, strict=True):
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=name)
        # the signs too: the recall and read planes hold −0.0 off their head's block, as the vector engine's
        # multiply by −1 made them
        assert np.array_equal(np.signbit(np.asarray(got)), np.signbit(want)), name
