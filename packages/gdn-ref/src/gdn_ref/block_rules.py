"""The rules of a fused decode-block call on the conv-state and recurrent-state pools (``block.py``'s semantics), as
``Violation``s naming the argument, the value, the rule and the fix: what a host checks before it launches the
block, and what the kernel checks at trace time (shapes and dtypes only: index values are device data).

The block's tensors are laid out by ``BLOCK_SPECS`` (dimension symbols, as the decode step's ``STEP_SPECS``); on top
of them: the q|k|v channels C = 2·Hk·Dk + Hv·Dv (Hk derived, dividing Hv), the z projection Hv·Dv wide, the hidden
size a multiple of 128 (the in_proj contracts it on the partitions), at most ``MAX_BLOCK_TOKENS`` tokens a call,
and the conv's own rules (``conv_rules``: widths, windows, channels, the pool's dtype) on the conv's operands.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from .contract import INDEX_DTYPE, Violation, _head_dim_violations, _spec, index_violations, spec_violations
from .conv_rules import conv_step_violations

BLOCK = "gdn_block_step"
HIDDEN_QUANTUM = 128  # the in_proj contracts the hidden size over the 128 partitions
# Tokens of a call (N·T): the in_proj keeps up to 8 PSUM accumulators of 128 tokens open at once.
MAX_BLOCK_TOKENS = 1024
CONV_ARGUMENTS = {"weight": "conv_weight", "bias": "conv_bias"}  # the conv step's argument -> the block's

BLOCK_SPECS = {
    "hidden": _spec("N T E", "compute", "the layer's input after its input norm, token-major"),
    "w_qkv": _spec("E C", "compute", "q|k|v in_proj weight (nn.Linear.weight.T)"),
    "w_z": _spec("E Z", "compute", "z (output gate) in_proj weight"),
    "w_b": _spec("E Hv", "compute", "b (update strength) in_proj weight"),
    "w_a": _spec("E Hv", "compute", "a (decay input) in_proj weight"),
    "A_log": _spec("Hv", "float32", "per-v-head log decay coefficient"),
    "dt_bias": _spec("Hv", "float32", "per-v-head softplus bias"),
    "norm_weight": _spec("Dv", "float32", "gated RMSNorm weight"),
    "state_pool": _spec("P Hv Dk Dv", "float32", "recurrent-state pool, fp32, updated in place"),
    "state_indices": _spec("N|N T", INDEX_DTYPE, "pool row of each request ([N]) or of each token's states ([N, T])"),
    "num_accepted_tokens": _spec("N", INDEX_DTYPE, "accepted tokens of the previous step", optional=True),
}


def block_violations(
    hidden: Any,
    w_qkv: Any,
    w_z: Any,
    w_b: Any,
    w_a: Any,
    conv_weight: Any,
    conv_bias: Any,
    A_log: Any,
    dt_bias: Any,
    norm_weight: Any,
    conv_pool: Any,
    state_pool: Any,
    state_indices: Any,
    num_accepted_tokens: Any = None,
    *,
    host: bool = True,
) -> list[Violation]:
    """Every broken rule of a fused decode-block call; with ``host``, the index values too (they address both pools).

    Args:
        As ``gdn_ref.block.gdn_block_decode_pool`` (tensors need only ``.shape`` and ``.dtype`` unless ``host``).
        host (bool): also read the index values; False at trace time.

    Returns:
        list[Violation]: empty when the call is valid.
    """
    call = dict(hidden=hidden, w_qkv=w_qkv, w_z=w_z, w_b=w_b, w_a=w_a, A_log=A_log, dt_bias=dt_bias,
                norm_weight=norm_weight, state_pool=state_pool, state_indices=state_indices,
                num_accepted_tokens=num_accepted_tokens)  # fmt: skip
    found, sizes = spec_violations(BLOCK, BLOCK_SPECS, call)
    found += _head_dim_violations(BLOCK, sizes, (("Dk", "state_pool"), ("Dv", "state_pool")))
    if found:
        return found

    def bad(rule: str, argument: str, value: str, text: str, fix: str) -> None:
        found.append(Violation(f"block.{rule}", argument, value, text, fix, BLOCK))

    n, t, e, c = sizes["N"], sizes["T"], sizes["E"], sizes["C"]
    hv, dk, dv = sizes["Hv"], sizes["Dk"], sizes["Dv"]
    if e % HIDDEN_QUANTUM:
        bad("hidden_size", "hidden", f"E={e}", f"the hidden size must be a multiple of {HIDDEN_QUANTUM} (the in_proj "
            "contracts it over the partitions)", f"pad the hidden size to a multiple of {HIDDEN_QUANTUM}")  # fmt: skip
    if n * t > MAX_BLOCK_TOKENS:
        bad("tokens", "hidden", f"N*T={n * t}", f"a call takes at most {MAX_BLOCK_TOKENS} tokens (N·T)",
            f"split the batch into calls of at most {MAX_BLOCK_TOKENS} tokens")  # fmt: skip
    if sizes["Z"] != hv * dv:
        bad("z_width", "w_z", f"shape {tuple(np.shape(w_z))}", f"w_z must be [E, Hv·Dv] = [{e}, {hv * dv}] (one gate "
            "per output element)", "pass the layer's z projection")  # fmt: skip
    key_dim, odd = divmod(c - hv * dv, 2)
    hk = key_dim // dk if key_dim > 0 and not odd and key_dim % dk == 0 else 0
    if not hk or hv % hk:
        bad("channels", "w_qkv", f"C={c} with Hv={hv}, Dk={dk}, Dv={dv}", "the q|k|v channels must be 2·Hk·Dk + "
            "Hv·Dv with Hk key heads dividing the Hv value heads", "pass the layer's fused q|k|v projection "
            "(q, k, v contiguous in that order)")  # fmt: skip
    stand_in = np.broadcast_to(np.zeros((), np.asarray(hidden).dtype if host else _numpy_dtype(hidden)), (n, t, c))
    conv = conv_step_violations(stand_in, conv_pool, conv_weight, conv_bias, state_indices, num_accepted_tokens,
                                "silu", api=BLOCK, in_row=False)  # fmt: skip
    # The conv's rules name the conv's arguments; the block's own names for them (its x is the in_proj's output).
    found += [replace(v, argument=CONV_ARGUMENTS.get(v.argument, v.argument)) for v in conv if v.argument != "x"]
    pool_rows = np.shape(conv_pool)[0] if len(np.shape(conv_pool)) == 3 else None
    if pool_rows is not None and pool_rows != sizes["P"]:
        bad("pool_rows", "conv_pool", f"P={pool_rows}", f"one index names a row of both pools: the conv pool needs "
            f"the state pool's P={sizes['P']} rows", "allocate both pools with the same rows")  # fmt: skip
    if host and not found:
        found += [replace(v, api=BLOCK) for v in index_violations(state_indices, num_accepted_tokens, sizes["P"], t)]
    return found


def _numpy_dtype(tensor: Any) -> Any:
    """A trace-time tensor's dtype as numpy's (the conv rules read only its name)."""
    name = str(getattr(tensor, "dtype", "float32")).rsplit(".", 1)[-1]
    if name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(name) if name in ("float32", "float16") else np.float32
