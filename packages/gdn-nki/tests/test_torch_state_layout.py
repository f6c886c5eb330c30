"""V-major state pools through the torch drop-ins: FLA's ``state_v_first`` / ``transpose_state_layout`` (chunk and
fused_recurrent) and ``state_v_first`` on SGLang's ``fused_sigmoid_gating_delta_rule_update`` and vLLM's pool
variant. Each V-major call equals the K-major call on the transposed pool bit for bit; the fused-gating op carries
the flag through ``torch.compile`` and its fake-tensor rules to the device launch (a recording stand-in asserts
what reaches ``gdn_step``). Skipped without torch."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'gdn-nki[torch]'; nox -s integration)")

import torch.nn.functional as F  # noqa: E402, N812

import gdn_nki.torch  # noqa: E402
from gdn_nki.tkg.step import gdn_step  # noqa: E402
from gdn_nki.torch import device  # noqa: E402
from gdn_ref.contract import ContractError  # noqa: E402
from torch_device import compile_backend, launch_replaced, skip_on_device  # noqa: E402

HK, HV, K, V = 2, 4, 32, 32


def _vmajor(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(-1, -2).contiguous()


def _prefill(dv: int = V, tokens: int = 300) -> dict[str, Any]:
    torch.manual_seed(11)
    return dict(
        q=torch.randn(1, tokens, HK, K), k=F.normalize(torch.randn(1, tokens, HK, K), dim=-1),
        v=torch.randn(1, tokens, HV, dv), g=-0.3 * torch.rand(1, tokens, HV), beta=torch.rand(1, tokens, HV),
        cu_seqlens=torch.tensor([0, 130, 300]),
    )  # fmt: skip


@pytest.mark.parametrize("dv", [32, 64])
@pytest.mark.parametrize("flag", ["state_v_first", "transpose_state_layout"])
def test_chunk_on_a_v_major_pool_with_buckets_and_checkpoints(dv: int, flag: str) -> None:
    """SGLang's pool call (``initial_state_indices``) on a bucket with a checkpoint and a −1 row."""
    args = _prefill(dv)
    pool = torch.randn(8, HV, K, dv)
    rows = dict(initial_state_indices=torch.tensor([5, -1]), bucket=(512, 2), checkpoint_every=128,
                checkpoint_indices=torch.tensor([[2], [-1]]))  # fmt: skip
    k_major, v_major = pool.clone(), _vmajor(pool)
    o_k, _ = gdn_nki.torch.chunk_gated_delta_rule(**args, initial_state=k_major, **rows)
    o_v, returned = gdn_nki.torch.chunk_gated_delta_rule(**args, initial_state=v_major, output_final_state=True,
                                                         **rows, **{flag: True})  # fmt: skip
    assert returned is v_major
    assert torch.equal(o_k, o_v) and torch.equal(k_major, v_major.transpose(-1, -2))
    assert not torch.equal(k_major, pool)


def test_chunk_returns_v_major_final_states() -> None:
    args = _prefill(64)
    h0 = torch.randn(2, HV, K, 64)
    o_k, final_k = gdn_nki.torch.chunk_gated_delta_rule(**args, initial_state=h0, output_final_state=True)
    o_v, final_v = gdn_nki.torch.chunk_gated_delta_rule(**args, initial_state=_vmajor(h0), output_final_state=True,
                                                        state_v_first=True)  # fmt: skip
    assert final_v.shape == (2, HV, 64, K)
    assert torch.equal(o_k, o_v) and torch.equal(final_k, final_v.transpose(-1, -2))


def test_fla_decode_reads_and_returns_v_major_states() -> None:
    args = {name: x[:, :2] if name != "cu_seqlens" else torch.tensor([0, 1, 2]) for name, x in _prefill(64).items()}
    h0 = torch.randn(2, HV, K, 64)
    for flag in ("state_v_first", "transpose_state_layout"):
        o_k, f_k = gdn_nki.torch.fused_recurrent_gated_delta_rule(**args, initial_state=h0, output_final_state=True)
        o_v, f_v = gdn_nki.torch.fused_recurrent_gated_delta_rule(**args, initial_state=_vmajor(h0),
                                                                  output_final_state=True, **{flag: True})  # fmt: skip
        assert torch.equal(o_k, o_v) and torch.equal(f_k, f_v.transpose(-1, -2))
    with pytest.raises(ContractError, match=r"`initial_state`.*\[state_layout.v_first\]"):
        gdn_nki.torch.fused_recurrent_gated_delta_rule(**args, initial_state=h0, state_v_first=True)


@pytest.mark.parametrize("form", ["prefill", "decode"])
def test_v_major_states_without_a_pool_compile_to_the_k_major_op(form: str) -> None:
    """FLA's V-major call without a pool (per-sequence states, K != V so a transposed read cannot pass) compiles with
    no graph break to one K-major op with the states transposed in the graph, giving eager's and the K-major call's
    bits."""
    args = _prefill(64)
    if form == "decode":
        args = {name: x[:, :2] if name != "cu_seqlens" else torch.tensor([0, 1, 2]) for name, x in args.items()}
    call = gdn_nki.torch.chunk_gated_delta_rule if form == "prefill" else gdn_nki.torch.fused_recurrent_gated_delta_rule
    h0 = torch.randn(2, HV, K, 64)
    o_k, f_k = call(**args, initial_state=h0, output_final_state=True)
    o_e, f_e = call(**args, initial_state=_vmajor(h0), output_final_state=True, state_v_first=True)
    compiled = torch.compile(call, fullgraph=True, backend=compile_backend())
    o_c, f_c = compiled(**args, initial_state=_vmajor(h0), output_final_state=True, state_v_first=True)
    explained = torch._dynamo.explain(call)(**args, initial_state=_vmajor(h0), output_final_state=True,
                                            state_v_first=True)  # fmt: skip
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    assert f_c.shape == (2, HV, 64, K)
    for o, f in ((o_e, f_e), (o_c, f_c)):
        assert torch.equal(o, o_k) and torch.equal(f.transpose(-1, -2), f_k)


def _gating(n: int = 3, tokens: int = 2) -> dict[str, Any]:
    """SGLang's fused-gating verification step: [N, T] rows (one padding request), num_accepted_tokens."""
    torch.manual_seed(4)
    return dict(
        A_log=torch.rand(HV).log(), a=torch.randn(n * tokens, HV), dt_bias=torch.randn(HV), softplus_beta=1.0,
        softplus_threshold=20.0, q=torch.randn(1, n * tokens, HK, K), k=torch.randn(1, n * tokens, HK, K),
        v=torch.randn(1, n * tokens, HV, V), b=torch.randn(n * tokens, HV),
        initial_state_indices=torch.tensor([[4, 1], [-1, -1], [0, 6]], dtype=torch.int32),
        num_accepted_tokens=torch.tensor([2, 1, 1], dtype=torch.int32), use_qk_l2norm_in_kernel=True,
        cu_seqlens=torch.arange(0, n * tokens + 1, tokens, dtype=torch.int32),
    )  # fmt: skip


def test_sglang_fused_gating_on_a_v_major_pool_eager_and_compiled() -> None:
    pool = 0.1 * torch.randn(8, HV, K, V)
    k_major = pool.clone()
    o_k = gdn_nki.torch.fused_sigmoid_gating_delta_rule_update(**_gating(), initial_state_source=k_major)
    for run in (gdn_nki.torch.fused_sigmoid_gating_delta_rule_update,
                torch.compile(gdn_nki.torch.fused_sigmoid_gating_delta_rule_update, fullgraph=True,
                              backend=compile_backend())):  # fmt: skip
        v_major = _vmajor(pool)
        o_v = run(**_gating(), initial_state_source=v_major, state_v_first=True)
        assert torch.equal(o_k, o_v) and torch.equal(k_major, v_major.transpose(-1, -2))
    assert not torch.equal(k_major, pool)


def test_vllm_pool_variant_on_a_v_major_pool_eager_and_compiled() -> None:
    call = _gating()
    args = dict(q=call["q"], k=call["k"], v=call["v"], g=-torch.rand(1, 6, HV), beta=torch.rand(1, 6, HV),
                cu_seqlens=call["cu_seqlens"], ssm_state_indices=call["initial_state_indices"],
                num_accepted_tokens=call["num_accepted_tokens"])  # fmt: skip
    pool = torch.randn(8, HV, K, V)
    k_major, v_major = pool.clone(), _vmajor(pool)
    o_k, _ = gdn_nki.torch.vllm_fused_recurrent_gated_delta_rule(**args, initial_state=k_major)
    o_v, returned = gdn_nki.torch.vllm_fused_recurrent_gated_delta_rule(**args, initial_state=v_major,
                                                                        state_v_first=True)  # fmt: skip
    assert returned is v_major and torch.equal(o_k, o_v) and torch.equal(k_major, v_major.transpose(-1, -2))
    compiled = torch.compile(gdn_nki.torch.vllm_fused_recurrent_gated_delta_rule, fullgraph=True,
                             backend=compile_backend())  # fmt: skip
    v_major = _vmajor(pool)
    o_c, _ = compiled(**args, initial_state=v_major, state_v_first=True)  # the op, no graph break
    assert torch.equal(o_c, o_k) and torch.equal(k_major, v_major.transpose(-1, -2))


def test_the_device_launch_gets_the_flag_and_the_pool_itself() -> None:
    """The fused-gating op's device path on meta tensors: ``gdn_step`` gets ``state_v_first=True`` and the caller's
    V-major pool (no copy, no transpose); the trace-time rules refuse a pool of the other shape (K != V) with the
    CPU's rule, before any launch."""
    calls = []

    def launch(kernel: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append((kernel, args, kwargs))
        return args[0].new_empty((*args[2].shape[:3], args[2].shape[3])), args[3]

    call = {name: x.to("meta") if isinstance(x, torch.Tensor) else x for name, x in _gating().items()}
    pool = torch.empty(8, HV, V, K, device="meta")
    gates = (call["A_log"], call["a"], call["dt_bias"], call["q"], call["k"], call["v"], call["b"])
    with launch_replaced(launch):
        device.fused_sigmoid_gating(*gates, pool, call["initial_state_indices"], call["cu_seqlens"], 1.0, 20.0, None,
                                    True, call["num_accepted_tokens"], state_v_first=True)  # fmt: skip
        [(kernel, launched, options)] = calls
        assert kernel is gdn_step and launched[3] is pool and options["state_v_first"] is True
        wide = torch.empty(8, HV, 64, K, device="meta")
        v64 = torch.empty(1, 6, HV, 64, device="meta")
        with pytest.raises(ContractError, match=r"`initial_state_source`.*\[state_layout.v_first\].*\(64, 32\)"):
            device.fused_sigmoid_gating(*gates[:5], v64, gates[6], wide.transpose(-1, -2).contiguous(),
                                        call["initial_state_indices"], call["cu_seqlens"], 1.0, 20.0, None, True,
                                        call["num_accepted_tokens"], state_v_first=True)  # fmt: skip
    assert len(calls) == 1


def test_the_interpreted_device_path_gives_the_cpu_paths_bits() -> None:
    skip_on_device("nki-cpu interprets the launch on CPU tensors")
    from gdn_nki.common import backend

    def interpreted(kernel: Any, *args: Any, **kwargs: Any) -> Any:
        arrays = [x.numpy() if isinstance(x, torch.Tensor) else x for x in args]
        named = {n: x.numpy() if isinstance(x, torch.Tensor) else x for n, x in kwargs.items()}
        out, _ = backend.simulate(kernel)(*arrays, **named)
        return torch.from_numpy(out), args[3]

    pool = 0.1 * torch.randn(8, HV, V, K)
    want_pool = pool.clone()
    want = gdn_nki.torch.fused_sigmoid_gating_delta_rule_update(**_gating(), initial_state_source=want_pool,
                                                                state_v_first=True)  # fmt: skip
    call = _gating()
    gates = [call[n] for n in ("A_log", "a", "dt_bias", "q", "k", "v", "b")]
    with launch_replaced(interpreted):
        got = device.fused_sigmoid_gating(*gates, pool, call["initial_state_indices"], call["cu_seqlens"], 1.0, 20.0,
                                          None, True, call["num_accepted_tokens"], state_v_first=True)  # fmt: skip
    assert torch.equal(got, want) and torch.equal(pool, want_pool)


def test_chunk_on_a_v_major_pool_compiles_to_its_op_and_launches_with_the_flag() -> None:
    """SGLang's prefill on its V-major pool is one op (``gdn_nki::chunk_gated_delta_rule_pool``, the flag in its
    schema): compiled with no graph break it gives eager's bits, and on meta tensors its device path hands
    ``gdn_cte_bucket`` the pool itself with ``state_v_first=True``."""
    from gdn_nki.cte.bucket import gdn_cte_bucket

    args = _prefill()
    pool = torch.randn(8, HV, V, K)
    rows = dict(initial_state_indices=torch.tensor([5, -1]), bucket=(512, 2))
    eager_pool, compiled_pool = pool.clone(), pool.clone()
    want, _ = gdn_nki.torch.chunk_gated_delta_rule(**args, initial_state=eager_pool, state_v_first=True, **rows)
    compiled = torch.compile(gdn_nki.torch.chunk_gated_delta_rule, fullgraph=True, backend=compile_backend())
    got, _ = compiled(**args, initial_state=compiled_pool, state_v_first=True, **rows)
    assert torch.equal(got, want) and torch.equal(compiled_pool, eager_pool)
    calls = []

    def launch(kernel: Any, *launched: Any, **options: Any) -> Any:
        calls.append((kernel, launched, options))
        query, value = launched[0], launched[2]
        return query.new_empty((1, value.shape[1], query.shape[2], value.shape[3])), launched[7]

    meta = {name: x.to("meta") if isinstance(x, torch.Tensor) else x for name, x in args.items()}
    meta_pool = torch.empty(8, HV, V, K, device="meta")
    with launch_replaced(launch):
        device.chunk_pool(meta["q"], meta["k"], meta["v"], meta["g"], meta["beta"], meta_pool,
                          torch.tensor([5, -1], device="meta"), None, None, meta["cu_seqlens"], None, None, None,
                          False, False, False, "schur", 8, [512, 2], None, state_v_first=True)  # fmt: skip
    [(kernel, launched, options)] = calls
    assert kernel is gdn_cte_bucket and launched[7] is meta_pool and options["state_v_first"] is True


# gdn-spec's serving adapter for SGLang's pool-native call (noxfile's SERVING_ADAPTER), the pool V-major
SERVING_V_MAJOR = "fla-torch:varlen=yes,pool=initial_state_indices,bucket=yes,checkpoints=yes,read_rows=yes,state=vk"


def _spec_check(spec: str, keyword: str, tmp_path: Any) -> dict[str, Any]:
    """``gdn-spec check`` of the varlen area's serving checks, in a subprocess."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / f"summary-{spec.replace(':', '-')}.json"
    here = str(Path(__file__).parent)
    cmd = [sys.executable, "-m", "gdn_spec.cli", "check", spec, "--adapter", SERVING_V_MAJOR, "--area", "varlen",
           "-k", keyword, "--json", str(out), "--device", "cpu", "-n", "0"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])}
    env.pop("PYTEST_XDIST_WORKER", None)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, check=False)
    summary = json.loads(out.read_text()) if out.exists() else {}
    return {"code": proc.returncode, "summary": summary, "output": proc.stdout[-3000:] + proc.stderr[-3000:]}


def test_gdn_spec_passes_the_v_major_drop_in_and_fails_the_k_major_one_on_sglangs_pool(tmp_path: Any) -> None:
    """Through gdn-spec's serving adapter with SGLang's V-major pool (``state=vk``): the drop-in with
    ``state_v_first=True`` passes the serving layouts and the square-heads check; the drop-in left K-major fails
    the square-heads check (K = V: every shape rule passes, the values do not)."""
    skip_on_device("gdn-spec's subprocess runs on the CPU")
    good = _spec_check("v_major_drop_in:chunk_v_first", "square_heads or serving_layouts", tmp_path)
    assert good["code"] == 0 and good["summary"]["verdicts"] == {"varlen": "passed"}, good["output"]
    ran = {t: o for t, o in good["summary"]["outcomes"].items() if "square_heads" in t}
    assert ran and set(ran.values()) == {"passed"}, good["output"]
    bad = _spec_check("gdn_nki.torch:chunk_gated_delta_rule", "square_heads", tmp_path)
    assert bad["code"] != 0 and bad["summary"]["verdicts"] == {"varlen": "failed"}, bad["output"]
    assert all("Dk = Dv" in m for m in bad["summary"]["failures"].values()), bad["summary"]["failures"]
