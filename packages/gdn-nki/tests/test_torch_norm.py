"""gdn_nki.torch's gated RMSNorm drop-ins (FLA's ``rms_norm_gated`` and ``FusedRMSNormGated``): equal to gdn-ref's
fp64 oracle under gdn-spec's tolerance table and to HF's ``Qwen3NextRMSNormGated``, FLA's residual / prenorm
options, each option honoured or rejected by name, one custom op under torch.compile(fullgraph=True) and fake
tensors with the CPU's rules at trace time."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from gdn_nki.torch import FusedRMSNormGated, rms_norm_gated  # noqa: E402
from gdn_nki.torch.norm import rms_norm_gated_op  # noqa: E402
from gdn_ref.contract import ContractError  # noqa: E402
from gdn_ref.norm import gated_rms_norm_oracle  # noqa: E402
from gdn_spec.metrics import compare  # noqa: E402

D = 128
SHAPE = (24, 8, D)  # tokens × heads × head_v_dim


def _inputs(dtype: torch.dtype = torch.float32, seed: int = 0, shape: tuple[int, ...] = SHAPE):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen).to(dtype)
    g = (2 * torch.randn(shape, generator=gen)).to(dtype)
    weight = 1 + 0.5 * torch.randn(shape[-1], generator=gen)
    return x, g, weight


def _f64(t: torch.Tensor | None) -> np.ndarray | None:
    return None if t is None else t.detach().double().numpy()


def _assert_close(got: torch.Tensor, ref: np.ndarray, dtype: torch.dtype) -> None:
    error = compare("out", got.double().numpy(), ref, str(dtype).removeprefix("torch."))
    assert error.ok, error


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("activation", ["swish", "silu", "sigmoid"])
def test_function_matches_the_oracle(dtype: torch.dtype, activation: str) -> None:
    x, g, weight = _inputs(dtype)
    y = rms_norm_gated(x, g, weight, None, activation, eps=1e-6)
    assert y.shape == x.shape and y.dtype == dtype
    _assert_close(y, gated_rms_norm_oracle(_f64(x), _f64(g), _f64(weight), eps=1e-6, activation=activation), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_module_matches_the_oracle(dtype: torch.dtype) -> None:
    x, g, weight = _inputs(dtype, seed=1)
    norm = FusedRMSNormGated(D, eps=1e-6, activation="silu", dtype=dtype)
    assert torch.equal(norm.weight, torch.ones(D, dtype=dtype)) and norm.bias is None
    with torch.no_grad():
        norm.weight.copy_(weight)
        y = norm(x, g)
    _assert_close(y, gated_rms_norm_oracle(_f64(x), _f64(g), _f64(norm.weight), eps=1e-6), dtype)
    plain = FusedRMSNormGated(D, elementwise_affine=False, eps=1e-5)
    assert plain.weight is None
    _assert_close(plain(x, g), gated_rms_norm_oracle(_f64(x), _f64(g), None, eps=1e-5), dtype)


def test_hf_qwen3_next_rms_norm_gated() -> None:
    """HF's layer norm and ours on HF's call (2-D rows of head_v_dim): fp32 to fp32 rounding; bf16 within gdn-spec's
    bf16 bound of each other (HF rounds the normalized value to bf16 before the weight, FLA and we do not)."""
    hf = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    for dtype in (torch.float32, torch.bfloat16):
        x, g, weight = _inputs(dtype, seed=2, shape=(96, D))
        theirs = hf.Qwen3NextRMSNormGated(D, eps=1e-6).to(dtype)
        ours = FusedRMSNormGated(D, eps=1e-6, activation="silu", dtype=dtype)
        with torch.no_grad():
            theirs.weight.copy_(weight)
            ours.weight.copy_(weight)
            want, got = theirs(x, g), ours(x, g)
        assert got.dtype == want.dtype == dtype
        error = compare("out", got.double().numpy(), want.detach().double().numpy(), str(dtype).removeprefix("torch."))
        assert error.ok, error
        if dtype == torch.float32:
            assert error.rel_rms < 1e-6


@pytest.mark.parametrize("residual_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("residual_in_fp32", [False, True])
def test_residual_and_prenorm(residual_dtype: torch.dtype, residual_in_fp32: bool) -> None:
    """FLA: x + residual summed in fp32 is normalized; prenorm returns that sum in the residual's dtype (fp32 with
    ``residual_in_fp32``); y in x's dtype."""
    x, g, weight = _inputs(torch.bfloat16, seed=3)
    residual = torch.randn(SHAPE, generator=torch.Generator().manual_seed(9)).to(residual_dtype)
    y, h = rms_norm_gated(x, g, weight, None, "swish", residual=residual, prenorm=True,
                          residual_in_fp32=residual_in_fp32, eps=1e-6)  # fmt: skip
    assert y.dtype == torch.bfloat16
    assert h.dtype == (torch.float32 if residual_in_fp32 else residual_dtype)
    assert torch.equal(h, (x.float() + residual.float()).to(h.dtype))
    ref, _ = gated_rms_norm_oracle(_f64(x), _f64(g), _f64(weight), eps=1e-6, residual=_f64(residual), prenorm=True)
    _assert_close(y, ref, torch.bfloat16)


def test_prenorm_without_residual_returns_x() -> None:
    x, g, weight = _inputs(torch.bfloat16, seed=4)
    _, h = rms_norm_gated(x, g, weight, None, prenorm=True)
    assert h is x
    _, h32 = rms_norm_gated(x, g, weight, None, prenorm=True, residual_in_fp32=True)
    assert h32.dtype == torch.float32 and torch.equal(h32, x.float())


def test_gate_in_another_dtype_is_read_exactly() -> None:
    """An fp32 gate with bf16 x (FLA reads each in its own dtype): the gate is not rounded to bf16 first."""
    x, _, weight = _inputs(torch.bfloat16, seed=5)
    g = torch.randn(SHAPE, generator=torch.Generator().manual_seed(11))
    y = rms_norm_gated(x, g, weight, None, "silu")
    assert y.dtype == torch.bfloat16
    _assert_close(y, gated_rms_norm_oracle(_f64(x), _f64(g), _f64(weight)), torch.bfloat16)


def test_honoured_extension_values() -> None:
    """vLLM's norm_before_gate=True and group_size=D are this norm: accepted, same bits."""
    x, g, weight = _inputs(seed=6)
    plain = rms_norm_gated(x, g, weight, None)
    assert torch.equal(rms_norm_gated(x, g, weight, None, norm_before_gate=True, group_size=D), plain)


@pytest.mark.parametrize(
    ("change", "argument"),
    [
        ({"bias": torch.zeros(D)}, "bias"),
        ({"norm_before_gate": False}, "norm_before_gate"),
        ({"group_size": 64}, "group_size"),
        ({"upcast": True}, "upcast"),
        ({"activation": "gelu"}, "activation"),
        ({"eps": 0.0}, "eps"),
        ({"x": torch.zeros(SHAPE, dtype=torch.float16)}, "x"),
        ({"g": torch.zeros((24, 8, 64))}, "g"),
        ({"weight": torch.ones(64)}, "weight"),
        ({"residual": torch.zeros((24, D))}, "residual"),
        ({"x": np.zeros(SHAPE, np.float32)}, "x"),
    ],
)
def test_rejections_name_the_argument(change: dict, argument: str) -> None:
    x, g, weight = _inputs()
    call = {"x": x, "g": g, "weight": weight, "bias": None, **change}
    with pytest.raises(ContractError) as info:
        rms_norm_gated(**call)
    assert f"`{argument}`" in str(info.value)


def test_module_rejects_an_unknown_activation() -> None:
    with pytest.raises(ContractError, match="`activation`"):
        FusedRMSNormGated(D, activation="relu")


def test_nan_rejected_on_the_cpu() -> None:
    x, g, weight = _inputs()
    x[3, 2, 1] = float("nan")
    with pytest.raises(ContractError, match="`x`"):
        rms_norm_gated(x, g, weight, None)


def test_compile_fullgraph_bit_equal_to_eager() -> None:
    x, g, weight = _inputs(torch.bfloat16, seed=7)
    norm = FusedRMSNormGated(D, eps=1e-6, activation="silu")
    with torch.no_grad():
        norm.weight.copy_(weight)
        eager = norm(x, g)
        torch._dynamo.reset()
        compiled = torch.compile(norm, fullgraph=True, backend="eager")
        assert torch.equal(compiled(x, g), eager)
        function = torch.compile(rms_norm_gated, fullgraph=True, backend="eager")
        residual = torch.randn(SHAPE).to(torch.bfloat16)
        want = rms_norm_gated(x, g, weight, None, residual=residual, prenorm=True)
        got = function(x, g, weight, None, residual=residual, prenorm=True)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_compiled_graph_is_one_op() -> None:
    x, g, weight = _inputs(seed=8)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(rms_norm_gated)(x, g, weight, None, "silu")
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    targets = [str(node.target) for graph in explained.graphs for node in graph.graph.nodes]
    assert sum("rms_norm_gated" in t for t in targets) == 1


def test_fake_tensors_give_shapes_and_trace_time_rules() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x, g, weight = _inputs(torch.bfloat16)
        y = rms_norm_gated(x, g, weight, None)
        assert y.shape == SHAPE and y.dtype == torch.bfloat16
        with pytest.raises(ContractError, match="`x`"):
            rms_norm_gated_op(x.to(torch.float16), g.to(torch.float16), weight, 1e-6, "silu")


def test_opcheck() -> None:
    x, g, weight = _inputs(seed=9)
    torch.library.opcheck(rms_norm_gated_op, (x, g, weight, 1e-6, "silu"))
    torch.library.opcheck(rms_norm_gated_op, (x.to(torch.bfloat16), None, None, 1e-5, "sigmoid"))


def test_hf_qwen3_next_layer_with_the_drop_in_as_its_norm() -> None:
    """HF's Qwen3-Next GatedDeltaNet layer (``examples/qwen3_next_layer.py``'s tiny model) with its
    ``Qwen3NextRMSNormGated`` replaced by ``FusedRMSNormGated`` (its weight and eps): the layer's output equals HF's
    own within gdn-spec's fp32 bound, alone and with gdn-nki's chunk_gated_delta_rule swapped in too."""
    pytest.importorskip("transformers")
    from gdn_nki.torch import chunk_gated_delta_rule
    from test_qwen3_next import _example

    example = _example()
    layer, model, ids = example._layer_and_model(torch.float32)
    hidden = model.layers[0].input_layernorm(model.embed_tokens(ids[:, :40]))
    theirs_norm = layer.norm
    ours_norm = FusedRMSNormGated(theirs_norm.weight.shape[0], eps=theirs_norm.variance_epsilon, activation="silu")
    with torch.no_grad():
        ours_norm.weight.copy_(theirs_norm.weight)
        theirs = layer(hidden)
        layer.norm = ours_norm
        try:
            with_norm = layer(hidden)
            example.hf.torch_chunk_gated_delta_rule = chunk_gated_delta_rule
            try:
                with_both = layer(hidden)
            finally:
                example.hf.torch_chunk_gated_delta_rule = example.HF_CORE
        finally:
            layer.norm = theirs_norm
    assert not torch.equal(with_norm, theirs), "the layer ran our norm"
    for ours in (with_norm, with_both):
        error = compare("out", ours.numpy(), theirs.numpy(), "float32")
        assert error.ok, str(error)
