"""The shape and dtype rules of a gated RMSNorm launch, as ``Violation``\\ s naming the argument, the value, the rule
and the fix: what ``gdn_gated_rms_norm`` checks at trace time, the host entry point before launching, and the torch
drop-in's fake implementation under tracing (no value is read).

The semantic options (eps, activation, FLA's and vLLM's options Qwen3-Next does not use) are
``gdn_ref.norm.check_norm_options``' rules; these add what the kernel takes: float32 or bfloat16 tensors, the gate
in x's dtype, the weight in either, and a normalized axis of at most ``MAX_DIM`` elements.
"""

from __future__ import annotations

from typing import Any

from gdn_ref.contract import ContractError, Violation
from gdn_ref.norm import API, check_norm_options

IO_DTYPES = ("float32", "bfloat16")
# The normalized axis: one row of D elements lives on one partition (fp32 working tiles of D·4 bytes, three tile
# sets in SBUF) and the weight on every partition in PSUM (D·4 bytes of its 16 KiB). GatedDeltaNet heads are
# 64..256 wide; 2048 leaves room for any model's head dim.
MAX_DIM = 2048


def _dtype(t: Any) -> str:
    """The dtype's name as numpy, nki-cpu and NKI spell it ("bfloat16"), torch's prefix removed."""
    return str(getattr(t, "dtype", type(t).__name__)).removeprefix("torch.")


def _shape(t: Any) -> tuple[int, ...] | None:
    shape = getattr(t, "shape", None)
    return None if shape is None else tuple(int(s) for s in shape)


def norm_violations(x: Any, z: Any, weight: Any, eps: Any, activation: Any) -> list[Violation]:
    """Every broken rule of a gated RMSNorm launch ``y = x · rsqrt(mean(x²) + eps) · weight · act(z)``.

    Dimensions:
        D: the normalized (last) axis; any leading axes (tokens, heads), the same for x and z.

    Args:
        x: [..., D] float32 or bfloat16. z: x's shape and dtype, or None (no gate). weight: [D] float32 or
        bfloat16, or None (no scale). eps: a finite float > 0. activation: "silu" / "swish" or "sigmoid".

    Returns:
        list[Violation]: empty when the launch is well formed.
    """
    xs, zs, ws = _shape(x), _shape(z), _shape(weight)
    if xs is None or len(xs) < 2 or min(xs) < 1 or _dtype(x) not in IO_DTYPES:
        return [Violation("norm.x", "x", f"shape {xs} dtype {_dtype(x)}", "x must be [..., D] float32 or bfloat16 "
                          "with at least one leading axis and no empty axis", "pass the recurrence's output as "
                          "[tokens, heads, D] or [rows, D]", API)]  # fmt: skip
    try:
        check_norm_options(xs, zs, ws, eps=eps, activation=activation)
    except ContractError as error:
        return list(error.violations)
    found = []
    if xs[-1] > MAX_DIM:
        found.append(Violation("norm.dim", "x", f"D = {xs[-1]}", f"the normalized axis holds at most {MAX_DIM} "
                               "elements", "normalize per head (D = head_v_dim)", API))  # fmt: skip
    if z is not None and _dtype(z) != _dtype(x):
        found.append(Violation("norm.gate_dtype", "g", f"dtype {_dtype(z)}", f"the gate has x's dtype {_dtype(x)}",
                               f"pass g.to({_dtype(x)})", API))  # fmt: skip
    if weight is not None and _dtype(weight) not in IO_DTYPES:
        found.append(Violation("norm.weight_dtype", "weight", f"dtype {_dtype(weight)}", "weight is float32 or "
                               "bfloat16", "pass weight.float()", API))  # fmt: skip
    return found


def output_norm_violations(query: Any, value: Any, z: Any, weight: Any, eps: Any, activation: Any) -> list[Violation]:
    """Every broken rule of the gated RMSNorm ``gdn_cte_normed`` folds into its output stage, beside ``gdn_cte``'s.

    Dimensions:
        B, S, Hv, Dv: ``value``'s [B, Hv, S, Dv].

    Args:
        query, value: the launch's, whose dtype and shape set z's. z: [B, S, Hv, Dv] (seq-first, the layer's layout)
        in query's dtype; never None (the fused form always gates). weight, eps, activation: as
        ``norm_violations``.

    Returns:
        list[Violation]: empty when the norm's arguments are well formed (``value``'s own rules are
        ``gdn_cte``'s).
    """
    vs = _shape(value)
    if vs is None or len(vs) != 4:
        return []  # gdn_cte's own rules name value
    batch, heads, seq_len, dim = vs
    dtype = _dtype(query)
    expected = (batch, seq_len, heads, dim)
    if _shape(z) != expected or _dtype(z) != dtype:
        return [Violation("norm.fused_gate", "z", f"shape {_shape(z)} dtype {_dtype(z)}", f"z is [B, S, Hv, Dv] = "
                          f"{list(expected)} in the compute dtype {dtype} (the layer's seq-first layout)",
                          "pass the z projection as [batch, seq, value heads, head_v_dim] in query's dtype",
                          API)]  # fmt: skip
    return norm_violations(z, z, weight, eps, activation)
