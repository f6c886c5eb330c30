"""The gated RMSNorm folded into the bucketed serving prefill (``gdn_cte_bucket_normed``, ``gdn_nki.prefill_bucket``
with ``z``): bit for bit the bucket's launch then ``gdn_gated_rms_norm`` on the same z rows, at the layouts a server
runs (several sequences, one ending at the bucket's last chunk, -1 rows, an empty slot, checkpoints, read rows,
grid 2, bf16 and fp32, GQA); one program per bucket whatever the layout; the rejections (naming the argument,
nothing written)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import gdn_nki
import nki_cpu
from gdn_nki.common import backend
from gdn_ref.contract import ContractError

HK, HV, DK, DV = 1, 2, 32, 64  # two value heads per key head (Qwen3-Next's ratio)
C = gdn_nki.CHUNK_BY_ALGORITHM["schur"]
BUCKET = (4 * C, 4)
POOL_ROWS = 10
DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float32": np.float32}


def _inputs(lengths: list[int], dtype: str, seed: int) -> dict:
    """Packed head-major q/k/v and gates of sequences of ``lengths``, z seq-first [1, T, Hv, Dv], a weight, a pool."""
    rng = np.random.default_rng(seed)
    tokens, dt = sum(lengths), DTYPES[dtype]

    def unit(shape: tuple[int, ...]) -> np.ndarray:
        x = rng.standard_normal(shape)
        return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(dt)

    return {
        "query": unit((1, HK, tokens, DK)),
        "key": unit((1, HK, tokens, DK)),
        "value": (0.5 * rng.standard_normal((1, HV, tokens, DV))).astype(dt),
        "g_log": -rng.uniform(0.0, 0.3, (1, HV, tokens)).astype(np.float32),
        "beta": rng.uniform(0.1, 0.9, (1, HV, tokens)).astype(np.float32),
        "cu_seqlens": np.cumsum((0, *lengths)).astype(np.int32),
        "z": (2.0 * rng.standard_normal((1, tokens, HV, DV))).astype(dt),
        "norm_weight": (1.0 + 0.5 * rng.standard_normal(DV)).astype(np.float32),
        "recurrent_state": (0.1 * rng.standard_normal((POOL_ROWS, HV, DK, DV))).astype(np.float32),
    }


def _split(call: dict) -> tuple[dict, dict]:
    """The launch's arguments without the norm's, and the norm's (as ``gated_rms_norm`` takes them)."""
    plain = {k: v for k, v in call.items() if not k.startswith("norm_") and k != "z"}
    norm = {"eps": call.get("norm_eps", 1e-6), "activation": call.get("norm_activation", "silu")}
    return plain, norm


def _two_launches(call: dict) -> tuple[np.ndarray, np.ndarray]:
    """``prefill_bucket`` without the norm, then ``gated_rms_norm`` on its out and z head-major."""
    plain, norm = _split(call)
    plain["recurrent_state"] = plain["recurrent_state"].copy()
    out, pool = gdn_nki.prefill_bucket(**plain)
    z = np.ascontiguousarray(call["z"].transpose(0, 2, 1, 3))
    return gdn_nki.gated_rms_norm(out, z, call["norm_weight"], **norm), pool


def _assert_bits(got: np.ndarray, want: np.ndarray) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    same = got.view(np.uint8) == want.view(np.uint8)
    assert same.all(), f"{int((~same).sum())} bytes differ"


CHECKPOINTED = {"state_indices": [2, 5], "read_indices": [8, -1], "checkpoint_every": C,
                "checkpoint_indices": [[0, 1, 4], [6, -1, 9]]}  # fmt: skip


@pytest.mark.parametrize(
    ("dtype", "lengths", "options"),
    [
        # three sequences, the last ending at the bucket's last chunk (C + 5 → 2C, 2C: 4C = T), row -1 for one,
        # an empty slot left over
        ("bfloat16", [C + 5, 1, C], {"state_indices": [3, -1, 7]}),
        ("float32", [C + 5, 2 * C], {"state_indices": [3, 7]}),
        # prefix-cache checkpoints every chunk (the third past its sequence's end) and a read row
        ("bfloat16", [3 * C, 17], CHECKPOINTED),
        ("bfloat16", [C + 5, 2 * C], {"state_indices": [3, 7], "grid": 2}),  # value heads over two programs
        ("bfloat16", [2 * C], {"state_indices": [1], "norm_eps": 1e-2, "norm_activation": "sigmoid"}),
    ],
)
def test_bit_for_bit_the_bucket_then_the_norm(dtype: str, lengths: list[int], options: dict) -> None:
    call = {**_inputs(lengths, dtype, seed=len(lengths) + lengths[0]), "bucket": BUCKET, "scale": DK**-0.5}
    call.update({k: np.asarray(v, np.int32) if isinstance(v, list) else v for k, v in options.items()})
    want_y, want_pool = _two_launches(call)
    pool = call["recurrent_state"]
    y, final = gdn_nki.prefill_bucket(**call)
    assert final is pool
    _assert_bits(y, want_y)
    _assert_bits(pool, want_pool)  # every row: the ones named written alike, the others untouched


@pytest.mark.nki_cpu_only  # reads nki-cpu's trace
@pytest.mark.usefixtures("loop_every_steady_run")  # 24 chunks at group 3: unrolled at the default
def test_bit_for_bit_in_a_compiled_loop_crossing_sequences() -> None:
    """Each head's steady state a compiled loop whose iterations cross sequence boundaries: z's rows addressed from
    the loop's run-time token, which an unrolled launch never does."""
    lengths = [11 * C + 3, 0, 5 * C, 4 * C - 1]
    call = {**_inputs(lengths, "bfloat16", seed=9), "bucket": (24 * C, 4), "group_size": 3,
            "state_indices": np.asarray([4, 2, 0, -1], np.int32)}  # fmt: skip
    want_y, want_pool = _two_launches(call)
    y, pool = gdn_nki.prefill_bucket(**call)
    trace = nki_cpu.last_traces()[0]
    assert any(entry == ("loop", "fori_loop") for entry in trace.program if isinstance(entry, tuple)), "no loop ran"
    _assert_bits(y, want_y)
    _assert_bits(pool, want_pool)


@pytest.mark.nki_cpu_only  # reads nki-cpu's trace
def test_one_program_per_bucket() -> None:
    """Two layouts of the bucket (other lengths, rows, -1) run the same static program, as the unnormed bucket's."""
    prints = []
    for lengths, rows in (([C + 5, 1, C], [3, -1, 7]), ([4 * C], [0])):
        call = {**_inputs(lengths, "bfloat16", seed=1), "bucket": BUCKET, "state_indices": np.asarray(rows, np.int32)}
        gdn_nki.prefill_bucket(**call)
        prints.append(nki_cpu.last_trace().fingerprint())
    assert prints[0] == prints[1]


def _bad(change: dict) -> dict:
    call = {**_inputs([C + 5, C], "bfloat16", seed=4), "bucket": BUCKET, "state_indices": np.asarray([3, 7], np.int32)}
    for name, value in change.items():
        call[name] = value(call[name]) if callable(value) else value
    return call


@pytest.mark.parametrize(
    ("change", "argument"),
    [
        ({"z": lambda z: np.ascontiguousarray(z.transpose(0, 2, 1, 3))}, "z"),  # head-major: the wrong layout
        ({"z": lambda z: z[:, :-1]}, "z"),  # not the packed tokens
        ({"z": lambda z: z.astype(np.float32)}, "z"),  # not the compute dtype
        ({"norm_weight": np.ones(DV // 2, np.float32)}, "norm_weight"),
        ({"norm_weight": np.ones(DV, np.float16)}, "norm_weight"),
        ({"norm_eps": 0.0}, "norm_eps"),
        ({"norm_activation": "gelu"}, "norm_activation"),
        ({"z": None}, "norm_weight"),  # the norm's options without its gate
        ({"z": lambda z: np.where(np.arange(z.size).reshape(z.shape) == 9, np.nan, z).astype(z.dtype)}, "z"),
        ({"norm_weight": lambda w: np.where(np.arange(w.size) == 3, np.inf, w).astype(w.dtype)}, "norm_weight"),
    ],
)
def test_rejections_name_the_argument(change: dict, argument: str) -> None:
    call = _bad(change)
    before = call["recurrent_state"].copy()
    with pytest.raises(ContractError, match=f"`{argument}`") as info:
        gdn_nki.prefill_bucket(**call)
    assert "gdn_nki.prefill_bucket" in str(info.value)
    _assert_bits(call["recurrent_state"], before)  # nothing written


def test_kernel_asserts_at_trace_time() -> None:
    """A direct launch stops its trace naming the norm's broken rule, as the bucket's own."""
    z = np.zeros((1, 2 * C, HV, DV), ml_dtypes.bfloat16)
    call = _inputs([2 * C], "bfloat16", seed=2)
    with pytest.raises(AssertionError, match="`z`"):
        backend.simulate(gdn_nki.gdn_cte_bucket_normed)(
            call["query"], call["key"], call["value"], call["g_log"], call["beta"], z[:, :C], call["norm_weight"],
            np.asarray([0, 2], np.int32), np.asarray([0], np.int32), call["recurrent_state"],
            mask_pack=gdn_nki.build_mask_pack(),
        )  # fmt: skip
