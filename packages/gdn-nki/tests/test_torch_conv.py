"""gdn_nki.torch's vLLM ``causal_conv1d_update`` drop-in: equal to gdn-ref's fp64 conv oracle, padding rows
untouched, rejections by name with the pool unchanged, torch.compile without graph breaks, fake tensors."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from gdn_nki.torch.conv import causal_conv1d, causal_conv1d_fn, causal_conv1d_update  # noqa: E402
from gdn_ref.contract import ContractError  # noqa: E402
from gdn_ref.conv import conv_from_window  # noqa: E402
from gdn_spec.metrics import compare, describe  # noqa: E402

N, C, W, T, P = 3, 32, 4, 2, 5


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, C, T, generator=g)
    weight = torch.randn(C, W, generator=g) * 0.5
    bias = torch.randn(C, generator=g)
    pool = torch.randn(P, C, W - 1, generator=g)
    return x, weight, bias, pool


def _oracle(x, window, weight, bias):
    out, windows = conv_from_window(x.T.numpy(), window.numpy(), weight.numpy(), bias.numpy(), "silu")
    return out.T, windows[-1]


def test_update_matches_oracle_and_leaves_padding_rows():
    x, weight, bias, pool = _inputs()
    before = pool.clone()
    rows = torch.tensor([3, -1, 0], dtype=torch.int32)
    out = causal_conv1d_update(x, pool, weight, bias, "silu", rows)
    for n, row in ((0, 3), (2, 0)):
        want, window = _oracle(x[n], before[row], weight, bias)
        np.testing.assert_allclose(out[n].numpy(), want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(pool[row].numpy(), window, rtol=0, atol=1e-6)
    assert torch.equal(pool[[1, 2, 4]], before[[1, 2, 4]])


def test_single_token_and_custom_pad_slot_id():
    x, weight, bias, pool = _inputs(1)
    before = pool.clone()
    rows = torch.tensor([4, 99, 1], dtype=torch.int32)
    out = causal_conv1d_update(x[:, :, 0], pool, weight, bias, True, rows, pad_slot_id=99)
    assert out.shape == (N, C)
    want, window = _oracle(x[0, :, :1], before[4], weight, bias)
    np.testing.assert_allclose(out[0].numpy(), want[:, 0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(pool[4].numpy(), window, rtol=0, atol=1e-6)
    assert torch.equal(pool[[0, 2, 3]], before[[0, 2, 3]])


def _update_call(rows: list[int]):
    x, weight, bias, pool = _inputs(2)
    return pool, lambda: causal_conv1d_update(x, pool, weight, bias, True, torch.tensor(rows, dtype=torch.int32),
                                              pad_slot_id=99)  # fmt: skip


def _fn_call(rows: list[int]):
    x, weight, bias, pool = _inputs(3)
    return pool, lambda: causal_conv1d_fn(x[0].repeat(1, 5), weight, bias, pool, torch.tensor([0, 4, 10]),
                                          torch.tensor(rows, dtype=torch.int32), torch.tensor([True, False]),
                                          pad_slot_id=99)  # fmt: skip


@pytest.mark.parametrize(("call", "rows", "argument"), [(_update_call, [4, -1, 1], "conv_state_indices"),
                                                        (_fn_call, [-1, 2], "cache_indices")])  # fmt: skip
def test_with_another_pad_slot_id_a_minus_one_row_is_not_padding(call, rows, argument):
    """vLLM's kernels skip only a row equal to ``pad_slot_id``; any other value, −1 included, is a cache line
    (vLLM would read and write row −1, outside the pool): refused by name as out of range, the caller's −1 and id
    in the message, the pool unchanged. The same rows with vLLM's default id (−1) pad that request."""
    pool, run = call(rows)
    before = pool.clone()
    with pytest.raises(ContractError) as info:
        run()
    message = str(info.value)
    assert f"`{argument}`" in message and "-1" in message and "pad_slot_id=99" in message, message
    assert str(-(2**31)) not in message, message
    assert torch.equal(pool, before)
    pool, run = call([99 if r == -1 else r for r in rows])
    before = pool.clone()
    run()  # 99 pads that request: its row (and every row not named) untouched
    named = [r for r in rows if r >= 0]
    assert torch.equal(pool[[r for r in range(P) if r not in named]], before[[r for r in range(P) if r not in named]])


@pytest.mark.parametrize(
    ("option", "value"),
    [("num_accepted_tokens", torch.ones(N, dtype=torch.int32)),  # [N] rows, a row of W − 1 < W − 2 + T inputs
     ("query_start_loc", torch.arange(N + 1)),
     ("activation", "gelu")],
)  # fmt: skip
def test_rejections_name_the_argument_and_leave_the_pool(option, value):
    x, weight, bias, pool = _inputs()
    before = pool.clone()
    with pytest.raises(ContractError, match=option):
        causal_conv1d_update(x, pool, weight, bias, **{"activation": "silu", option: value})
    assert torch.equal(pool, before)


def test_out_of_range_row_rejected_pool_unchanged():
    x, weight, bias, pool = _inputs()
    before = pool.clone()
    with pytest.raises(ContractError):
        causal_conv1d_update(x, pool, weight, bias, "silu", torch.tensor([0, P, 1], dtype=torch.int32))
    assert torch.equal(pool, before)


def test_compile_fullgraph_bit_equal_to_eager():
    x, weight, bias, pool = _inputs(2)
    rows = torch.tensor([2, -1, 4], dtype=torch.int32)
    eager_pool = pool.clone()
    eager = causal_conv1d_update(x, eager_pool, weight, bias, "silu", rows)
    torch._dynamo.reset()
    compiled = torch.compile(causal_conv1d_update, fullgraph=True, backend="eager")
    got = compiled(x, pool, weight, bias, "silu", rows)
    assert torch.equal(got, eager) and torch.equal(pool, eager_pool)


def test_fake_tensor_mode_gives_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x, weight, bias, pool = _inputs()
        out = causal_conv1d_update(x, pool, weight, bias, "silu", torch.zeros(N, dtype=torch.int32))
    assert out.shape == (N, C, T)


def test_fn_matches_oracle_per_sequence_from_its_row():
    g = torch.Generator().manual_seed(3)
    lengths = [5, 0, 7, 3]
    bounds = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
    x = torch.randn(C, int(bounds[-1]), generator=g)
    weight, bias = torch.randn(C, W, generator=g) * 0.5, torch.randn(C, generator=g)
    pool = torch.randn(6, C, W - 1, generator=g)
    before = pool.clone()
    rows = torch.tensor([4, 2, -1, 1], dtype=torch.int32)
    initial = torch.tensor([True, False, False, False])
    out = causal_conv1d_fn(x, weight, bias, pool, bounds, rows, initial, "silu")
    assert out.shape == x.shape
    for i, row in enumerate(rows.tolist()):
        lo, hi = int(bounds[i]), int(bounds[i + 1])
        start = before[row] if bool(initial[i]) else torch.zeros(C, W - 1)
        want, windows = conv_from_window(x[:, lo:hi].T.numpy(), start.numpy(), weight.numpy(), bias.numpy(), "silu")
        np.testing.assert_allclose(out[:, lo:hi].T.numpy(), want, rtol=1e-5, atol=1e-5)
        if row >= 0 and hi > lo:
            np.testing.assert_allclose(pool[row].numpy(), windows[-1], rtol=0, atol=1e-6)
    assert torch.equal(pool[[0, 2, 3, 5]], before[[0, 2, 3, 5]])  # 2: an empty sequence's row, not rewritten


def test_fn_rejects_prefix_block_form_pool_unchanged():
    x, weight, bias, pool = _inputs()
    before = pool.clone()
    bounds = torch.tensor([0, 2], dtype=torch.int32)
    with pytest.raises(ContractError, match="num_computed_tokens"):
        causal_conv1d_fn(x[0], weight, bias, pool, bounds, num_computed_tokens=torch.zeros(1, dtype=torch.int32))
    assert torch.equal(pool, before)


def test_fn_compile_fullgraph_bit_equal_to_eager():
    x, weight, bias, pool = _inputs(4)
    packed = x.permute(1, 0, 2).reshape(C, N * T)
    bounds = torch.arange(0, N * T + 1, T, dtype=torch.int32)
    rows, initial = torch.tensor([1, 3, 0], dtype=torch.int32), torch.tensor([True, False, True])
    eager_pool = pool.clone()
    eager = causal_conv1d_fn(packed, weight, bias, eager_pool, bounds, rows, initial)
    torch._dynamo.reset()
    compiled = torch.compile(causal_conv1d_fn, fullgraph=True, backend="eager")
    got = compiled(packed, weight, bias, pool, bounds, rows, initial)
    assert torch.equal(got, eager) and torch.equal(pool, eager_pool)


@pytest.mark.parametrize("varlen", [False, True])
def test_fla_causal_conv1d_matches_oracle_with_caches_and_residual(varlen):
    g = torch.Generator().manual_seed(5)
    lengths = [6, 2, 9] if varlen else [7, 7]
    x = torch.randn(1 if varlen else 2, sum(lengths) if varlen else 7, C, generator=g)
    weight, bias = torch.randn(C, W, generator=g) * 0.5, torch.randn(C, generator=g)
    residual = torch.randn(x.shape, generator=g)
    initial = torch.randn(len(lengths), C, W, generator=g)
    kept = initial.clone()
    bounds = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32) if varlen else None
    y, final = causal_conv1d(x, weight, bias, residual, initial, True, "silu", cu_seqlens=bounds)
    assert torch.equal(initial, kept) and final.shape == initial.shape
    flat, res = x.reshape(-1, C), residual.reshape(-1, C)
    for i, n in enumerate(lengths):
        lo = sum(lengths[:i])
        want, windows = conv_from_window(
            flat[lo : lo + n].numpy(), kept[i].numpy(), weight.numpy(), bias.numpy(), "silu"
        )
        np.testing.assert_allclose(
            y.reshape(-1, C)[lo : lo + n].numpy(), want + res[lo : lo + n].numpy(), rtol=1e-5, atol=1e-5
        )
        np.testing.assert_allclose(final[i].numpy(), windows[-1], rtol=0, atol=1e-6)


@pytest.mark.parametrize("case", ["fp32 caches", "residual", "fp32 caches and residual"])
def test_fla_causal_conv1d_rounds_once_as_flas_kernel_at_bf16(case):
    """FLA's kernel reads bf16 x, fp32 caches and the residual into fp32, adds the residual to the fp32 sum and
    rounds once to bf16. Against the fp64 oracle of the very inputs: within the bf16 tolerance, and equal to the
    oracle rounded once to bf16 but for the rare element whose fp32 sum sits by a rounding boundary (rounding the
    caches to bf16 first, or the output before the residual, changes a large share of the outputs); the final
    caches in x's dtype, as FLA's."""
    g = torch.Generator().manual_seed(11)
    lengths = [2, 3, 1, 5, 2]  # short: most outputs read the caches
    x = torch.randn(1, sum(lengths), C, generator=g).to(torch.bfloat16)
    weight, bias = (torch.randn(C, W, generator=g) * 0.5).to(torch.bfloat16), torch.randn(C, generator=g)
    caches = torch.randn(len(lengths), C, W, generator=g) * 3
    caches = caches if "fp32" in case else caches.to(torch.bfloat16)
    residual = torch.randn(x.shape, generator=g).to(torch.bfloat16) if "residual" in case else None
    bounds = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
    y, final = causal_conv1d(x, weight, bias, residual, caches, True, "silu", cu_seqlens=bounds)
    assert y.dtype == final.dtype == torch.bfloat16
    want, windows = [], []
    for i, (lo, hi) in enumerate(zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)):
        out, window = conv_from_window(x[0, lo:hi].double().numpy(), caches[i].double().numpy(),
                                       weight.double().numpy(), bias.double().numpy(), "silu")  # fmt: skip
        want.append(out + (0 if residual is None else residual[0, lo:hi].double().numpy()))
        windows.append(window[-1])
    want = np.concatenate(want)
    error = compare("out", y[0].float().numpy(), want, "bfloat16")
    assert error.ok, describe([error])
    once = torch.from_numpy(want).to(torch.bfloat16)
    assert (y[0] != once).sum().item() <= max(2, once.numel() // 200), f"{(y[0] != once).sum()} of {once.numel()}"
    assert torch.equal(final, torch.from_numpy(np.stack(windows)).to(torch.bfloat16))


def test_fla_causal_conv1d_rejects_unknown_option():
    x, weight, bias, _ = _inputs()
    with pytest.raises(ContractError, match="seq_idx"):
        causal_conv1d(x.transpose(1, 2), weight, bias, seq_idx=torch.zeros(1))


def _hf_fallbacks():
    modeling = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    return modeling.causal_conv1d_update, modeling.causal_conv1d_fn


def test_update_equals_hf_torch_fallback_on_gathered_rows():
    hf_update, _ = _hf_fallbacks()
    x, weight, bias, pool = _inputs(6)
    rows = torch.tensor([4, 0, 2], dtype=torch.int32)
    hf_state = pool[rows.long()].clone()
    want = hf_update(x, hf_state, weight, bias, activation="silu")
    got = causal_conv1d_update(x, pool, weight, bias, "silu", rows)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pool[rows.long()], hf_state, rtol=0, atol=0)


def test_fn_equals_hf_torch_fallback_from_empty_windows():
    _, hf_fn = _hf_fallbacks()
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, C, 9, generator=g)
    weight, bias = torch.randn(C, W, generator=g) * 0.5, torch.randn(C, generator=g)
    want = hf_fn(x, weight, bias, activation="silu")
    pool = torch.zeros(2, C, W - 1)
    bounds = torch.tensor([0, 9, 18], dtype=torch.int32)
    got = causal_conv1d_fn(x.permute(1, 0, 2).reshape(C, 18), weight, bias, pool, bounds)
    torch.testing.assert_close(got.reshape(C, 2, 9).permute(1, 0, 2), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pool, x[:, :, -(W - 1) :], rtol=0, atol=0)


def test_gdn_spec_vllm_conv_adapter_matches_the_family_reference():
    from gdn_spec.conv.adapters import reference, vllm_update

    x, weight, bias, pool = (t.numpy() for t in _inputs(8))
    tokens = np.ascontiguousarray(np.swapaxes(x, 1, 2))  # the family's [N, T, C]
    rows = np.array([2, -1, 4], np.int32)
    ours, theirs = pool.copy(), pool.copy()
    out, _ = vllm_update(causal_conv1d_update)(tokens, ours, weight, bias, rows)
    want, _ = reference()(tokens, theirs, weight, bias, rows)
    np.testing.assert_allclose(out[[0, 2]], want[[0, 2]], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-6)
    kept = ours.copy()
    with pytest.raises(ContractError):
        vllm_update(causal_conv1d_update)(tokens, ours, weight[:, :2].copy(), bias, np.array([2, 2, 4], np.int32))
    assert np.array_equal(ours, kept)


def test_fla_causal_conv1d_compile_fullgraph_bit_equal_to_eager():
    g = torch.Generator().manual_seed(9)
    x = torch.randn(1, 11, C, generator=g)
    weight, initial = torch.randn(C, W, generator=g), torch.randn(2, C, W, generator=g)
    bounds = torch.tensor([0, 4, 11], dtype=torch.int32)
    eager = causal_conv1d(x, weight, None, None, initial, True, "silu", cu_seqlens=bounds)
    torch._dynamo.reset()
    compiled = torch.compile(causal_conv1d, fullgraph=True, backend="eager")
    got = compiled(x, weight, None, None, initial, True, "silu", cu_seqlens=bounds)
    assert torch.equal(got[0], eager[0]) and torch.equal(got[1], eager[1])


def test_update_per_token_rows_roll_back_as_the_recurrent_pool():
    """gdn-nki's speculative form: [N, T] rows (the window after token t to row [n, t]) and num_accepted_tokens
    (resume from row [n, a − 1]), against gdn-ref's fp64 pool oracle; padding and unnamed rows untouched."""
    from gdn_ref.conv import causal_conv1d_decode_pool

    x, weight, bias, pool = _inputs(4)
    pool = torch.cat([pool, torch.randn(3, C, W - 1)])  # 8 rows
    before = pool.clone()
    rows = torch.tensor([[0, 1], [-1, -1], [5, 6]], dtype=torch.int32)
    accepted = torch.tensor([2, 1, 1], dtype=torch.int32)
    out = causal_conv1d_update(x, pool, weight, bias, "silu", rows, num_accepted_tokens=accepted)
    want, after = causal_conv1d_decode_pool(x.transpose(1, 2).numpy(), weight.numpy(), bias.numpy(), before.numpy(),
                                            rows.numpy(), accepted.numpy(), "silu")  # fmt: skip
    np.testing.assert_allclose(out.transpose(1, 2).numpy(), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(pool.numpy(), after, rtol=0, atol=1e-6)
    assert torch.equal(pool[[2, 3, 4, 7]], before[[2, 3, 4, 7]])


def test_fn_reads_other_rows_and_writes_checkpoints():
    """gdn-nki's serving keywords: a sequence resuming from a row it does not end in (read_indices) and the window
    after every 128 tokens to its checkpoint row, in a bucket; against gdn-ref's fp64 pool oracle."""
    from gdn_ref.conv import causal_conv1d_prefill_pool

    g = torch.Generator().manual_seed(6)
    lengths = [300, 7]
    bounds = torch.tensor([0, 300, 307], dtype=torch.int32)
    x = torch.randn(C, 307, generator=g)
    weight, bias = torch.randn(C, W, generator=g) * 0.5, torch.randn(C, generator=g)
    pool = torch.randn(9, C, W - 1, generator=g)
    before = pool.clone()
    rows, reads = torch.tensor([1, 2], dtype=torch.int32), torch.tensor([7, -1], dtype=torch.int32)
    table = torch.tensor([[4, 5], [-1, -1]], dtype=torch.int32)
    out = causal_conv1d_fn(x, weight, bias, pool, bounds, rows, activation="silu", read_indices=reads,
                           checkpoint_every=128, checkpoint_indices=table, bucket=(512, 4))  # fmt: skip
    want, after = causal_conv1d_prefill_pool(x.T.numpy(), weight.numpy(), bias.numpy(), bounds.numpy(),
                                             before.numpy(), rows.numpy(), "silu", 128, table.numpy(), reads.numpy())  # fmt: skip
    np.testing.assert_allclose(out.T.numpy(), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(pool.numpy(), after, rtol=0, atol=1e-6)
    assert sum(lengths) == out.shape[1] and torch.equal(pool[[0, 3, 6, 7, 8]], before[[0, 3, 6, 7, 8]])


@pytest.mark.parametrize(("T_spec", "extra"), [(1, 0), (2, 0), (4, 0), (4, 3)])
def test_update_in_row_form_as_vllm_calls_it_in_spec_decode(T_spec, extra):
    """vLLM's own speculative form, as its GDN backend calls it: conv_state rows of W − 1 + num_spec inputs (and
    longer: only the first W − 2 + T written, as vLLM's kernel), [N] conv_state_indices with pad_slot_id rows,
    x [N, C, T], num_accepted_tokens 1..T: against gdn-ref's fp64 in-row oracle, bf16; the padding row and unnamed
    rows untouched; an accepted count past T rejected by name, the pool unchanged."""
    from gdn_ref.conv import causal_conv1d_decode_pool

    g = torch.Generator().manual_seed(T_spec)
    n_req, pad = 5, 77
    x = torch.randn(n_req, C, T_spec, generator=g).to(torch.bfloat16)
    weight, bias = (torch.randn(C, W, generator=g) * 0.5).to(torch.bfloat16), torch.randn(C, generator=g)
    pool = torch.randn(8, C, W - 2 + T_spec + extra, generator=g).to(torch.bfloat16)
    before = pool.clone()
    rows = torch.tensor([6, pad, 0, 3, 5], dtype=torch.int32)
    accepted = (torch.arange(n_req, dtype=torch.int32) % T_spec) + 1
    out = causal_conv1d_update(x, pool, weight, bias.to(torch.bfloat16), True, rows, num_accepted_tokens=accepted,
                               pad_slot_id=pad)  # fmt: skip
    live = torch.where(rows == pad, -1, rows)
    want, after = causal_conv1d_decode_pool(x.float().transpose(1, 2).numpy(), weight.float().numpy(),
                                            bias.to(torch.bfloat16).float().numpy(), before.float().numpy(),
                                            live.numpy(), accepted.numpy(), "silu")  # fmt: skip
    error = compare("out", out.float().transpose(1, 2).numpy(), want, "bfloat16")
    assert error.ok, describe([error])
    np.testing.assert_array_equal(pool.float().numpy(), after.astype(np.float32))
    assert torch.equal(pool[[1, 2, 4, 7]], before[[1, 2, 4, 7]])
    assert torch.equal(pool[:, :, W - 2 + T_spec :], before[:, :, W - 2 + T_spec :])  # a longer row's tail
    bad = accepted.clone()
    bad[2] = T_spec + 1
    with pytest.raises(ContractError, match="num_accepted_tokens"):
        causal_conv1d_update(x, pool, weight, None, True, rows, num_accepted_tokens=bad, pad_slot_id=pad)
    np.testing.assert_array_equal(pool.float().numpy(), after.astype(np.float32))
    with pytest.raises(ContractError, match="conv_state"):  # a row one input short of the window at offset T − 1
        short = pool[:, :, : W - 3 + T_spec].contiguous()
        causal_conv1d_update(x, short, weight, None, True, rows, num_accepted_tokens=accepted, pad_slot_id=pad)


def _refused(call) -> str:
    with pytest.raises(ContractError) as refused:
        call()
    return str(refused.value)


def test_bad_values_and_dtypes_are_reported_in_the_callers_layout():
    """The drop-ins hand the host path x token-major; a NaN is still reported at the caller's index of x ([N, C],
    [N, C, T], vLLM's [dim, tokens], FLA's [B, T, D]) and a float16 x is refused as the caller's x, not as an
    [N, T, C] "token-major" tensor the caller never made (both once read in the kernel's layout)."""
    x, weight, bias, pool = _inputs()
    before = pool.clone()
    rows = torch.tensor([3, -1, 0], dtype=torch.int32)
    bad = x.clone()
    bad[2, 5, 1] = float("nan")  # request 2, channel 5, token 1
    assert "value nan at index [2, 5, 1]" in _refused(
        lambda: causal_conv1d_update(bad, pool, weight, bias, "silu", rows)
    )
    one = x[:, :, 0].clone()
    one[2, 7] = float("inf")
    assert "value inf at index [2, 7]" in _refused(lambda: causal_conv1d_update(one, pool, weight, bias, "silu", rows))
    packed = torch.randn(C, 12)
    packed[6, 9] = float("nan")  # channel 6, token 9
    bounds = torch.tensor([0, 5, 12], dtype=torch.int32)
    assert "value nan at index [6, 9]" in _refused(lambda: causal_conv1d_fn(packed, weight, bias, pool, bounds))
    batch = torch.randn(2, 6, C)
    batch[1, 3, 4] = float("-inf")
    assert "value -inf at index [1, 3, 4]" in _refused(lambda: causal_conv1d(batch, weight, bias))
    assert torch.equal(pool, before)
    for call in (lambda: causal_conv1d_update(x.half(), pool, weight, bias, "silu", rows),
                 lambda: causal_conv1d_fn(packed.half(), weight, bias, pool, bounds),
                 lambda: causal_conv1d(batch.half(), weight, bias)):  # fmt: skip
        message = _refused(call)
        assert "`x` dtype float16" in message and "[N, T, C]" not in message and "token-major" not in message


def test_an_empty_batch_is_refused_in_the_callers_words():
    """No request (x [0, C]) or no token: refused as the caller's empty x, eagerly and under fake tensors, not as a
    malformed [N, T, C] "token-major" tensor the caller never passed."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    _, weight, bias, pool = _inputs()
    none = torch.zeros(0, dtype=torch.int32)
    bounds = torch.tensor([0], dtype=torch.int32)
    calls = (lambda: causal_conv1d_update(torch.zeros(0, C), pool, weight, bias, "silu", none),
             lambda: causal_conv1d_fn(torch.zeros(C, 0), weight, bias, pool, bounds),
             lambda: causal_conv1d(torch.zeros(1, 0, C), weight, bias))  # fmt: skip
    for call in calls:
        message = _refused(call)
        assert "`x` shape" in message and "must not be empty" in message and "[N, T, C]" not in message
    with FakeTensorMode(allow_non_fake_inputs=True):
        assert "must not be empty" in _refused(calls[0])
