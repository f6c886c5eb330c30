"""CPU torch tensors as launch arguments: numpy views of the caller's memory (bf16 by its bits), torch results.
Skipped, with the reason, where torch is not installed."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (nox -s integration installs it)")

import nki_cpu  # noqa: E402
from nki_cpu import isa as nisa  # noqa: E402
from nki_cpu import language as nl  # noqa: E402


@nki_cpu.jit
def add_into(a, acc):
    """out = a + acc, and acc updated in place with the sum (an aliased in/out argument)."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    a_tile = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    acc_tile = nl.ndarray(acc.shape, dtype=acc.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a_tile, src=a)
    nisa.dma_copy(dst=acc_tile, src=acc)
    total = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=total, data1=a_tile, data2=acc_tile, op=nl.add)
    nisa.dma_copy(dst=out, src=total)
    nisa.dma_copy(dst=acc, src=total)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_in_torch_out_with_in_place_writes(dtype: torch.dtype) -> None:
    a = torch.randn(16, 8).to(dtype)
    acc = torch.randn(16, 8).to(dtype)
    want = (a.float() + acc.float()).to(dtype)
    out = add_into(a, acc)
    assert isinstance(out, torch.Tensor) and out.dtype == dtype
    assert torch.equal(out, want) and torch.equal(acc, want), "the kernel's write reached the caller's tensor"


def test_numpy_arguments_still_return_numpy() -> None:
    out = add_into(np.ones((4, 4), np.float32), np.ones((4, 4), np.float32))
    assert isinstance(out, np.ndarray) and (out == 2).all()


def test_a_tensor_off_the_cpu_is_refused_by_argument_name() -> None:
    with pytest.raises(TypeError, match=r"`acc`.*meta"):
        add_into(torch.ones(4, 4), torch.ones(4, 4, device="meta"))
