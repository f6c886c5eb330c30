"""Seq-first GDN kernels in numpy (FLA and HF calling conventions) and broken adapters around them.

The kernels are ``mutants.recurrence`` (float64, value head h reads key head h // (Hv // Hk)) behind the
seq-first conventions the adapters declare: ``fla_style`` (scale argument, native GQA, [N, H, K, V] states,
optional ``cu_seqlens``), ``hf_style`` (multiplies q by K**-0.5 itself, no GQA: the caller repeats heads),
``v_first_style`` (states [N, H, V, K]), ``caller_scaled_style`` (applies no scale: the adapter scales q) and
``leaky_varlen`` (a packed sequence starts from the previous sequence's final state instead of its own).
``on_torch`` turns one into a torch kernel; ``writing`` into a mutant that writes one of its arguments in place
(and may raise after), which the suite must fail naming the argument whatever the adapter converted it from.

The broken adapters are the correct layout glue with one step wrong each: the scale applied twice, heads
repeated wrongly, the state transposed. Every one must fail the math profile.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from gdn_spec.adapters.seqfirst import Conventions, Glue, seq_first, wrap_seq_first
from mutants import recurrence

CAPS = {"max_work": 1 << 22}


def _run(q, k, v, g, beta, scale, initial_state, cu_seqlens, leak=False, flaw=None):
    """Head-major recurrence over each packed sequence; returns (out in q's dtype, fp32 states [N, Hv, K, V])."""
    B, Hv, S, Dv = v.shape
    bounds = [0, S] if cu_seqlens is None else [int(b) for b in cu_seqlens]
    n = len(bounds) - 1
    if cu_seqlens is not None and B != 1:
        raise ValueError(f"cu_seqlens needs B == 1, got B={B}")
    start = np.zeros((max(B, n), Hv, q.shape[-1], Dv)) if initial_state is None else initial_state.astype(np.float64)
    out = np.empty(v.shape)
    finals = []
    for i in range(n):
        a, b = bounds[i], bounds[i + 1]
        first = finals[-1] if leak and finals else start[i : i + 1] if cu_seqlens is not None else start
        o, final = recurrence(
            q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], g[:, :, a:b], beta[:, :, a:b], scale, first, flaw
        )
        out[:, :, a:b] = o
        finals.append(final)
    return out.astype(q.dtype), np.concatenate(finals).astype(np.float32)


def fla_style(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    beta: np.ndarray,
    scale: float | None = None,
    initial_state: np.ndarray | None = None,
    output_final_state: bool = False,
    cu_seqlens: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """FLA convention: [B, T, H, D] in and out, native GQA, ``scale`` (default K**-0.5), [N, H, K, V] states."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    o, final = _run(*(seq_first(x) for x in (q, k, v, g, beta)), scale, initial_state, cu_seqlens)
    return seq_first(o), final if output_final_state else None


def _flawed(flaw: str, doc: str) -> Callable[..., Any]:
    """``fla_style`` with one ``mutants.recurrence`` flaw in every sequence it runs."""

    def kernel(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        o, final = _run(*(seq_first(x) for x in (q, k, v, g, beta)), scale, initial_state, cu_seqlens, flaw=flaw)
        return seq_first(o), final if output_final_state else None

    kernel.__doc__ = doc
    return kernel


# issue 29: a kernel skipping the decay on the tokens of a partial last chunk (right on every chunk-multiple
# length), and one restarting from a zero state every 1024 tokens (right on every short length).
fla_undecayed_tail = _flawed("undecayed_tail", "``fla_style`` leaving the tokens of a partial last chunk undecayed.")
fla_lost_carry = _flawed("lost_carry", "``fla_style`` restarting from a zero state every 1024 tokens.")


def leaky_varlen(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    """``fla_style`` whose packed sequences each start from the previous one's final state."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    o, final = _run(*(seq_first(x) for x in (q, k, v, g, beta)), scale, initial_state, cu_seqlens, leak=True)
    return seq_first(o), final if output_final_state else None


def hf_style(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    g: np.ndarray,
    beta: np.ndarray,
    initial_state: np.ndarray | None = None,
    output_final_state: bool = False,
    **kwargs: Any,
) -> tuple[np.ndarray, np.ndarray | None]:
    """HF convention: multiplies q by K**-0.5 itself, takes no scale, needs as many key heads as value heads."""
    if query.shape[2] != value.shape[2]:
        raise ValueError(f"query has {query.shape[2]} heads, value {value.shape[2]}: repeat the key heads first")
    return fla_style(query, key, value, g, beta, query.shape[-1] ** -0.5, initial_state, output_final_state)


def v_first_style(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False):
    """FLA convention with ``state_v_first``: states are [N, H, V, K]."""
    state = None if initial_state is None else np.swapaxes(initial_state, -1, -2)
    o, final = fla_style(q, k, v, g, beta, scale, state, output_final_state)
    return o, None if final is None else np.ascontiguousarray(np.swapaxes(final, -1, -2))


def caller_scaled_style(q, k, v, g, beta, initial_state=None, output_final_state=False):
    """FLA convention applying no scale: the caller multiplies q by it (adapter option ``scale=caller``)."""
    return fla_style(q, k, v, g, beta, 1.0, initial_state, output_final_state)


# The base kernels' declaration; on_torch's and writing's kernels inherit it (functools.wraps copies __dict__).
for _kernel in (
    fla_style,
    leaky_varlen,
    hf_style,
    v_first_style,
    caller_scaled_style,
    fla_undecayed_tail,
    fla_lost_carry,
):
    _kernel.gdn_spec_capabilities = dict(CAPS)


def on_torch(kernel: Callable[..., Any]) -> Callable[..., Any]:
    """``kernel`` (numpy, seq-first) taking and returning torch tensors on the CPU, as FLA's and HF's kernels do.

    It computes on numpy views of the tensors' memory, so ``writing(on_torch(...))`` writes the tensor the adapter
    handed it. torch is imported at the call: this module loads without it.
    """

    @functools.wraps(kernel)  # its signature, so the adapter names the arguments as ``kernel`` does
    def torch_kernel(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
        from gdn_spec.adapters.torch_io import TorchIO

        io = TorchIO.create("cpu")

        def numpy_of(x: Any) -> Any:
            return io.from_kernel(x) if isinstance(x, io.torch.Tensor) else x

        o, final = kernel(*map(numpy_of, args), **{name: numpy_of(x) for name, x in kwargs.items()})
        return io.to_kernel(np.ascontiguousarray(o)), None if final is None else io.to_kernel(final)

    return torch_kernel


def writing(kernel: Callable[..., Any], argument: str, *, then_raise: bool = False) -> Callable[..., Any]:
    """``kernel`` with the right numbers that then doubles its own ``argument`` in place (scratch reuse), and raises
    after the write when ``then_raise`` (a refusal that wrote first).

    Args:
        kernel (Callable): a seq-first kernel, numpy or ``on_torch``.
        argument (str): the kernel's own name of the argument it writes (``q``, ``query``, ``initial_state``).
        then_raise (bool): raise ValueError after the write instead of returning.

    Returns:
        Callable: the mutant, with ``kernel``'s signature. The suite must fail it naming ``argument``, whatever
        the adapter handed it (a view of the suite's array, a contiguous copy, repeated heads, a scaled query, a
        transposed state, a tensor).
    """

    @functools.wraps(kernel)
    def mutant(*args: Any, **kwargs: Any) -> Any:
        result = kernel(*args, **kwargs)
        written = inspect.signature(kernel).bind(*args, **kwargs).arguments.get(argument)
        if written is not None:
            written *= 2.0  # in place: numpy's and torch's *= write the object itself
        if then_raise:
            raise ValueError(f"{argument}: refused, after writing it")
        return result

    return mutant


# Mutants writing an argument the adapter hands over (hf_writes_query: HF's kernels call it `query`, FLA's `q`).
hf_writes_query = writing(hf_style, "query")
fla_writes_query = writing(fla_style, "q")
fla_writes_key = writing(fla_style, "k")
caller_scaled_writes_query = writing(caller_scaled_style, "q")
writes_initial_state = writing(fla_style, "initial_state")  # a returned-state kernel "freeing" the slot
v_first_writes_initial_state = writing(v_first_style, "initial_state")
fla_writes_query_then_raises = writing(fla_style, "q", then_raise=True)
torch_fla_style = on_torch(fla_style)
torch_hf_style = on_torch(hf_style)
torch_caller_scaled_style = on_torch(caller_scaled_style)
torch_fla_undecayed_tail = on_torch(fla_undecayed_tail)
torch_fla_lost_carry = on_torch(fla_lost_carry)
torch_hf_writes_query = writing(torch_hf_style, "query")
torch_caller_scaled_writes_query = writing(torch_caller_scaled_style, "q")
torch_fla_writes_key = writing(torch_fla_style, "k")
torch_fla_writes_key_then_raises = writing(torch_fla_style, "k", then_raise=True)


def fla_returns_three(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False):
    """``fla_style`` returning (o, final_state, None): the adapter must say how many items came back."""
    return (*fla_style(q, k, v, g, beta, scale, initial_state, output_final_state), None)


fla_returns_three.gdn_spec_capabilities = dict(CAPS)


# --- Pool kernels (SGLang's pool-native call): the pool updated in place at the named rows --------------------


def _pool_kernel(flaw: str | None, state_layout: str = "kv", doc: str = "") -> Callable[..., Any]:
    """A seq-first pool kernel on ``mutants.recurrence``: ``initial_state`` is the pool, ``state_indices`` its rows
    (-1: start from zero, store nothing), ``bucket`` taken and not needed, checkpoints and read rows honoured. Without
    ``state_indices`` it is ``fla_style`` (a dense or per-sequence call). One flaw at most:
    ``stores_minus_one_rows`` stores a row-less sequence's final state into ``pool[-1]`` (-1 as a Python index);
    ``ignores_read_indices`` starts every sequence from its ``state_indices`` row. ``state_layout="vk"``: the pool is
    [P, H, V, K]."""

    def kernel(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
               state_indices=None, bucket=None, checkpoint_every=None, checkpoint_indices=None, read_indices=None):  # fmt: skip
        del bucket  # one layout per call here: a bucket matters to a compiled kernel only
        if state_indices is None:
            return fla_style(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens)
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        pool = initial_state if state_layout == "kv" else np.swapaxes(initial_state, -1, -2)  # a view: writes land
        heads = [seq_first(x) for x in (q, k, v, g, beta)]
        out = np.zeros(heads[2].shape)
        bounds = [int(b) for b in cu_seqlens]
        for i, row in enumerate(int(r) for r in state_indices):
            a, b = bounds[i], bounds[i + 1]
            if a == b:
                continue
            start = row if read_indices is None or flaw == "ignores_read_indices" else int(read_indices[i])
            first = np.zeros((1, *pool.shape[1:])) if start < 0 else pool[start : start + 1]

            def run(tokens: int, first: np.ndarray = first, a: int = a) -> tuple[np.ndarray, np.ndarray]:
                return recurrence(*(x[:, :, a : a + tokens] for x in heads), scale, first)

            out[:, :, a:b], final = run(b - a)
            if row >= 0 or flaw == "stores_minus_one_rows":
                pool[row] = final[0]
            for c, checkpoint_row in enumerate(() if checkpoint_every is None else checkpoint_indices[i]):
                tokens = (c + 1) * checkpoint_every
                if checkpoint_row >= 0 and tokens <= b - a:
                    pool[int(checkpoint_row)] = run(tokens)[1][0]
        return seq_first(out).astype(q.dtype), None

    kernel.__doc__ = doc
    kernel.gdn_spec_capabilities = dict(CAPS)
    return kernel


pool_style = _pool_kernel(None, doc="A correct pool kernel (SGLang-style: the pool is the output).")
v_first_pool_style = _pool_kernel(None, "vk", doc="``pool_style`` with a [P, H, V, K] pool (SGLang's layout).")
pool_stores_minus_one_rows = _pool_kernel("stores_minus_one_rows", doc="Stores a -1 sequence into pool[-1].")
pool_ignores_read_indices = _pool_kernel("ignores_read_indices", doc="Starts from state_indices, not read_indices.")
pool_reads_v_first_as_k_major = _pool_kernel(
    None,
    "kv",
    doc="Run under ``state=vk``: reads and writes the [P, H, V, K] pool as [P, H, K, V] (a K-major kernel "
    "handed SGLang's pool): at Dk != Dv it cannot run, at Dk = Dv it runs transposed.",
)
torch_pool_style = on_torch(pool_style)
# name -> (kernel, the serving test it must fail, a phrase of the failure)
POOL_MUTANTS = {
    "pool_stores_minus_one_rows": (pool_stores_minus_one_rows, "test_serving_layouts_match_the_oracle",
                                   "which the call names for no store"),
    "pool_ignores_read_indices": (pool_ignores_read_indices, "test_sequences_start_from_their_read_rows",
                                  "> tol"),
}  # fmt: skip


class ScaleTwice(Glue):
    """Multiplies q by the scale AND passes it to a kernel that applies it."""

    def query(self, query: np.ndarray, scale: float) -> tuple[np.ndarray, dict[str, float]]:
        return (query.astype(np.float64) * scale).astype(query.dtype), {"scale": float(scale)}


class TiledHeads(Glue):
    """Repeats key heads with np.tile (value head h reads key head h % Hk) instead of np.repeat."""

    def heads(self, x: np.ndarray, ratio: int) -> np.ndarray:
        return np.tile(x, (1, ratio, 1, 1))


class TransposedState(Glue):
    """Hands the kernel the state as [V, K] and reads it back as such, for a kernel that keeps [K, V]."""

    def state_in(self, state: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.swapaxes(state, -1, -2))

    def state_out(self, state: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.swapaxes(state, -1, -2))


def _adapted(kernel, glue_type: type[Glue], **conventions: str):
    conv = Conventions(**conventions)
    fn = wrap_seq_first(kernel, conv, glue=glue_type(conv))
    fn.gdn_spec_capabilities = {**CAPS, "validates_arguments": False, "state_in_place": False}
    return fn


# name -> (gdn_cte-signature callable, areas expected to fail, -k filter)
BROKEN_ADAPTERS = {
    "scale_twice": (_adapted(fla_style, ScaleTwice), ("numerics",), "float32 and random"),
    "tiled_heads": (_adapted(hf_style, TiledHeads, scale="internal", gqa="repeat"), ("head_mapping",), ""),
    # (not the long cases: at Dk != Dv the transposed state breaks the kernel before any number is compared)
    "transposed_state": (_adapted(fla_style, TransposedState), ("numerics",), "float32 and initial_state and not long"),
}
for _name, (_fn, _areas, _k) in BROKEN_ADAPTERS.items():
    globals()[_name] = _fn
