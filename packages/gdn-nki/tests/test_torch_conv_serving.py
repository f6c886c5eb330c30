"""gdn_nki.torch's vLLM conv drop-ins in the serving example's forms (``examples/serving/kernels.py``): the decode
step with [N, T] rows and ``num_accepted_tokens`` and the prefill with read rows, checkpoints and a bucket, compiled
without a graph break to eager's bits; their index rules' rejections named, the pool unchanged. (Their values
against gdn-ref's oracles: ``test_torch_conv.py``.)"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gdn_nki.torch.conv import causal_conv1d_fn, causal_conv1d_update  # noqa: E402
from gdn_ref.contract import ContractError  # noqa: E402

C, W = 32, 4


def _conv(seed: int, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(C, W, generator=g) * 0.5, torch.randn(C, generator=g), torch.randn(rows, C, W - 1, generator=g)


def test_compile_fullgraph_serving_forms_bit_equal_to_eager():
    """The serving example's calls (per-token rows with num_accepted_tokens; read rows, checkpoints and a bucket)
    compile without a graph break to eager's bits."""
    weight, bias, pool = _conv(13, 8)
    g = torch.Generator().manual_seed(14)
    x, packed = torch.randn(2, C, 3, generator=g), torch.randn(C, 140, generator=g)
    rows, accepted = torch.tensor([[0, 1, 2], [5, 6, 7]], dtype=torch.int32), torch.tensor([2, 3], dtype=torch.int32)
    bounds = torch.tensor([0, 139, 140], dtype=torch.int32)
    prefill = dict(read_indices=torch.tensor([4, -1], dtype=torch.int32), checkpoint_every=128,
                   checkpoint_indices=torch.tensor([[3], [-1]], dtype=torch.int32), bucket=(256, 2))  # fmt: skip

    def serve(pool):
        out = causal_conv1d_update(x, pool, weight, bias, "silu", rows, num_accepted_tokens=accepted)
        return out, causal_conv1d_fn(packed, weight, bias, pool, bounds, rows[:, 0], activation="silu", **prefill)

    eager_pool = pool.clone()
    eager = serve(eager_pool)
    torch._dynamo.reset()
    got = torch.compile(serve, fullgraph=True, backend="eager")(pool)
    assert all(torch.equal(a, b) for a, b in zip(got, eager, strict=True)) and torch.equal(pool, eager_pool)


@pytest.mark.parametrize(
    ("options", "named"),
    [({"checkpoint_every": 100, "checkpoint_indices": torch.zeros(1, 1, dtype=torch.int32)}, "checkpoint_every"),
     ({"read_indices": torch.tensor([9], dtype=torch.int32)}, "read_indices"),
     ({"checkpoint_every": 128, "checkpoint_indices": torch.tensor([[1]], dtype=torch.int32)}, "checkpoint_indices"),
     ({"bucket": (128,)}, "bucket")],
)  # fmt: skip
def test_fn_serving_keywords_rejected_by_name_pool_unchanged(options, named):
    """A checkpoint spacing off the 128 grid, a read row outside the pool, a checkpoint row the sequence also ends
    in, a bucket that is not (T, N)."""
    weight, bias, pool = _conv(15, 5)
    before = pool.clone()
    x = torch.randn(C, 2)
    with pytest.raises(ContractError, match=named):
        causal_conv1d_fn(x, weight, bias, pool, torch.tensor([0, 2], dtype=torch.int32),
                         torch.tensor([1], dtype=torch.int32), **options)  # fmt: skip
    assert torch.equal(pool, before)


def test_update_per_token_rows_repeated_rejected_pool_unchanged():
    """[N, T] rows name each window once: a row repeated across requests is refused before anything is written."""
    weight, bias, pool = _conv(16, 6)
    before = pool.clone()
    rows = torch.tensor([[0, 1], [1, 2]], dtype=torch.int32)
    with pytest.raises(ContractError, match="state_indices"):
        causal_conv1d_update(torch.randn(2, C, 2), pool, weight, bias, "silu", rows,
                             num_accepted_tokens=torch.tensor([1, 2], dtype=torch.int32))  # fmt: skip
    assert torch.equal(pool, before)
