"""A small continuous-batching engine over HF transformers' Qwen3-Next whose GatedDeltaNet cores run on gdn-nki
(``examples/serve_qwen3_next.py`` drives it). Modules: ``kernels`` (the one seam to the GDN kernels, trace
counting, the guard that keeps HF's GDN functions off the path), ``pool`` (state-pool rows with owners and NaN
poison), ``model`` (HF's layers over a packed batch with per-request caches), ``engine`` (scheduler, speculative
decoding, prefix cache)."""
