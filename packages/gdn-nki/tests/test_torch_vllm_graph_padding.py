"""vLLM's speculative-decode calls with its CUDA-graph padding: the metadata tables are the graph's batch B long while
the call covers N <= B requests.

vLLM's GDN metadata builder pads a spec-decode batch to the captured graph's size (vllm-project/vllm
``vllm/v1/attention/backends/gdn_attn.py``, ``GDNAttentionMetadataBuilder.build``: ``spec_query_start_loc`` to
B + 1 entries, its tail repeating the last bound; ``num_accepted_tokens`` to B, its tail 1;
``spec_state_indices_tensor`` to [B, T], its tail ``PAD_SLOT_ID``), and its GDN layer
(``vllm/model_executor/layers/mamba/gdn_linear_attn.py``, ``_forward_core``) passes them on as they are, with
``conv_state_indices = spec_state_indices_tensor[:, 0][:num_spec_decodes]`` and
``cu_seqlens = spec_query_start_loc[:num_spec_decodes + 1]``: vLLM's kernels take N from those and never read the
tables' tails. The drop-ins do the same: each padded call gives the unpadded call's bits and pool, eager and
compiled; a table SHORTER than the batch is still refused by name. Skipped without torch.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'gdn-nki[torch]'; nox -s integration)")

import gdn_nki.torch  # noqa: E402
from gdn_ref.contract import ContractError  # noqa: E402
from torch_device import compile_backend  # noqa: E402

HK, HV, D, W, T = 1, 2, 16, 4, 3  # heads, head dim, conv width, tokens per request (1 + 2 drafts)
C, L, P = 2 * HK * D + HV * D, W - 2 + T, 8  # conv channels, vLLM's conv row (W − 1 + drafts), pool rows
N, B = 2, 4  # live requests, the graph's batch
ROWS = [[5, 1, 2], [3, 0, 6]]
PADDED_ROWS = ROWS + [[-1] * T] * (B - N)
ACCEPTED = [2, 3]  # request 0 rolls back one draft, request 1 keeps both


def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _conv_call(padded: bool) -> tuple[dict[str, Any], torch.Tensor]:
    """vLLM's varlen conv update: x [N·T, C] packed, the pool [P, C, L]."""
    qsl = list(range(0, N * T + 1, T)) + ([N * T] * (B - N) if padded else [])
    accepted = ACCEPTED + ([1] * (B - N) if padded else [])
    pool = torch.randn(P, C, L, generator=_g(1)).to(torch.bfloat16)
    return dict(x=torch.randn(N * T, C, generator=_g(2)).to(torch.bfloat16),
                weight=(torch.randn(C, W, generator=_g(3)) * 0.5).to(torch.bfloat16), bias=None, activation="silu",
                conv_state_indices=torch.tensor(PADDED_ROWS, dtype=torch.int32)[:, 0][:N],
                num_accepted_tokens=torch.tensor(accepted, dtype=torch.int32),
                query_start_loc=torch.tensor(qsl, dtype=torch.int32), max_query_len=T), pool  # fmt: skip


def _conv(args: dict[str, Any], pool: torch.Tensor) -> torch.Tensor:
    return gdn_nki.torch.causal_conv1d_update(args["x"], pool, **{k: v for k, v in args.items() if k != "x"})


def _recurrent_call(padded: bool, sigmoid: bool) -> tuple[dict[str, Any], torch.Tensor]:
    """vLLM's spec-decode recurrence on its V-major pool: ``fused_recurrent_gated_delta_rule`` (g, beta) or
    ``fused_sigmoid_gating_delta_rule_update`` (the raw gates a, b)."""
    tokens = N * T
    args = dict(q=torch.randn(1, tokens, HK, D, generator=_g(4)), k=torch.randn(1, tokens, HK, D, generator=_g(5)),
                v=torch.randn(1, tokens, HV, D, generator=_g(6)), inplace_final_state=True,
                cu_seqlens=torch.arange(0, tokens + 1, T, dtype=torch.int32),
                ssm_state_indices=torch.tensor(PADDED_ROWS if padded else ROWS, dtype=torch.int32),
                num_accepted_tokens=torch.tensor(ACCEPTED + ([1] * (B - N) if padded else []), dtype=torch.int32),
                use_qk_l2norm_in_kernel=True)  # fmt: skip
    if sigmoid:
        args.update(
            A_log=torch.rand(HV, generator=_g(7)).log(),
            dt_bias=torch.randn(HV, generator=_g(8)),
            a=torch.randn(tokens, HV, generator=_g(9)),
            b=torch.randn(tokens, HV, generator=_g(10)),
        )
    else:
        args.update(
            g=-torch.rand(1, tokens, HV, generator=_g(7)),
            beta=torch.rand(1, tokens, HV, generator=_g(8)),
            state_v_first=True,
        )
    return args, torch.randn(P, HV, D, D, generator=_g(11)) * 0.1


def _recurrent(sigmoid: bool, args: dict[str, Any], pool: torch.Tensor) -> torch.Tensor:
    fn = (gdn_nki.torch.vllm_fused_sigmoid_gating_delta_rule_update if sigmoid
          else gdn_nki.torch.vllm_fused_recurrent_gated_delta_rule)  # fmt: skip
    return fn(initial_state=pool, **args)[0]


def _same(run: Any, make: Any, compiled: bool) -> None:
    """The padded call (eager or compiled) gives the unpadded eager call's output and pool, bit for bit."""
    want_args, want_pool = make(False)
    want = run(want_args, want_pool)
    args, pool = make(True)
    before = pool.clone()
    fn = torch.compile(run, backend=compile_backend(), fullgraph=True) if compiled else run
    got = fn(args, pool)
    assert not torch.equal(pool, before)  # the call wrote its rows
    assert torch.equal(got, want) and torch.equal(pool, want_pool)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_the_varlen_conv_takes_vllms_graph_padded_tables(compiled: bool) -> None:
    torch._dynamo.reset()
    _same(_conv, _conv_call, compiled)


@pytest.mark.parametrize("sigmoid", [False, True], ids=["fused_recurrent", "fused_sigmoid_gating"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_the_spec_recurrence_takes_vllms_graph_padded_rows(sigmoid: bool, compiled: bool) -> None:
    torch._dynamo.reset()
    _same(lambda args, pool: _recurrent(sigmoid, args, pool), lambda padded: _recurrent_call(padded, sigmoid),
          compiled)  # fmt: skip


def test_tables_shorter_than_the_batch_are_still_refused_by_name() -> None:
    args, pool = _conv_call(False)
    before = pool.clone()
    with pytest.raises(ContractError, match=r"num_accepted_tokens"):
        _conv({**args, "num_accepted_tokens": args["num_accepted_tokens"][:1]}, pool)
    args, state = _recurrent_call(False, sigmoid=False)
    kept = state.clone()
    with pytest.raises(ContractError, match=r"ssm_state_indices"):
        _recurrent(False, {**args, "ssm_state_indices": args["ssm_state_indices"][:1]}, state)
    assert torch.equal(pool, before) and torch.equal(state, kept)


def test_vllms_fused_gating_reads_the_first_tokens_of_longer_gates() -> None:
    """In a batch mixing spec decodes and prefills vLLM's layer hands its spec-path ``fused_sigmoid_gating_delta_rule
    _update`` the whole step's raw gates (``a``, ``b`` [num_actual_tokens, HV], the spec tokens first) beside q of
    the spec tokens; its kernel reads them at the offsets ``cu_seqlens`` gives. The drop-in does too: the call with
    five more gate rows gives the call's bits and pool."""
    want_args, want_pool = _recurrent_call(False, sigmoid=True)
    want = _recurrent(True, want_args, want_pool)
    args, pool = _recurrent_call(True, sigmoid=True)
    tail = torch.randn(5, HV, generator=_g(12))
    got = _recurrent(True, {**args, "a": torch.cat([args["a"], tail]), "b": torch.cat([args["b"], -tail])}, pool)
    assert torch.equal(got, want) and torch.equal(pool, want_pool)


def test_the_conv_update_takes_newer_vllms_null_block_padding() -> None:
    """Newer vLLM pads a decode graph's rows with its null block (``NULL_BLOCK_ID = 0``,
    ``vllm/v1/attention/backends/utils.py``) and names the padding id ``null_block_id`` where ``pad_slot_id`` was
    (``causal_conv1d_update``'s 10th parameter): rows [3, 5, 0, 0] with ``null_block_id=0`` are the call with rows
    [3, 5, −1, −1] — the same outputs and pool, row 0 untouched; both ids given and different is refused by name."""
    pool = torch.randn(P, C, W - 1, generator=_g(13))
    x, weight = torch.randn(4, C, generator=_g(14)), torch.randn(C, W, generator=_g(15))
    want_pool = pool.clone()
    want = gdn_nki.torch.causal_conv1d_update(x, want_pool, weight, None, "silu", torch.tensor([3, 5, -1, -1]))
    got = gdn_nki.torch.causal_conv1d_update(x, pool, weight, None, "silu", torch.tensor([3, 5, 0, 0]), null_block_id=0)
    assert torch.equal(got, want) and torch.equal(pool, want_pool)
    with pytest.raises(ContractError, match=r"`null_block_id`"):
        gdn_nki.torch.causal_conv1d_update(x, pool, weight, None, "silu", torch.tensor([3, 5, 0, 0]), pad_slot_id=7,
                                           null_block_id=0)  # fmt: skip
    assert torch.equal(pool, want_pool)
