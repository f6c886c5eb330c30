"""Context encoding (prefill): the chunk-parallel ``gdn_cte`` kernel, its packed (``gdn_cte_varlen``) and bucketed
(``gdn_cte_bucket``) launch forms, and the pipeline stages they share.

Imports only ``gdn_nki.common`` (``docs/architecture.md``, "gdn-nki's layers").
"""
