"""The causal depthwise conv1d kernels of a GatedDeltaNet layer (issue 43): ``step`` (decode / verify on a
conv-state pool)."""
