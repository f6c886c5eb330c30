"""The rules of a ``gdn_gating`` launch (vLLM's ``fused_gdn_gating``), as ``Violation``\\ s naming the argument, the
value, the rule and the fix: what the kernel checks at trace time, the host entry point before launching, and the
torch op's fake implementation under tracing (no value is read).

vLLM's signature: ``fused_gdn_gating(A_log, a, b, dt_bias, beta=1.0, threshold=20.0) -> (g, beta_output)``, a and b
[tokens, heads] (the layer's ``ba`` projection split per head), A_log and dt_bias [heads]; g is [1, tokens, heads]
fp32 and beta_output [1, tokens, heads] in b's dtype. Its softplus is ``log(1 + exp(beta·x)) / beta`` where
``beta·x <= threshold`` and x above: the kernel computes the exact ``softplus(beta·x) / beta``, which equals that
within fp32 rounding whenever the threshold is at least ``MIN_THRESHOLD`` (above it the two differ by less than
log1p(e^−20) / beta relative to x: 2e-9, below half an fp32 ulp). A lower threshold switches to x where the
softplus still differs from it, which the kernel does not do: rejected.
"""

from __future__ import annotations

import math
from typing import Any

from gdn_ref.contract import Violation

API = "fused_gdn_gating"
IO_DTYPES = ("float32", "bfloat16")
MIN_THRESHOLD = 20.0  # the exact softplus reproduces vLLM's thresholded one from here up (module docstring)
# The heads of a row live on one partition ([R, H] per partition, fp32 working tiles); the constants on every
# partition in PSUM (2·H·4 bytes of its 16 KiB). Qwen3-Next has 32 value heads (64 in the larger configs).
MAX_HEADS = 1024


def _dtype(t: Any) -> str:
    return str(getattr(t, "dtype", type(t).__name__)).removeprefix("torch.")


def _shape(t: Any) -> tuple[int, ...] | None:
    shape = getattr(t, "shape", None)
    return None if shape is None else tuple(int(s) for s in shape)


def _bad(argument: str, value: str, rule: str, fix: str, rule_id: str) -> Violation:
    return Violation(rule_id, argument, value, rule, fix, API)


def gating_violations(a_log: Any, a: Any, b: Any, dt_bias: Any, beta: Any, threshold: Any) -> list[Violation]:
    """Every broken rule of ``fused_gdn_gating(A_log, a, b, dt_bias, beta, threshold)``.

    Dimensions:
        T: tokens (rows of a and b). H: heads.

    Args:
        a_log: [H] float32 or bfloat16. a, b: [T, H] float32 or bfloat16, T >= 1. dt_bias: [H] float32 or
        bfloat16. beta: the softplus' beta, a finite float > 0. threshold: at least ``MIN_THRESHOLD``.

    Returns:
        list[Violation]: empty when the launch is well formed.
    """
    found = []
    shape = _shape(a)
    if shape is None or len(shape) != 2 or min(shape) < 1 or _dtype(a) not in IO_DTYPES:
        return [_bad("a", f"shape {shape} dtype {_dtype(a)}", "a is [tokens, heads] float32 or bfloat16 with no empty "
                     "axis", "pass the layer's a projection as [num_tokens, num_v_heads]", "gating.a")]  # fmt: skip
    heads = shape[1]
    if heads > MAX_HEADS:
        found.append(_bad("a", f"heads = {heads}", f"at most {MAX_HEADS} heads", "split the heads over launches",
                          "gating.heads"))  # fmt: skip
    if _shape(b) != shape or _dtype(b) not in IO_DTYPES:
        found.append(_bad("b", f"shape {_shape(b)} dtype {_dtype(b)}", f"b is a's shape {list(shape)}, float32 or "
                          "bfloat16", "pass the layer's b projection shaped like a", "gating.b"))  # fmt: skip
    for name, vector in (("A_log", a_log), ("dt_bias", dt_bias)):
        if _shape(vector) != (heads,) or _dtype(vector) not in IO_DTYPES:
            found.append(_bad(name, f"shape {_shape(vector)} dtype {_dtype(vector)}", f"{name} is [heads] = [{heads}] "
                              "float32 or bfloat16", f"pass the layer's {name} parameter", f"gating.{name}"))  # fmt: skip
    if not _positive_finite(beta):
        found.append(_bad("beta", f"= {beta!r}", "the softplus' beta is a finite float > 0", "pass beta=1.0 "
                          "(Qwen3-Next's)", "gating.beta"))  # fmt: skip
    if not _number(threshold) or not float(threshold) >= MIN_THRESHOLD:
        found.append(_bad("threshold", f"= {threshold!r}", f"the kernel computes the exact softplus, which a threshold "
                          f">= {MIN_THRESHOLD} reproduces in fp32", "pass threshold=20.0 (the default)",
                          "gating.threshold"))  # fmt: skip
    return found


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _positive_finite(x: Any) -> bool:
    return _number(x) and math.isfinite(float(x)) and float(x) > 0
