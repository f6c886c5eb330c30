"""The drop-ins as a model developer calls them, after changing one import: each under its original's parameter
names, order and defaults (FLA's two, vLLM's pool decode, SGLang's fused-gating update, read from their sources),
FLA's decode options honoured or rejected by name (never ignored), and vLLM's keyword call of
``fused_recurrent_gated_delta_rule`` — the name vLLM shares with FLA — run as vLLM's pool decode from the same
import. Skipped without torch."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'gdn-nki[torch]'; nox -s integration)")

import gdn_nki.torch  # noqa: E402
from gdn_ref.contract import ContractError  # noqa: E402
from test_torch_ops import HV, fla_decode_call, verify_call  # noqa: E402

_ = object()  # a parameter without a default
# The originals' leading parameters, in order, with defaults, as their sources declare them:
# FLA (fla-org/flash-linear-attention bc3b101, 2026-08-22): fla/ops/gated_delta_rule/chunk.py and
# fused_recurrent.py; vLLM (vllm/model_executor/layers/fla/ops/fused_recurrent.py, 03c6dad); SGLang
# (python/sglang/srt/layers/attention/fla/fused_sigmoid_gating_recurrent.py, 06a2775; vLLM-ascend's is the same);
# vLLM's prefill gates (vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py, a55a8d9).
ORIGINALS: dict[str, list[tuple[str, Any]]] = {
    "chunk_gated_delta_rule": [
        ("q", _), ("k", _), ("v", _), ("g", _), ("beta", _), ("scale", None), ("initial_state", None),
        ("output_final_state", False), ("use_qk_l2norm_in_kernel", False), ("use_beta_sigmoid_in_kernel", False),
        ("allow_neg_eigval", False), ("state_v_first", False), ("cu_seqlens", None), ("cu_seqlens_cpu", None),
        ("chunk_indices", None), ("cp_context", None),
    ],
    "fused_recurrent_gated_delta_rule": [
        ("q", _), ("k", _), ("v", _), ("g", None), ("gk", None), ("gv", None), ("beta", None), ("scale", None),
        ("initial_state", None), ("output_final_state", False), ("use_qk_l2norm_in_kernel", False),
        ("use_gate_in_kernel", False), ("A_log", None), ("dt_bias", None), ("use_beta_sigmoid_in_kernel", False),
        ("allow_neg_eigval", False), ("state_v_first", False), ("cu_seqlens", None),
    ],
    "vllm_fused_recurrent_gated_delta_rule": [
        ("q", _), ("k", _), ("v", _), ("g", _), ("beta", None), ("scale", None), ("initial_state", None),
        ("inplace_final_state", True), ("cu_seqlens", None), ("ssm_state_indices", None),
        ("num_accepted_tokens", None), ("retrieve_parent_token", None), ("use_qk_l2norm_in_kernel", False),
    ],
    "fused_sigmoid_gating_delta_rule_update": [
        ("A_log", _), ("a", _), ("dt_bias", _), ("softplus_beta", _), ("softplus_threshold", _), ("q", _), ("k", _),
        ("v", _), ("b", _), ("initial_state_source", _), ("initial_state_indices", _), ("scale", None),
        ("use_qk_l2norm_in_kernel", False), ("cu_seqlens", None),
    ],
    "fused_gdn_gating": [("A_log", _), ("a", _), ("b", _), ("dt_bias", _), ("beta", 1.0), ("threshold", 20.0)],
    # vLLM's fused-gating update (vllm/model_executor/layers/fla/ops/fused_sigmoid_gating.py, 2baf56c3): SGLang's
    # name, its own signature and V-major pool; under its own name here (and the shared name with its keywords).
    "vllm_fused_sigmoid_gating_delta_rule_update": [
        ("A_log", _), ("a", _), ("b", _), ("dt_bias", _), ("q", _), ("k", _), ("v", _), ("beta", 1.0),
        ("threshold", 20.0), ("scale", None), ("initial_state", None), ("inplace_final_state", True),
        ("cu_seqlens", None), ("ssm_state_indices", None), ("num_accepted_tokens", None),
        ("use_qk_l2norm_in_kernel", False), ("is_kda", False),
    ],
    # vLLM's and SGLang's packed decode (vllm/model_executor/layers/fla/ops/fused_recurrent.py; SGLang's
    # python/sglang/srt/layers/attention/fla/fused_recurrent.py and its vendor ports declare the same).
    "fused_recurrent_gated_delta_rule_packed_decode": [
        ("mixed_qkv", _), ("a", _), ("b", _), ("A_log", _), ("dt_bias", _), ("scale", _), ("initial_state", _),
        ("out", _), ("ssm_state_indices", _), ("use_qk_l2norm_in_kernel", False),
    ],
    # vLLM's prefill (vllm/model_executor/layers/fla/ops/chunk.py, 044990c): FLA's name, its own positional order
    # and three results (o, final_state, intermediate_states); under its own name here, as vLLM's pool decode.
    "vllm_chunk_gated_delta_rule": [
        ("q", _), ("k", _), ("v", _), ("g", _), ("beta", _), ("scale", None), ("initial_state", None),
        ("output_final_state", False), ("cu_seqlens", None), ("head_first", False),
        ("use_qk_l2norm_in_kernel", False), ("return_intermediate_states", False),
    ],
    # vLLM's conv (vllm/model_executor/layers/mamba/ops/causal_conv1d.py, 533d337; vLLM 0.23's Qwen GDN layer,
    # qwen_gdn_linear_attn.py a55a8d9, calls both by these names and keywords).
    "causal_conv1d_fn": [
        ("x", _), ("weight", _), ("bias", _), ("conv_states", _), ("query_start_loc", _), ("cache_indices", None),
        ("has_initial_state", None), ("activation", "silu"), ("pad_slot_id", -1),
        ("block_idx_first_scheduled_token", None), ("block_idx_last_scheduled_token", None),
        ("initial_state_idx", None), ("num_computed_tokens", None), ("block_size_to_align", 0), ("metadata", None),
        ("validate_data", False),
    ],
    "causal_conv1d_update": [
        ("x", _), ("conv_state", _), ("weight", _), ("bias", None), ("activation", None),
        ("conv_state_indices", None), ("num_accepted_tokens", None), ("query_start_loc", None),
        ("max_query_len", -1), ("pad_slot_id", -1), ("block_idx_last_scheduled_token", None),
        ("initial_state_idx", None), ("validate_data", False),
    ],
}  # fmt: skip


@pytest.mark.parametrize("name", list(ORIGINALS))
def test_each_drop_in_leads_with_its_originals_parameters_in_order_with_their_defaults(name: str) -> None:
    parameters = list(inspect.signature(getattr(gdn_nki.torch, name)).parameters.values())
    ours = [(p.name, _ if p.default is p.empty else p.default) for p in parameters[: len(ORIGINALS[name])]]
    assert ours == ORIGINALS[name]


def _raw_gates(args: dict[str, Any]) -> dict[str, Any]:
    """The call with FLA's fused activations: the raw gate, the β logits and the layer's parameters."""
    torch.manual_seed(11)
    shape = args["g"].shape
    return {**args, "g": torch.randn(shape), "beta": torch.randn(shape), "A_log": torch.rand(HV).log(),
            "dt_bias": torch.randn(HV), "use_gate_in_kernel": True, "use_beta_sigmoid_in_kernel": True}  # fmt: skip


def test_fla_decode_computes_the_fused_gates_as_hfs_layer_does() -> None:
    """use_gate_in_kernel / use_beta_sigmoid_in_kernel give the bits of the call with HF's Qwen3-Next formulas
    applied first (g = −exp(A_log)·softplus(a + dt_bias), β = sigmoid(b), fp32), on the op and the host path."""
    fused = _raw_gates(fla_decode_call())
    fused_only = ("A_log", "dt_bias", "use_gate_in_kernel", "use_beta_sigmoid_in_kernel")
    precomputed = {name: x for name, x in fused.items() if name not in fused_only}
    precomputed["g"] = -fused["A_log"].float().exp() * torch.nn.functional.softplus(fused["g"] + fused["dt_bias"])
    precomputed["beta"] = fused["beta"].sigmoid()
    want = gdn_nki.torch.fused_recurrent_gated_delta_rule(**precomputed)
    for check_values in (True, False):  # the op, and the host path (check_values=False on the CPU)
        got = gdn_nki.torch.fused_recurrent_gated_delta_rule(**fused, check_values=check_values)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert gdn_nki.torch.check_values(gdn_nki.torch.fused_recurrent_gated_delta_rule, **fused) is None


@pytest.mark.parametrize(
    ("option", "value"),
    [("allow_neg_eigval", True), ("A_log", None)],
)
def test_fla_decode_rejects_by_name_the_options_it_does_not_honour(option: str, value: Any) -> None:
    args = fla_decode_call()
    if option == "A_log":  # use_gate_in_kernel without its parameter
        args.update(use_gate_in_kernel=True, A_log=None)
    else:
        args[option] = value
    with pytest.raises(ContractError, match=f"`{option}`"):
        gdn_nki.torch.fused_recurrent_gated_delta_rule(**args)


def test_vllms_keyword_call_of_the_shared_name_is_vllms_pool_decode() -> None:
    """vLLM imports ``fused_recurrent_gated_delta_rule`` and calls it with its pool keywords: from gdn_nki.torch
    that call is vLLM's (the pool written in place at the rows, returned), bit for bit the pool variant's."""
    want_args = verify_call()
    want_o, want_pool = gdn_nki.torch.vllm_fused_recurrent_gated_delta_rule(**want_args)
    args = verify_call()
    o, pool = gdn_nki.torch.fused_recurrent_gated_delta_rule(**args)
    assert pool is args["initial_state"]
    assert torch.equal(o, want_o) and torch.equal(pool, want_pool)


def test_vllms_keyword_beside_flas_own_option_is_rejected_and_writes_nothing() -> None:
    args = {**verify_call(), "output_final_state": True}
    before = args["initial_state"].clone()
    with pytest.raises(ContractError, match="`output_final_state`") as error:
        gdn_nki.torch.fused_recurrent_gated_delta_rule(**args)
    assert "gdn_nki.torch.fused_recurrent_gated_delta_rule" in str(error.value)
    assert torch.equal(args["initial_state"], before)


@pytest.mark.parametrize("form", ["FLA's fused gates", "vLLM's keywords"])
def test_both_forms_compile_without_a_graph_break(form: str) -> None:
    args = _raw_gates(fla_decode_call()) if form == "FLA's fused gates" else verify_call()
    drop_in = gdn_nki.torch.fused_recurrent_gated_delta_rule
    torch._dynamo.reset()
    explained = torch._dynamo.explain(lambda **kwargs: drop_in(**kwargs))(**args)
    assert (explained.graph_break_count, explained.graph_count) == (0, 1), explained.break_reasons
    ops = [
        str(node.target) for graph in explained.graphs for node in graph.graph.nodes if "gdn_nki" in str(node.target)
    ]
    want = (
        "fused_recurrent_gated_delta_rule" if form == "FLA's fused gates" else "vllm_fused_recurrent_gated_delta_rule"
    )
    assert ops == [f"gdn_nki.{want}.default"]


def test_vllms_positional_call_of_the_shared_name_is_vllms_too() -> None:
    """gdn-spec's vLLM adapter (as vLLM's signature allows) passes beta, scale and the pool by position, where FLA's
    order has gk, gv and beta: with vLLM's keywords the call is bound in vLLM's order."""
    want_args = verify_call()
    want_o, want_pool = gdn_nki.torch.vllm_fused_recurrent_gated_delta_rule(**want_args)
    args = verify_call()
    q, k, v, g, beta, pool = (args.pop(name) for name in ("q", "k", "v", "g", "beta", "initial_state"))
    o, got = gdn_nki.torch.fused_recurrent_gated_delta_rule(q, k, v, g, beta, None, pool, True, **args)
    assert got is pool and torch.equal(o, want_o) and torch.equal(pool, want_pool)


# --- keywords: unknown ones rejected (HF's pass-through ones accepted), hints for what a caller most likely meant ---

FLA_DECODES = {
    "gdn_nki.torch": lambda: gdn_nki.torch.fused_recurrent_gated_delta_rule,
    "host path": lambda: gdn_nki.torch.fused_recurrent.fused_recurrent_gated_delta_rule,
}


@pytest.mark.parametrize("form", list(FLA_DECODES))
def test_fla_decode_rejects_a_misspelt_keyword_naming_the_one_meant(form: str) -> None:
    args = fla_decode_call()
    del args["use_qk_l2norm_in_kernel"]
    with pytest.raises(ContractError, match=r"`use_qk_l2norm`.*\[keyword.unknown\]") as error:
        FLA_DECODES[form]()(**args, use_qk_l2norm=True)  # silently unnormalized before
    assert "did you mean use_qk_l2norm_in_kernel=?" in str(error.value)
    assert str(error.value).startswith("gdn_nki.torch.fused_recurrent_gated_delta_rule rejected the call")


@pytest.mark.parametrize("form", list(FLA_DECODES))
def test_fla_decode_accepts_hfs_pass_through_keywords_unchanged(form: str) -> None:
    args = fla_decode_call()
    want_o, want_state = FLA_DECODES[form]()(**args)
    o, state = FLA_DECODES[form]()(**args, use_cache=True, position_ids=None, cache_position=torch.arange(1))
    assert torch.equal(o, want_o) and torch.equal(state, want_state)


@pytest.mark.parametrize("keyword", ["state_indices", "initial_state_indices"])
def test_fla_decode_points_a_pools_rows_to_the_forms_that_take_a_pool(keyword: str) -> None:
    args = fla_decode_call()
    args["initial_state"] = torch.zeros(4, *args["initial_state"].shape[1:])  # a pool, as a prefill call passes
    with pytest.raises(ContractError, match=rf"`{keyword}`.*\[keyword.unknown\]") as error:
        gdn_nki.torch.fused_recurrent_gated_delta_rule(**args, **{keyword: torch.tensor([0, 3])})
    message = str(error.value)
    assert "takes no pool" in message and "ssm_state_indices=" in message, message
    assert "initial_state_source=pool, initial_state_indices=rows" in message, message
    assert "initial_state must be" not in message, message


def test_fla_decode_says_a_fifth_positional_beta_is_gk_in_flas_order() -> None:
    args = fla_decode_call()
    q, k, v, g, beta = (args.pop(name) for name in ("q", "k", "v", "g", "beta"))
    with pytest.raises(ContractError, match=r"`gk`") as error:
        gdn_nki.torch.fused_recurrent_gated_delta_rule(q, k, v, g, beta, **args)  # HF's positional order
    message = str(error.value)
    assert "FLA's order (q, k, v, g, gk, gv, beta" in message and "pass beta=... " in message, message
    per_key = torch.zeros(*g.shape, q.shape[-1])  # a real per-key decay [B, T, HV, K]: no word of beta
    with pytest.raises(ContractError, match=r"`gk`") as error:
        gdn_nki.torch.fused_recurrent_gated_delta_rule(q, k, v, g, per_key, beta=beta, **args)
    assert "beta" not in str(error.value) and "pass gk=None and a per-head g" in str(error.value)


@pytest.mark.parametrize(("rows", "hinted"), [([-1, 1], True), ([5, 1], False)])
def test_prefill_pool_row_minus_one_without_a_bucket_names_the_bucketed_form(rows: list[int], hinted: bool) -> None:
    torch.manual_seed(9)
    q, k = torch.nn.functional.normalize(torch.randn(2, 1, 3, 2, 8), dim=-1)
    v, g, beta = torch.randn(1, 3, 2, 8), -torch.rand(1, 3, 2), torch.rand(1, 3, 2)
    pool = torch.randn(4, 2, 8, 8)
    before = pool.clone()
    with pytest.raises(ContractError, match=r"`state_indices`.*\[state_indices.range\]") as error:
        gdn_nki.torch.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=pool, cu_seqlens=torch.tensor([0, 1, 3]),
                                             state_indices=torch.tensor(rows))  # fmt: skip
    message = str(error.value)
    assert ("PAD_SLOT_ID" in message and "bucket=(T, N)" in message and "configure_buckets" in message) == hinted
    assert "use rows in [0, 4)" in message
    assert torch.equal(pool, before)


@pytest.mark.parametrize("module", ["gdn_nki.torch", "gdn_nki.torch_decode"])
def test_decode_errors_name_the_public_module(module: str) -> None:
    import importlib

    decode = importlib.import_module(module).fused_recurrent_gated_delta_rule
    args = fla_decode_call()
    with pytest.raises(ContractError) as error:
        decode(**{**args, "gk": torch.zeros(2, 1, HV, 8)})
    assert str(error.value).startswith("gdn_nki.torch.fused_recurrent_gated_delta_rule rejected the call")


def test_vllms_prefill_positional_call_returns_three_values_with_flas_bits() -> None:
    """vLLM's positional order (cu_seqlens 9th, use_qk_l2norm_in_kernel 11th) reaches the same prefill as FLA's
    keywords; the third result is None."""
    from test_torch_ops import prefill_call

    args = prefill_call()
    cu = torch.tensor([0, 30, 80], dtype=torch.int32)
    packed = {name: args[name].reshape(1, -1, *args[name].shape[2:]) for name in ("q", "k", "v", "g", "beta")}
    want = gdn_nki.torch.chunk_gated_delta_rule(**packed, initial_state=args["initial_state"], output_final_state=True,
                                                cu_seqlens=cu, use_qk_l2norm_in_kernel=True)  # fmt: skip
    o, final, intermediate = gdn_nki.torch.vllm_chunk_gated_delta_rule(
        *packed.values(), None, args["initial_state"], True, cu, False, True
    )
    assert intermediate is None
    assert torch.equal(o, want[0]) and torch.equal(final, want[1])


@pytest.mark.parametrize(("option", "value"), [("return_intermediate_states", True), ("head_first", True)])
def test_vllms_prefill_rejects_what_it_does_not_honour_by_name(option: str, value: Any) -> None:
    from test_torch_ops import prefill_call

    args = {name: x for name, x in prefill_call().items() if name != "use_qk_l2norm_in_kernel"}
    with pytest.raises(ContractError, match=f"`{option}`"):
        gdn_nki.torch.vllm_chunk_gated_delta_rule(**args, **{option: value})


def test_flas_name_with_vllms_keyword_is_vllms_form() -> None:
    """``return_intermediate_states`` is vLLM's keyword, which FLA's function does not take: FLA's name called with
    it (positional arguments in vLLM's order) gives vLLM's three results, the bits of vLLM's entry."""
    from test_torch_traced_rejections import vllm_prefill_call

    args = vllm_prefill_call()
    positional = [args[name] for name in ("q", "k", "v", "g", "beta")]
    order = (None, args["initial_state"], True, args["cu_seqlens"], False, True)
    want = gdn_nki.torch.vllm_chunk_gated_delta_rule(*positional, *order)
    got = gdn_nki.torch.chunk_gated_delta_rule(*positional, *order, return_intermediate_states=False)
    assert len(got) == 3 and got[2] is None
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    with pytest.raises(ContractError, match="`return_intermediate_states`"):
        gdn_nki.torch.chunk_gated_delta_rule(*positional, return_intermediate_states=True)


@pytest.mark.parametrize("keyword", ["chunk_indices", "chunk_offsets", "core_attn_out"])
def test_vllms_v_major_forms_keywords_are_rejected_naming_the_layout(keyword: str) -> None:
    from test_torch_traced_rejections import vllm_prefill_call

    with pytest.raises(ContractError, match=rf"`{keyword}`.*V-major \[N, H, V, K\]"):
        gdn_nki.torch.vllm_chunk_gated_delta_rule(**vllm_prefill_call(), **{keyword: torch.zeros(1)})
