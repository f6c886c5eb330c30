"""Token generation (decode): ``gdn_tkg`` (AWS's fused single-token step) and ``gdn_step`` (N requests × T tokens on
a state pool), with the recurrence, the request pipeline and the state tiles they share.

Imports only ``gdn_nki.common`` (``docs/architecture.md``, "gdn-nki's layers").
"""
