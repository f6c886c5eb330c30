"""``gdn_cte_normed``: the chunked prefill with the layer's gated RMSNorm folded into its output stage. It composes
two kernel families — ``cte`` (the prefill) and ``norm`` (the norm's tiles and rules) — so it sits above both, as
``block`` does over ``tkg`` and ``conv``."""
