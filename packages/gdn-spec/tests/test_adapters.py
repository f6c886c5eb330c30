"""Adapters: option parsing, the seq-first layout glue against a direct gdn_cte call, exact bf16 through torch,
identity of in-place states through the torch and nki adapters, and a kernel's write to any array an adapter
converted for it reaching the suite's array (returned or raised, numpy or torch)."""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import pytest

import adapter_kernels
from gdn_spec.adapters import adapt, parse
from gdn_spec.adapters.seqfirst import Conventions, kernel_names
from gdn_spec.contract import valid_call
from gdn_spec.impl import ImplementationError, load
from gdn_spec.regimes import Geometry, make_case
from gdn_spec.suite._support import call_args, changed, run, snapshot
from mutants import CORRECT


@pytest.mark.parametrize(
    "spec", ["nope", "fla:scale", "fla:scale=sometimes", "fla:heads=repeat", "torch:scale=internal", "nki:state=vk"]
)
def test_bad_adapter_specs_are_errors(spec: str) -> None:
    with pytest.raises(ImplementationError):
        adapt(load("adapter_kernels:fla_style"), spec)


def test_presets_and_options() -> None:
    assert parse("hf-torch") == ("hf-torch", {"scale": "internal"})
    assert parse("fla:gqa=repeat,state=vk") == ("fla", {"gqa": "repeat", "state": "vk"})
    assert Conventions.from_options({"varlen": "yes"}).takes_cu_seqlens


def test_an_option_given_twice_is_an_error_naming_both_values() -> None:
    with pytest.raises(ImplementationError, match=r"'gqa' given twice .*'native' and 'repeat'"):
        parse("fla:gqa=native,state=vk,gqa=repeat")
    assert parse("hf-torch:scale=external") == ("hf-torch", {"scale": "external"}), "an option overrides a preset"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("fla:varlen=yes,pol=state_indices", r"unknown seq-first adapter option 'pol' \(did you mean 'pool'\?\)"),
        (
            "fla:varlen=yes,pool=initial_state_indice",
            r"pool='initial_state_indice' \(did you mean 'initial_state_indices'\?\)",
        ),
        ("fla:varlen=yes,pool=state_indices,chekpoints=yes", r"'chekpoints' \(did you mean 'checkpoints'\?\)"),
        ("fla:varlen=yes,pool=state_indices,bucket=true", r"bucket='true'.*choose one of \('no', 'yes'\)"),
        ("fla:pool=state_indices", r"pool=state_indices needs varlen=yes"),
        ("fla:varlen=yes,bucket=yes", r"bucket=yes needs a pool.*add pool="),
        ("fla:varlen=yes,read_rows=yes", r"read_rows=yes needs a pool"),
    ],
)
def test_misspelt_or_unusable_pool_options_are_errors_naming_the_fix(spec: str, message: str) -> None:
    with pytest.raises(ImplementationError, match=message):
        adapt(load("adapter_kernels:pool_style"), spec)


def test_a_pool_adapter_declares_the_serving_capabilities_it_passes() -> None:
    plain = adapt(load("adapter_kernels:pool_style"), "fla:varlen=yes")
    assert not any(getattr(plain.capabilities, c) for c in ("state_pool", "bucket", "checkpoints", "read_rows"))
    pooled = adapt(load("adapter_kernels:pool_style"), "fla:varlen=yes,pool=initial_state_indices,checkpoints=yes")
    caps = pooled.capabilities
    assert (caps.state_pool, caps.checkpoints, caps.bucket, caps.read_rows) == (True, True, False, False)
    assert not caps.state_in_place, "a dense call still returns a new state"
    assert {"state_pool", "checkpoints", "read_rows"} <= set(caps.set_by_adapter)
    assert pooled.argument_name("state_indices") == "initial_state_indices"
    assert "pool=initial_state_indices, checkpoints=yes" in pooled.via and "bucket" not in pooled.via


def _pool_call(adapter: str, dtype: str = "float32") -> tuple[Any, Any]:
    """The adapted ``pool_style`` and a serving call of the suite (two sequences, rows 3 and -1, a checkpoint)."""
    from gdn_spec.serving import Layout, serving_call, with_checkpoints

    impl = adapt(load("adapter_kernels:pool_style"), adapter)
    served = serving_call(impl.capabilities, Layout("two", (150, 40), (3, -1)), Geometry(1, 1, 2, 128, 32, 16),
                          dtype, "schur", 128, 5, call_args)  # fmt: skip
    if impl.capabilities.checkpoints:
        with_checkpoints(served, 128, np.array([[6], [-1]]))
    return impl, served


def test_a_pool_call_hands_the_kernel_the_callers_pool_and_returns_it() -> None:
    """The pool call's state is the caller's pool itself, written by the kernel at the named rows only (the
    suite's oracle checks the values; here: the object, and the rows the kernel wrote and left)."""
    impl, served = _pool_call("fla:varlen=yes,pool=state_indices,checkpoints=yes")
    pool = served.call["recurrent_state"]
    out, state = impl(**served.call)
    assert state is pool and out.shape == served.call["value"].shape
    moved = {r for r in range(len(pool)) if pool[r].tobytes() != served.state_before[r].tobytes()}
    assert moved == {3, 6}, moved


@pytest.mark.parametrize(
    ("adapter", "keyword", "message"),
    [
        ("fla:varlen=yes", "state_indices", r"pool=no"),
        ("fla:varlen=yes,pool=state_indices", "checkpoint_every", r"checkpoint_every given.*checkpoints=no"),
        ("fla:varlen=yes,pool=state_indices,checkpoints=yes", "nonsense", r"unexpected keyword argument 'nonsense'"),
    ],
)
def test_a_keyword_the_adapter_does_not_pass_on_is_refused(adapter: str, keyword: str, message: str) -> None:
    _, served = _pool_call("fla:varlen=yes,pool=state_indices,checkpoints=yes")
    adapted = adapt(load("adapter_kernels:pool_style"), adapter)
    call = {**served.call, keyword: served.call.get(keyword, 1)}
    if keyword == "state_indices":
        call.pop("checkpoint_every"), call.pop("checkpoint_indices")
    with pytest.raises((ValueError, TypeError), match=message):
        adapted(**call)


def test_device_needs_a_torch_adapter() -> None:
    with pytest.raises(ImplementationError, match="device"):
        adapt(load("adapter_kernels:fla_style"), "fla", device="cpu")


@pytest.mark.parametrize(
    ("spec", "adapter"),
    [
        ("adapter_kernels:fla_style", "fla"),
        ("adapter_kernels:hf_style", "fla:scale=internal,gqa=repeat"),
        ("adapter_kernels:v_first_style", "fla:state=vk"),
    ],
)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_seq_first_glue_equals_the_direct_call(spec: str, adapter: str, dtype: str) -> None:
    case = make_case("initial_state", Geometry(2, 2, 6, 128, 32, 16), dtype, 3)
    adapted = adapt(load(spec), adapter)
    assert adapted.default_profile == "math" and "fla adapter" in adapted.via
    out, state = adapted(**call_args(case, "schur"))
    ref_out, ref_state = CORRECT(**call_args(case, "schur"))
    assert out.shape == ref_out.shape and state.shape == ref_state.shape
    assert out.tobytes() == ref_out.tobytes() and np.array_equal(state, ref_state)


@pytest.mark.parametrize(
    ("spec", "adapter", "message"),
    [
        ("adapter_kernels:hf_writes_query", "fla:scale=internal,gqa=repeat", "the caller's `query`: the inputs"),
        ("adapter_kernels:fla_writes_query", "fla", "the caller's `q` (the suite's `query`, renamed by the adapter)"),
    ],
)
def test_a_written_input_is_named_by_the_kernels_own_signature(spec: str, adapter: str, message: str) -> None:
    """HF's kernels call their first argument ``query``, FLA's ``q``: a seq-first kernel writing it was told it
    changed `q` whatever it called it (one FLA table named every seq-first adapter's arguments)."""
    adapted = adapt(load(spec), adapter)
    # One batch item and one head: the kernel gets the caller's own memory (a contiguous seq-first view); other
    # shapes hand it copies, whose writes the adapter carries back (test_a_write_to_a_converted_argument_...).
    case = make_case("random", Geometry(1, 1, 1, 128, 16, 16), "float32", 0)
    with pytest.raises(pytest.fail.Exception) as info:
        run(adapted, call_args(case, "schur"))
    assert str(info.value).startswith(f"the call changed {message}"), str(info.value)


# Two batch items, two key heads, four value heads: every array the adapter hands a seq-first kernel is a copy of
# the suite's (a transpose made contiguous, heads repeated, a scaled query, a transposed state, a tensor made from
# one of those), never its memory, so a write reaches the suite only through the adapter's Handoff.
COPIED = Geometry(2, 2, 4, 128, 16, 16)
HAS_TORCH = importlib.util.find_spec("torch") is not None
NEEDS_TORCH = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")

# (correct kernel, the same writing one argument in place, adapter, device, the argument as the kernel calls it)
WRITES = [
    ("fla_style", "fla_writes_key", "fla", None, "k"),
    ("hf_style", "hf_writes_query", "fla:scale=internal,gqa=repeat", None, "query"),
    ("caller_scaled_style", "caller_scaled_writes_query", "fla:scale=caller", None, "q"),
    ("v_first_style", "v_first_writes_initial_state", "fla:state=vk", None, "initial_state"),
    pytest.param("torch_fla_style", "torch_fla_writes_key", "fla-torch:gqa=repeat", "cpu", "k", marks=NEEDS_TORCH),
    pytest.param("torch_hf_style", "torch_hf_writes_query", "hf-torch:gqa=repeat", "cpu", "query", marks=NEEDS_TORCH),
    pytest.param(
        "torch_caller_scaled_style",
        "torch_caller_scaled_writes_query",
        "fla-torch:scale=caller",
        "cpu",
        "q",
        marks=NEEDS_TORCH,
    ),
]


@pytest.mark.parametrize(("correct", "mutant", "adapter", "device", "argument"), WRITES)
def test_a_write_to_a_converted_argument_fails_naming_it(
    correct: str, mutant: str, adapter: str, device: str | None, argument: str
) -> None:
    """A kernel writing an array the adapter converted (not a view of the suite's) wrote a copy the suite never
    compared: only calls where the conversion was a view (B = H = 1 through ``fla``) were caught."""
    case = make_case("initial_state", COPIED, "float32", 0)
    run(adapt(load(f"adapter_kernels:{correct}"), adapter, device), call_args(case, "schur"))  # writes nothing
    with pytest.raises(pytest.fail.Exception) as info:
        run(adapt(load(f"adapter_kernels:{mutant}"), adapter, device), call_args(case, "schur"))
    assert str(info.value).startswith(f"the call changed the caller's `{argument}`"), str(info.value)
    if argument == "initial_state":  # the rule is the adapter's, not a declaration of the kernel's
        assert "'s adapter sets state_in_place=False" in str(info.value), str(info.value)
        assert "seq-first kernel returns its final state" in str(info.value), str(info.value)


@pytest.mark.parametrize(
    ("mutant", "adapter", "device", "written"),
    [
        ("fla_writes_query_then_raises", "fla", None, "query"),
        pytest.param("torch_fla_writes_key_then_raises", "fla-torch:gqa=repeat", "cpu", "key", marks=NEEDS_TORCH),
    ],
)
def test_a_write_before_a_refusal_reaches_the_caller(
    mutant: str, adapter: str, device: str | None, written: str
) -> None:
    """The rejection tests check that a refused call wrote nothing: the adapter carries a write back whether the
    kernel returned or raised."""
    call = valid_call("schur", "float32", COPIED)
    before = snapshot(call)
    with pytest.raises(ValueError, match="refused, after writing it"):
        adapt(load(f"adapter_kernels:{mutant}"), adapter, device)(**call)
    assert changed(before, call) == [written]


def _star_args(*args: Any, **kwargs: Any) -> None: ...


class _ModuleLike:
    """A torch ``nn.Module``-like kernel: called through ``__call__(*args)``, its signature is ``forward``'s."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def forward(self, query, key, value, g, beta, chunk_size=64, initial_state=None, output_final_state=False): ...


@pytest.mark.parametrize(
    ("kernel", "first_five"),
    [
        (adapter_kernels.hf_style, ("query", "key", "value", "g", "beta")),
        (adapter_kernels.fla_style, ("q", "k", "v", "g", "beta")),
        (_ModuleLike(), ("query", "key", "value", "g", "beta")),
        (_star_args, ("q", "k", "v", "g", "beta")),  # nothing to read: the adapter's (FLA's) names
        (max, ("q", "k", "v", "g", "beta")),  # a builtin without a readable signature
        (lambda a, b, *rest, **kw: None, ("a", "b", "v", "g", "beta")),
    ],
    ids=["hf", "fla", "module-forward", "star-args", "builtin", "two-positional"],
)
def test_kernel_names_come_from_the_signature(kernel: Any, first_five: tuple[str, ...]) -> None:
    names = kernel_names(kernel)
    assert tuple(names[a] for a in ("query", "key", "value", "g_log", "beta")) == first_five, names
    assert (names["recurrent_state"], names["scale"]) == ("initial_state", "scale"), names  # passed by keyword


def test_hf_transformers_kernels_are_named_as_they_name_their_arguments() -> None:
    """transformers wraps ``torch_chunk_gated_delta_rule`` in a ``kernels`` module whose own signature is
    ``(*args, **kwargs)``; its ``forward`` carries HF's names."""
    hf = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    for kernel in (hf.torch_chunk_gated_delta_rule, hf.torch_recurrent_gated_delta_rule):
        assert kernel_names(kernel)["query"] == "query" and kernel_names(kernel)["key"] == "key", kernel


def test_internal_scale_rejects_another_scale() -> None:
    adapted = adapt(load("adapter_kernels:hf_style"), "fla:scale=internal,gqa=repeat")
    call = valid_call("schur", "float32", supply_state=False)
    call["scale"] = 0.5
    with pytest.raises(ValueError, match="scale"):
        adapted(**call)


# ---- torch: exact bf16 and identity of in-place states -------------------------------------------------------


def test_torch_bf16_is_exact_both_ways() -> None:
    torch = pytest.importorskip("torch")
    from gdn_spec.adapters.torch_io import BF16, TorchIO

    io = TorchIO.create("cpu")
    bits = np.arange(-(2**15), 2**15, 7, dtype=np.int64).astype(np.int16)
    x = bits.view(BF16)  # every 7th bf16 bit pattern, NaNs and infinities included
    t = io.to_kernel(x)
    assert t.dtype == torch.bfloat16 and t.view(torch.int16).numpy().tobytes() == bits.tobytes()
    assert io.from_kernel(t).tobytes() == x.tobytes()
    caller = np.zeros(4, np.float32)
    io.to_kernel(caller).add_(1.0)  # on the CPU the tensor IS the caller's memory: in-place writes reach it
    assert caller.tolist() == [1.0] * 4


def test_torch_signature_returns_the_callers_state_object() -> None:
    torch = pytest.importorskip("torch")
    from gdn_spec.adapters.torch_io import TorchIO, wrap_torch_signature

    def kernel(query, key, value, g_log, beta, scale, recurrent_state, **_):
        assert isinstance(query, torch.Tensor)
        recurrent_state.add_(1.0)  # in place, as gdn_cte's contract asks
        return value.clone(), recurrent_state

    call = valid_call("schur", "bfloat16")
    buffer = call["recurrent_state"]
    before = buffer.copy()
    out, state = wrap_torch_signature(kernel, TorchIO.create("cpu"))(**call)
    assert state is buffer and np.array_equal(buffer, before + 1.0)
    assert out.dtype == call["value"].dtype and out.tobytes() == call["value"].tobytes()


def test_torch_signature_carries_writes_back_from_device_copies() -> None:
    """On a GPU the kernel's tensors are copies: its in-place state, and an input it writes, reach the caller's
    arrays only by being carried back. A CPU conversion that copies, as a device does, shows both (the adapter
    copied back only a returned argument, and only off the CPU)."""
    torch = pytest.importorskip("torch")
    from gdn_spec.adapters.torch_io import TorchIO, wrap_torch_signature

    class CopyingIO(TorchIO):
        def to_kernel(self, x: np.ndarray) -> Any:
            return super().to_kernel(x).clone()

    def kernel(query, value, recurrent_state, **_):
        recurrent_state.add_(1.0)  # in place, as gdn_cte's contract asks
        query.mul_(2.0)  # an input written: the suite must see it
        return value.clone(), recurrent_state

    call = valid_call("schur", "float32", COPIED)
    buffer, state_before, query_before = call["recurrent_state"], call["recurrent_state"].copy(), call["query"].copy()
    _, state = wrap_torch_signature(kernel, CopyingIO(torch, "cpu"))(**call)
    assert state is buffer and np.array_equal(buffer, state_before + 1.0)
    assert np.array_equal(call["query"], query_before * 2.0)


# ---- raw NKI: simulated, aliasing decided by value ------------------------------------------------------------


def test_raw_nki_kernel_returns_the_callers_state_object() -> None:
    pytest.importorskip("gdn_nki")
    adapted = adapt(load("gdn_nki:gdn_cte"), "nki")
    assert not adapted.capabilities.content_checks and "nki" in adapted.via
    call = valid_call("schur", "float32", Geometry(1, 1, 1, 128, 16, 16), seed=5)
    buffer = call["recurrent_state"]
    out, state = adapted(**call)
    assert state is buffer
    ref_out, ref_state = CORRECT(**valid_call("schur", "float32", Geometry(1, 1, 1, 128, 16, 16), seed=5))
    assert np.allclose(state, ref_state, rtol=1e-3, atol=1e-4) and np.allclose(out, ref_out, rtol=1e-3, atol=1e-4)


def test_torch_adapter_declares_what_it_cannot_express() -> None:
    pytest.importorskip("torch")
    adapted = adapt(load("mutants:CORRECT"), "torch", device="cpu")
    assert adapted.capabilities.inexpressible_rules == ("recurrent_state.writable",)
    assert adapted.default_profile == "api" and adapted.via.startswith("torch adapter, torch ")
