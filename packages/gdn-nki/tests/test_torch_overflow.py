"""The red-team repro on the torch drop-ins: un-normalised q and k with use_qk_l2norm_in_kernel off overflow the
recurrence (β·‖k‖² > 2); the call is refused naming `k` and the fix, and the pool row is left as it was."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'gdn-nki[torch]'; nox -s integration)")

from gdn_nki.torch import chunk_gated_delta_rule  # noqa: E402
from gdn_nki.torch_decode import fused_recurrent_gated_delta_rule  # noqa: E402
from gdn_ref.contract import ContractError  # noqa: E402


def _inputs(tokens: int, dim: int, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return dict(
        q=torch.randn(1, tokens, 1, dim, generator=gen),
        k=torch.randn(1, tokens, 1, dim, generator=gen),  # ‖k‖ ≈ √dim: β·‖k‖² far above 2
        v=torch.randn(1, tokens, 1, dim, generator=gen),
        g=-0.01 * torch.rand(1, tokens, 1, generator=gen),
        beta=torch.rand(1, tokens, 1, generator=gen),
    )


def _assert_names_the_overflow(error: ContractError) -> None:
    (violation,) = error.violations
    assert violation.rule_id == "recurrence.overflow" and violation.argument == "k"
    assert "use_qk_l2norm_in_kernel=True" in violation.fix
    assert "β·‖k‖² > 2" in violation.rule


def test_the_repro_is_refused_and_the_pool_row_is_untouched() -> None:
    x = _inputs(200, 128)
    pool = torch.randn(3, 1, 128, 128)
    before = pool.clone()
    with pytest.raises(ContractError) as caught:
        chunk_gated_delta_rule(**x, initial_state=pool, state_indices=torch.tensor([1]),
                               cu_seqlens=torch.tensor([0, 200]))  # fmt: skip
    _assert_names_the_overflow(caught.value)
    assert caught.value.entry_point == "gdn_nki.torch.chunk_gated_delta_rule"
    assert torch.equal(pool, before)


def test_the_fix_the_error_names_makes_the_same_call_complete() -> None:
    x = _inputs(200, 128)
    pool = torch.randn(3, 1, 128, 128)
    o, _ = chunk_gated_delta_rule(**x, initial_state=pool, state_indices=torch.tensor([1]),
                                  cu_seqlens=torch.tensor([0, 200]), use_qk_l2norm_in_kernel=True)  # fmt: skip
    assert o.isfinite().all() and pool.isfinite().all()


def test_fla_fused_recurrent_refuses_the_overflow() -> None:
    x = _inputs(96, 64)
    state = torch.zeros(1, 1, 64, 64)
    with pytest.raises(ContractError) as caught:
        fused_recurrent_gated_delta_rule(**x, initial_state=state, output_final_state=True)
    _assert_names_the_overflow(caught.value)
    assert not state.any()
