"""Error metrics against the float64 oracle and the one tolerance table per compute dtype.

The metric is FLA's: relative RMS error ``rms(got − ref) / rms(ref)``, plus the max-abs error, reported both raw
and relative to ``max|ref|`` so one bound serves outputs of any magnitude (a 1e5 initial state included). A
NaN or Inf anywhere fails, whatever the numbers say.

The table holds for well-conditioned problems. Two measured properties of a case adapt it, both computed from
the oracle alone, never from the implementation under test:

- **Conditioning.** A computation in a dtype with unit roundoff u cannot be more accurate than the problem's own
  sensitivity to u-sized perturbations of its operands. ``condition`` is that sensitivity in units of u: the
  oracle is re-run with q, k, v and the initial state each perturbed by independent relative noise uniform in
  [−u, u], and the rel-RMS change of an output, divided by u, is its condition. Well-conditioned regimes measure
  ≈ 1 (random keys: 0.97 for out, 0.84 for the state, at bf16); near-collinear keys ≈ 4 (the triangular solve of
  an ill-conditioned I + A). Both bounds of an output are multiplied by ``min(MAX_CONDITION, max(1, condition))``, so
  well-conditioned cases are held to the table exactly and no case's bound grows past MAX_CONDITION = 8 times
  the table (bf16: 8e-2 rel-RMS, 0.32 max; fp32: 1.6e-3, 1.6e-2): a wrong result (a zero output is rel-RMS 1)
  always fails. The table itself budgets no ill-conditioning, so nothing is counted twice.
- **The state's scale.** The state error of any implementation whose transitions are built from compute-dtype
  operands is about u times the magnitude of the state its last chunk multiplies, and the delta rule can erase
  most of a large initial state (large_state at Dk = 16: 25 000× over 384 tokens). The state's errors are
  therefore taken relative to the larger of the final state and the oracle's state entering the last chunk
  (``oracle.LONGEST_CHUNK`` tokens) (``oracle.carried_state``), never the initial state itself: erasure within one chunk is at most ~30×
  at the suite's shapes, so a zero or doubled final state still fails (measured in tests/test_metrics.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

# rms(ref) below this is treated as this: a (near-)zero reference is judged on an absolute scale instead of
# dividing by ~0. 1e-6 is far below any regime's output scale (β ≥ 1e-4 and unit v give ≳ 1e-5).
REF_RMS_FLOOR = 1e-6

FP32_UNIT_ROUNDOFF = 2.0**-24
BF16_UNIT_ROUNDOFF = 2.0**-8
# The largest multiplier a measured condition can apply to the table. The suite's regimes measure at most ~5
# (near-collinear keys); 8 leaves room for draws a little worse while every bound stays far below a wrong answer.
MAX_CONDITION = 8.0


@dataclass(frozen=True)
class Tolerance:
    """Bounds for one output: relative RMS error and max-abs error relative to max|ref|."""

    rel_rms: float
    max_rel: float


TOLERANCES: dict[str, dict[str, Tolerance]] = {
    "float32": {
        # u = 6e-8. A chunk sums up to C = 128 terms (worst case C·u = 7.6e-6) and the result passes a handful
        # of such sums and the triangular solve: ~2e-4 rel-RMS. FLA's 0.002 for "fp32" paths includes TF32
        # matmuls (u = 4.9e-4, i.e. 4u); true fp32 matmuls earn a 10× tighter bound. The measured condition,
        # not this entry, accounts for ill-conditioned keys.
        "out": Tolerance(rel_rms=2e-4, max_rel=2e-3),
        # The state is the same sums without the readout; its error is the same order. The max bound is 10×
        # the RMS bound: the largest of ~1e5 errors sits ~4σ out, with margin for the collinear regime's tails.
        "state": Tolerance(rel_rms=2e-4, max_rel=2e-3),
    },
    "bfloat16": {
        # u = 3.9e-3, so one bf16 rounding costs ~u/√3 = 2.3e-3 RMS. The output meets about five independent
        # roundings (q, the staged state, the decayed QKᵀ block, V_new, the final cast): √5·2.3e-3 = 5e-3,
        # FLA's bf16/fp16 ratio; 1e-2 is a 2× margin over that estimate. Ill-conditioning is NOT budgeted here:
        # the measured condition widens the bound (module docstring). The inputs' own rounding is excluded
        # because the oracle runs on the rounded inputs.
        "out": Tolerance(rel_rms=1e-2, max_rel=4e-2),
        # The fp32 state accumulates kᵀV_new products with bf16 operands: the same few roundings, no final cast.
        # max_rel = 10u: a single element may see several roundings of the same sign.
        "state": Tolerance(rel_rms=1e-2, max_rel=4e-2),
    },
}


@dataclass(frozen=True)
class Error:
    """One output's error against its reference."""

    output: str
    rel_rms: float
    max_abs: float
    max_rel: float
    finite: bool
    tolerance: Tolerance
    # "got (a, b), expected (b, a)" when the shapes differ (no number is then meaningful); "" otherwise.
    shape_mismatch: str = ""

    @property
    def ok(self) -> bool:
        """Finite and within both bounds."""
        return self.finite and self.rel_rms <= self.tolerance.rel_rms and self.max_rel <= self.tolerance.max_rel

    @property
    def ratio(self) -> float:
        """Error as a fraction of the tolerance (the larger of the two bounds); inf when not finite."""
        if not self.finite:
            return float("inf")
        return max(self.rel_rms / self.tolerance.rel_rms, self.max_rel / self.tolerance.max_rel)

    def as_dict(self) -> dict[str, float | bool | str]:
        """Plain, JSON-serializable numbers (for test reports)."""
        d = asdict(self)
        d.update(tol_rel_rms=self.tolerance.rel_rms, tol_max_rel=self.tolerance.max_rel, ratio=self.ratio)
        del d["tolerance"]
        return d

    def against_bounds(self) -> str:
        """The figures next to their bounds, each marked ``>`` (out of bounds) or ``<=``: "rel_rms 3.5e-01 >
        tol 1.0e-02, max_rel 1.0e+00 > tol 4.0e-02 (max_abs 3.9e-01)"; the shapes or non-finite values instead
        when those are what failed."""
        if self.shape_mismatch:
            return f"shape {self.shape_mismatch}"
        if not self.finite:
            return "non-finite values (NaN or Inf)"
        figures = [
            f"{label} {value:.3e} {'>' if value > bound else '<='} tol {bound:.1e}"
            for label, value, bound in (
                ("rel_rms", self.rel_rms, self.tolerance.rel_rms),
                ("max_rel", self.max_rel, self.tolerance.max_rel),
            )
        ]
        return f"{', '.join(figures)} (max_abs {self.max_abs:.3e})"

    def __str__(self) -> str:
        if self.shape_mismatch:
            return f"{self.output}: shape {self.shape_mismatch} FAIL"
        status = "ok" if self.ok else "FAIL"
        finite = "" if self.finite else " NON-FINITE"
        return (
            f"{self.output}: rel_rms={self.rel_rms:.3e} (tol {self.tolerance.rel_rms:.1e}) "
            f"max_abs={self.max_abs:.3e} max_rel={self.max_rel:.3e} (tol {self.tolerance.max_rel:.1e}){finite} {status}"
        )


def rms(x: np.ndarray) -> float:
    """Root mean square in float64."""
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64)))) if x.size else 0.0


UNIT_ROUNDOFF = {"float32": FP32_UNIT_ROUNDOFF, "bfloat16": BF16_UNIT_ROUNDOFF}


def compare(
    output: str,
    got: np.ndarray,
    ref: np.ndarray,
    dtype: str,
    *,
    condition: float = 1.0,
    scale_floor: np.ndarray | None = None,
) -> Error:
    """Error of ``got`` against ``ref`` for the named output ("out" or "state") under the dtype's tolerance.

    Args:
        output (str): "out" or "state": selects the tolerance entry.
        got (np.ndarray): the implementation's result, any float dtype (widened to float64).
        ref (np.ndarray): the reference, same shape.
        dtype (str): compute dtype of the call ("float32" or "bfloat16").
        condition (float): the case's measured condition for this output (module docstring); the bounds are
            multiplied by ``min(MAX_CONDITION, max(1, condition))``.
        scale_floor (np.ndarray): an array whose RMS and max-abs floor ``ref``'s in the relative errors
            (the state carried into the last chunk, for the state output); None for none.

    Returns:
        Error: the numbers; a shape mismatch never passes (its numbers are inf and it says which shapes).
    """
    base = TOLERANCES[dtype][output]
    widen = min(MAX_CONDITION, max(1.0, float(condition)))
    tolerance = Tolerance(rel_rms=base.rel_rms * widen, max_rel=base.max_rel * widen)
    got64, ref64 = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    if got64.shape != ref64.shape:
        mismatch = f"{got64.shape}, expected {ref64.shape}"
        return Error(output, float("inf"), float("inf"), float("inf"), False, tolerance, shape_mismatch=mismatch)
    finite = bool(np.isfinite(got64).all())
    diff = np.where(np.isfinite(got64), got64 - ref64, np.inf)
    max_abs = float(np.max(np.abs(diff))) if diff.size else 0.0
    floor = np.zeros(1) if scale_floor is None else np.asarray(scale_floor, dtype=np.float64)
    scale = max(float(np.max(np.abs(ref64))) if ref64.size else 0.0, float(np.max(np.abs(floor))), REF_RMS_FLOOR)
    rel_rms = rms(diff) / max(rms(ref64), rms(floor), REF_RMS_FLOOR) if finite else float("inf")
    return Error(output, rel_rms, max_abs, max_abs / scale, finite, tolerance)


def relative_change(perturbed: np.ndarray, ref: np.ndarray) -> float:
    """rms(perturbed − ref) / rms(ref) (floored like the error metric)."""
    return rms(perturbed - ref) / max(rms(ref), REF_RMS_FLOOR)


def describe(errors: list[Error]) -> str:
    """One line per output, for assertion messages."""
    return "; ".join(str(e) for e in errors)
