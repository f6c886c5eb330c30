"""The float64 causal depthwise conv1d oracle of a GatedDeltaNet layer: prefill over packed sequences and the
decode / verify step on a conv-state pool, each formula in ONE place.

A Qwen3-Next / Qwen3.5 GatedDeltaNet layer convolves its q|k|v projections (``conv_dim`` channels, 8192 at
Qwen3-Next's shapes) along time with a depthwise kernel of width W (4), adds a bias when the layer has one and
applies SiLU. Channel c of token t is

    y[t, c] = act(b[c] + Σ_{j<W} w[c, j] · x̃[t − (W − 1) + j, c])

where x̃ is the sequence preceded by its *window*: the W − 1 inputs before its first token (zeros for a sequence
that starts from nothing). The conv state a server keeps per request is that window, channel-major, oldest input
first: ``[.., C, L]`` with L >= W − 1 inputs, of which the taps read the last W − 1. After a run of tokens the state
is the last L inputs of (state ++ tokens).

Sources and their conventions (read, not copied):

- Hugging Face transformers 5.24/5.25 ``modeling_qwen3_next.py``: ``torch_causal_conv1d_update`` (5.25:
  ``causal_conv1d_update``) ``(hidden_states [B, C, T],
  conv_state [B, C, L], weight [C, W], bias, activation)`` concatenates the state and the tokens, keeps the last L
  as the new state (in place) and returns the last T outputs of a valid depthwise ``F.conv1d``: the taps read the
  last W − 1 state entries, whatever L (HF's cache keeps L = W). Its prefill fallback (5.25: ``causal_conv1d_fn``)
  convolves with W − 1 zeros of left padding (an empty window) and stores the last W inputs, left-padded with
  zeros.
- vLLM ``causal_conv1d_fn(x [C, tokens], weight, bias, conv_states [P, C, L], query_start_loc [n + 1],
  cache_indices [n], has_initial_state [n], activation)``: sequence i runs over tokens ``query_start_loc[i] ..
  query_start_loc[i + 1] − 1`` from pool row ``cache_indices[i]``'s window when ``has_initial_state[i]``, else from
  zeros, and writes its final window (the last L inputs of window ++ tokens) back to that row; a padding slot's
  row (``pad_slot_id``) is skipped. ``causal_conv1d_update(x, conv_state, weight, bias, activation,
  conv_state_indices, num_accepted_tokens)``: decode and speculative verification; for the latter vLLM keeps one
  longer row per request (L = W − 2 + T) and starts at entry ``num_accepted_tokens − 1`` of it.

Here the decode pool is addressed as gdn-nki's recurrent decode step addresses its state pool (``gdn_ref.decode``,
``gdn_nki.decode_step``), so one set of rows and one ``num_accepted_tokens`` roll both states back: ``[N]`` rows (a
request reads its row and writes its window after its T tokens there) or ``[N, T]`` rows (the window after token
t goes to row ``[n, t]``, the request starts from row ``[n, num_accepted_tokens[n] − 1]``, row ``[n, 0]`` without
it); −1 is padding: nothing of the pool is read or written and the request's outputs are zeros. vLLM's one long
row holds the same windows: its window at offset a − 1 is our row ``[n, a − 1]``'s.

vLLM's own speculative form ("in-row": ``[N]`` rows with ``num_accepted_tokens``) is also here, as vLLM's
``causal_conv1d_update`` computes it when ``num_accepted_tokens`` is given (``IS_SPEC_DECODING``): request n's row
R (L entries, L >= W − 2 + T: vLLM allocates W − 1 + num_speculative_tokens) is read from offset
o = num_accepted_tokens[n] − 1: the taps' window is R[o .. o + W − 2], and the row's first W − 2 + T entries (the
kernel's state length, vLLM's ``causal_conv1d_update`` at commit 03c6dad84ad3b1df303e98805a3a0324d70e1539) become
R[o + 1 .. o + W − 2] ++ the T tokens, so the next step's window at offset a' − 1 ends at its a'-th accepted token;
a longer row's entries from W − 2 + T on are left as they were.

vLLM's varlen form of that step (``causal_conv1d_update_varlen``: ``query_start_loc`` with
``num_accepted_tokens``, as its GDN layer calls it in speculative decoding, vllm-project/vllm
``vllm/model_executor/models/qwen3_next.py``; the kernel's ``IS_VARLEN`` branch in
``vllm/model_executor/layers/mamba/ops/causal_conv1d.py`` at commit 03c6dad84ad3b1df303e98805a3a0324d70e1539):
x is packed [tokens, C], request n owns tokens ``query_start_loc[n] .. query_start_loc[n + 1] − 1`` (len_n of
them, at most ``max_query_len``). Its taps read the row at offset o as above; the kernel's state length is
W − 2 + len_n, so it writes the row's first W − 2 + len_n entries, R[o + 1 .. o + W − 2] ++ its len_n tokens, and
leaves the others as they were; a request of no tokens reads and writes nothing.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

ACTIVATIONS = (None, "silu")
PADDING_ROW = -1


def _act(y: np.ndarray, activation: str | None) -> np.ndarray:
    """SiLU (x · sigmoid(x), as HF's ``F.silu`` and vLLM's kernels) or the identity, float64."""
    if activation is None:
        return y
    if activation != "silu":
        raise ValueError(f"activation {activation!r}: one of {ACTIVATIONS}")
    return y / (1.0 + np.exp(-y))


def conv_from_window(
    x: np.ndarray, window: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None, activation: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """One sequence's conv from its window, and the window after every token.

    Dimensions:
        T: tokens. C: channels. W: kernel width. L: inputs a window holds, L >= W − 1.

    Args:
        x (np.ndarray): [T, C] the sequence's inputs, token-major (as the projections give them).
        window (np.ndarray): [C, L] the inputs before its first token, oldest first (zeros: an empty window).
        weight (np.ndarray): [C, W] depthwise taps; tap W − 1 multiplies the current token.
        bias (np.ndarray | None): [C], or None.
        activation (str | None): "silu" or None.

    Returns:
        tuple[np.ndarray, np.ndarray]: out [T, C] and the windows after each token [T, C, L] (the window after
        the last token is the sequence's final window; T = 0 gives [0, C, L]: the window stays as it was), float64.
    """
    x = np.asarray(x, dtype=np.float64)
    window = np.asarray(window, dtype=np.float64)
    w = np.asarray(weight, dtype=np.float64)
    tokens, channels = x.shape
    state_len, width = window.shape[1], w.shape[1]
    if state_len < width - 1:
        raise ValueError(f"a window of {state_len} inputs is shorter than the W − 1 = {width - 1} the taps read")
    extended = np.concatenate([window.T, x], axis=0)  # [L + T, C]: the inputs before the first token, then tokens
    y = (
        np.zeros((tokens, channels))
        if bias is None
        else np.broadcast_to(np.asarray(bias, np.float64), (tokens, channels)).copy()
    )
    for j in range(width):  # tap j reads the input W − 1 − j tokens back
        start = state_len - (width - 1) + j
        y += w[:, j] * extended[start : start + tokens]
    windows = (
        np.stack([extended[t + 1 : t + 1 + state_len].T for t in range(tokens)])
        if tokens
        else np.zeros((0, channels, state_len))
    )
    return _act(y, activation), windows


def causal_conv1d_varlen(
    x: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray | None,
    cu_seqlens: Any,
    windows: np.ndarray,
    activation: str | None = "silu",
    checkpoint_every: int | None = None,
) -> tuple[np.ndarray, np.ndarray, dict[tuple[int, int], np.ndarray]]:
    """Packed sequences, each from its own window: the prefill oracle.

    Dimensions:
        tokens: packed tokens. n: sequences. C: channels. W: width. L >= W − 1: window length.

    Args:
        x (np.ndarray): [tokens, C], the sequences back to back.
        weight, bias, activation: as ``conv_from_window``.
        cu_seqlens: [n + 1] non-decreasing from 0 to ``tokens`` (vLLM's ``query_start_loc``); empty sequences
            allowed.
        windows (np.ndarray): [n, C, L] each sequence's starting window (zeros for an empty one).
        checkpoint_every (int | None): also return the window after every ``checkpoint_every`` tokens of each
            sequence (the positions of the recurrent state's checkpoints).

    Returns:
        tuple: out [tokens, C]; final windows [n, C, L] (an empty sequence keeps its window); and the checkpoint
        windows by (sequence, k) — the window after (k + 1) · checkpoint_every tokens, for each such position
        within the sequence — all float64.
    """
    bounds = [int(b) for b in np.asarray(cu_seqlens).reshape(-1)]
    x = np.asarray(x, dtype=np.float64)
    out = np.zeros(x.shape)
    finals = np.array(windows, dtype=np.float64, copy=True)
    checkpoints: dict[tuple[int, int], np.ndarray] = {}
    for i, (start, end) in enumerate(itertools.pairwise(bounds)):
        if end == start:
            continue
        y, after = conv_from_window(x[start:end], windows[i], weight, bias, activation)
        out[start:end] = y
        finals[i] = after[-1]
        if checkpoint_every:
            for k in range((end - start) // checkpoint_every):
                checkpoints[(i, k)] = after[(k + 1) * checkpoint_every - 1]
    return out, finals, checkpoints


def causal_conv1d_prefill_pool(
    x: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray | None,
    cu_seqlens: Any,
    pool: np.ndarray,
    state_indices: Any,
    activation: str | None = "silu",
    checkpoint_every: int | None = None,
    checkpoint_indices: Any = None,
    read_indices: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The serving prefill on a conv-state pool: what every row must hold afterwards.

    Args:
        x, weight, bias, cu_seqlens, activation, checkpoint_every: as ``causal_conv1d_varlen``.
        pool (np.ndarray): [P, C, L] conv states (not modified).
        state_indices: [n] the row sequence i starts from and writes its final window to; −1: an empty window,
            nothing stored (vLLM's ``cache_indices`` with ``has_initial_state`` = row >= 0).
        checkpoint_indices: [n, K] rows of the windows after (k + 1) · checkpoint_every tokens; −1 or a position
            past the sequence's length: not stored.
        read_indices: [n] the row sequence i starts from when it is not the row it ends in (a prefix-cache hit);
            −1: an empty window. None: ``state_indices``.

    Returns:
        tuple: out [tokens, C] float64 and the pool after the call (a float64 copy; rows not named as they were).
    """
    rows = np.asarray(state_indices).reshape(-1).astype(np.int64)
    reads = rows if read_indices is None else np.asarray(read_indices).reshape(-1).astype(np.int64)
    after = np.array(pool, dtype=np.float64, copy=True)
    windows = np.stack([after[r] if r >= 0 else np.zeros(pool.shape[1:]) for r in reads])
    out, finals, checkpoints = causal_conv1d_varlen(x, weight, bias, cu_seqlens, windows, activation, checkpoint_every)
    lengths = np.diff(np.asarray(cu_seqlens).reshape(-1).astype(np.int64))
    if checkpoint_indices is not None:
        table = np.asarray(checkpoint_indices).astype(np.int64)
        for (i, k), window in checkpoints.items():
            if k < table.shape[1] and table[i, k] >= 0:
                after[table[i, k]] = window
    for i, row in enumerate(rows):
        if row >= 0 and lengths[i] > 0:
            after[row] = finals[i]
    return out, after


def causal_conv1d_decode_pool(
    x: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray | None,
    pool: np.ndarray,
    state_indices: Any,
    num_accepted_tokens: Any = None,
    activation: str | None = "silu",
) -> tuple[np.ndarray, np.ndarray]:
    """The decode / verify step on a conv-state pool (module docstring: rows, rollback, padding).

    Dimensions:
        N: requests. T: new tokens each. C: channels. P: pool rows. L >= W − 1.

    Args:
        x (np.ndarray): [N, T, C] token-major.
        weight, bias, activation: as ``conv_from_window``.
        pool (np.ndarray): [P, C, L] (not modified).
        state_indices: [N] or [N, T] rows; −1: padding.
        num_accepted_tokens: [N] in [1, T]: with [N, T] rows the request starts from row
            ``[n, num_accepted_tokens[n] − 1]``; with [N] rows, vLLM's in-row form (module docstring): its row is
            read from offset ``num_accepted_tokens[n] − 1`` (L >= W − 2 + T).

    Returns:
        tuple: out [N, T, C] (zeros for padding requests) and the pool after the step, float64.
    """
    x = np.asarray(x, dtype=np.float64)
    rows = np.asarray(state_indices).astype(np.int64)
    if rows.ndim == 1 and num_accepted_tokens is not None:
        return _decode_in_row(x, weight, bias, pool, rows, np.asarray(num_accepted_tokens), activation)
    per_token = rows.ndim == 2
    rows = rows.reshape(rows.shape[0], -1)
    after = np.array(pool, dtype=np.float64, copy=True)
    out = np.zeros(x.shape)
    reads = []
    for n in range(x.shape[0]):
        col = 0
        if per_token and num_accepted_tokens is not None:
            col = int(np.asarray(num_accepted_tokens).reshape(-1)[n]) - 1
        reads.append(rows[n, col])
    before = {int(r): after[r].copy() for r in reads if r >= 0}  # every read before any write: rows may overlap
    for n, read in enumerate(reads):
        if read < 0:
            continue
        y, windows = conv_from_window(x[n], before[int(read)], weight, bias, activation)
        out[n] = y
        if per_token:
            for t in range(x.shape[1]):
                after[rows[n, t]] = windows[t]
        else:
            after[rows[n, 0]] = windows[-1]
    return out, after


def _decode_in_row(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, pool: np.ndarray, rows: np.ndarray,
                   accepted: np.ndarray, activation: str | None) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """vLLM's in-row speculative step (module docstring): request n's taps read its row from offset
    o = accepted[n] − 1, and the row's first W − 2 + T entries become R[o + 1 .. o + W − 2] ++ its tokens."""
    tokens, width, state_len = x.shape[1], np.shape(weight)[1], np.shape(pool)[2]
    if state_len < width - 2 + tokens:
        raise ValueError(f"an in-row state of L = {state_len} is shorter than the W − 2 + T = {width - 2 + tokens} "
                         "entries its windows span")  # fmt: skip
    after = np.array(pool, dtype=np.float64, copy=True)
    out = np.zeros(x.shape)
    before = {int(r): after[r].copy() for r in rows if r >= 0}  # every read before any write
    for n, row in enumerate(rows):
        if row < 0:
            continue
        offset = int(accepted.reshape(-1)[n]) - 1
        if not 0 <= offset < tokens:
            raise ValueError(f"num_accepted_tokens[{n}] = {offset + 1} is outside [1, T = {tokens}]")
        source = before[int(row)]
        out[n], _ = conv_from_window(x[n], source[:, offset : offset + width - 1], weight, bias, activation)
        _write_in_row(after[row], source, offset, x[n], width)
    return out, after


def _write_in_row(row: np.ndarray, source: np.ndarray, offset: int, tokens: np.ndarray, width: int) -> None:
    """What vLLM's kernel stores in an in-row row (module docstring): its first W − 2 + len entries become
    ``source``[o + 1 .. o + W − 2] ++ the len ``tokens`` ([len, C]); the row's later entries are left as they were."""
    kept = np.concatenate([source[:, offset + 1 : offset + width - 1], tokens.T], axis=1)
    row[:, : kept.shape[1]] = kept


def causal_conv1d_update_varlen(
    x: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray | None,
    pool: np.ndarray,
    query_start_loc: Any,
    state_indices: Any,
    num_accepted_tokens: Any,
    max_query_len: int,
    activation: str | None = "silu",
) -> tuple[np.ndarray, np.ndarray]:
    """vLLM's varlen speculative step on a conv-state pool (module docstring: the row each request writes).

    Dimensions:
        tokens: packed tokens. N: requests. C: channels. W: width. P: pool rows. L >= W − 2 + max_query_len.

    Args:
        x (np.ndarray): [tokens, C] the requests' tokens back to back, token-major.
        weight, bias, activation: as ``conv_from_window``.
        pool (np.ndarray): [P, C, L] (not modified).
        query_start_loc: [N + 1] request bounds, from 0 to ``tokens``, non-decreasing.
        state_indices: [N] rows; −1: padding (nothing read or written, its outputs zeros).
        num_accepted_tokens: [N] in [1, max_query_len]: the taps read the row from entry num_accepted_tokens − 1.
        max_query_len (int): the most tokens a request has (vLLM's kernel's state length W − 2 + max_query_len).

    Returns:
        tuple: out [tokens, C] (zeros for padding requests) and the pool after the step, float64.
    """
    x = np.asarray(x, dtype=np.float64)
    bounds = np.asarray(query_start_loc).astype(np.int64).reshape(-1)
    rows = np.asarray(state_indices).astype(np.int64).reshape(-1)
    accepted = np.asarray(num_accepted_tokens).astype(np.int64).reshape(-1)
    width, state_len = np.shape(weight)[1], np.shape(pool)[2]
    if state_len < width - 2 + max_query_len:
        raise ValueError(f"an in-row state of L = {state_len} is shorter than the W − 2 + max_query_len = "
                         f"{width - 2 + max_query_len} entries its windows span")  # fmt: skip
    after = np.array(pool, dtype=np.float64, copy=True)
    out = np.zeros(x.shape)
    before = {int(r): after[r].copy() for r in rows if r >= 0}  # every read before any write
    for n, row in enumerate(rows):
        start, stop = int(bounds[n]), int(bounds[n + 1])
        if row < 0 or stop == start:
            continue
        if not 0 <= stop - start <= max_query_len:
            raise ValueError(f"request {n} has {stop - start} tokens, outside [0, max_query_len = {max_query_len}]")
        offset = int(accepted[n]) - 1
        if not 0 <= offset < max_query_len:
            raise ValueError(f"num_accepted_tokens[{n}] = {offset + 1} is outside [1, {max_query_len}]")
        source = before[int(row)]
        out[start:stop], _ = conv_from_window(x[start:stop], source[:, offset : offset + width - 1], weight, bias,
                                              activation)  # fmt: skip
        _write_in_row(after[row], source, offset, x[start:stop], width)
    return out, after
