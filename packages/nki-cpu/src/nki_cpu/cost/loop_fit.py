"""The compiled-loop barrier's fixed cost, fitted to the one measurement AWS publishes of it.

The "NKI Dynamic Loops" deep dive (SDK documentation sources, date-modified 03/31/2026, section "Iterations Do
Not Overlap"; docs/nki-sources.md §4.7) measures one body three ways, 64 iterations on trn1 under NKI 0.6.0: a
[128, 2048] fp32 tile loaded from HBM, ``nisa.activation`` and ``nisa.tensor_scalar`` applied to it, stored back.
About 7.5 µs per iteration as a ``range`` loop (unrolled), 17.9 µs as ``nl.fori_loop`` and 10.2 µs per tile with
four tiles per ``fori_loop`` iteration (1 : 2.39 : 1.36). This module holds that body in the three forms, runs them
through the interpreter and the cost model on the Trn1 figures, and fits ``Figures.loop_barrier_ns``: the one value
that brings the two loop forms closest to the page's figures (least squares on their relative errors; the unrolled
form has no barrier). ``bench/bench_loop_barrier.py`` prints the fit; ``tests/test_cost_loops.py`` holds the
figure to it.

Dimensions:
    ``TILE_ROWS`` × ``TILE_COLS`` fp32 tiles, ``TILES`` of them per launch; times in µs per tile.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from nki_cpu import isa as nisa
from nki_cpu import language as nl
from nki_cpu import runtime
from nki_cpu.cost.figures import TRN1, Figures
from nki_cpu.cost.report import estimate

TILE_ROWS, TILE_COLS = 128, 2048  # the page's [128, 2048] fp32 tile
TILES = 64  # the page's 64 iterations
TILES_PER_ITERATION = 4  # the page's grouped form: four tiles per fori_loop iteration
# The page's figures, µs per tile, by form.
PAGE_US = {"range": 7.5, "fori_loop": 17.9, "fori_loop, 4 tiles": 10.2}
FORMS = tuple(PAGE_US)
FITTED = ("fori_loop", "fori_loop, 4 tiles")  # the forms a barrier enters
# What the page's figures allow a barrier to cost, whatever the model: nothing beyond the drain, up to the whole
# difference between its fori_loop and unrolled figures (were the body as fast alone as unrolled).
PLAUSIBLE_NS = (0.0, (PAGE_US["fori_loop"] - PAGE_US["range"]) * 1e3)


def _tile_view(hbm: Any, index: Any) -> Any:
    """HBM tile ``index`` of a [TILES * TILE_ROWS, TILE_COLS] tensor (an int, or the run-time iteration value)."""
    return hbm.ap(pattern=[[TILE_COLS, TILE_ROWS], [1, TILE_COLS]], scalar_offset=index, indirect_dim=0)


def _body(x: Any, out: Any, index: Any) -> None:
    """The page's body: load the tile, ``activation``, ``tensor_scalar``, store it."""
    tile = nl.ndarray((TILE_ROWS, TILE_COLS), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=_tile_view(x, index))
    nisa.activation(dst=tile, op=nl.exp, data=tile)
    nisa.tensor_scalar(dst=tile, data=tile, op0=nl.multiply, operand0=0.5)
    nisa.dma_copy(dst=_tile_view(out, index), src=tile)


def _unrolled(x: Any) -> Any:
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for i in range(TILES):
        _body(x, out, i)
    return out


def _fori(x: Any) -> Any:
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.fori_loop(0, TILES, lambda i: _body(x, out, i))
    return out


def _fori_grouped(x: Any) -> Any:
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)

    def group(i: Any) -> None:
        for k in range(TILES_PER_ITERATION):  # unrolled inside the body: the loads overlap the previous compute
            _body(x, out, i + k)

    nl.fori_loop(0, TILES, group, step=TILES_PER_ITERATION)
    return out


KERNELS: dict[str, Callable[[Any], Any]] = {"range": _unrolled, "fori_loop": _fori, "fori_loop, 4 tiles": _fori_grouped}


@dataclass(frozen=True)
class Fit:
    """The barrier figure fitted to the page, and what the model gives with it.

    Attributes:
        barrier_ns: the fitted ``loop_barrier_ns``.
        us_per_tile: per form, µs per tile at ``barrier_ns`` (Trn1 figures).
        page_us: per form, the page's µs per tile.
        alone_ns: per loop form, the barrier that reproduces that form's page figure exactly.
    """

    barrier_ns: float
    us_per_tile: dict[str, float]
    page_us: dict[str, float]
    alone_ns: dict[str, float]

    def ratios(self, times: dict[str, float]) -> tuple[float, ...]:
        """``times`` of the forms relative to the unrolled one (the page's are 1 : 2.39 : 1.36)."""
        return tuple(times[form] / times["range"] for form in FORMS)


def traces() -> dict[str, Any]:
    """Each form's launch trace (the data: standard normal, seeded; the times do not depend on it)."""
    x = np.random.default_rng(0).standard_normal((TILES * TILE_ROWS, TILE_COLS)).astype(np.float32)
    found = {}
    for form, body in KERNELS.items():
        runtime.simulate(runtime.jit(body))(x)
        found[form] = runtime.last_trace()
    return found


def us_per_tile(found: dict[str, Any], figures: Figures) -> dict[str, float]:
    """Each form's makespan per tile (µs) under ``figures``."""
    return {form: estimate(trace, figures=figures).makespan_ns / TILES / 1e3 for form, trace in found.items()}


def fit(base: Figures = TRN1) -> Fit:
    """Fit ``loop_barrier_ns`` on ``base`` (the page measured trn1) to the page's two loop forms.

    Notes:
        Each loop form's time is linear in the barrier's cost (every barrier waits for all earlier work, so the
        schedule between barriers does not depend on it): two estimates give each line, and the least-squares
        value of the relative errors has a closed form.
    """
    found = traces()
    at = {b: us_per_tile(found, dataclasses.replace(base, loop_barrier_ns=b)) for b in (0.0, 1000.0)}
    # per loop form: µs per tile = intercept + slope × barrier (ns)
    lines = {form: (at[0.0][form], (at[1000.0][form] - at[0.0][form]) / 1000.0) for form in FITTED}
    # minimise Σ ((a + s·b) / p − 1)² over b: b = Σ s/p · (1 − a/p) / Σ (s/p)²
    num = sum(s / PAGE_US[f] * (1 - a / PAGE_US[f]) for f, (a, s) in lines.items())
    den = sum((s / PAGE_US[f]) ** 2 for f, (a, s) in lines.items())
    barrier = num / den
    alone = {f: (PAGE_US[f] - a) / s for f, (a, s) in lines.items()}
    return Fit(barrier, us_per_tile(found, dataclasses.replace(base, loop_barrier_ns=barrier)), dict(PAGE_US), alone)
