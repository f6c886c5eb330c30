"""A small continuous-batching engine over HF transformers' Qwen3-Next whose GatedDeltaNet layers run on gdn-nki
between HF's projections — conv, gating, recurrence, gated norm (``examples/serve_qwen3_next.py`` drives it).
Modules: ``kernels`` (the one seam to gdn-nki's drop-ins, the launches' phases and buckets, the guard that keeps
HF's GDN functions off the path), ``pool`` (rows of recurrent states and conv windows with owners and NaN poison),
``model`` (HF's layers over a packed batch with per-request caches), ``engine`` (scheduler, speculative decoding,
prefix cache)."""
