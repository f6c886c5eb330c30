"""Conv kernels for ``gdn-spec check --family conv`` runs in a subprocess (``module:callable`` names): the fp64
oracles as kernels, and one with a planted bug."""

from __future__ import annotations

import numpy as np

from gdn_spec.conv import CAPABILITIES_ATTR
from gdn_spec.conv.adapters import reference, reference_prefill

oracle_decode = reference()
oracle_prefill = reference_prefill()


def padding_written(x, conv_pool, weight, bias, state_indices, num_accepted_tokens=None, **options):
    """The oracle (every form it declares), except that a −1 request's window lands in the pool's last row (−1 read
    as an index from the end): a pool row nobody named is written."""
    out, pool = oracle_decode(x, conv_pool, weight, bias, state_indices, num_accepted_tokens, **options)
    if (np.asarray(state_indices).reshape(len(state_indices), -1)[:, 0] < 0).any():
        pool[-1] = 0
    return out, pool


setattr(padding_written, CAPABILITIES_ATTR, getattr(oracle_decode, CAPABILITIES_ATTR))


def numbers_only(x, conv_pool, weight, bias, state_indices, num_accepted_tokens=None, *, activation="silu"):
    """The oracle declaring neither [N, T] rows, the in-row form nor rejections (as HF's update through its glue):
    three checks skip."""
    return oracle_decode(x, conv_pool, weight, bias, state_indices, num_accepted_tokens, activation=activation)


setattr(numbers_only, CAPABILITIES_ATTR, {"name": "oracle, numbers only"})


def no_varlen_call(x, conv_pool, weight, bias, state_indices, num_accepted_tokens=None, *, activation="silu"):
    """The oracle declaring every form but taking no ``query_start_loc``: its varlen check fails (the kernel raises
    TypeError), every other check still runs and passes."""
    return oracle_decode(x, conv_pool, weight, bias, state_indices, num_accepted_tokens, activation=activation)


setattr(no_varlen_call, CAPABILITIES_ATTR, getattr(oracle_decode, CAPABILITIES_ATTR))
