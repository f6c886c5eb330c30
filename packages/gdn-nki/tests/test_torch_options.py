"""FLA's options, keywords and positional order at ``gdn_nki.torch.chunk_gated_delta_rule``: every current FLA
option honoured, accepted for a stated reason, or rejected by name; the ecosystem's pool keywords; unknown keywords
and old positional orders rejected with the fix. Skipped where torch is not installed."""

from __future__ import annotations

import inspect

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'gdn-nki[torch]'; nox -s integration)")

from torch.nn.functional import softplus  # noqa: E402

from gdn_nki.host.torch_io import as_numpy  # noqa: E402
from gdn_nki.torch import chunk_gated_delta_rule  # noqa: E402
from gdn_nki.torch.chunk import HF_PASS_THROUGH  # noqa: E402
from gdn_ref.activations import beta_from_logit, log_decay_from_gate  # noqa: E402
from gdn_ref.contract import ContractError  # noqa: E402
from gdn_spec.metrics import compare  # noqa: E402
from gdn_spec.regimes import Geometry  # noqa: E402
from nki_inputs import case, seq_first  # noqa: E402

HV = 2
# fp32 evaluations of the gate formula round each of exp, softplus and the product, and torch's fp32 exp, softplus
# and sigmoid are themselves within ~1-2 ulps: a few fp32 ulps apart at most from one rounding of the exact value.
FP32_GATE_ULPS = 4 * 2.0**-24


def _call(dtype: str = "float32", seed: int = 21, batch: int = 1, seq_len: int = 90) -> dict:
    """FLA-style seq-first torch arguments of one small case (Hk 1, Hv 2, K = V = 16)."""
    c = case(dtype, Geometry(B=batch, Hk=1, Hv=HV, S=seq_len, Dk=16, Dv=16), seed)
    return seq_first(c)


def _raw_gate(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 3) -> tuple[torch.Tensor, ...]:
    """A raw gate ``a`` spanning both signs (above 0 it was a g_log.domain error when read as a log-decay) and
    the tails of the softplus, with Qwen3-Next-like A_log (log of U(0.01, 16)) and dt_bias."""
    gen = torch.Generator().manual_seed(seed)
    raw = (torch.randn(shape, generator=gen) * 4).to(dtype)
    raw.view(-1)[:4] = torch.tensor([30.0, -30.0, 0.0, 19.5]).to(dtype)
    a_log = torch.empty(shape[-1]).uniform_(0.01, 16, generator=gen).log()
    dt_bias = torch.randn(shape[-1], generator=gen)
    return raw, a_log, dt_bias


# --- the signature ---

# Current FLA's positional parameters (fla/ops/gated_delta_rule/chunk.py, chunk_gated_delta_rule, main after 0.5.2).
FLA_POSITIONAL = (
    "q", "k", "v", "g", "beta", "scale", "initial_state", "output_final_state", "use_qk_l2norm_in_kernel",
    "use_beta_sigmoid_in_kernel", "allow_neg_eigval", "state_v_first", "cu_seqlens", "cu_seqlens_cpu",
    "chunk_indices", "cp_context",
)  # fmt: skip


def test_the_positional_order_is_current_flas() -> None:
    params = inspect.signature(chunk_gated_delta_rule).parameters.values()
    positional = tuple(p.name for p in params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD)
    assert positional == FLA_POSITIONAL


@pytest.mark.parametrize(
    ("extra", "slot"),
    [
        ((), "use_qk_l2norm_in_kernel"),  # FLA <= 0.2, vLLM's and SGLang's copies: cu_seqlens ninth
        ((False,), "use_beta_sigmoid_in_kernel"),  # FLA 0.3-0.5.0: tenth (after use_qk_l2norm_in_kernel)
    ],
)
def test_cu_seqlens_in_an_older_positional_slot_is_rejected_by_name(extra: tuple, slot: str) -> None:
    args = _call()
    cu = torch.tensor([0, 40, 90])
    positional = (args["q"], args["k"], args["v"], args["g"], args["beta"], None, None)
    with pytest.raises(ContractError, match=rf"`{slot}` a tensor of shape \(3,\) violates \[flag.tensor\]") as err:
        chunk_gated_delta_rule(*positional, False, *extra, cu)
    assert "pass cu_seqlens=... (and every argument after output_final_state) by keyword" in str(err.value)
    assert "FLA <= 0.2" in str(err.value)
    with pytest.raises(ContractError, match=r"`output_final_state` a tensor"):  # the slot before, likewise
        chunk_gated_delta_rule(*positional, torch.tensor([True]))
    _, final = chunk_gated_delta_rule(*positional, torch.tensor(True))  # a 0-d tensor is a truth value, as in FLA
    assert final is not None


# --- FLA's options ---


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_gate_is_flas_formula_within_fp32_rounding(dtype: torch.dtype) -> None:
    """gdn-ref's one gate formula against FLA's own torch reference of it (``naive_gdn_gate``:
    -A_log.float().exp() * softplus(g.float() + dt_bias.float()), which is also HF's Qwen3-Next line): within
    ``FP32_GATE_ULPS`` relative (the two round differently; nothing else differs)."""
    raw, a_log, dt_bias = _raw_gate((2, 300, 8), dtype)
    fla = -a_log.float().exp() * softplus(raw.float() + dt_bias.float())
    ours = log_decay_from_gate(as_numpy(raw), a_log.numpy(), dt_bias.numpy())
    assert ours.dtype == np.float32 and (ours <= 0).all()
    np.testing.assert_allclose(ours, fla.numpy(), rtol=FP32_GATE_ULPS, atol=0)
    no_bias = log_decay_from_gate(as_numpy(raw), a_log.numpy())
    np.testing.assert_allclose(no_bias, (-a_log.exp() * softplus(raw.float())).numpy(), rtol=FP32_GATE_ULPS)


def test_the_fused_beta_sigmoid_is_torchs_sigmoid_within_fp32_rounding() -> None:
    logit = torch.linspace(-40, 40, 4001)
    ours = beta_from_logit(logit.numpy())
    np.testing.assert_allclose(ours, torch.sigmoid(logit).numpy(), rtol=FP32_GATE_ULPS, atol=0)
    assert ours.min() >= 0 and ours.max() == 1.0, "saturates at 1 in fp32, inside the contract's [0, 1]"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_use_gate_in_kernel_computes_the_decay_from_the_raw_gate(dtype: str) -> None:
    """``use_gate_in_kernel=True`` with A_log and dt_bias: g is the raw gate (values above 0 included). The call
    equals passing gdn-ref's log-decay as g, bit for bit (one formula, computed on the host before the launch),
    and passing FLA's own fp32 evaluation of it within the fp32 bound (the two gates differ by a few ulps)."""
    args = _call(dtype)
    raw, a_log, dt_bias = _raw_gate(tuple(args["g"].shape), args["g"].dtype)
    assert (raw > 0).any()
    state = torch.randn(1, HV, 16, 16)
    common = dict(initial_state=state, output_final_state=True)
    fused = chunk_gated_delta_rule(**{**args, "g": raw}, use_gate_in_kernel=True, A_log=a_log, dt_bias=dt_bias,
                                   **common)  # fmt: skip
    host = torch.from_numpy(log_decay_from_gate(as_numpy(raw), a_log.numpy(), dt_bias.numpy()))
    want = chunk_gated_delta_rule(**{**args, "g": host}, **common)
    assert torch.equal(fused[0], want[0]) and torch.equal(fused[1], want[1])
    fla_g = -a_log.float().exp() * softplus(raw.float() + dt_bias)
    fla = chunk_gated_delta_rule(**{**args, "g": fla_g}, **common)
    for name, got, ref in (("out", fused[0], fla[0]), ("state", fused[1], fla[1])):
        error = compare(name, np.asarray(as_numpy(got), np.float64), np.asarray(as_numpy(ref), np.float64), dtype)
        assert error.ok, str(error)
    ignored = chunk_gated_delta_rule(**args, A_log=a_log, dt_bias=dt_bias, **common)  # FLA: unused without the flag
    plain = chunk_gated_delta_rule(**args, **common)
    assert torch.equal(ignored[0], plain[0])


def test_use_beta_sigmoid_in_kernel_reads_beta_as_a_logit() -> None:
    args = _call()
    logit = torch.randn(args["beta"].shape, generator=torch.Generator().manual_seed(5)) * 3
    fused, _ = chunk_gated_delta_rule(**{**args, "beta": logit}, use_beta_sigmoid_in_kernel=True)
    want, _ = chunk_gated_delta_rule(**{**args, "beta": torch.from_numpy(beta_from_logit(logit.numpy()))})
    assert torch.equal(fused, want)


BAD_GATES = {
    "no A_log": (dict(A_log=None), "A_log", "A_log.required"),
    "A_log per key head": (dict(A_log=torch.zeros(3)), "A_log", "A_log.shape"),
    "A_log not finite": (dict(A_log=torch.tensor([0.0, float("inf")])), "A_log", "A_log.finite"),
    "dt_bias NaN": (dict(dt_bias=torch.tensor([float("nan"), 0.0])), "dt_bias", "dt_bias.finite"),
    "A_log float16": (dict(A_log=torch.zeros(HV, dtype=torch.float16)), "A_log", "A_log.torch"),
    "raw gate NaN": (dict(nan_at=(0, 7, 1)), "g", "g.finite"),
}


@pytest.mark.parametrize("name", list(BAD_GATES))
def test_bad_gate_parameters_are_rejected_by_name(name: str) -> None:
    changes, argument, rule = BAD_GATES[name]
    args = _call()
    gate = dict(A_log=torch.zeros(HV), dt_bias=torch.zeros(HV))
    changes = dict(changes)
    nan_at = changes.pop("nan_at", None)
    if nan_at is not None:
        args["g"][nan_at] = float("nan")
    with pytest.raises(ContractError, match=rf"`{argument}`.*\[{rule}\]"):
        chunk_gated_delta_rule(**args, use_gate_in_kernel=True, **{**gate, **changes})


@pytest.mark.parametrize(
    "options",
    [
        dict(allow_neg_eigval=True, use_beta_sigmoid_in_kernel=True),
        dict(allow_neg_eigval=True),  # FLA rejects this one too (it needs the sigmoid)
    ],
)
def test_allow_neg_eigval_is_rejected_by_name(options: dict) -> None:
    with pytest.raises(ContractError, match=r"`allow_neg_eigval` = True violates \[option.unsupported\].*\[0, 1\]"):
        chunk_gated_delta_rule(**_call(), **options)
    chunk_gated_delta_rule(**_call(), allow_neg_eigval=False)  # unset: accepted


def test_flas_chunking_caches_and_chunk_size_are_accepted_and_change_nothing() -> None:
    """``cu_seqlens_cpu`` and ``chunk_indices`` are FLA's caches of its own 64-token chunking of ``cu_seqlens``;
    ``chunk_size`` its chunk. gdn-nki chunks by its algorithm; the recurrence, so the result, is the same."""
    args = _call()
    cu = torch.tensor([0, 40, 90])
    want = chunk_gated_delta_rule(**args, cu_seqlens=cu, output_final_state=True)
    fla_indices = torch.tensor([[0, 0], [1, 0]])  # FLA's [chunks, (sequence, chunk in it)] for [0, 40, 90]
    for extra in (dict(cu_seqlens_cpu=cu.clone()), dict(chunk_indices=fla_indices), dict(chunk_size=32)):
        got = chunk_gated_delta_rule(**args, cu_seqlens=cu, output_final_state=True, **extra)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), extra
    for bad in (128, 64.0, True):
        with pytest.raises(ContractError, match=r"`chunk_size`.*\[option.chunk_size\]"):
            chunk_gated_delta_rule(**args, chunk_size=bad)


# --- keywords ---


def _pool_call(**changes) -> tuple[dict, torch.Tensor]:
    args = _call()
    pool = torch.randn(4, HV, 16, 16, generator=torch.Generator().manual_seed(2))
    args.update(initial_state=pool, cu_seqlens=torch.tensor([0, 40, 90]), output_final_state=True)
    args.update(changes)
    return args, pool


def test_initial_state_indices_is_state_indices() -> None:
    """SGLang's and FlashInfer's name for the pool rows: the same in-place update."""
    args, pool = _pool_call(state_indices=torch.tensor([3, 1]))
    before = pool.clone()
    want = chunk_gated_delta_rule(**args)[0]
    want_pool = pool.clone()
    pool.copy_(before)
    args.pop("state_indices")
    got, returned = chunk_gated_delta_rule(**args, initial_state_indices=torch.tensor([3, 1]))
    assert returned is pool and torch.equal(got, want) and torch.equal(pool, want_pool)
    assert not torch.equal(pool[[3, 1]], before[[3, 1]]) and torch.equal(pool[[0, 2]], before[[0, 2]])
    with pytest.raises(ContractError, match=r"`initial_state_indices` given with state_indices"):
        chunk_gated_delta_rule(**args, initial_state_indices=torch.tensor([3, 1]), state_indices=torch.tensor([3, 1]))


@pytest.mark.parametrize(("typo", "closest"), [("state_indice", "state_indices"), ("use_gate_in_kernal", "use_gate_in_kernel"),
                                               ("initial_states", "initial_state"), ("frobnicate", None)])  # fmt: skip
def test_an_unknown_keyword_is_rejected_naming_the_closest_and_writes_nothing(typo: str, closest: str | None) -> None:
    args, pool = _pool_call()
    before = pool.clone()
    with pytest.raises(ContractError, match=rf"`{typo}`.*\[keyword.unknown\]") as err:
        chunk_gated_delta_rule(**args, **{typo: torch.tensor([3, 1])})
    message = str(err.value)
    assert (f"did you mean {closest}=?" in message) if closest else ("did you mean" not in message), message
    assert torch.equal(pool, before), "nothing written"


def test_hf_pass_through_keywords_are_accepted() -> None:
    """What HF's GDN layers pass through their ``**kwargs`` (Qwen3-Next: the decoder's use_cache, the model's
    TransformersKwargs) runs as without them."""
    args, _ = _pool_call(initial_state=None)
    cu = args["cu_seqlens"]
    want = chunk_gated_delta_rule(**args)
    hf = dict(use_cache=True, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=50, max_length_k=50,
              output_attentions=False, position_ids=torch.arange(90)[None], seq_idx=None)  # fmt: skip
    assert set(hf) <= HF_PASS_THROUGH
    got = chunk_gated_delta_rule(**args, **hf)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("keyword", ["cu_seq_lens_q", "seq_idx"])
def test_hf_packing_keywords_without_cu_seqlens_are_rejected(keyword: str) -> None:
    args = _call()
    packing = torch.tensor([0, 40, 90]) if keyword == "cu_seq_lens_q" else torch.zeros(1, 90, dtype=torch.int32)
    with pytest.raises(ContractError, match=rf"`{keyword}` given without cu_seqlens.*pass cu_seqlens="):
        chunk_gated_delta_rule(**args, **{keyword: packing})


# --- smaller ones ---


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.int32])
def test_any_integer_torch_state_indices_are_taken_as_numpy_ones_are(dtype: torch.dtype) -> None:
    args, pool = _pool_call()
    before = pool.clone()
    want = chunk_gated_delta_rule(**args, state_indices=np.array([3, 1], np.uint8))
    want_pool = pool.clone()
    pool.copy_(before)
    got = chunk_gated_delta_rule(**args, state_indices=torch.tensor([3, 1], dtype=dtype))
    assert torch.equal(got[0], want[0]) and torch.equal(pool, want_pool)
    pool.copy_(before)
    uint8_cu = chunk_gated_delta_rule(**{**args, "cu_seqlens": torch.tensor([0, 40, 90], dtype=torch.uint8)},
                                      state_indices=torch.tensor([3, 1]))  # fmt: skip
    assert torch.equal(uint8_cu[0], want[0])


def test_errors_from_the_kernels_contract_speak_the_callers_argument_names() -> None:
    """neumann supports no initial state: the fix names FLA's argument (initial_state), not the kernel's."""
    args = _call()
    args.update(k=args["k"].repeat(1, 1, HV, 1), q=args["q"].repeat(1, 1, HV, 1))  # neumann: Hk == Hv
    with pytest.raises(ContractError, match=r"\[neumann.no_state\]") as err:
        chunk_gated_delta_rule(**args, initial_state=torch.zeros(1, HV, 16, 16), algorithm="neumann")
    message = str(err.value)
    assert "`initial_state` a supplied state" in message and "pass initial_state=None" in message, message
    assert "recurrent_state" not in message, message


def test_a_bfloat16_raw_gate_is_widened_exactly() -> None:
    raw = torch.randn(50).to(torch.bfloat16)
    narrow = log_decay_from_gate(as_numpy(raw), np.zeros(50, np.float32))
    wide = log_decay_from_gate(raw.float().numpy(), np.zeros(50, np.float32))
    assert as_numpy(raw).dtype == ml_dtypes.bfloat16 and np.array_equal(narrow, wide)
