"""Verification in chunk form: a request's T tokens advanced together, every product against the state before them.

Used for T > 1 with [N] rows (only the state after the T tokens is kept). Per value head (key head j), with α_t,
β_t, q_t (scaled), k_t, v_t of token t, γ_t = α_0···α_t and S the state before the tokens, unrolling
``gdn_ref.recurrent`` (decay, delta against the decayed state, rank-1 write, read after the write) gives

    u_t = X_tᵛ − (X_tᵏ)ᵀ S      X_t = β_t [γ_t k_t ; v_t] − Σ_{i<t} A_ti X_i,   A_ti = β_t (γ_t/γ_i) k_tᵀk_i
    o_t = Z_tᵛ − (Z_tᵏ)ᵀ S      Z_t = Σ_{i≤t} C_ti X_i − [γ_t q_t ; 0],      C_ti = (γ_t/γ_i) k_iᵀq_t
    S'  = γ_{T−1} S + Σ_t w_t k_t u_tᵀ,   w_t = α_{t+1}···α_{T−1}

(X_t = [X_tᵏ; X_tᵛ]: a Dk column and a Dv column; the forward substitution of the unit lower-triangular system
(I + A) U = B, B_t = β_t (v_t − γ_t Sᵀk_t), done on the columns themselves.) Nothing but the last line touches S:
a tile's [u; o] of all T tokens is one accumulation group of ``rows`` matmuls whose moving operand holds 2·T·H
columns — the tensor engine's cost of one token's (``nc_matmul``: max(min(64, M), N) cycles, N = 2·T·H ≤ 64) — and
the state is decayed once and written once. The sign convention is ``state_tiles``': the recall plane holds X_tᵏ,
the read plane Z_tᵏ, both negated by the signed mask, the key plane w_t k_t; the value columns X_tᵛ and Z_tᵛ enter
the group first, by a 0/1 matmul against the identity.

The arithmetic differs from the token-by-token step's (it is the chunked form's), so the results agree within
the tolerance table (``gdn_ref``'s decode bounds), not bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..common.backend import nisa, nl
from ..common.engines import GPSIMD, SCALAR
from ..common.lockstep import lockstep
from ..common.tiles import FP32, matmul, psum, sbuf, transpose
from .recurrence import Constants, Gates, Shapes, token_gates, token_keys
from .state_tiles import PLANES, PSUM_BANK_FP32, LayoutConstants, Steps, TileLayout


@dataclass(frozen=True)
class ChunkOperands:
    """One block's operands for all T tokens of a request.

    Attributes:
        stationaries: [P, rows, tiles, 2, T, H]: the signed, head-masked selection products of the recall and
            read planes; [:, lo, t] is tile t's moving operand for dk_lo = lo (the key plane reaches the write
            through ``writes``).
        writes: [T·Hv, rows, P] (the whole request's): [:, lo] the stationary of the rank-T write for
            dk_lo = lo, row (token t, tile, head h) holding w_t k_t[dk_hi(p)·rows + lo] of that head on the
            partitions p of head h's block, zero elsewhere (every tile's rows: a tile's write meets only its own,
            the others' deltas being zero).
        decay: [P, tiles]: γ_{T−1} of partition p's head.
        values: [Dv, 2, T, Hv] fp32 (the whole request's): X_tᵛ and Z_tᵛ of every value head.
        deferred: (group, issue) pairs not yet issued (the later groups' selection products, the write's masking):
            ``chunk_columns`` issues them between its matmuls and before a tile of that group, ``chunk_write``
            whatever is left before a write.
    """

    stationaries: Any
    writes: Any
    decay: Any
    values: Any
    # between its matmuls the tensor engine waits out each accumulation anyway
    deferred: list[tuple[int, Callable[[], None]]] = field(default_factory=list)


GROUP_TILES = 4  # tiles whose selection products are made together (``_block_operands``)
PAIRS_AHEAD = 8  # token pairs whose scaled ratios are made before their couplings (``prepare_chunk``)


def _per_value_head(per_key_head: Any, ratio: int) -> Any:
    """[P, Hk] seen as [P, Hk, r] (stride 0): each key head's value for its r value heads."""
    return per_key_head.expand_dim(2).broadcast(2, ratio)


def _by_value_head(tile: Any, key_heads: int) -> Any:
    return tile.reshape((tile.shape[0], key_heads, tile.shape[-1] // key_heads))


def prepare_chunk(shapes: Shapes, gates: Gates, consts: Constants, loaded: Any, scale: float, l2norm: bool) -> Steps:
    """Every state-independent operand of a request's T tokens in chunk form (module docstring), one dependency
    level per step; returns one ``ChunkOperands`` per block of ``layout.block_heads`` value heads."""
    tokens, hk, hv, dk, dv = shapes.tokens, shapes.key_heads, shapes.value_heads, shapes.dk, shapes.dv
    r, layout, lanes = shapes.ratio, consts.layout, consts.layout.lanes

    def token(t: int) -> Steps:
        return (yield from lockstep([token_keys(shapes, loaded.keys[t], consts, scale, l2norm),
                                     token_gates(gates, consts, loaded.gates[t])], yield_after_last=False))  # fmt: skip

    per_token = yield from lockstep([token(t) for t in range(tokens)], yield_after_last=False)
    q_cols = [keys[0] for keys, _ in per_token]
    k_cols = [keys[1] for keys, _ in per_token]
    overlap = [keys[2] for keys, _ in per_token]
    alpha = [gates_[0] for _, gates_ in per_token]
    beta = [gates_[1] for _, gates_ in per_token]

    def value_tile() -> Any:
        return sbuf((lanes, hv), FP32)

    def by(tile: Any, parts: int | None = None) -> Any:  # a [lanes, Hv] tile (its first parts) as [P, Hk, r]
        return _by_value_head(tile if parts is None else tile[0:parts, :], hk)

    def product(dst: Any, a: Any, b: Any, engine: Any = GPSIMD) -> Any:  # dst = a ⊙ b over [P, Hk, r] views
        nisa.tensor_tensor(dst=_by_value_head(dst, hk), data1=a, data2=b, op=nl.multiply, engine=engine)
        return dst

    # k_tᵀk_i and k_iᵀq_t (i < t) of every key head on every partition: one products tile, sums against ones.
    pairs = [(t, i) for t in range(tokens) for i in range(t)]
    products = sbuf((dk, 2, len(pairs), hk), FP32)
    for n, (t, i) in enumerate(pairs):
        nisa.tensor_tensor(dst=products[:, 0, n, :], data1=k_cols[t], data2=k_cols[i], op=nl.multiply)
        nisa.tensor_tensor(dst=products[:, 1, n, :], data1=q_cols[t], data2=k_cols[i], op=nl.multiply)
    # γ_t, the ratios γ_t/γ_i (i < t) and w_t, products of the α's (GpSimd, SBUF only)
    ratio: dict[tuple[int, int], Any] = {}
    for t in range(1, tokens):
        for i in range(t):
            ratio[t, i] = alpha[t] if i == t - 1 else product(value_tile(), by(ratio[t - 1, i]), by(alpha[t]))
    gamma = [alpha[0]]
    for t in range(1, tokens):
        gamma.append(product(value_tile(), by(gamma[-1]), by(alpha[t])))
    weight: list[Any] = [None] * tokens  # w_{T−1} = 1
    for t in range(tokens - 2, -1, -1):
        weight[t] = (
            alpha[t + 1] if weight[t + 1] is None else product(value_tile(), by(weight[t + 1]), by(alpha[t + 1]))
        )
    yield
    flat = products.reshape((dk, 2 * len(pairs) * hk))
    gram = sbuf((lanes, 2, len(pairs), hk), FP32)
    width = flat.shape[1]
    for start in range(0, width, PSUM_BANK_FP32):
        stop = min(width, start + PSUM_BANK_FP32)
        sums = matmul(consts.ones, flat[:, start:stop])
        nisa.activation(dst=gram.reshape((lanes, width))[:, start:stop], op=nl.copy, data=sums)
    beta_gamma = [product(value_tile(), by(beta[t]), by(gamma[t])) for t in range(tokens)]
    # The key plane's columns and γ_t q_t (Z_t's) need no sums: GpSimd makes them while the Gram matmul's sums
    # are made, so after the sums only the couplings stand before the forward substitution.
    cols = sbuf((dk, PLANES, tokens, hv), FP32)  # recall X_tᵏ, read Z_tᵏ, key w_t k_t
    for t in range(tokens):
        product(cols[:, 0, t, :], by(beta_gamma[t], dk), _per_value_head(k_cols[t], r))
        if weight[t] is None:
            nisa.tensor_copy(dst=_by_value_head(cols[:, 2, t, :], hk), src=_per_value_head(k_cols[t], r),
                             engine=GPSIMD)  # fmt: skip
        else:
            product(cols[:, 2, t, :], by(weight[t], dk), _per_value_head(k_cols[t], r))
    read = [product(sbuf((dk, hv), FP32), by(gamma[t], dk), _per_value_head(q_cols[t], r)) for t in range(tokens)]
    yield
    coupling, reads = {}, {}  # A_ti and C_ti
    # β_t γ_t/γ_i of up to PAIRS_AHEAD pairs first, then their couplings: back to back, each coupling would wait out
    # its factor's latency on GpSimd (a bounded batch: T(T − 1)/2 tiles live at once would not fit SBUF at T = 128).
    for start in range(0, len(pairs), PAIRS_AHEAD):
        batch = list(enumerate(pairs))[start : start + PAIRS_AHEAD]
        scaled = [product(value_tile(), by(ratio[t, i]), by(beta[t])) for _, (t, i) in batch]
        for (n, (t, i)), factor in zip(batch, scaled, strict=True):
            coupling[t, i] = product(value_tile(), by(factor), _per_value_head(gram[:, 0, n, :], r))
    # The value columns v_t [Dv, Hv]: each block's rows turned on the tensor engine.
    turned = []
    block = layout.block_heads
    for t in range(tokens):
        per_block = [transpose(loaded.values[b][t]) for b in range(hv // block)]
        turned.append(per_block)
    # The key plane through the selection for the rank-T write's stationaries (masked later, ``write_rows``): the
    # tensor engine is idle until the forward substitution ends.
    selected = [matmul(cols[:, PLANES - 1], consts.tiles.select[:, lo, :], psum((tokens * hv, layout.partitions)),
                       moving_onezero=True) for lo in range(layout.rows)]  # fmt: skip
    yield
    values = sbuf((dv, 2, tokens, hv), FP32)  # X_tᵛ, Z_tᵛ
    for t in range(tokens):
        for b, rows in enumerate(turned[t]):
            nisa.tensor_tensor(dst=values[:, 0, t, b * block : (b + 1) * block], data1=rows,
                               data2=beta[t][0:dv, b * block : (b + 1) * block], op=nl.multiply)  # fmt: skip
    yield
    planes = ((cols[:, 0], cols[:, 1], dk, {"engine": GPSIMD}), (values[:, 0], values[:, 1], dv, {}))
    # X_t −= A_ti X_i (i < t), as soon as X_i is final: every later token's term first, then its subtraction, so
    # the T − 1 − i chains fill each other's dependency latency on the in-order engines; each X_t still subtracts
    # its terms in the order i = 0, 1, … (the same roundings as token by token).
    # C_ti of the pairs (t, i > ·) after level i: GpSimd makes them while the next level waits on this one.
    for i in range(tokens - 1):
        for plane, _, parts, kw in planes:
            later = {t: coupling[t, i][0:parts, :] for t in range(i + 1, tokens)}
            _fold_level(plane, plane[:, i, :], later, nl.subtract, kw)
        for t in range(i + 1, tokens):
            n = pairs.index((t, i))
            reads[t, i] = product(value_tile(), by(ratio[t, i]), _per_value_head(gram[:, 1, n, :], r))
        yield
    # Z_t = Σ_{i≤t} C_ti X_i − [γ_t q_t; 0]  (C_tt = k_tᵀq_t, the token's overlap): the T sums side by side, each
    # adding its terms in the order i = 0, 1, … after its own token's.
    for source, target, parts, kw in planes:
        for t in range(tokens):
            nisa.tensor_tensor(dst=_by_value_head(target[:, t, :], hk), data1=_by_value_head(source[:, t, :], hk),
                               data2=_per_value_head(overlap[t][0:parts, :], r), op=nl.multiply, **kw)  # fmt: skip
        for i in range(tokens - 1):
            _fold_level(target, source[:, i, :], {t: reads[t, i][0:parts, :] for t in range(i + 1, tokens)}, nl.add, kw)
    for t in range(tokens):
        nisa.tensor_tensor(dst=cols[:, 1, t, :], data1=cols[:, 1, t, :], data2=read[t], op=nl.subtract, engine=GPSIMD)
    yield
    # The rank-T write's stationaries of every tile at once: the key plane through the selection (``selected``,
    # above), masked to each row's head block between the first tiles' product matmuls (``deferred``), not in
    # front of the blocks' first selection products that those wait on: the first write is a few tiles later.
    writes = sbuf((tokens * hv, layout.rows, layout.partitions), FP32)
    blocks = []
    for h0 in range(0, hv, block):
        blocks.append((yield from _block_operands(layout, consts.tiles, cols, gamma[-1], values, writes, h0, tokens)))

    def write_rows(lo: int) -> None:
        nisa.tensor_tensor(dst=writes[:, lo, :], data1=selected[lo], data2=consts.tiles.write_mask, op=nl.multiply)

    # a group past every tile: no tile's products force them; ``chunk_write`` issues what is left before a write
    blocks[0].deferred.extend((len(blocks) * layout.tiles, lambda lo=lo: write_rows(lo)) for lo in range(layout.rows))
    return blocks


def _fold_level(targets: Any, source: Any, factors: dict[int, Any], op: Any, kw: dict[str, Any]) -> None:
    """``targets[:, t] = targets[:, t] op (source ⊙ factors[t])`` for every token t in ``factors`` ([parts, Hv]
    each): every term first, then every update — the updates are independent, so the in-order engine does not wait
    out each term's latency before its update."""
    terms = {}
    for t, factor in factors.items():
        terms[t] = sbuf(tuple(source.shape), FP32)
        nisa.tensor_tensor(dst=terms[t], data1=source, data2=factor, op=nl.multiply, **kw)
    for t, term in terms.items():
        nisa.tensor_tensor(dst=targets[:, t, :], data1=targets[:, t, :], data2=term, op=op, **kw)


def _block_operands(layout: TileLayout, consts: LayoutConstants, cols: Any, decay: Any, values: Any, writes: Any,
                    h0: int, tokens: int) -> Steps:  # fmt: skip
    """The selection products of the block of heads ``h0 .. h0 + block`` for all T tokens (``ChunkOperands``)."""
    parts, rows, h, per_block = layout.partitions, layout.rows, layout.heads, layout.tiles_per_block
    block = layout.block_heads
    # The recall and read planes only: the key plane reaches the write through ``writes``. A group of tiles at a
    # time, so the first tiles' [u; o] matmuls start while the later tiles' products are made.
    masked = sbuf((parts, rows, per_block, 2, tokens, h), FP32)  # tile-major: a tile's operand is one run
    mask = consts.signed_mask[:, 0:2, :].expand_dim(2).broadcast(2, tokens)

    def selected(first: int, lo: int) -> None:  # Dk row lo of the group of tiles from ``first``
        group = min(GROUP_TILES, per_block - first)
        moving = cols[:, 0:2, :, h0 + first * h : h0 + (first + group) * h]  # [Dk, 2, T, group·H]
        products = psum((parts, 2, tokens, group * h))
        matmul(consts.select[:, lo, :], moving, dst=products, stationary_onezero=True)
        nisa.tensor_tensor(dst=masked[:, lo, first : first + group].permute((0, 2, 3, 1, 4)),
                           data1=products.reshape((parts, 2, tokens, group, h)),
                           data2=mask.expand_dim(3).broadcast(3, group), op=nl.multiply)  # fmt: skip

    for lo in range(rows):
        selected(0, lo)
    deferred = [(first // GROUP_TILES, lambda first=first, lo=lo: selected(first, lo))
                for first in range(GROUP_TILES, per_block, GROUP_TILES) for lo in range(rows)]  # fmt: skip
    head_mask = consts.signed_mask[:, PLANES - 1, :].expand_dim(1).broadcast(1, per_block)
    decay_heads = sbuf((parts, per_block, h), FP32)
    nisa.tensor_tensor(dst=decay_heads, data1=decay[0:parts, h0 : h0 + block].reshape((parts, per_block, h)),
                       data2=head_mask, op=nl.multiply, engine=GPSIMD)  # fmt: skip
    yield
    decay_p = sbuf((parts, per_block), FP32)
    nisa.tensor_reduce(dst=decay_p, op=nl.add, data=decay_heads, axis=2)
    return ChunkOperands(stationaries=masked, writes=writes, decay=decay_p, values=values, deferred=deferred)


def chunk_columns(layout: TileLayout, consts: LayoutConstants, ops: ChunkOperands, t: int, tile: int,
                  state: Any, tokens: int, between: Callable[[int], None] | None = None) -> Any:  # fmt: skip
    """All T tokens' [u; o] of tile ``t`` of a block (``tile``: its index in the request) from the state before
    them: [Dv, 2, T, H] fp32 in PSUM (plane 0 the deltas u, plane 1 the outputs).

    ``between(lo)`` is called after the matmul of Dk row ``lo``: independent tensor-engine work (another tile's
    ``chunk_write`` row) issued there runs while the next row's matmul waits out that one's accumulation latency."""
    dv, h = layout.dv, layout.heads
    while ops.deferred and ops.deferred[0][0] <= t // GROUP_TILES:  # this tile's selection products first
        ops.deferred.pop(0)[1]()
    mixed = psum((dv, 2, tokens, h))
    matmul(consts.value_identity, ops.values[:, :, :, tile * h : (tile + 1) * h], dst=mixed, stationary_onezero=True)
    for lo in range(layout.rows):
        matmul(state[:, lo * dv : (lo + 1) * dv], ops.stationaries[:, lo, t], dst=mixed, accumulate=True)
        if ops.deferred:
            ops.deferred.pop(0)[1]()
        if between is not None:
            between(lo)
    return mixed


def chunk_deltas(layout: TileLayout, consts: LayoutConstants, tile: int, mixed: Any, outputs: Any,
                 tokens: int) -> Any:  # fmt: skip
    """A tile's deltas u of all T tokens as rows for the rank-T write (``chunk_write``), from ``chunk_columns``'
    result (``tile``: its index in the request); its outputs go to ``outputs`` [Dv, T, H].

    Returns:
        [T·Hv, Dv] fp32 SBUF: row (token, tile', head) holds that u for this tile, zero for every other tile (u's
        columns evacuated into a zeroed [Dv, T, tiles, H] tile, turned by a 0/1 matmul against the identity).
    """
    dv, h = layout.dv, layout.heads
    nisa.activation(dst=outputs, op=nl.copy, data=mixed[:, 1])
    padded = sbuf((dv, tokens, layout.tiles, h), FP32)
    nisa.memset(dst=padded, value=0.0, engine=GPSIMD)
    nisa.activation(dst=padded[:, :, tile, :], op=nl.copy, data=mixed[:, 0])
    turned = psum((tokens * layout.value_heads, dv))
    matmul(padded, consts.value_identity, dst=turned, moving_onezero=True)
    deltas = sbuf((tokens * layout.value_heads, dv), FP32)
    nisa.activation(dst=deltas, op=nl.copy, data=turned)
    return deltas


def chunk_write(layout: TileLayout, ops: ChunkOperands, t: int, state: Any, deltas: Any,
                rows: Iterable[int] | None = None) -> None:  # fmt: skip
    """S ← γ_{T−1} S + Σ_t w_t k_t u_tᵀ on tile ``t`` of a block: one matmul per Dk row of a partition,
    contracting over the request's T·Hv (token, tile, head) rows (``writes`` against ``chunk_deltas``' rows, which
    are zero for every other tile), then per row the decay on the scalar engine and the add on the vector engine
    (``rows``: only those Dk rows of a partition, default all).

    ``scalar_tensor_tensor`` (decay and add in one instruction) is "equivalent to running two operations
    back-to-back", a ``tensor_scalar`` then a ``tensor_tensor`` ("nki.isa.scalar_tensor_tensor", SDK 2.33), and
    ``tensor_scalar`` runs on the scalar engine ("nki.isa.tensor_scalar", SDK 2.33): the same two fp32 roundings
    in the same order, the state's bits unchanged. The decay does not wait for the matmul, and the vector engine's
    add with one operand in PSUM costs N cycles against the fused instruction's 2N for fp32 (nki-cpu's
    COST_MODEL.md, the documented per-instruction costs): 0.13 µs a [128, 128] row instead of 0.27."""
    dv = layout.dv
    while ops.deferred:  # the write's stationaries among them (``prepare_chunk``)
        ops.deferred.pop(0)[1]()
    decay = ops.decay[:, t : t + 1]
    for lo in range(layout.rows) if rows is None else rows:
        piece = state[:, lo * dv : (lo + 1) * dv]
        decayed = sbuf((layout.partitions, dv), FP32)
        nisa.tensor_scalar(dst=decayed, data=piece, op0=nl.multiply, operand0=decay, engine=SCALAR)
        written = psum((layout.partitions, dv))
        matmul(ops.writes[:, lo, :], deltas, dst=written)
        nisa.tensor_tensor(dst=piece, data1=decayed, data2=written, op=nl.add)
