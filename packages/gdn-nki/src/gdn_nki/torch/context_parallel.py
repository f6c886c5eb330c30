"""Context parallelism: one long prompt's prefill split over the ranks of a ``torch.distributed`` process group.

Each rank holds a contiguous, equal slice of the packed tokens (FLA's ``build_cp_context`` split of the global
``cu_seqlens``); sequences may span rank boundaries, others lie within one rank. Per value head a segment of tokens
maps its entry state affinely (``gdn_ref.segments``): S_end = M·S₀ + L and o_t = o_t(from zero) + p_tᵀ S₀, where M
and p are the segment run with zero values from the identity state. So every rank, at once:

1. prefills its pieces (pass A): the first from zero when its sequence began on an earlier rank, every other from
   its own initial state (a row of ``initial_state``, or of a pool through ``state_indices``);
2. if its first piece continues a sequence, prefills that piece again with zero values from the identity state
   (pass B, Dv = Dk): the piece's transition M (the final state) and read-out p (the outputs);
3. exchanges one carry — the affine map from its first piece's entry state to the state it hands the next rank —
   with every rank of the group (``all_gather``: Hv·Dk·(Dk + Dv) fp32 per rank, whatever the tokens), composes the
   carries of the ranks its first sequence spans into its entry state S₀, and corrects: o += p S₀ on the first
   piece, its state M S₀ + L. Correcting, not prefilling the piece again from S₀: in nki-cpu's model the
   correction as an NKI kernel costs 28–34 % of a pass (bench/bench_context_parallel.py, PERFORMANCE.md).

Bad input is found on every rank before any collective (each rank's slice, its states and rows, its context's
group) and exchanged in a header, and the ranks vote after their kernels and again after their corrections, so a
failure anywhere raises on every rank before any pool row is written.

Both passes are the kernel as it is (``chunk_gated_delta_rule``): M comes from the kernel itself, as the final
state of its identity-state run, not from a kernel entry point of its own; so every gate it accepts — −inf resets, huge
gates — carries through exactly: a reset zeroes M and every later p. A sequence's final state comes back on the rank
where it ends (a pool row is written there, and only there, once every rank has finished); initial states work on
the rank where a sequence starts. Every collective runs under the group's timeout (``init_process_group(timeout=)``):
a rank that never arrives fails the others' call instead of hanging it.

On device tensors, and under ``torch.compile`` (``on_device``), the call reads no tensor value on the host: the
passes are the drop-in's op (the kernel), pool rows move by ``index_select`` / ``index_copy_`` with −1 masked, the
exchanges are functional collectives of fixed size (traced as graph nodes), and the ranks' agreement is a tensor
masking every write (``_device_call``). The value rules and the votes after the kernels stay the CPU path's.
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
from typing import Any

from gdn_ref.contract import ContractError, Violation, names_entry_point

from ..host.torch_io import check_states, import_torch, is_torch_tensor

torch = import_torch()
dist = torch.distributed
funcol = importlib.import_module("torch.distributed._functional_collectives")

# The keyword options both passes take as the caller gave them (the same q/k normalization and gates in both).
FORWARDED = ("use_qk_l2norm_in_kernel", "use_beta_sigmoid_in_kernel", "use_gate_in_kernel", "A_log", "dt_bias",
             "algorithm", "group_size")  # fmt: skip
CALLER = "gdn_nki.torch.context_parallel_chunk_gated_delta_rule"


@dataclasses.dataclass
class ContextParallel:
    """What one rank needs to know of a context-parallel layout (FLA's ``FLACPContext`` fields, and ours).

    Attributes:
        group: the process group the tokens are split over (one rank per slice, in rank order).
        cu_seqlens: [n + 1] int32, this rank's pieces in its own tokens (FLA's rank-local ``cu_seqlens``).
        cu_seqlens_cpu: the same on the CPU, int64.
        is_first_rank: this rank's first piece starts its sequence (FLA's name).
        pre_num_ranks: how many earlier ranks this rank's first sequence began before this one.
        is_last_rank: this rank's last piece ends its sequence (FLA's name).
        post_num_ranks: how many later ranks this rank's last sequence continues onto.
        first_sequence: the global index of this rank's first piece's sequence.
        tokens_per_rank: the slice every rank holds.
        layout: a fingerprint of the global ``cu_seqlens`` and the group's size this context was built from (every
            rank's must agree: ranks built from different boundaries would compose each other's carries wrongly).
        world: the group's size when the context was built (a call on a group of another size is refused).
        rank: this rank's place in that group.
        sequences: N, the batch's sequences (the length ``state_indices`` and a per-sequence ``initial_state`` have).
        sent_bytes: the bytes this rank sent in the collectives of its last call (the exchange is independent of
            the tokens; tests read it).
        pieces: ``cu_seqlens_cpu`` as Python ints (made from it when not given).
    """

    group: Any
    cu_seqlens: Any
    cu_seqlens_cpu: Any
    is_first_rank: bool
    pre_num_ranks: int
    is_last_rank: bool
    post_num_ranks: int
    first_sequence: int
    tokens_per_rank: int
    layout: int = 0
    world: int = 0
    rank: int = -1
    sequences: int = 0
    sent_bytes: int = 0
    pieces: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        # The boundaries as Python ints, read once here on the host: the call itself reads no tensor value.
        if not self.pieces:
            self.pieces = tuple(int(x) for x in self.cu_seqlens_cpu.tolist())

    @property
    def num_seqs(self) -> int:
        """The pieces on this rank."""
        return len(self.pieces) - 1


@names_entry_point("gdn_nki.torch.build_cp_context")
def build_cp_context(
    cu_seqlens: Any, group: Any, kernel_size: int | None = None, cu_seqlens_cpu: Any = None
) -> ContextParallel:
    """This rank's slice of a packed batch split evenly over ``group`` (FLA's ``build_cp_context``).

    Dimensions:
        N: sequences of the whole batch; T: its tokens, a multiple of the group's size W.

    Args:
        cu_seqlens (torch.Tensor): [N + 1] global boundaries, 0 = cu[0] < cu[1] < ... < cu[N] = T.
        group (ProcessGroup): the ranks the tokens are split over; rank r holds tokens [r·T/W, (r+1)·T/W).
        kernel_size: FLA's conv halo: rejected when set (no conv here).
        cu_seqlens_cpu (torch.Tensor | None): the same boundaries on the CPU (read instead of ``cu_seqlens``).

    Returns:
        ContextParallel: this rank's pieces and where its first and last sequences begin and end.
    """
    if kernel_size is not None:
        raise _rejection("kernel_size", f"= {kernel_size!r}", "a GDN context carries no conv halo", "omit it")
    host = (cu_seqlens if cu_seqlens_cpu is None else cu_seqlens_cpu).detach().to("cpu", torch.int64)
    bounds = [int(x) for x in host.tolist()]
    if len(bounds) < 2 or bounds[0] != 0 or any(b <= a for a, b in itertools.pairwise(bounds)):
        raise _rejection("cu_seqlens", f"= {bounds[:8]}", "cu_seqlens starts at 0 and increases strictly",
                         "pass the global boundaries of non-empty sequences")  # fmt: skip
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    total = bounds[-1]
    if total % world:
        raise _rejection("cu_seqlens", f"with {total} tokens", f"the tokens split evenly over the group's {world} "
                         "ranks", f"pad the batch to a multiple of {world} tokens")  # fmt: skip
    part = total // world
    start, end = rank * part, (rank + 1) * part
    first = max(i for i in range(len(bounds) - 1) if bounds[i] <= start)
    last = min(i for i in range(1, len(bounds)) if bounds[i] >= end) - 1
    local = [min(max(b, start), end) - start for b in bounds[first : last + 2]]
    first_rank, last_rank = bounds[first] // part, (bounds[last + 1] - 1) // part
    return ContextParallel(
        group=group,
        cu_seqlens=torch.tensor(local, dtype=torch.int32, device=cu_seqlens.device),
        cu_seqlens_cpu=torch.tensor(local, dtype=torch.int64),
        is_first_rank=first_rank == rank,
        pre_num_ranks=rank - first_rank,
        is_last_rank=last_rank == rank,
        post_num_ranks=last_rank - rank,
        first_sequence=first,
        tokens_per_rank=part,
        layout=hash((world, *bounds)),  # ints hash alike in every process (no hash randomization)
        world=world,
        rank=rank,
        sequences=len(bounds) - 1,
    )


def context_parallel_prefill(
    prefill: Any,
    q: Any,
    k: Any,
    v: Any,
    g: Any,
    beta: Any,
    cp_context: ContextParallel,
    scale: float | None = None,
    initial_state: Any = None,
    output_final_state: bool = False,
    state_indices: Any = None,
    caller_problem: Violation | None = None,
    **options: Any,
) -> tuple[Any, Any]:
    """This rank's share of a context-parallel prefill; every rank of ``cp_context.group`` calls it at once
    (``gdn_nki.torch.context_parallel_chunk_gated_delta_rule`` is this with ``chunk_gated_delta_rule``).

    Dimensions:
        L: this rank's tokens (the same on every rank). n: this rank's pieces. N: the batch's sequences. P: pool
        rows. Hk, Hv, K, V as ``chunk_gated_delta_rule`` (with tensor parallelism: this rank's heads).

    Args:
        prefill: ``chunk_gated_delta_rule`` (passed in: it calls back here with ``cp_context``).
        q, k, v, g, beta: this rank's tokens, seq-first [1, L, ·], as ``chunk_gated_delta_rule``.
        cp_context (ContextParallel): ``build_cp_context`` of the global ``cu_seqlens`` on this group.
        scale (float | None): query scaling; None = K ** -0.5.
        initial_state (torch.Tensor | None): [N, Hv, K, V] fp32, sequence i's initial state (read on the rank
            where i starts); with ``state_indices`` a [P, Hv, K, V] fp32 pool, its rows read where a sequence
            starts and written, in place, where it ends.
        output_final_state (bool): return the states after this rank's pieces.
        state_indices (torch.Tensor | None): [N] pool rows of the batch's sequences (−1: start from zero, store
            nothing).
        caller_problem (Violation | None): what the caller found wrong with this rank's own arguments: raised on
            every rank after the header exchange, not on this rank alone (which would leave the others waiting out
            the group's timeout).
        options: ``use_qk_l2norm_in_kernel``, ``use_beta_sigmoid_in_kernel``, ``use_gate_in_kernel``, ``A_log``,
            ``dt_bias``, ``algorithm``, ``group_size``, as ``chunk_gated_delta_rule``.

    Returns:
        tuple: ``o`` [1, L, Hv, V] in q's dtype — the single-rank prefill's output for these tokens — and, with
        ``output_final_state``, [n, Hv, K, V] fp32, the state after each piece's last token here (a sequence's final
        state on the rank where it ends; with a pool, the pool itself, updated), else None.

    Notes:
        A call completes on every rank or raises on every rank (``ContractError`` for bad input anywhere — a
        rank's slice, pool rows or states, a group of another size than the context's, or a value only one rank's
        kernel sees — naming the rank; ``RuntimeError`` when a rank failed otherwise, in its kernel or while
        correcting), with no pool row written on any rank: the ranks vote after their kernels and again before
        any row is written. The bytes sent do not grow with L: a header, one carry and two statuses
        (``cp_context.sent_bytes``).
    """
    unknown = sorted(set(options) - set(FORWARDED))
    if unknown and caller_problem is None:
        caller_problem = _violation(unknown[0], "given", f"context parallelism forwards only {', '.join(FORWARDED)}",
                                    "run bucketed, checkpointed or pool-reading calls without cp_context")  # fmt: skip
    context = cp_context
    context.sent_bytes = 0
    value_heads, dk, dv = v.shape[2], k.shape[3], v.shape[3]
    traced = on_device(q, k, v, g, beta, initial_state, state_indices)
    problem = caller_problem or _local_problem(q, v, context, initial_state, state_indices, (value_heads, dk, dv),
                                               traced)  # fmt: skip
    flag = 0 if problem is None else 1
    header = torch.tensor([q.shape[1], value_heads, dk, dv, flag, context.layout], dtype=torch.int64, device=q.device)
    call = (prefill, (q, k, v, g, beta), context, scale, initial_state, state_indices, options)
    if traced:
        return _device_call(call, header, problem, output_final_state)
    headers = _all_gather(context, header)
    _agree(context, headers, problem)
    other = [r for r, h in enumerate(headers) if int(h[5]) != int(headers[0][5])]
    if other:
        ranks = ", ".join(f"rank {r}" for r in other)
        raise _rejection("cu_seqlens", f"on {ranks} differs from rank 0's (or the group's size)", "every rank "
                         "builds its context from the same global cu_seqlens on the same group", "pass every rank "
                         "the whole batch's cu_seqlens; no rank ran or wrote anything")  # fmt: skip
    for name, column in (("tokens", 0), ("value heads", 1), ("K", 2), ("V", 3)):
        seen = sorted({int(h[column]) for h in headers})
        if len(seen) > 1:
            raise _rejection("q" if column < 3 else "v", f"with {name} {seen} across the ranks", "every rank of "
                             "the group holds the same number of tokens and heads", "split the batch with "
                             "build_cp_context and pass each rank its slice")  # fmt: skip

    failure, result = None, None
    try:
        result = _prefill_here(*call)
    except Exception as error:  # a rank's failure is every rank's: no rank commits, none hangs
        failure = _failure(context, error)
    carry = result[0] if result is not None else torch.zeros(value_heads, dk, dk + dv)
    carries = _all_gather(context, carry.float().contiguous())
    _settle(context, failure, "its prefill")
    try:
        out, states = _finished(context, result, carries, dk)
    except Exception as error:  # the same vote before any row is written
        failure = _failure(context, error)
    _settle(context, failure, "its correction")
    if not output_final_state:
        return out, None
    if state_indices is None:
        return out, states
    _write_rows(context, initial_state, state_indices, states)
    return out, initial_state


def on_device(*tensors: Any) -> bool:
    """Whether the call takes the device path: a tensor off the CPU, or a ``torch.compile`` trace (whose graph
    reads no value on the host, whatever the device)."""
    return torch.compiler.is_compiling() or any(is_torch_tensor(x) and x.device.type != "cpu" for x in tensors)


def _device_call(call: tuple, header: Any, problem: Violation | None, output_final_state: bool) -> tuple[Any, Any]:
    """The call on device tensors (or traced): no value read on the host. The header and the carries are exchanged
    as tensors of fixed size (functional collectives: one graph node each under ``torch.compile``); what the ranks
    agree on is a tensor, ``agreed``: with any rank's call bad (its flag, or its tokens, heads or layout unlike rank
    0's) no rank writes a row and every rank's outputs are NaN, while the bad rank raises its ContractError once it
    has taken part in both exchanges (so the others do not wait out the group's timeout). Under ``torch.compile`` a
    rank's own violation is found while tracing, before its graph (and its exchanges) runs: its peers then fail at
    the group's timeout, writing nothing. Row values (range, duplicates) are trusted, as on the other device paths.
    """
    _, tensors, context, _, initial_state, state_indices, _ = call
    v, k = tensors[2], tensors[1]
    value_heads, dk, dv = v.shape[2], k.shape[3], v.shape[3]
    headers = _gather(context, header)
    same = (headers == headers[:1]).all(0)
    agreed = same[:4].all() & same[5] & (headers[:, 4] == 0).all()
    if problem is not None:
        _gather(context, torch.zeros(value_heads, dk, dk + dv, device=v.device))
        raise ContractError([dataclasses.replace(problem, value=f"{problem.value} (on rank {context.rank}; no rank "
                                                 "wrote anything)")], CALLER)  # fmt: skip
    result = _prefill_here(*call)
    carries = _gather(context, result[0].float().contiguous())
    out, states = _finished(context, result, carries, dk)
    out = torch.where(agreed, out, torch.full_like(out, float("nan")))
    if not output_final_state:
        return out, None
    if state_indices is None:
        return out, torch.where(agreed, states, torch.full_like(states, float("nan")))
    _write_rows(context, initial_state, state_indices, states, agreed)
    return out, initial_state


def _write_rows(context: ContextParallel, pool: Any, state_indices: Any, states: Any, agreed: Any = None) -> None:
    """Each piece's final state to its pool row, in place, where its sequence ends here and its row is not −1 (and
    the ranks ``agreed``): one ``index_copy_`` of this rank's n rows, no value read on the host. A row not written
    (−1 taken as row 0, a sequence continuing on the next rank) is copied onto itself — unless a written row shares
    its target, whose new state it then carries too — so rows named twice always receive one value."""
    n = context.num_seqs
    rows = _local_rows(context, state_indices, pool.device)
    ends = torch.tensor([i < n - 1 or context.is_last_rank for i in range(n)], device=pool.device)
    keep = ends & (rows >= 0)
    if agreed is not None:
        keep = keep & agreed
    targets = rows.clamp(min=0)
    writer = keep[None, :] & (targets[None, :] == targets[:, None])  # [i, j]: piece j writes piece i's target
    written = writer.any(1).reshape(n, 1, 1, 1)
    source = writer.to(torch.int32).argmax(1)
    values = torch.where(written, states.index_select(0, source), pool.index_select(0, targets))
    pool.index_copy_(0, targets, values)


def _finished(context: ContextParallel, result: tuple, carries: Any, dk: int) -> tuple[Any, Any]:
    """This rank's outputs and piece states from the true entry state of its first piece (unchanged when its first
    piece starts its sequence)."""
    _, out, readout, transition, states = result
    if not context.is_first_rank:
        entry = _entry_state(context, carries, dk)
        out = _corrected(out, readout, entry)
        states[0] = transition @ entry + states[0]
    return out, states


def _failure(context: ContextParallel, error: Exception) -> tuple[str, Any]:
    """What this rank tells the others of its failure: a ContractError's violations (their sequences as the
    batch's indices, each marked with the rank), or any other error's text."""
    rank = dist.get_rank(context.group)
    if isinstance(error, ContractError):
        return "contract", [dataclasses.replace(
            v, value=f"{v.value} (on rank {rank})",
            sequence=None if v.sequence is None else context.first_sequence + v.sequence,
        ) for v in error.violations]  # fmt: skip
    return "error", f"{type(error).__name__}: {error}"


def _settle(context: ContextParallel, failure: tuple[str, Any] | None, stage: str) -> None:
    """Every rank's vote on ``stage``: raise on every rank when any rank failed it — a ContractError carrying the
    violations when every failure was one, else a RuntimeError naming each failed rank — before any row is written."""
    status = _all_gather(context, torch.tensor([0 if failure is None else 1], dtype=torch.int64))
    if not any(int(s) for s in status):
        return
    failures = {r: f for r, f in enumerate(_all_gather_objects(context, failure)) if f is not None}
    if all(kind == "contract" for kind, _ in failures.values()):
        raise ContractError([v for _, violations in failures.values() for v in violations], CALLER)
    named = "; ".join(f"rank {r}: {detail if kind == 'error' else ContractError(detail)}"
                      for r, (kind, detail) in failures.items())  # fmt: skip
    raise RuntimeError(f"{CALLER}: a rank failed in {stage}, so no rank wrote its pool rows ({named})")


def _corrected(out: Any, readout: Any, entry: Any) -> Any:
    """``out`` with the first piece's outputs read from its true entry state: o_t += p_tᵀ S₀, in fp32, rounded once."""
    length = readout.shape[0]
    first = out[0, :length].float() + torch.einsum("thk,hkv->thv", readout.float(), entry)
    out = out.clone()
    out[0, :length] = first.to(out.dtype)
    return out


def _prefill_here(prefill, tensors, context, scale, initial_state, state_indices, options) -> tuple:
    """This rank's two passes: (carry [Hv, K, K + V], out, readout [len₀, Hv, K], M [Hv, K, K], states [n, Hv, K, V]).
    Every tensor made here is made on q's device; ``prefill`` is the drop-in (its op on a device)."""
    q, k, v, g, beta = tensors
    value_heads, dk, dv = v.shape[2], k.shape[3], v.shape[3]
    entry = _initial_states(context, initial_state, state_indices, (value_heads, dk, dv), q.device)
    out, states = prefill(q, k, v, g, beta, scale, initial_state=entry, output_final_state=True,
                          cu_seqlens=context.cu_seqlens.to(q.device), **options)  # fmt: skip
    readout = transition = None
    if not context.is_first_rank:  # pass B over the first piece: zero values from the identity state
        length = context.pieces[1]
        first = [x[:, :length] for x in (q, k, g, beta)]
        zeros = torch.zeros(1, length, value_heads, dk, dtype=v.dtype, device=v.device)
        identity = torch.eye(dk, device=q.device).expand(1, value_heads, dk, dk).contiguous()
        p, m = prefill(first[0], first[1], zeros, first[2], first[3], scale, initial_state=identity,
                       output_final_state=True, **options)  # fmt: skip
        readout, transition = p[0], m[0]
    # The carry: the map from the first piece's entry state to the state handed to the next rank. Only a rank
    # whose one piece spans it passes the entry state on (M, L); any other hands on its last piece's state (0, L).
    spans = context.num_seqs == 1 and not context.is_first_rank
    carry_m = transition if spans else torch.zeros(value_heads, dk, dk, device=q.device)
    carry = torch.cat([carry_m, states[-1]], dim=-1)
    return carry, out, readout, transition, states


def _entry_state(context: ContextParallel, carries: Any, dk: int) -> Any:
    """The first piece's true entry state: the carries of the ranks its sequence spans, composed in order."""
    rank = dist.get_rank(context.group)
    entry = None
    for source in range(rank - context.pre_num_ranks, rank):
        m, state = carries[source][..., :dk], carries[source][..., dk:]
        entry = state if entry is None else m @ entry + state
    return entry


def _initial_states(context: ContextParallel, initial_state: Any, state_indices: Any, tail: tuple, device: Any) -> Any:
    """[n, Hv, K, V] fp32: each piece's state to start from here (zero for a continued first piece or a −1 row),
    gathered by tensor ops (a pool's rows by ``index_select``, −1 masked)."""
    n = context.num_seqs
    zeros = torch.zeros(n, *tail, device=device)
    if initial_state is None:
        return zeros
    read = torch.tensor([i > 0 or context.is_first_rank for i in range(n)], device=device)
    if state_indices is None:
        first = context.first_sequence
        taken = initial_state[first : first + n].to(torch.float32)
    else:
        rows = _local_rows(context, state_indices, device)
        read = read & (rows >= 0)
        taken = initial_state.index_select(0, rows.clamp(min=0)).to(torch.float32)
    return torch.where(read.reshape(n, 1, 1, 1), taken, zeros)


def _local_rows(context: ContextParallel, state_indices: Any, device: Any) -> Any:
    """[n] int64 on ``device``: the pool rows of this rank's pieces (a slice of the batch's, no value read)."""
    first = context.first_sequence
    return state_indices[first : first + context.num_seqs].to(device=device, dtype=torch.int64)


def _local_problem(
    q: Any,
    v: Any,
    context: ContextParallel,
    initial_state: Any,
    state_indices: Any,
    tail: tuple[int, int, int],
    traced: bool = False,
) -> Violation | None:
    """What is wrong with this rank's part of the call, found before any collective (None: nothing); ``traced``: the
    rules that read no value only (the device path)."""
    world, rank = dist.get_world_size(context.group), dist.get_rank(context.group)
    if context.world and (world, rank) != (context.world, context.rank):
        return _violation("cp_context", f"built as rank {context.rank} of a group of {context.world}, called as rank "
                          f"{rank} of {world}", "the call runs on the group its context was built on",
                          "build the context with build_cp_context(cu_seqlens, group) on the call's group")  # fmt: skip
    if q.shape[0] != 1 or q.shape[1] != context.tokens_per_rank:
        total = context.tokens_per_rank * world
        split = (f", a slice of the batch's {total} tokens for {total // q.shape[1]} ranks on a group of {world}"
                 if q.shape[0] == 1 and 0 < q.shape[1] and total % q.shape[1] == 0 else "")  # fmt: skip
        return _violation("q", f"of shape {tuple(q.shape)}{split}", f"each rank holds [1, {context.tokens_per_rank}, "
                          f"...]: build_cp_context's slice of the batch over the group's {world} ranks",
                          "build the context on the group the tokens are split over and pass each rank its slice")  # fmt: skip
    if state_indices is not None and initial_state is None:
        return _violation("state_indices", "given without a pool", "state_indices name rows of the pool passed as "
                          "initial_state", "pass the pool as initial_state, or no state_indices")  # fmt: skip
    return None if initial_state is None else _state_problem(context, initial_state, state_indices, tail, traced)


def _state_problem(
    context: ContextParallel, initial_state: Any, state_indices: Any, tail: tuple, traced: bool = False
) -> Violation | None:
    """What is wrong with the states (one per sequence, or a pool and its rows), checked on every rank before any
    collective: a row is written on the rank where its sequence ends, which may not be where it was read. The
    single-rank call's rules of types and shapes, then the rows: the whole batch's, each −1 or a distinct row."""
    try:
        check_states(initial_state, state_indices, context.sequences, tail, any_device=traced)
    except ContractError as error:
        return error.violations[0]
    if state_indices is None:
        return None
    n = context.sequences
    if not is_torch_tensor(state_indices) or tuple(state_indices.shape) != (n,):
        found = f"{type(state_indices).__name__} of shape {tuple(getattr(state_indices, 'shape', ()))}"
        return _violation("state_indices", found, f"an integer [{n}] tensor: one pool row per sequence of the batch",
                          "pass the whole batch's rows (-1: none) on every rank")  # fmt: skip
    if traced:  # the row values are trusted on a device, as by the other device paths
        return None
    rows = state_indices.detach().to("cpu").tolist()
    pool = initial_state.shape[0]
    bad = [(i, row) for i, row in enumerate(rows) if not -1 <= row < pool]
    if bad:
        return _violation("state_indices", f"[{bad[0][0]}] = {bad[0][1]} ({len(bad)} outside)", f"each row is -1 "
                          f"or one of the pool's {pool} rows", f"use rows in [0, {pool}) or -1")  # fmt: skip
    live = [row for row in rows if row >= 0]
    repeated = sorted({row for row in live if live.count(row) > 1})
    if repeated:
        return _violation("state_indices", f"naming rows {repeated} twice", "each sequence writes its final state "
                          "to its own row: the rows must be distinct", "give every sequence its own row, or -1")  # fmt: skip
    return None


def _agree(context: ContextParallel, headers: list[Any], problem: Violation | None) -> None:
    """Raise on every rank when any rank found its part of the call wrong: one ContractError with every rank's
    violation, each marked with its rank."""
    if not any(int(h[4]) for h in headers):
        return
    problems = _all_gather_objects(context, problem)
    raise ContractError([dataclasses.replace(v, value=f"{v.value} (on rank {r}; no rank ran or wrote anything)")
                         for r, v in enumerate(problems) if v is not None], CALLER)  # fmt: skip


def _all_gather(context: ContextParallel, tensor: Any) -> list[Any]:
    """``dist.all_gather`` of one tensor per rank, its bytes counted in ``context.sent_bytes``."""
    gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size(context.group))]
    try:
        dist.all_gather(gathered, tensor, group=context.group)
    except RuntimeError as error:  # gloo's timeout or a peer gone: name what the caller can act on
        raise RuntimeError(f"{CALLER}: a rank of the group did not reach the exchange within the group's timeout "
                           f"(init_process_group(timeout=)) or left the group; no rank wrote its pool rows ({error})") from error  # fmt: skip
    context.sent_bytes += tensor.numel() * tensor.element_size()
    return gathered


def _gather(context: ContextParallel, tensor: Any) -> Any:
    """[W, ...]: every rank's ``tensor`` stacked in rank order, by a functional collective (``all_gather_single``:
    traced by ``torch.compile`` as one graph node, no host read), its bytes counted in ``context.sent_bytes``."""
    world = dist.get_world_size(context.group)
    gathered = funcol.all_gather_single(tensor, 0, context.group)
    context.sent_bytes += tensor.numel() * tensor.element_size()
    return gathered.reshape(world, *tensor.shape)


def _all_gather_objects(context: ContextParallel, value: Any) -> list[Any]:
    """Every rank's message (only after a failure: the happy path sends tensors of fixed size)."""
    gathered: list[Any] = [None] * dist.get_world_size(context.group)
    dist.all_gather_object(gathered, value, group=context.group)
    return gathered


def _violation(argument: str, value: str, rule: str, fix: str) -> Violation:
    return Violation(f"context_parallel.{argument}", argument, value, rule, fix, api=CALLER)


def _rejection(argument: str, value: str, rule: str, fix: str) -> ContractError:
    return ContractError([_violation(argument, value, rule, fix)])
