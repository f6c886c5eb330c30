"""torch at the host entry points and the FLA-compatible ``gdn_nki.torch.chunk_gated_delta_rule``: torch in,
torch out, in-place states and pools, varlen in one launch, FLA's semantics, and every bad input rejected by name
with nothing written. Skipped, with the reason, where torch is not installed (``nox -s integration`` has it)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'gdn-nki[torch]'; nox -s integration)")

import gdn_nki  # noqa: E402
import nki_cpu  # noqa: E402
from gdn_nki.host.torch_io import as_numpy, as_torch  # noqa: E402
from gdn_nki.torch import chunk_gated_delta_rule  # noqa: E402
from gdn_ref.contract import ContractError  # noqa: E402
from gdn_spec.regimes import Case, Geometry  # noqa: E402
from nki_inputs import assert_matches_oracle, case, kernel_kwargs, seq_first  # noqa: E402


def _torch_kwargs(c: Case, algorithm: str = "schur") -> dict:
    return {k: as_torch(v.copy()) if isinstance(v, np.ndarray) else v for k, v in kernel_kwargs(c, algorithm).items()}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_bfloat16_crosses_by_its_bits(dtype: str) -> None:
    x = torch.randn(3, 5, dtype=getattr(torch, dtype))
    a = as_numpy(x)
    assert a.dtype.name == dtype and np.shares_memory(a, as_numpy(x))
    assert torch.equal(as_torch(a), x)
    assert np.array_equal(a.astype(np.float64), x.double().numpy())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_simulate_and_prefill_take_torch_and_return_torch_with_the_state_in_place(dtype: str) -> None:
    c = case(dtype, Geometry(B=2, Hk=1, Hv=2, S=128, Dk=32, Dv=16), seed=1, regime="initial_state")
    want_out, want_state = gdn_nki.simulate(**kernel_kwargs(c, "schur"))
    kwargs = _torch_kwargs(c)
    state = kwargs["recurrent_state"]
    out, got_state = gdn_nki.simulate(**kwargs)
    assert isinstance(out, torch.Tensor) and out.dtype == getattr(torch, dtype)
    assert got_state is state, "a supplied torch state is the returned object"
    assert np.array_equal(as_numpy(out), want_out) and np.array_equal(state.numpy(), want_state)
    kwargs = _torch_kwargs(c)
    kwargs["query"] = kwargs["query"][:, :, :100]
    for name in ("key", "value", "g_log", "beta"):
        kwargs[name] = kwargs[name][:, :, :100]  # non-contiguous views: honoured by a copy
    out, _ = gdn_nki.prefill(**{k: v for k, v in kwargs.items() if k != "mask_pack"})
    assert tuple(out.shape) == (2, 2, 100, 16)


def test_gdn_cte_called_directly_takes_torch_on_the_cpu() -> None:
    c = case("bfloat16", Geometry(B=1, Hk=1, Hv=1, S=128, Dk=32, Dv=16), seed=2, regime="initial_state")
    want = gdn_nki.simulate(**kernel_kwargs(c, "schur"))
    kwargs = _torch_kwargs(c)
    state = kwargs["recurrent_state"]
    out, final = gdn_nki.gdn_cte(**kwargs)
    assert isinstance(out, torch.Tensor) and isinstance(final, torch.Tensor)
    assert np.array_equal(as_numpy(out), want[0]) and np.array_equal(state.numpy(), want[1])


def test_a_strided_torch_state_is_updated_through_a_staged_copy() -> None:
    c = case("float32", Geometry(B=1, Hk=1, Hv=2, S=128, Dk=16, Dv=16), seed=3, regime="initial_state")
    want = gdn_nki.simulate(**kernel_kwargs(c, "schur"))[1]
    kwargs = _torch_kwargs(c)
    holder = torch.zeros(1, 2, 16, 16)
    state = holder.transpose(2, 3)  # a strided view
    state.copy_(kwargs["recurrent_state"])
    kwargs["recurrent_state"] = state
    _, got = gdn_nki.simulate(**kwargs)
    assert got is state and np.array_equal(state.numpy(), want)


@pytest.mark.parametrize(
    ("name", "bad", "words"),
    [
        ("query", lambda x: x.to("meta"), "device"),
        ("value", lambda x: x.half(), "dtype float16"),
        ("recurrent_state", lambda x: x.to(torch.bfloat16), "dtype bfloat16"),
        ("recurrent_state", lambda x: x[:, :1].expand(x.shape), "stride-0"),
    ],
)
def test_host_entry_points_reject_unreadable_torch_tensors_by_name(name: str, bad, words: str) -> None:
    c = case("float32", Geometry(B=1, Hk=1, Hv=2, S=128, Dk=16, Dv=16), seed=4, regime="initial_state")
    kwargs = _torch_kwargs(c)
    state_before = kwargs["recurrent_state"].clone()
    kwargs[name] = bad(kwargs[name])
    with pytest.raises(ContractError, match=f"`{name}`.*{words}"):
        gdn_nki.simulate(**kwargs)
    if name != "recurrent_state":
        assert torch.equal(kwargs["recurrent_state"], state_before)


# --- the FLA-compatible entry point ---


def _head_major_out(o: torch.Tensor) -> np.ndarray:
    return as_numpy(o.transpose(1, 2).contiguous())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fla_entry_matches_the_oracle_with_gqa_and_default_scale(dtype: str) -> None:
    c = case(dtype, Geometry(B=2, Hk=2, Hv=4, S=150, Dk=32, Dv=16), seed=5, regime="initial_state")
    assert c.scale == pytest.approx(32**-0.5)
    initial = as_torch(c.kernel["recurrent_state"].copy())
    before = initial.clone()
    o, final = chunk_gated_delta_rule(**seq_first(c), initial_state=initial, output_final_state=True)
    assert o.shape == (2, 150, 4, 16) and o.dtype == getattr(torch, dtype)
    assert final.dtype == torch.float32 and final.shape == (2, 4, 32, 16)
    assert torch.equal(initial, before), "FLA never writes initial_state"
    assert_matches_oracle(c, _head_major_out(o), final.numpy(), "fla entry")
    _, none = chunk_gated_delta_rule(**seq_first(c), initial_state=initial)
    assert none is None, "the final state only when asked"


def test_fla_entry_reads_a_bfloat16_initial_state_widened_exactly() -> None:
    c = case("bfloat16", Geometry(B=1, Hk=1, Hv=2, S=40, Dk=16, Dv=16), seed=12, regime="initial_state")
    narrow = as_torch(c.kernel["recurrent_state"]).to(torch.bfloat16)
    got = chunk_gated_delta_rule(**seq_first(c), initial_state=narrow, output_final_state=True)
    want = chunk_gated_delta_rule(**seq_first(c), initial_state=narrow.float(), output_final_state=True)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    pool = narrow.clone()
    with pytest.raises(ContractError, match=r"`initial_state`.*bfloat16"):  # a pool is written: fp32 only
        chunk_gated_delta_rule(**seq_first(c), initial_state=pool, state_indices=torch.tensor([0]))


def test_fla_entry_l2norm_in_kernel_equals_normalizing_first() -> None:
    c = case("float32", Geometry(B=1, Hk=1, Hv=1, S=64, Dk=32, Dv=16), seed=6)
    args = seq_first(c)
    raw = dict(args, q=args["q"] * 3.0, k=args["k"] * 0.5)
    o_norm, _ = chunk_gated_delta_rule(**raw, use_qk_l2norm_in_kernel=True)
    o_plain, _ = chunk_gated_delta_rule(**args)
    assert torch.allclose(o_norm, o_plain, rtol=1e-5, atol=1e-6)


def test_fla_entry_varlen_is_one_launch_and_equals_batch_rows() -> None:
    c = case("bfloat16", Geometry(B=3, Hk=1, Hv=2, S=100, Dk=32, Dv=16), seed=7, regime="initial_state")
    args = seq_first(c)
    initial = as_torch(c.kernel["recurrent_state"].copy())
    o_dense, s_dense = chunk_gated_delta_rule(**args, initial_state=initial, output_final_state=True)
    packed = {k: v.reshape(1, 300, *v.shape[2:]) for k, v in args.items()}
    cu = torch.tensor([0, 100, 200, 300])
    o_var, s_var = chunk_gated_delta_rule(**packed, initial_state=initial, output_final_state=True, cu_seqlens=cu)
    if not gdn_nki.common.backend.USING_REAL_NKI:
        assert len(nki_cpu.last_traces()) == 1, "one kernel launch"
    assert torch.equal(o_var.reshape(3, 100, 2, 16), o_dense) and torch.equal(s_var, s_dense)
    for i in range(3):  # each sequence alone
        alone = {k: v[i : i + 1] for k, v in args.items()}
        o_i, s_i = chunk_gated_delta_rule(**alone, initial_state=initial[i : i + 1], output_final_state=True)
        assert torch.equal(o_i[0], o_dense[i]) and torch.equal(s_i[0], s_dense[i])


def test_fla_entry_state_pool_updates_named_slots_only() -> None:
    c = case("bfloat16", Geometry(B=2, Hk=1, Hv=2, S=70, Dk=32, Dv=16), seed=8, regime="initial_state")
    args = seq_first(c)
    pool = torch.randn(5, 2, 32, 16)
    slots = torch.tensor([4, 1])
    pool[slots] = as_torch(c.kernel["recurrent_state"].copy())
    before = pool.clone()
    o, final = chunk_gated_delta_rule(**args, initial_state=pool, state_indices=slots, output_final_state=True)
    assert final is pool
    o_ref, s_ref = chunk_gated_delta_rule(**args, initial_state=before[slots], output_final_state=True)
    assert torch.equal(o, o_ref) and torch.equal(pool[slots], s_ref)
    untouched = [0, 2, 3]
    assert pool[untouched].numpy().tobytes() == before[untouched].numpy().tobytes()


def _fla_call(**changes):
    c = case("float32", Geometry(B=1, Hk=1, Hv=2, S=90, Dk=16, Dv=16), seed=9)
    args = seq_first(c)
    args.update(
        initial_state=torch.randn(3, 2, 16, 16),
        state_indices=torch.tensor([2, 0]),
        cu_seqlens=torch.tensor([0, 40, 90]),
        output_final_state=True,
    )
    args.update(changes)
    return args


BAD_FLA = {
    "q on another device": (dict(q=lambda a: a["q"].to("meta")), "q", "device"),
    "v float16": (dict(v=lambda a: a["v"].half()), "v", "to(torch.float32) (lossless"),
    "q, k, v float16": ({n: (lambda a, n=n: a[n].half()) for n in ("q", "k", "v")}, "q", "to(torch.float32) (lossless"),
    "g float16": (dict(g=lambda a: a["g"].half()), "g", "to(torch.float32) (lossless"),
    "k of another dtype": (dict(k=lambda a: a["k"].to(torch.bfloat16)), "k", "dtype"),
    "g head-first": (dict(g=lambda a: a["g"].transpose(1, 2).contiguous()), "g", "seq-first"),
    "cu_seqlens from 1": (dict(cu_seqlens=lambda a: torch.tensor([1, 40, 90])), "cu_seqlens", "start at 0"),
    "cu_seqlens flat": (dict(cu_seqlens=lambda a: torch.tensor([0, 40, 40, 90])), "cu_seqlens", "drop empty"),
    "cu_seqlens of lengths": (dict(cu_seqlens=lambda a: torch.tensor([0, 60, 30, 90])), "cu_seqlens", "cumulative"),
    "no tokens": ({n: (lambda a, n=n: a[n][:, :0]) for n in ("q", "k", "v", "g", "beta")}, "q", "empty"),
    "pool requiring grad": (
        dict(initial_state=lambda a: a["initial_state"].requires_grad_()),
        "initial_state",
        "requires_grad",
    ),
    "cu_seqlens short": (dict(cu_seqlens=lambda a: torch.tensor([0, 40, 80])), "cu_seqlens", "end at"),
    "cu_seqlens float": (dict(cu_seqlens=lambda a: torch.tensor([0.0, 40.0, 90.0])), "cu_seqlens", "int"),
    "batch 2 with cu_seqlens": (
        {n: (lambda a, n=n: torch.cat([a[n], a[n]])) for n in ("q", "k", "v", "g", "beta")},
        "cu_seqlens",
        "[cu_seqlens.batch] with cu_seqlens the sequences are packed into one row, so B must be 1",
    ),
    "pool a view of a leaf requiring grad": (
        dict(initial_state=lambda a: torch.randn(5, 2, 16, 16, requires_grad=True)[1:4]),
        "initial_state",
        "view of a leaf",
    ),
    "pool an unbind view of a non-leaf": (
        dict(initial_state=lambda a: (torch.randn(2, 3, 2, 16, 16, requires_grad=True) * 1).unbind(0)[0]),
        "initial_state",
        "in-place",
    ),
    "slots of floats": (dict(state_indices=lambda a: [2.7, 0.2]), "state_indices", "integer"),
    "slots of strings": (dict(state_indices=lambda a: ["2", "0"]), "state_indices", "integer"),
    "slots 2-D": (dict(state_indices=lambda a: torch.tensor([[2], [0]])), "state_indices", "1-D"),
    "state_v_first, a state of neither layout": (
        dict(state_v_first=lambda a: True, initial_state=lambda a: torch.zeros(3, 2, 16, 8)),
        "initial_state",
        "state_v_first=True",
    ),
    "both layout flags": (
        dict(state_v_first=lambda a: True, transpose_state_layout=lambda a: True),
        "transpose_state_layout",
        "FLA refuses both",
    ),
    "slot out of range": (dict(state_indices=lambda a: torch.tensor([3, 0])), "state_indices", "range|index"),
    "slot repeated": (dict(state_indices=lambda a: torch.tensor([1, 1])), "state_indices", "distinct"),
    "state fp16": (dict(initial_state=lambda a: a["initial_state"].half()), "initial_state", "float16"),
    "state shape": (dict(initial_state=lambda a: torch.zeros(3, 2, 16, 8)), "initial_state", "shape"),
    "pool strided": (
        dict(initial_state=lambda a: a["initial_state"].transpose(2, 3)),
        "initial_state",
        "contiguous",
    ),
    "N states without slots": (
        dict(state_indices=lambda a: None, initial_state=lambda a: torch.zeros(3, 2, 16, 16)),
        "initial_state",
        "shape",
    ),
}


@pytest.mark.parametrize("name", list(BAD_FLA))
def test_fla_entry_rejects_bad_input_by_name_and_writes_nothing(name: str) -> None:
    changes, argument, words = BAD_FLA[name]
    args = _fla_call()
    for key, make in changes.items():
        args[key] = make(args)
    pool = args["initial_state"]
    before = pool.detach().clone() if pool.device.type == "cpu" and pool.dtype == torch.float32 else None
    with pytest.raises(ContractError, match=f"`{argument}`") as err:
        chunk_gated_delta_rule(**args)
    assert any(w in str(err.value) for w in words.split("|")), str(err.value)
    if before is not None:
        assert pool.detach().numpy().tobytes() == before.numpy().tobytes(), "nothing written, the pool included"


def test_fla_entry_rejects_a_numpy_state_by_name() -> None:
    args = _fla_call(state_indices=None, cu_seqlens=None)
    args["initial_state"] = np.zeros((1, 2, 16, 16), np.float32)
    with pytest.raises(ContractError, match="`initial_state` of type ndarray"):
        chunk_gated_delta_rule(**args)


def test_fla_entry_rejects_head_first_and_warns_on_a_head_first_looking_shape() -> None:
    """FLA deprecated ``head_first``; a head-first [B, H, T, D] call whose g/beta also happen to be [B, H, T]
    (Hk == Hv) passes every shape rule of the seq-first layout and would return garbage: the flag is rejected,
    and the shape that betrays the mistake (fewer tokens than heads) warns, as FLA does."""
    args = seq_first(case("float32", Geometry(B=1, Hk=4, Hv=4, S=40, Dk=16, Dv=16), seed=12))
    with pytest.raises(ContractError, match="`head_first`"):
        chunk_gated_delta_rule(**args, head_first=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        chunk_gated_delta_rule(**args, head_first=False)  # seq-first with T >= H: silent
        for unset in ({"head_first": None}, {"state_v_first": 0}, {"cp_context": False}):
            chunk_gated_delta_rule(**args, **unset)  # unset as FLA's truthiness test reads it
    with pytest.raises(ContractError, match="`state_v_first`"):
        chunk_gated_delta_rule(**args, state_v_first=torch.tensor([False, False]))  # no single truth value
    head_first = {name: x.transpose(1, 2).contiguous() for name, x in args.items()}
    with pytest.warns(UserWarning, match="head-first"):
        chunk_gated_delta_rule(**head_first)


@pytest.mark.parametrize("packed", [False, True])
def test_fla_entry_reports_a_bad_value_by_its_own_name_and_seq_first_index(packed: bool) -> None:
    """The contract scans the kernel's head-major view ([1, H, B·T, D], argument ``value``); the caller gets their
    own argument name and [b, t, h, d] index, the kernel's kept beside it."""
    c = case("float32", Geometry(B=1 if packed else 2, Hk=1, Hv=2, S=50 if not packed else 100, Dk=16, Dv=16),
             seed=13)  # fmt: skip
    args = seq_first(c)
    if packed:
        args["cu_seqlens"] = torch.tensor([0, 45, 100])
    b, t = (0, 57) if packed else (1, 7)
    args["v"][b, t, 1, 5] = float("nan")
    with pytest.raises(ContractError, match=rf"`v` value nan at index \[{b}, {t}, 1, 5\] \(the kernel's `value`"):
        chunk_gated_delta_rule(**args)
    args["v"][b, t, 1, 5] = 0.0
    args["g"][b, t, 0] = 0.5
    with pytest.raises(ContractError, match=rf"`g` value 0.5 at index \[{b}, {t}, 0\]"):
        chunk_gated_delta_rule(**args)


def test_host_entry_points_give_torch_callers_torch_fixes() -> None:
    c = case("float32", Geometry(B=1, Hk=1, Hv=2, S=128, Dk=16, Dv=16), seed=14, regime="initial_state")
    kwargs = _torch_kwargs(c)
    kwargs["g_log"] = kwargs["g_log"].to(torch.bfloat16)
    with pytest.raises(ContractError, match=r"Fix: pass g_log\.to\(torch\.float32\)"):
        gdn_nki.prefill(**kwargs)
    kwargs = _torch_kwargs(c)
    kwargs["recurrent_state"] = torch.zeros(1, 2, 16, 8)
    with pytest.raises(ContractError, match=r"torch\.zeros\(\(1, 2, 16, 16\), dtype=torch\.float32\)"):
        gdn_nki.prefill(**kwargs)


def test_fla_entry_is_forward_only_and_says_so_at_backward_instead_of_dropping_gradients() -> None:
    """FLA's kernel has a backward; ours has none. Handing back a detached ``o`` would let a training loop run
    with no gradient through the GDN layers and no error: the outputs stay on the graph and backward raises."""
    c = case("float32", Geometry(B=1, Hk=1, Hv=2, S=40, Dk=16, Dv=16), seed=9, regime="initial_state")
    kwargs = seq_first(c)
    kwargs["q"].requires_grad_()
    o, final = chunk_gated_delta_rule(**kwargs, output_final_state=True)
    want, _ = chunk_gated_delta_rule(**{k: v.detach() for k, v in kwargs.items()})
    assert o.requires_grad and final.requires_grad and torch.equal(o.detach(), want)
    with pytest.raises(NotImplementedError, match="forward-only"):
        o.sum().backward()
    with torch.no_grad():
        o, final = chunk_gated_delta_rule(**kwargs, output_final_state=True)
    assert not o.requires_grad and not final.requires_grad


def test_host_entry_points_are_forward_only_too() -> None:
    c = case("float32", Geometry(B=1, Hk=1, Hv=1, S=128, Dk=16, Dv=16), seed=10, regime="initial_state")
    kwargs = _torch_kwargs(c)
    kwargs["value"].requires_grad_()
    state = kwargs["recurrent_state"]
    out, final = gdn_nki.simulate(**kwargs)
    assert final is state, "the caller's state is still the returned object"
    with pytest.raises(NotImplementedError, match="forward-only"):
        out.sum().backward()
    assert final.requires_grad, "the state written in place is on the graph too, as a torch in-place write"
    with pytest.raises(NotImplementedError, match="forward-only"):
        final.sum().backward()
    leaf = torch.zeros(1, 1, 16, 16, requires_grad=True)
    with pytest.raises(ContractError, match="`recurrent_state` a leaf with requires_grad=True"):
        gdn_nki.simulate(**{**kwargs, "recurrent_state": leaf})
    assert not leaf.detach().any(), "nothing written"
    with torch.no_grad():  # where torch allows an in-place write to a leaf that requires grad, so does gdn-nki
        gdn_nki.simulate(**{**kwargs, "recurrent_state": leaf})


def test_host_entry_points_reject_states_torch_would_not_write_in_place_before_writing() -> None:
    """torch refuses an in-place write to a view of a leaf that requires grad (in grad mode) and to an inference
    tensor outside inference mode; the kernel writes through numpy, so such a state is rejected before the launch,
    not found out by torch after the state was written."""
    c = case("float32", Geometry(B=1, Hk=1, Hv=1, S=128, Dk=16, Dv=16), seed=13, regime="initial_state")
    kwargs = _torch_kwargs(c)
    base = torch.randn(2, 1, 16, 16, requires_grad=True)
    view = base[1:2]
    before = base.detach().clone()
    with pytest.raises(ContractError, match="`recurrent_state` a view of a leaf with requires_grad=True"):
        gdn_nki.prefill(**{**kwargs, "recurrent_state": view})
    assert torch.equal(base.detach(), before), "nothing written"
    with torch.no_grad():  # allowed by torch there, so written
        gdn_nki.prefill(**{**kwargs, "recurrent_state": view})
    assert not torch.equal(base.detach()[1], before[1])
    with torch.inference_mode():
        inference = torch.zeros(1, 1, 16, 16)
    with pytest.raises(ContractError, match="`recurrent_state` an inference tensor"):
        gdn_nki.simulate(**{**kwargs, "recurrent_state": inference})
    assert not inference.any(), "nothing written"
    with torch.inference_mode():
        _, final = gdn_nki.simulate(**{**kwargs, "recurrent_state": inference})
    assert final is inference and inference.any()


def test_states_torch_refuses_only_at_the_write_are_rejected_with_the_state_untouched() -> None:
    """Views torch refuses to update in place only when the write is recorded (returned by unbind, or made under
    no_grad, of a tensor on a graph): the record comes before the state is written, so the refusal is a rejection
    naming the argument and the state keeps its values."""
    c = case("float32", Geometry(B=1, Hk=1, Hv=1, S=128, Dk=16, Dv=16), seed=14, regime="initial_state")
    kwargs = _torch_kwargs(c)
    kwargs["value"] = kwargs["value"].clone().requires_grad_()  # a training step: an input on a graph
    on_graph = torch.randn(2, 1, 1, 16, 16, requires_grad=True) * 1
    with torch.no_grad():
        made_without_grad = on_graph[0]
    for state in (on_graph.unbind(0)[0], made_without_grad):
        before = state.detach().clone()
        with pytest.raises(ContractError, match="`recurrent_state` a tensor torch will not write in place"):
            gdn_nki.simulate(**{**kwargs, "recurrent_state": state})
        assert torch.equal(state.detach(), before), "refused before the write"
    committed = []
    state = torch.zeros(1, 1, 16, 16)
    gdn_nki.simulate(**{**kwargs, "recurrent_state": state}, on_commit=lambda: committed.append(state.clone()))
    assert len(committed) == 1 and not committed[0].any() and state.any(), "on_commit runs right before the write"


def test_fla_entry_records_its_in_place_pool_update_on_the_graph() -> None:
    args = _fla_call()
    args["q"] = args["q"].clone().requires_grad_()
    _, pool = chunk_gated_delta_rule(**args)
    assert pool is args["initial_state"] and pool.requires_grad
    with pytest.raises(NotImplementedError, match="forward-only"):
        pool.sum().backward()
    chunk_gated_delta_rule(**args)  # a pool already on the graph (not a leaf) is updated again
