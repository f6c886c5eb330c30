"""The torch drop-ins as ``torch.library`` custom ops: one import, FakeTensorMode, opcheck, compile and export."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'gdn-nki[torch]'; nox -s integration)")

import gdn_nki.torch  # noqa: E402
import gdn_nki.torch_decode  # noqa: E402

# The originals' names: FLA's two, vLLM's pool variant (its own name here: vLLM reuses FLA's), vLLM / SGLang's
# fused-gating update.
DROP_INS = (
    "chunk_gated_delta_rule",
    "fused_recurrent_gated_delta_rule",
    "vllm_fused_recurrent_gated_delta_rule",
    "fused_sigmoid_gating_delta_rule_update",
)


def test_one_import_holds_every_drop_in_and_torch_decode_still_does() -> None:
    for name in DROP_INS:
        assert name in gdn_nki.torch.__all__, name
    for name in gdn_nki.torch_decode.__all__:
        assert getattr(gdn_nki.torch_decode, name) is getattr(gdn_nki.torch, name), name
