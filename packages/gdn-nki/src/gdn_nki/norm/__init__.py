"""The gated RMSNorm of a GatedDeltaNet layer's output stage (issue 43 item 4): ``kernel`` (rows of any packed
[..., D] tensor, FLA's ``FusedRMSNormGated`` semantics) and ``rules`` (its shape and dtype rules)."""
