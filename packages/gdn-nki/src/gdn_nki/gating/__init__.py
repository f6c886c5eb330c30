"""The prefill gates as an NKI kernel: vLLM's ``fused_gdn_gating`` (g = −exp(A_log)·softplus(a + dt_bias), β =
sigmoid(b))."""
