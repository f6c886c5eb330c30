"""gdn-nki for PyTorch model code: FLA's ``chunk_gated_delta_rule`` on the NKI kernel (``chunk.py``), and the
decode drop-ins (``fused_recurrent.py``). Needs the optional extra ``gdn-nki[torch]``.

    from gdn_nki.torch import chunk_gated_delta_rule   # was: from fla.ops.gated_delta_rule import ...
"""

from .chunk import chunk_gated_delta_rule

__all__ = ["chunk_gated_delta_rule"]
