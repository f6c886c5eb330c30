"""``gdn_block_tkg``: AWS's documented fused GDN decode block (SDK 2.33, ``nkilib.experimental.gdn``, "GDN Block TKG
Kernel API Reference"), in NKI, with its signature and semantics.

``gdn_block_tkg(hidden [B, 1, H], W_in_qkv [H, conv_dim], W_in_z [H, value_dim], W_in_a [H, Hv], W_in_b [H, Hv],
conv_weight [conv_dim, K], conv_state [B, conv_dim, K], A_log [Hv], dt_bias [Hv], norm_weight [head_v_dim],
recurrent_state [B, Hv, head_k_dim, head_v_dim]) -> (core_out [B, 1, value_dim], new_conv_state, new_recurrent_state)``:
the whole Qwen3.5 GDN decode layer but out_proj — in_proj, the conv1d decode with SiLU (the window slides by one),
the split and GQA repeat of q and k (value head h reads key head h // (Hv / Hk)), l2norm of q and k, β = sigmoid(b),
g = −exp(A_log)·softplus(a + dt_bias), the single-token recurrence and RMSNormGated with z. Every dimension comes
from the shapes (head_k_dim from the state, Hk from conv_dim − value_dim). Functional, as the page says: the inputs
are only read, and the new states are returned for the caller to alias into its caches.

Where the page is silent, Hugging Face's Qwen3-Next layer decides, as for ``gdn_tkg``: eps 1e-6 for both norms, the
output scaled by head_k_dim^-0.5, fp32 arithmetic; the conv state holds K inputs (HF's layout, and
``gdn_conv1d_decode``'s), core_out in hidden's dtype.

It is ``gdn_block_step`` on one-row-per-request pools: the states are copied into the returned tensors (HBM to
HBM), which the pool kernel then updates in place at rows 0 .. B − 1.
"""

from __future__ import annotations

from typing import Any

from ..common.backend import nisa, nki, nl
from ..common.kernel_assert import kernel_assert
from ..common.tiles import FP32, sbuf
from .in_proj import copy_by_rows
from .step import gdn_block_step


@nki.jit
def gdn_block_tkg(
    hidden: Any,
    W_in_qkv: Any,
    W_in_z: Any,
    W_in_a: Any,
    W_in_b: Any,
    conv_weight: Any,
    conv_state: Any,
    A_log: Any,
    dt_bias: Any,
    norm_weight: Any,
    recurrent_state: Any,
) -> tuple[Any, Any, Any]:
    """Fused GDN decode block: in_proj + conv1d + GQA + gated delta-rule + gated RMSNorm in one kernel.

    Dimensions:
        B: batch rows. H: hidden size, a multiple of 128. conv_dim = 2·key_dim + value_dim. Hv = len(A_log).
        head_k_dim, head_v_dim <= 128. K: conv width, 2..5.

    Args:
        hidden (nl.NkiTensor): [B, 1, H] @ HBM, bf16 (or float32) decode-step hidden states.
        W_in_qkv (nl.NkiTensor): [H, conv_dim] @ HBM, hidden's dtype, the q|k|v in_proj weight (nn.Linear.weight.T).
        W_in_z (nl.NkiTensor): [H, value_dim] @ HBM, the z in_proj weight.
        W_in_a (nl.NkiTensor): [H, Hv] @ HBM, the a in_proj weight. W_in_b (nl.NkiTensor): [H, Hv], b's.
        conv_weight (nl.NkiTensor): [conv_dim, K] @ HBM fp32 (or bf16), the depthwise taps.
        conv_state (nl.NkiTensor): [B, conv_dim, K] @ HBM, hidden's dtype, the conv window (read only).
        A_log, dt_bias (nl.NkiTensor): [Hv] @ HBM fp32. norm_weight (nl.NkiTensor): [head_v_dim] @ HBM fp32.
        recurrent_state (nl.NkiTensor): [B, Hv, head_k_dim, head_v_dim] @ HBM fp32 (read only).

    Returns:
        tuple: core_out [B, 1, value_dim] in hidden's dtype; new_conv_state [B, conv_dim, K]; new_recurrent_state
        [B, Hv, head_k_dim, head_v_dim] fp32.

    Notes:
        Shapes are checked by ``gdn_block_step``'s trace-time rules (names as ``gdn_ref.block_rules`` gives them).
        The copies cost one read and one write of both states beyond the pool form's (the functional API's price).
    """
    batch, tokens = hidden.shape[0], hidden.shape[1]
    kernel_assert(len(hidden.shape) == 3 and tokens == 1 and len(conv_state.shape) == 3
                  and conv_state.shape[0] == batch and len(recurrent_state.shape) == 4
                  and recurrent_state.shape[0] == batch,
                  f"gdn_block_tkg: hidden {tuple(hidden.shape)}, conv_state {tuple(conv_state.shape)}, recurrent_state "
                  f"{tuple(recurrent_state.shape)} must be [B, 1, H], [B, conv_dim, K] and [B, Hv, head_k_dim, "
                  "head_v_dim] for the same B. Fix: one decode token per batch row, one state of each per row")  # fmt: skip
    conv_rows = nl.ndarray(tuple(conv_state.shape), dtype=conv_state.dtype, buffer=nl.shared_hbm)
    state_rows = nl.ndarray(tuple(recurrent_state.shape), dtype=recurrent_state.dtype, buffer=nl.shared_hbm)
    for source, target in ((conv_state, conv_rows), (recurrent_state, state_rows)):
        flat = (batch, source.size // batch)
        copy_by_rows(target.reshape(flat), source.reshape(flat))
    rows = nl.ndarray((batch,), dtype=nl.int32, buffer=nl.shared_hbm)  # row b of both pools: batch row b
    numbers = sbuf((1, batch), FP32)
    nisa.iota(dst=numbers, pattern=[[1, batch]], offset=0, channel_multiplier=0)
    as_int = sbuf((1, batch), nl.int32)
    nisa.tensor_copy(dst=as_int, src=numbers)
    nisa.dma_copy(dst=rows.reshape((1, batch)), src=as_int)
    core_out, _, _ = gdn_block_step(hidden, W_in_qkv, W_in_z, W_in_b, W_in_a, conv_weight, None, A_log, dt_bias,
                                    norm_weight, conv_rows, state_rows, rows)  # fmt: skip
    return core_out, conv_rows, state_rows
