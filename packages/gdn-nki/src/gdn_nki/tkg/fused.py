"""``gdn_tkg``: AWS's documented fused single-token decode step (SDK 2.33, nkilib.experimental.gdn), in NKI.

The signature and semantics are the "GDN TKG Kernel API Reference" page's: raw q, k (GQA-expanded, not
normalized), v, raw b and a, A_log, dt_bias, the output gate z and norm_weight, and the state; it folds l2norm(q, k),
β = sigmoid(b), g = −exp(A_log)·softplus(a + dt_bias) and RMSNormGated(out, z) around the recurrence. Where the
page is silent the kernel follows Hugging Face's Qwen3-Next layer (``gdn_ref.decode`` lists each choice): eps
1e-6 for both norms, the output scaled by K^-0.5, all arithmetic in fp32, ``out`` in q's dtype and a new fp32
state (``state_in`` is only read).
"""

from __future__ import annotations

from typing import Any

from gdn_ref.contract import validate_tkg

from ..common.backend import nki, nl
from ..common.kernel_assert import assert_valid_call
from ..common.tiles import FP32
from .pipeline import Request, emit_requests
from .recurrence import Constants, Gates, OutputNorm, Shapes, allocate_out
from .request_loop import program_share


@nki.jit
def gdn_tkg(
    q: Any,
    k: Any,
    v: Any,
    b: Any,
    a: Any,
    A_log: Any,
    dt_bias: Any,
    z: Any,
    norm_weight: Any,
    state_in: Any,
) -> tuple[Any, Any]:
    """Fused single-token gated delta-rule decode step.

    Dimensions:
        BH: batch × value heads, row b·Hv + h (value head fastest). Hv = len(A_log). K, V: head dims <= 128.

    Args:
        q (nl.NkiTensor): [BH, K] @ HBM, RAW query (GQA-expanded, not l2-normed); float32 or bfloat16, the
            compute dtype of the I/O.
        k (nl.NkiTensor): [BH, K] @ HBM, RAW key (GQA-expanded, not l2-normed), q's dtype.
        v (nl.NkiTensor): [BH, V] @ HBM, value, q's dtype.
        b (nl.NkiTensor): [BH] @ HBM fp32, RAW beta pre-sigmoid.
        a (nl.NkiTensor): [BH] @ HBM fp32, RAW gate input (pre-softplus).
        A_log (nl.NkiTensor): [Hv] @ HBM fp32, per-v-head log decay coefficient.
        dt_bias (nl.NkiTensor): [Hv] @ HBM fp32, per-v-head softplus bias.
        z (nl.NkiTensor): [BH, V] @ HBM, output gate of the gated RMSNorm, q's dtype.
        norm_weight (nl.NkiTensor): [V] @ HBM fp32, RMSNorm weight.
        state_in (nl.NkiTensor): [BH, K, V] @ HBM fp32, the state before the token (read only).

    Returns:
        tuple: ``out`` [BH, V] in q's dtype = RMSNormGated(o, z), and the state after the token [BH, K, V] fp32.

    Notes:
        Every rule a trace can see (``gdn_ref.contract.validate_tkg``) is checked before anything is allocated;
        ``gdn_nki.tkg_simulate`` also scans the values. Each batch row b is one request of ``pipeline.emit_requests``
        with Hk = Hv (the inputs are already expanded); the rows are split over the launch grid (``gdn_tkg[2]``:
        program p runs rows p, p + 2, …), its gated RMSNorm one per request over every head's outputs.
    """
    assert_valid_call(validate_tkg(q, k, v, b, a, A_log, dt_bias, z, norm_weight, state_in, host=False))
    bh, dk = q.shape
    hv, dv = A_log.shape[0], v.shape[1]
    shapes = Shapes(requests=bh // hv, tokens=1, key_heads=hv, value_heads=hv, dk=dk, dv=dv)
    batch = bh // hv
    q, k, v, a, b = (x.reshape((batch, 1, hv, -1)) for x in (q, k, v, a, b))  # [B, T = 1, Hv, ·] requests
    gates = Gates(a=a, b=b, A_log=A_log, dt_bias=dt_bias)
    norm = OutputNorm(z=z.reshape((batch, 1, hv, dv)), norm_weight=norm_weight)
    out = allocate_out(shapes, q.dtype)
    state_out = nl.ndarray((bh, dk, dv), dtype=FP32, buffer=nl.shared_hbm)
    # The batch rows split over the launch grid as gdn_step's requests (``request_loop``): program p runs rows p,
    # p + grid, … (none when B < grid), each writing only its rows of the shared out and state_out. All in one group
    # (no compiled loop): a run-time row would address views of AWS's flat [BH, ·] tensors, which nki-cpu refuses
    # (the pages disagree on how ``.ap`` counts a view's offsets), so the rows stay trace-time ints.
    share = program_share(batch, per_iteration=batch)
    if share is None:
        return out.reshape((bh, dv)), state_out
    consts = Constants(shapes, gates, norm)
    source, target = (s.reshape((batch, hv, dk, dv)) for s in (state_in, state_out))

    def iteration(g: Any) -> None:
        requests = (Request(n=n, source=source, target=target, read_row=n, final_row=n)
                    for _, n in share.members(share.base(g)))  # fmt: skip
        emit_requests(shapes, (q, k, v, out), gates, consts, requests, scale=dk**-0.5, l2norm=True, norm=norm)

    share.run(iteration)
    return out.reshape((bh, dv)), state_out
