"""The decode family: how gdn-spec calls and judges a decode kernel (N requests × T tokens on a state pool).

The calling convention is ``gdn_nki.decode_step``'s host signature, numpy, keyword arguments::

    fn(query=, key=, value=, state_pool=, state_indices=, [num_accepted_tokens=], g_log=, beta=  # or a=, b=,
       A_log=, dt_bias=, scale=, use_qk_l2norm=) -> (out, state_pool)

- query, key [N, T, Hk, Dk] and value [N, T, Hv, Dv] in the compute dtype (float32 or bfloat16), token-major;
- state_pool [P, Hv, Dk, Dv] float32, updated in place: only the rows live requests name are read or written;
- state_indices int32 [N] (request n reads row [n] and writes its state after the T tokens there) or [N, T]
  (the state after token t goes to row [n, t]; request n reads row [n, num_accepted_tokens[n] - 1], or [n, 0]);
  -1 marks a padding request, which reads and writes nothing (its outputs are unspecified);
- gating precomputed (g_log, beta [N, T, Hv] fp32) or fused (a, b [N, T, Hv], A_log, dt_bias [Hv] fp32:
  g = −exp(A_log)·softplus(a + dt_bias), β = sigmoid(b));
- scale multiplies the outputs; use_qk_l2norm normalizes q and k inside (x·rsqrt(Σx² + 1e-6)).

It returns out [N, T, Hv, Dv] in query's dtype and the pool (the same object). A kernel declares what it supports
in ``fn.gdn_spec_decode_capabilities`` (``DecodeCapabilities``), which also marks it as a decode kernel for
``gdn-spec check``; kernels of other conventions run through ``gdn_spec.decode.adapters``. The checks are the suite's
``test_decode_*`` modules; cases and the oracle's expectation are ``cases``.
"""

from .capabilities import CAPABILITIES_ATTR, DecodeCapabilities
from .cases import Addressing, DecodeCase, DecodeGeometry, errors_vs_oracle, expected, make_decode_case

__all__ = [
    "CAPABILITIES_ATTR",
    "Addressing",
    "DecodeCapabilities",
    "DecodeCase",
    "DecodeGeometry",
    "errors_vs_oracle",
    "expected",
    "make_decode_case",
]
