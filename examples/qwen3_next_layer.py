"""A Qwen3-Next GatedDeltaNet layer and a 2-layer model on gdn-nki, against HF transformers' own torch path.

A tiny ``Qwen3NextConfig`` (hidden 128, layers linear/full, 2 key and 4 value heads of dims 32/64, random weights:
nothing is downloaded) is run twice per dtype (fp32, bf16): with HF's ``torch_chunk_gated_delta_rule`` and with
``gdn_nki.torch.chunk_gated_delta_rule`` swapped in for it — the one-line change a model makes to use the kernel.
Each run prefills a prompt, then decodes tokens one at a time with HF's recurrent path continuing from the state
the prefill left in the cache (ours, in the swapped run).

Judged with gdn-spec's metrics (relative RMS and max error against the dtype's tolerance table):

- ``core``: every call of the swapped function against the float64 oracle on the very inputs the kernel saw;
- ``layer`` / ``model`` / ``decode``: our run against HF's run in the same dtype (both share every projection,
  norm and convolution, so the difference is the GDN core's). As gdn-spec adapts its table to a case's measured
  condition, the bounds here are multiplied by the model's measured sensitivity to its GDN core: HF's run in the
  same dtype is repeated with the core's outputs (o and the final state) perturbed by relative noise uniform in
  [-u, u] (u of the dtype), and the rel-RMS change of each compared output, in units of u, is its condition
  (never less than 1). In bf16 that change includes every later bf16 rounding the perturbation flips — the
  model's own resolution, which no core can beat.

    python examples/qwen3_next_layer.py          # needs: pip install "gdn-nki[torch]" gdn-spec transformers
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from transformers import Qwen3NextConfig
from transformers.models.qwen3_next import modeling_qwen3_next as hf

from gdn_nki.host.torch_io import as_numpy
from gdn_nki.torch import chunk_gated_delta_rule
from gdn_ref.recurrent import recurrent
from gdn_spec.metrics import UNIT_ROUNDOFF, Error, compare, relative_change

PROMPT, DECODE_STEPS, BATCH, SEED = 100, 4, 2, 0
# Weights at this scale give the GDN core O(0.1-1) inputs and outputs (at the default 0.02 they are ~1e-10, below
# the metrics' absolute floor, where a relative error says nothing).
INIT_RANGE = 0.2
DTYPES = ("float32", "bfloat16")
HF_CORE = hf.torch_chunk_gated_delta_rule  # the module attribute the layer calls for prefill


def tiny_config() -> Qwen3NextConfig:
    """Qwen3-Next's structure at toy size; dense MLPs (no expert routing, which a tiny difference could flip)."""
    return Qwen3NextConfig(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
        mlp_only_layers=[0, 1],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=32,
        linear_value_head_dim=64,
        max_position_embeddings=512,
        initializer_range=INIT_RANGE,
    )


@dataclass
class CoreCall:
    """One call of the swapped core and its errors against the float64 oracle."""

    tokens: int
    errors: list[Error]


@dataclass
class Comparison:
    """What one dtype's runs measured."""

    dtype: str
    core: list[CoreCall] = field(default_factory=list)
    layer: Error | None = None
    model: Error | None = None
    decode: list[Error] = field(default_factory=list)

    def errors(self) -> list[Error]:
        found = [e for call in self.core for e in call.errors]
        return [*found, *(e for e in (self.layer, self.model) if e is not None), *self.decode]

    @property
    def ok(self) -> bool:
        return all(e.ok for e in self.errors())


def _oracle_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                 initial: torch.Tensor | None) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The float64 oracle on the inputs exactly as the kernel sees them: q, k l2-normalized and rounded to the
    compute dtype (``use_qk_l2norm_in_kernel``); the oracle maps value head j to key head j // (Hv / Hk)."""

    def head_major(x: torch.Tensor) -> np.ndarray:
        return np.asarray(as_numpy(x.transpose(1, 2).contiguous()), dtype=np.float64)

    def normalized(x: torch.Tensor) -> torch.Tensor:
        wide = x.float()
        return (wide * torch.rsqrt((wide * wide).sum(-1, keepdim=True) + 1e-6)).to(x.dtype)

    query, key = (head_major(normalized(x)) for x in (q, k))
    state = None if initial is None else initial.double().numpy()
    return recurrent(query, key, head_major(v), head_major(g.float()), head_major(beta.float()),
                     scale=q.shape[-1] ** -0.5, initial_state=state)  # fmt: skip


@contextlib.contextmanager
def gdn_nki_core(record: list[CoreCall], dtype: str) -> Iterator[None]:
    """Swap gdn-nki's FLA-compatible entry point in for HF's torch path, judging each call against the oracle.

    A model needs only ``hf.torch_chunk_gated_delta_rule = chunk_gated_delta_rule``; the wrapper records calls."""

    def core(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
             **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
        o, state = chunk_gated_delta_rule(query, key, value, g, beta, **kwargs)
        ref_out, ref_state = _oracle_core(query, key, value, g, beta, kwargs.get("initial_state"))
        errors = [compare("out", as_numpy(o.transpose(1, 2).contiguous()), ref_out, dtype)]
        if state is not None:
            errors.append(compare("state", state.numpy(), ref_state, dtype))
        record.append(CoreCall(query.shape[1], errors))
        return o, state

    hf.torch_chunk_gated_delta_rule = core
    try:
        yield
    finally:
        hf.torch_chunk_gated_delta_rule = HF_CORE


@contextlib.contextmanager
def perturbed_core(u: float, seed: int) -> Iterator[None]:
    """HF's core with its outputs perturbed by independent relative noise uniform in [-u, u]."""
    rng = np.random.default_rng(seed)

    def jitter(x: torch.Tensor) -> torch.Tensor:
        noise = torch.from_numpy(1.0 + u * rng.uniform(-1.0, 1.0, tuple(x.shape)))
        return (x.double() * noise).to(x.dtype)

    def core(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        o, state = HF_CORE(*args, **kwargs)
        return jitter(o), None if state is None else jitter(state)

    hf.torch_chunk_gated_delta_rule = core
    try:
        yield
    finally:
        hf.torch_chunk_gated_delta_rule = HF_CORE


def sensitivity(dtype: str, exact: tuple[torch.Tensor, ...]) -> list[float]:
    """Per compared output (layer, prefill, decode steps): HF's run's rel-RMS response in ``dtype`` to u-sized
    relative perturbations of the GDN core's outputs, in units of u; ``exact`` is the unperturbed run."""
    u = UNIT_ROUNDOFF[dtype]
    layer, model, ids = _layer_and_model(getattr(torch, dtype))
    with perturbed_core(u, SEED):
        perturbed = _run(model, layer, ids)
    return [relative_change(p.double().numpy(), e.double().numpy()) / u for p, e in zip(perturbed, exact, strict=True)]


def _layer_and_model(dtype: torch.dtype) -> tuple[hf.Qwen3NextGatedDeltaNet, hf.Qwen3NextModel, torch.Tensor]:
    torch.manual_seed(SEED)
    model = hf.Qwen3NextModel(tiny_config()).eval()
    for module in model.modules():
        if isinstance(module, hf.Qwen3NextGatedDeltaNet):
            # HF initializes exp(A_log) up to 16, so g ~ -15 and the state forgets everything each token; decay
            # rates like a trained model's (g ~ -0.01 .. -0.3) make the prefill carry state across chunks.
            module.A_log.data = torch.empty_like(module.A_log).uniform_(0.01, 0.4).log()
    model = model.to(dtype)
    ids = torch.randint(0, 256, (BATCH, PROMPT + DECODE_STEPS))
    return model.layers[0].linear_attn, model, ids


def _run(model: hf.Qwen3NextModel, layer: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The layer alone on the prompt's embeddings, the model's prefill, then one token at a time from its cache."""
    with torch.no_grad():
        layer_out = layer(model.layers[0].input_layernorm(model.embed_tokens(ids[:, :PROMPT])))
        prefill = model(ids[:, :PROMPT], use_cache=True)
        # ``cache``, not ``past_key_values``: transformers 5.24 (our floor) renamed the argument and the output
        # field and drops the old names in 5.40.
        cache, steps = prefill.cache, []
        for t in range(PROMPT, PROMPT + DECODE_STEPS):
            step = model(ids[:, t : t + 1], cache=cache, use_cache=True)
            cache = step.cache
            steps.append(step.last_hidden_state)
    return layer_out, prefill.last_hidden_state, *steps


def compare_dtype(dtype: str) -> Comparison:
    """HF's run and ours in ``dtype``; see the module docstring for what is judged against what."""
    torch_dtype = getattr(torch, dtype)
    layer, model, ids = _layer_and_model(torch_dtype)
    theirs = _run(model, layer, ids)
    result = Comparison(dtype)
    with gdn_nki_core(result.core, dtype):
        ours = _run(model, layer, ids)

    errors = [
        compare("out", a.float().numpy(), b.float().numpy(), dtype, condition=c)
        for a, b, c in zip(ours, theirs, sensitivity(dtype, theirs), strict=True)
    ]
    result.layer, result.model, *result.decode = errors
    return result


def report(result: Comparison) -> str:
    def row(what: str, e: Error) -> str:
        verdict = "ok" if e.ok else "FAIL"
        return f"  {what:<22} rel_rms {e.rel_rms:9.2e}  max_abs {e.max_abs:9.2e}  (tol {e.tolerance.rel_rms:.1e})  {verdict}"

    lines = [f"{result.dtype}:"]
    for i, call in enumerate(result.core):
        for e in call.errors:
            lines.append(row(f"core #{i} {e.output} vs fp64", e))
    lines.append(row("layer vs HF", result.layer))
    lines.append(row("model prefill vs HF", result.model))
    lines += [row(f"decode step {i + 1} vs HF", e) for i, e in enumerate(result.decode)]
    return "\n".join(lines)


def main() -> int:
    print(f"Qwen3-Next, tiny config, B={BATCH}, prompt {PROMPT} tokens, {DECODE_STEPS} decode steps")
    results = [compare_dtype(d) for d in DTYPES]
    for r in results:
        print(report(r))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
