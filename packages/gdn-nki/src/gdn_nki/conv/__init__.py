"""The causal depthwise conv1d kernels of a GatedDeltaNet layer (issue 43): ``prefill`` (packed sequences in a
bucket on a conv-state pool) and ``step`` (decode / verify on the pool)."""
