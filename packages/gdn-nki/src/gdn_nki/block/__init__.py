"""The fused decode block of a GatedDeltaNet layer (issue 43, items 2–3): ``gdn_block_step`` (one launch per layer
per step on the conv-state and recurrent-state pools) and AWS's ``gdn_block_tkg``, composed from the conv step
(``conv/``), the decode recurrence (``tkg/``) with the gated norm folded in or the norm kernel (``norm/``) after it,
and an in_proj stage of their own.

Imports ``conv/``, ``tkg/``, ``norm/`` and ``common/`` (``docs/architecture.md``, "gdn-nki's layers")."""
