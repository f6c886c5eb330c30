"""``gdn_conv_step``: the causal depthwise conv1d of a GatedDeltaNet layer's decode / verify step on a conv-state
pool addressed on device (``gdn_ref.conv.causal_conv1d_decode_pool``).

N requests × T new tokens each, C channels (q|k|v), kernel width W, a pool [P, C, L] of windows (the last L >= W − 1
inputs of each request, channel-major, oldest first: vLLM's and HF's ``[.., dim, state_len]``) updated in place.
Rows are addressed exactly as ``tkg.step`` addresses the recurrent state pool, so one set of indices and one
``num_accepted_tokens`` roll both states back:

- ``state_indices`` [N]: request n reads row ``state_indices[n]`` and writes its window after the T tokens there;
- [N, T]: the window after token t goes to row ``[n, t]``; the request reads row ``[n, num_accepted_tokens[n] − 1]``
  (``[n, 0]`` without it);
- [N] with ``num_accepted_tokens`` (vLLM's in-row form, ``gdn_ref.conv``): request n's row holds
  L >= W − 2 + T inputs; the taps read its window from offset o = num_accepted_tokens[n] − 1, and the row's first
  W − 2 + T entries are written back as entries o + 1 .. o + W − 2, then the T tokens (vLLM's kernel's state length;
  a longer row's later entries stay as they were). The offset is device data: the row's load is addressed at
  row · C · L + o (one run-time ``scalar_offset``, "NKI Scalar Values": + and * of scalars, SDK 2.33) and moves
  each partition's run of the row shifted by o (``_shifted_row``), so channel f's entries o .. o + L − T land
  first in its L slots — all the step reads, in one run per partition;
- −1 is padding: every pool transfer it addresses is skipped by the DMA (``oob_mode.skip``, "nki.isa.dma_copy",
  SDK 2.33) and its outputs are zeros: act(0 · sum), the activation's per-partition scale set from a per-group
  live mask (``_live_mask``), so every request's row of ``out`` is written without a row to look up. That holds
  while the request's x is finite (0 · inf is NaN): the host scans x unless told not to.

Layout: a request's data lives on ``PARTITIONS_PER_REQUEST`` (16) partitions, channel c = s·F + f on partition s of
them (F = C / 16 consecutive channels per partition), so ``REQUESTS_PER_GROUP`` (8) requests fill the 128 partitions
and every instruction works on 8 requests at once. Each partition's share of a pool row is one run of F·L elements
(3 KiB for bf16 at C = 8192, L = 3) and of a token's inputs one run of F (1 KiB): DMA efficiency rises with
contiguous bytes per descriptor (docs/nki-sources.md §4.4), and a layout with the 128 channels of a tile on
partitions would move each request's elements in runs of L or 1 (6 or 2 bytes). Depthwise: each channel is
independent, so any channel-to-partition map works as long as inputs, taps, windows and outputs share it.

All arithmetic is fp32 (the DMA widens bf16 inputs and the activation narrows the output), as HF's fallback computes
in the weight's dtype and vLLM's kernels accumulate in fp32. The sums run on the tensor engine (0/1 matmuls against
the identity accumulating in PSUM, ``OUTPUTS_ON_PE``) beside the vector engine's reduce, the same fold either way. Up to ``TRIPS_PER_ITERATION`` trips of the group
pipeline run unrolled; past that, as a compiled loop of such bodies (``nl.fori_loop``, SDK 2.33), so the program
stops growing with N; one compiled program per (N, T).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gdn_ref.contract import Violation
from gdn_ref.conv_rules import CONV_STEP, conv_step_violations

from ..common.backend import nisa, nki, nl
from ..common.engines import GPSIMD, SCALAR, VECTOR
from ..common.kernel_assert import assert_valid_call, kernel_assert
from ..common.pool_rows import PoolRows
from ..common.request_rows import accepted_offsets, entry, request_rows
from ..common.tiles import FP32, matmul, psum, sbuf

PARTITIONS_PER_REQUEST = 16  # runs of 1 KiB (x, out) and 3 KiB (windows) per partition at C = 8192, bf16
REQUESTS_PER_GROUP = 128 // PARTITIONS_PER_REQUEST


@nki.jit
def gdn_conv_step(
    x: Any,
    conv_pool: Any,
    weight: Any,
    bias: Any,
    state_indices: Any,
    num_accepted_tokens: Any = None,
    activation: str | None = "silu",
    out_parts: tuple[Any, ...] | None = None,
    state_row_stride: int | None = None,
    state_len: int | None = None,
    row_tables: RowTables | None = None,
) -> tuple[Any, Any]:
    """Convolve T new tokens of N requests, each from its window in a conv-state pool, and store the windows.

    Dimensions:
        N: requests. T: new tokens each. C: channels, a multiple of 16. W: kernel width, 2..5. L >= W − 1: the
        inputs a window holds. P: pool rows.

    Args:
        x (nl.NkiTensor): [N, T, C] @ HBM, float32 or bfloat16, token-major (as the projections give it).
        conv_pool (nl.NkiTensor): [P, C, L] @ HBM, x's dtype (windows hold inputs: exact), MUTABLE: only rows named
            by live requests are read or written.
        weight (nl.NkiTensor): [C, W] @ HBM fp32 or bf16; tap W − 1 multiplies the current token.
        bias (nl.NkiTensor): [C] @ HBM fp32 or bf16, or None.
        state_indices (nl.NkiTensor): [N] or [N, T] int32 @ HBM: pool rows (module docstring); −1 = padding.
        num_accepted_tokens (nl.NkiTensor): optional [N] int32 @ HBM: with [N, T] indices the row to resume from;
            with [N] indices the offset in the row (vLLM's in-row form, L >= W − 2 + T).
        activation (str | None): "silu" (Qwen3-Next) or None.
        out_parts (tuple[nl.NkiTensor, ...] | None): optional HBM tensors [N, T, ...] in x's dtype, written instead
            of ``out``: the channels in order, C_i (the product of part i's trailing dimensions) each, summing to C,
            each a multiple of C / 16 (``split_parts``): the fused block's q, k and v, which would otherwise be
            copied out of ``out``.
        state_row_stride, state_len (int): trace-time; the pool's rows lie ``state_row_stride`` elements apart, each
            a dense [C, L = state_len] (vLLM's hybrid cache, ``common.pool_rows``): ``conv_pool`` is then the pool's
            span, 1-D of (P − 1)·state_row_stride + C·L elements, of which only the named rows are read or written.
        row_tables (RowTables | None): optional, the launch's row tables made earlier by ``conv_row_tables`` on the
            same indices and shapes (the fused block makes them before its in_proj, whose stores would otherwise
            hold their DMA); None: made here, first.

    Returns:
        tuple: ``out`` [N, T, C] in x's dtype (zeros for padding requests; ``out_parts`` when given) and
        ``conv_pool`` (the same buffer).

    Notes:
        Trace-time rules (``gdn_ref.conv_rules.conv_step_violations``) stop the trace before anything is allocated;
        the index values are device data: ``gdn_nki.conv_decode_step`` checks them on the host first.
    """
    pool = PoolRows.of(conv_pool, state_row_stride, (x.shape[-1], state_len))
    assert_valid_call(
        conv_step_violations(x, pool.view, weight, bias, state_indices, num_accepted_tokens, activation)
        or step_sbuf_violations(x, pool.view, weight, bias, state_indices)
    )
    n_req, tokens, channels = x.shape
    state_len, width = pool.view.shape[2], weight.shape[1]
    per_part = channels // PARTITIONS_PER_REQUEST
    per_token = len(state_indices.shape) == 2
    in_row = num_accepted_tokens is not None and not per_token
    out = out_parts or (nl.ndarray((n_req, tokens, channels), dtype=x.dtype, buffer=nl.shared_hbm),)
    widths = tuple(_row_width(part) // tokens for part in out)
    kernel_assert(split_parts(channels, widths) and all(part.shape[:2] == (n_req, tokens) for part in out),
                  f"out_parts of widths {widths} must be [N, T, ...] = [{n_req}, {tokens}, ...] and sum to "
                  f"C = {channels} in multiples of C / 16 = {per_part}. Fix: parts of whole partitions, or None")  # fmt: skip

    groups, sets, trips = _launch_plan(x, pool.view, weight, per_token, in_row)
    # Group g's slot j is request j·G + g (G: the groups the launch runs): slot j's requests are consecutive, so
    # each slot's flags are one contiguous run of the index tensor (``_live_mask``). Requests past N have −1 rows
    # and are outside x and out: their transfers are skipped.
    total = trips * sets
    if row_tables is not None:
        kernel_assert(row_tables.groups == total, f"row_tables made for {row_tables.groups} groups, this launch runs "
                      f"{total}. Fix: make them by conv_row_tables on this call's tensors")  # fmt: skip
    first_rows = _first_rows(state_indices, n_req, total) if row_tables is None else row_tables.first_rows
    whole, channels, sum_banks, on_vector, gpsimd_channels = _engine_plan(tokens, per_part, width, sets, per_token,
                                                                          biased=bias is not None)  # fmt: skip
    # The vector engine's products read the taps from PSUM: the banks their spread wrote, kept.
    psum_taps: list[tuple[int, Any]] | None = [] if on_vector < tokens else None
    taps, bias_column = _constants(weight, bias, per_part, psum_taps)
    if row_tables is None:
        rows = _read_rows(state_indices, num_accepted_tokens, n_req, tokens, total, pool.view.shape[0], in_row)
    else:
        rows = row_tables.rows
    identity = _identity()
    summed_on_pe = (identity, whole, channels, sum_banks)
    multiplied_on_vector = (psum_taps, on_vector, gpsimd_channels) if psum_taps is not None else None
    # The first set's tiles zeroed on GpSimd while it waits for the indices; the others' on the vector engine, so
    # GpSimd's row loads (the first loads wait on them) queue behind one set's memsets, not every set's.
    tile_sets = [_TileSet(x.dtype, per_part, tokens, state_len, width, per_token, bias_column, summed_on_pe=summed_on_pe,
                          clear=GPSIMD if s == 0 else VECTOR, multiplied_on_vector=multiplied_on_vector,
                          in_row=in_row)
                 for s in range(sets)]  # fmt: skip
    live = _live_mask(first_rows, total) if row_tables is None else row_tables.live
    shape = (tokens, _kept_length(state_len, width, tokens, in_row), width)
    accepted = num_accepted_tokens is not None and not in_row  # the read row from ``request_rows``' second tile

    made: dict[int, list[_Slot]] = {}

    def slots_of(g: Any) -> list[_Slot]:
        # An unrolled group's slots are made once, so its store reuses the row its load read ([N] rows: the same
        # row), one `scalar_load` a request less on GpSimd, which the stores' DMA queues wait on (N = 64: 30.9 ->
        # 29.2 us). The value stays live until the store, up to ``sets`` groups later (at most 32 rows at once).
        if not isinstance(g, int):
            return [_Slot(rows, g, j, total, tokens, per_token, accepted, in_row) for j in range(REQUESTS_PER_GROUP)]
        if g not in made:
            made[g] = [_Slot(rows, g, j, total, tokens, per_token, accepted, in_row) for j in range(REQUESTS_PER_GROUP)]
        return made[g]

    # A software pipeline of ``sets`` groups: a group's loads are issued right after the group ``sets`` places
    # before it in the same tile set is convolved, so the DMA moves one group while the engines convolve the others.
    for s, tile_set in enumerate(tile_sets):
        tile_set.load(x, pool, slots_of(s))

    def iteration(i: Any, ahead: bool = True) -> None:
        for s, tile_set in enumerate(tile_sets):
            g = i * sets + s
            if ahead and tokens > 1:
                # The next loads' rows first: their `scalar_load`s (GpSimd) behind this group's products held the
                # loads, and the DMA idled (N = 64, T = 4: 57.3 -> 57.0 us; T = 1 gains nothing: unchanged).
                for slot in slots_of(g + sets):
                    slot.read_row()
            tile_set.convolve(taps, _column(live, g), shape, activation)
            if ahead:  # before the stores: a DMA queue is in order, and a store waits for the group's arithmetic
                tile_set.load(x, pool, slots_of(g + sets))
            tile_set.store(out, pool, slots_of(g))

    # Every trip but the last loads the next one's groups; the last, unrolled, loads nothing (its groups would be
    # past the launch's, and the slot map would make them other groups' requests). The others run
    # TRIPS_PER_ITERATION to a compiled-loop iteration: every iteration boundary drains the engines and costs a
    # barrier (nki-cpu COST_MODEL.md item 6; "NKI Dynamic Loops"), which the pipeline's groups would otherwise
    # overlap; the rest, fewer than a body, unrolled.
    looped = (trips - 1) // TRIPS_PER_ITERATION if trips - 1 > TRIPS_PER_ITERATION else 0

    def body(i: Any) -> None:  # TRIPS_PER_ITERATION trips, their slots' rows from one window (``_RowWindow``)
        base = i * (TRIPS_PER_ITERATION * sets)
        window = _RowWindow(rows, base, total, (TRIPS_PER_ITERATION + 1) * sets, tokens, per_token, accepted,
                            in_row)  # fmt: skip
        for k in range(TRIPS_PER_ITERATION):
            for s, tile_set in enumerate(tile_sets):
                local = k * sets + s
                tile_set.convolve(taps, _column(live, base + local), shape, activation)
                tile_set.load(x, pool, window.slots(local + sets))
                tile_set.store(out, pool, window.slots(local))

    if looped:
        nl.fori_loop(0, looped, body)
    for k in range(looped * TRIPS_PER_ITERATION, trips - 1):
        iteration(k)
    last = trips - 1
    if _drains_in_runs(tile_sets[0], tokens):
        for s, tile_set in enumerate(tile_sets):
            g = last * sets + s
            tile_set.convolve_and_store(out, pool, slots_of(g), taps, _column(live, g), shape, activation)
    elif groups == 1 and MULTI_TOKEN_RUNS > 1:  # nothing to overlap a lone group's drain: its channels in runs
        tile_sets[0].convolve_in_runs(out, pool, slots_of(0), taps, _column(live, 0), shape, activation)
    else:
        iteration(last, ahead=False)
    return (out if out_parts else out[0]), conv_pool


@dataclass(frozen=True)
class RowTables:
    """A launch's row tables, made before its work: each slot's indices on its partitions (``_first_rows``), the
    live mask (``_live_mask``) and ``request_rows``' tiles (with the in-row offsets when vLLM's in-row form)."""

    groups: int
    first_rows: Any
    live: Any
    rows: tuple[Any, ...]


def conv_row_tables(
    x: Any,
    conv_pool: Any,
    weight: Any,
    state_indices: Any,
    num_accepted_tokens: Any = None,
) -> RowTables:
    """The row tables ``gdn_conv_step`` would make first, made now (for a caller with other work to overlap them).

    Dimensions:
        N, T, C, W, L, P: as ``gdn_conv_step``'s.

    Args:
        x (nl.NkiTensor): [N, T, C], the conv's input (its shape and dtype only: nothing is read).
        conv_pool (nl.NkiTensor): [P, C, L], the pool as ``gdn_conv_step`` will be given it (shape only).
        weight (nl.NkiTensor): [C, W] (shape only).
        state_indices, num_accepted_tokens (nl.NkiTensor): as ``gdn_conv_step``'s; read now.

    Returns:
        RowTables: to pass as ``gdn_conv_step``'s ``row_tables`` with the same tensors.

    Notes:
        The same instructions ``gdn_conv_step`` issues without them, in the same order among themselves.
    """
    n_req, tokens = x.shape[:2]
    per_token = len(state_indices.shape) == 2
    in_row = num_accepted_tokens is not None and not per_token
    _, sets, trips = _launch_plan(x, conv_pool, weight, per_token, in_row)
    total = trips * sets
    first_rows = _first_rows(state_indices, n_req, total)
    rows = _read_rows(state_indices, num_accepted_tokens, n_req, tokens, total, conv_pool.shape[0], in_row)
    return RowTables(total, first_rows, _live_mask(first_rows, total), rows)


def _launch_plan(x: Any, pool: Any, weight: Any, per_token: bool, in_row: bool) -> tuple[int, int, int]:
    """(groups of requests, tile sets, pipeline trips) of a launch."""
    n_req, tokens, channels = x.shape
    state_len, width = pool.shape[2], weight.shape[1]
    per_part = channels // PARTITIONS_PER_REQUEST
    groups = -(-n_req // REQUESTS_PER_GROUP)
    longer_rows = in_row and state_len > _kept_length(state_len, width, tokens, in_row)  # ``_TileSet.rows_as_read``
    set_bytes = _set_bytes(x, per_part, tokens, state_len, width, per_token, longer_rows)
    sets = _tile_sets(groups, max(1, SET_BUDGET // set_bytes))
    return groups, sets, -(-groups // sets)


def _read_rows(state_indices: Any, num_accepted_tokens: Any, n_req: int, tokens: int, total: int, pool_rows: int,
               in_row: bool) -> tuple[Any, ...]:  # fmt: skip
    """``request_rows``' tiles for ``total`` groups' slots, then (vLLM's in-row form) each request's offset."""
    slots = total * REQUESTS_PER_GROUP
    rows = request_rows(state_indices, None if in_row else num_accepted_tokens, n_req, tokens, slots, pool_rows,
                        outputs=False)  # fmt: skip
    if in_row:  # the rows, then each request's offset in its row
        rows = (*rows, accepted_offsets(num_accepted_tokens, n_req, tokens, slots))
    return rows


BANK = 512  # fp32 columns of one PSUM bank: a matmul's largest moving free size (docs/nki-sources.md §2.9)
# SBUF bytes per partition the tile sets may take (of 212,984 usable: docs/nki-sources.md §2.9), the rest for the
# constants; verification with every token's window kept at T = 4 fits two sets.
SET_BUDGET = 160 * 1024
TILE_SETS = 4  # the most groups in flight
PREFERRED_SETS = 3  # loads of one beside the products of the next and the sums of a third
# Trips of the pipeline (TILE_SETS groups each) a compiled-loop iteration runs; a launch of at most this many
# trips before its last runs unrolled (PERFORMANCE.md, "Decode speed": the loop's barriers against program size).
TRIPS_PER_ITERATION = 16


# T: outputs summed on the tensor engine, the first ones (a fraction: that share of the next one's channels), the
# others by the vector engine's reduce; T - 1 where absent. T = 4: 2 + 11/16 balances the two once the taps' spread
# banks serve the vector engine's products (no copy of the taps into PSUM): N = 64 / 256 61.6 / 206.8 us against
# 62.2 / 210.7 at 2.75 (PERFORMANCE.md, "Decode speed", item 11).
OUTPUTS_ON_PE = {1: 1, 2: 1, 4: 2.6875}
# The same with [N, T] rows (every token's window kept): 2.6875 there cost N = 256 309.0 -> 309.1 us.
OUTPUTS_ON_PE_EVERY_WINDOW = {4: 2.75}
PRODUCTS_ON_VECTOR = {}  # T: outputs whose products the vector engine forms (the others' GpSimd); 1 where absent
# Without a bias (Qwen3-Next's conv: ``bias=False``) a sum has W terms, not W + 1: the PE's share and the vector
# engine's products (the last outputs', a fraction: that share of the output before them, its last channels)
# retuned for it (PERFORMANCE.md, "Decode speed", item 12).
# T = 4: 2 + 13/16 outputs summed on the PE, 1 + 7/16 multiplied on the vector engine (N = 64 / 256 60.9 / 206.0 ->
# 57.3 / 202.0 us; the biased plan's 2.6875 and 1 left GpSimd binding; a flat optimum: PE 2.8125-3.0 and vector
# 1.25-1.4375 all give 57.0-57.6).
OUTPUTS_ON_PE_NO_BIAS = {4: 2.8125}
PRODUCTS_ON_VECTOR_NO_BIAS = {4: 1.4375}


PSUM_BANKS = 8  # [128, 512] fp32 each (docs/nki-sources.md §2.9)


def _engine_plan(
    tokens: int, per_part: int, width: int, sets: int, per_token: bool = False, biased: bool = True
) -> tuple[int, int, int, int, int]:
    """(whole outputs summed on the PE, the next output's channels summed there, PSUM banks a tile set sums in, the
    first output multiplied on the vector engine, that output's channels still multiplied on GpSimd) within PSUM's
    8 banks: the taps' banks when the vector engine multiplies (the banks their spread wrote, ``_replicated``), then
    up to 2 sum banks a set (the outputs take them in turn); with no room for the taps every product stays on
    GpSimd, and with more channels a partition than a bank holds every sum on the vector engine. ``per_token``:
    [N, T] rows; ``biased``: the conv has a bias (a term of every sum)."""
    if per_part > BANK:
        return 0, 0, 0, tokens, 0
    on_pe, on_vector = _split(tokens, per_token, biased)
    whole, channels = _whole_and_channels(on_pe, per_part)
    vector_from, gpsimd_channels = _whole_and_channels(on_vector, per_part)
    wanted = min(2, whole + (channels > 0))
    tap_banks = -(-per_part // max(1, BANK // width)) if vector_from < tokens else 0
    if tap_banks + sets * min(1, wanted) > PSUM_BANKS:
        tap_banks, vector_from, gpsimd_channels = 0, tokens, 0
    banks = min(wanted, (PSUM_BANKS - tap_banks) // sets)
    return whole, channels, banks, vector_from, gpsimd_channels


def _whole_and_channels(outputs: float, per_part: int) -> tuple[int, int]:
    """A share of outputs as (whole outputs, channels of the next one); a narrow C rounds a share up to the whole
    output."""
    whole, channels = int(outputs), round((outputs - int(outputs)) * per_part)
    return (whole + 1, 0) if channels == per_part else (whole, channels)


def _split(tokens: int, per_token: bool = False, biased: bool = True) -> tuple[float, float]:
    """(outputs summed on the PE, the first output multiplied on the vector engine: a fraction from that share of
    its channels on) for T tokens (``per_token``: [N, T] rows; ``biased``: a bias term in every sum)."""
    on_pe = (OUTPUTS_ON_PE_EVERY_WINDOW if per_token else {}).get(tokens, OUTPUTS_ON_PE.get(tokens, tokens - 1))
    on_vector = PRODUCTS_ON_VECTOR.get(tokens, 1 if tokens > 2 else 0)
    if not biased and not per_token:
        on_pe = OUTPUTS_ON_PE_NO_BIAS.get(tokens, on_pe)
        on_vector = PRODUCTS_ON_VECTOR_NO_BIAS.get(tokens, on_vector)
    return on_pe, tokens - on_vector


def _tile_sets(groups: int, fit: int) -> int:
    """Groups in flight: of the counts from 2 that SBUF fits (up to ``TILE_SETS``), the one that pads the launch with
    the fewest groups past N (whole trips), nearest ``PREFERRED_SETS`` on a tie: N = 64 (8 groups) on 3 sets ran a
    ninth group of padding, 1/9 of the launch."""
    most = min(TILE_SETS, groups, fit)
    counts = range(min(2, most), most + 1)  # one set only when one fits or runs: it overlaps nothing
    return min(counts, key=lambda s: (-(-groups // s) * s, abs(s - PREFERRED_SETS), -s))


def _identity() -> Any:
    """[128, 128] fp32 identity: the stationary of the PE's sums (``_sum_on_pe``)."""
    diagonal = sbuf((128, 128), FP32)  # column − partition
    nisa.iota(dst=diagonal, pattern=[[1, 128]], offset=0, channel_multiplier=-1)
    identity = sbuf((128, 128), FP32)
    nisa.tensor_scalar(dst=identity, data=diagonal, op0=nl.equal, operand0=0.0)
    return identity


def _set_bytes(x: Any, per_part: int, tokens: int, state_len: int, width: int, per_token: bool,
               rows_as_read: bool = False) -> int:  # fmt: skip
    """SBUF bytes per partition of one ``_TileSet`` (``rows_as_read``: with its in-row rows as read)."""
    io = _io_bytes(x.dtype)
    kept = tokens + rows_as_read if per_token else 1 + rows_as_read
    return per_part * (state_len * io + 2 * tokens * io + tokens * (width + 1) * 4 + tokens * 4 + kept * state_len * io)


def _io_bytes(dtype: Any) -> int:
    """Bytes of an element of x (fp32 or bf16), for a kernel tensor's or a numpy array's dtype."""
    return 4 if dtype == FP32 or str(dtype).removeprefix("torch.") == "float32" else 2


# SBUF bytes a partition keeps beside one tile set and the taps and bias: the PE's identity and its iota, the
# live-request column, the slot replicator's rows (688 bytes at C = 16384, measured by nki-cpu's allocator).
STEP_CONSTANTS_SLACK = 1024


def step_sbuf_violations(x: Any, conv_pool: Any, weight: Any, bias: Any, state_indices: Any) -> list[Violation]:
    """The shapes whose one group of requests does not fit a partition's SBUF: one ``_TileSet`` (the fewest the
    kernel runs), the taps and bias (fp32) and ``STEP_CONSTANTS_SLACK`` over ``sbuf_fmax_bytes``
    ("nki.language.tile_size", SDK 2.33) — refused before the trace allocates, naming x's channels. Only fp32 past
    Qwen3.5's channels reaches it: C = 16384 with T = 4 and [N, T] rows; every model shape fits (C = 8192, 12288 in
    fp32 and bf16, every form). Shapes the contract rules reject are left to them (none here)."""
    shapes = [tuple(getattr(a, "shape", ())) for a in (x, conv_pool, weight, state_indices)]
    if [len(s) for s in shapes[:3]] != [3, 3, 2] or shapes[0][2] % PARTITIONS_PER_REQUEST:
        return []
    _, tokens, channels = shapes[0]
    state_len, width, per_token = shapes[1][2], shapes[2][1], len(shapes[3]) == 2
    per_part = channels // PARTITIONS_PER_REQUEST
    need = (_set_bytes(x, per_part, tokens, state_len, width, per_token)
            + per_part * 4 * (width + (bias is not None)) + STEP_CONSTANTS_SLACK)  # fmt: skip
    limit = nl.tile_size.sbuf_fmax_bytes
    if need <= limit:
        return []
    io = _io_bytes(x.dtype)
    form = " and [N, T] rows (every token's window kept)" if per_token else ""
    return [Violation("conv.sbuf", "x", f"C = {channels} channels in {'float32' if io == 4 else 'bfloat16'} with "
                      f"T = {tokens}{form}", f"one group of requests' tiles, the taps and the bias take {need} bytes "
                      f"of a partition's SBUF, over its {limit}", "pass x and the pool in bfloat16, fewer tokens a "
                      "call (T = 2), [N] rows (only the last window kept), or split the channels into two convs on "
                      "pools of their own (the conv is depthwise)", CONV_STEP)]  # fmt: skip


class _Slot:
    """One request slot of a group: its partitions and request index, and its rows (run-time scalars) loaded from
    ``request_rows``' tiles only when asked: each ``scalar_load`` is a GpSimd instruction. The read row is loaded
    once per slot object (an unrolled group's load and store share one; a compiled loop's body makes its own)."""

    def __init__(self, rows: tuple[Any, ...], g: Any, j: int, total: int, tokens: int, per_token: bool, accepted: bool,
                 in_row: bool = False, n: Any = None):  # fmt: skip
        """``rows`` hold group g's slot j at entry j·total + g (per request); ``n`` the request when that is not
        g + j·total (a ``_RowWindow``'s rows); ``in_row``: ``rows[1]`` holds the offsets of vLLM's in-row form."""
        self.part = slice(j * PARTITIONS_PER_REQUEST, (j + 1) * PARTITIONS_PER_REQUEST)
        self.n = g + j * total if n is None else n  # request j·G + g (the kernel's map of slots)
        self._rows, self._g, self._first = rows, g, j * total
        self._tokens, self._per_token, self._accepted = tokens, per_token, accepted
        self._in_row = in_row
        self._read: Any = None

    def _load(self, tile: int, static: int, scale: int) -> Any:
        return entry(self._rows[tile], static, self._g, scale)

    def read_row(self) -> Any:
        """The row the request's window is loaded from (loaded on the first call, then reused)."""
        if self._read is None:
            if self._accepted:
                self._read = self._load(1, self._first, 1)
            else:
                width = self._tokens if self._per_token else 1
                self._read = self._load(0, self._first * width, width)
        return self._read

    def read_view(self, pool: Any) -> Any:
        """The pool entries its load moves: its read row, or with the in-row form the row shifted by its offset
        (``_shifted_row``). The offset is loaded per call, right before the load that uses it: only the row stays
        live until the store (up to (TILE_SETS + 1) · 8 = 40 rows at once, a sequencer holding 64 registers:
        "nki.isa.register_alloc"; nki-cpu's rule ``live_registers``)."""
        if not self._in_row:
            return _pool_view(pool, self.read_row())
        start = pool.row_start(self.read_row()) + self._load(1, self._first, 1)
        return _shifted_row(pool, start, self._tokens)

    def write_rows(self) -> tuple[Any, ...]:
        """The rows its windows are stored to: one per token with per-token rows, else its read row."""
        if not self._per_token:
            return (self.read_row(),)
        return tuple(self._load(0, self._first * self._tokens + t, self._tokens) for t in range(self._tokens))


class _RowWindow:
    """The rows of ``span`` consecutive groups from group ``base`` (a compiled loop's run-time value) on, copied into
    fixed tiles once per loop iteration: one GpSimd copy per slot and table (each slot's requests are consecutive
    entries), after which every slot's rows are ``scalar_load``s at static offsets. Loaded one entry at a time
    (``request_rows.entry``: a copy, then the load, each waiting on the one before) the slots' rows held GpSimd
    for most of a loop iteration."""

    def __init__(self, rows: tuple[Any, ...], base: Any, total: int, span: int, tokens: int, per_token: bool,
                 accepted: bool, in_row: bool = False):  # fmt: skip
        self._base, self._total, self._span = base, total, span
        self._flags = (tokens, per_token, accepted, in_row)
        self._tiles = []
        for table in rows:
            width = table.shape[1] // (total * REQUESTS_PER_GROUP)  # entries a request
            window = sbuf((1, REQUESTS_PER_GROUP * span * width), table.dtype)
            for j in range(REQUESTS_PER_GROUP):
                run = table.ap(pattern=[[table.shape[1], 1], [1, span * width]], offset=j * total * width,
                               scalar_offset=base * width, indirect_dim=1)  # fmt: skip
                nisa.tensor_copy(dst=window[:, j * span * width : (j + 1) * span * width], src=run, engine=GPSIMD)
            self._tiles.append(window)

    def slots(self, local: int) -> list[_Slot]:
        """Group ``base + local``'s slots (``local`` < span), their rows from the window."""
        tiles, base, total = tuple(self._tiles), self._base, self._total
        return [
            _Slot(tiles, local, j, self._span, *self._flags, n=base + local + j * total)
            for j in range(REQUESTS_PER_GROUP)
        ]


class _TileSet:
    """The tiles one group of 8 requests is convolved in (allocated once: a compiled body touches the same tiles
    every iteration): windows [128, F, L] and inputs [128, T, F] in x's dtype as loaded; the products of every tap
    [128, T, F, W (+1: the bias)] and their sums [128, T, F] fp32; the outputs [128, T, F] and the windows to keep
    [128, T or 1, F, L] in x's dtype, as stored."""

    def __init__(
        self,
        dtype: Any,
        per_part: int,
        tokens: int,
        state_len: int,
        width: int,
        per_token: bool | None,
        bias_column: Any,
        first_output: int = 0,
        summed_on_pe: tuple[Any, int] | None = None,
        clear: Any = GPSIMD,
        multiplied_on_vector: tuple[list[Any], int] | None = None,
        in_row: bool = False,
    ):
        """``per_token``: keep the window after every token (True), the last (False) or none (None);
        ``first_output``: the first token whose output is computed (the tokens before it are a halo);
        ``summed_on_pe``: (the [128, 128] fp32 identity, k, c, banks): the first k outputs' sums (and output k's
        first c channels') are accumulated by the tensor engine in PSUM (``_sum_on_pe``) in ``banks`` banks taken in
        turn, the rest reduced by the vector engine; ``clear``: the engine that zeroes the loaded tiles first;
        ``multiplied_on_vector``: (the taps' PSUM banks as ``_replicated`` keeps them; k; c): the products of the
        outputs from k on are formed by the vector engine (output k's from channel c on), the others' by GpSimd; ``in_row``: vLLM's in-row
        form, the windows tile holding a row's L − T + 1 entries from the request's offset, the taps' window its
        first W − 1 (``_convolve``)."""
        self.first_output = first_output
        outputs = tokens - first_output
        self.identity, self.pe_outputs, self.pe_channels, banks = summed_on_pe if summed_on_pe else (None, 0, 0, 0)
        self.psum_taps, self.vector_from, self.gpsimd_channels = multiplied_on_vector or (None, outputs, 0)
        self.bias = bias_column
        # A PSUM bank ([128, 512] fp32, docs/nki-sources.md §2.9) per output summed there, each sum its own
        # accumulation group; at most two (the outputs take them in turn), so two sets and the taps fit PSUM's eight.
        self.pe_sums = [psum((128, per_part)) for _ in range(banks)]
        self.windows = sbuf((128, per_part, state_len), dtype)
        self.in_row = in_row
        # The inputs of ``windows`` the step reads, from each channel's first: the in-row form's W − 1 from the
        # offset on (of the L − T + 1 loaded; the rest of its slots: the next channel's entries, unused); the windows
        # kept are those W − 1's last W − 2 ++ the tokens, vLLM's row of W − 2 + T, whatever L.
        self.loaded = width - 1 if in_row else state_len
        self.first_tap = 0 if in_row else state_len - (width - 1)  # the taps' window in ``windows``
        self.inputs = sbuf((128, tokens, per_part), dtype)
        # A padding slot's skipped loads leave defined values.
        nisa.memset(dst=self.windows, value=0.0, engine=clear)
        nisa.memset(dst=self.inputs, value=0.0, engine=clear)
        terms = width + (bias_column is not None)
        self.products = sbuf((128, outputs, per_part, terms), FP32)  # output-major: each output's terms one run
        if bias_column is not None:  # the bias as one more term of every sum, set once
            for t in range(self.pe_outputs, outputs):  # the tensor engine adds the bias column itself
                nisa.activation(dst=self.products[:, t, :, width], op=nl.copy, data=bias_column, engine=SCALAR)
        self.sums = sbuf((128, outputs, per_part), FP32)
        self.result = sbuf((128, outputs, per_part), dtype)
        self.kept = None
        if per_token is not None:
            self.kept = sbuf((128, tokens if per_token else 1, per_part, state_len), dtype)
        # The in-row form on rows longer than vLLM's W − 2 + T: the rows as they are, whose entries from W − 2 + T on
        # go back unchanged with the kept window (whole rows stored: one run a partition; storing only the first
        # W − 2 + T, runs of W − 2 + T a channel: 976.6 against 98.4 us at N = 64, T = 4, L = 7; PERFORMANCE.md,
        # "Conv1d").
        self.rows_as_read = None
        if in_row and state_len > _kept_length(state_len, width, tokens, in_row):
            self.rows_as_read = sbuf((128, per_part, state_len), dtype)
            nisa.memset(dst=self.rows_as_read, value=0.0, engine=clear)

    def load(self, x: Any, pool: Any, slots: list[_Slot]) -> None:
        for slot in slots:
            src = slot.read_view(pool)
            dst = self.windows[slot.part]
            if self.in_row:  # a run of the row's flat entries: the first F·L − (T − 1) of the partition's slots
                dst = self.windows.reshape((128, -1))[slot.part, 0 : src.shape[1]]
            nisa.dma_copy(dst=dst, src=src, oob_mode=nisa.oob_mode.skip)
            if self.rows_as_read is not None:
                nisa.dma_copy(dst=self.rows_as_read[slot.part], src=_pool_view(pool, slot.read_row()),
                              oob_mode=nisa.oob_mode.skip)  # fmt: skip
            if not isinstance(slot.n, int) or slot.n < x.shape[0]:  # a static slot past N has no inputs
                nisa.dma_copy(dst=self.inputs[slot.part], src=_input_view(x, slot.n), **_skip_if_scalar(slot.n))

    def convolve(self, taps: Any, live: Any, shape: tuple[int, int, int], activation: str | None) -> None:
        """The group's conv over all 128 partitions (``_convolve``); ``live`` [128, 1] fp32 zeroes padding slots."""
        _convolve(self, taps, live, shape, activation)

    def store(self, out: Any, pool: Any, slots: list[_Slot]) -> None:
        for slot in slots:
            self._store_windows(pool, slot)
            self._store_outputs(out, slot)

    def _store_windows(self, pool: Any, slot: _Slot) -> None:
        """A slot's kept windows into the rows it writes (skipped for padding's −1 rows)."""
        for t, row in enumerate(slot.write_rows()):
            nisa.dma_copy(dst=_pool_view(pool, row), src=self.kept[slot.part, t], oob_mode=nisa.oob_mode.skip)

    def _store_outputs(self, out: Any, slot: _Slot) -> None:
        """A slot's outputs: every request's row, padding's zeros included; a static slot past N has none."""
        if not isinstance(slot.n, int) or slot.n < out[0].shape[0]:
            _store_out(out, self.result, slot)

    def convolve_and_store(self, out: Any, pool: Any, slots: list[_Slot], taps: Any, live: Any,
                           shape: tuple[int, int, int], activation: str | None) -> None:  # fmt: skip
        """The set's last group of the launch, nothing loaded behind it (``_drains_in_runs``): its windows kept
        (vector engine) and stored first, then its channels in ``DRAIN_RUNS`` runs, each run's products, sum and
        activation issued before the next run's, so GpSimd, the tensor engine, the vector engine and the scalar
        engine work on successive runs side by side instead of each waiting for the whole group. The same
        roundings as ``_convolve``, element by element."""
        width = shape[2]
        runs = self._windows_stored_then_runs(pool, slots, shape, DRAIN_RUNS)
        on_vector = [i % DRAIN_SUMMED_ON_VECTOR_EVERY == DRAIN_SUMMED_ON_VECTOR_EVERY - 1 for i in range(len(runs))]
        if self.bias is not None:  # the bias term of the runs the vector engine sums (the PE adds its own)
            for run, vector in zip(runs, on_vector, strict=True):
                if vector:
                    nisa.tensor_copy(dst=self.products[:, 0, run, width], src=self.bias[:, run], engine=GPSIMD)
        # Run i + 1's products from the window before run i's from the new input: a run's two products write one
        # box of the products tile, which the model (and a compiler ordering by boxes) orders, so back to back the
        # second would wait out the first's latency.
        _one_output_products(self, taps, shape, runs[0], from_window=True)
        for i, run in enumerate(runs):
            if i + 1 < len(runs):
                _one_output_products(self, taps, shape, runs[i + 1], from_window=True)
            _one_output_products(self, taps, shape, run, from_window=False)
            if on_vector[i]:
                nisa.tensor_reduce(dst=self.sums[:, 0, run], op=nl.add, data=self.products[:, 0, run], axis=2)
                nisa.activation(dst=self.result[:, 0, run], op=_act(activation), data=self.sums[:, 0, run],
                                scale=live, engine=SCALAR)  # fmt: skip
            else:
                _sum_on_pe(self, self.products[:, 0], 0, live, activation, run)
        for slot in slots:  # whole rows: a run's stores would each wait for the one before (one box of ``out``)
            self._store_outputs(out, slot)

    def convolve_in_runs(self, out: Any, pool: Any, slots: list[_Slot], taps: Any, live: Any,
                         shape: tuple[int, int, int], activation: str | None) -> None:  # fmt: skip
        """A launch's only group at T > 1 (``gdn_conv_step``): its windows kept and stored first, then
        ``_convolve`` over its channels in ``MULTI_TOKEN_RUNS`` runs, each output's channels on the engines the whole
        group's conv gives them, so the run after the first multiplies while the first is summed (PERFORMANCE.md,
        "Decode speed", item 11). Each element's products and sum are the whole group's, so the outputs are its bit
        for bit. The windows are copied by the vector engine, idle until the first products: on the scalar engine
        (as the pipelined groups copy them) they held the first run's activations, [N, T] rows at N = 1 19.0 µs
        against 17.4."""
        for run in self._windows_stored_then_runs(pool, slots, shape, MULTI_TOKEN_RUNS):
            _convolve(self, taps, live, shape, activation, run=run)
        for slot in slots:
            self._store_outputs(out, slot)

    def _windows_stored_then_runs(self, pool: Any, slots: list[_Slot], shape: tuple[int, int, int],
                                  count: int) -> list[slice]:  # fmt: skip
        """A drained group's start: its windows kept by the vector engine and stored; its channels as ``count``
        runs (the last shorter when ``count`` does not divide them)."""
        tokens, state_len, _ = shape
        _keep_windows(self, tokens, state_len, VECTOR)
        for slot in slots:
            self._store_windows(pool, slot)
        per_part = self.inputs.shape[2]
        step = -(-per_part // count)
        return [slice(c0, min(per_part, c0 + step)) for c0 in range(0, per_part, step)]


# A lone group's channel runs at T > 1 (``_TileSet.convolve_in_runs``; 1: the whole group, pipelined as every other
# launch): 2 against 1 and 3, 4, 8 (more, smaller instructions, each paying its fixed cost): N = 8, T = 4
# 18.5 / 19.6 / 18.7 / 19.0 / 20.5 us.
MULTI_TOKEN_RUNS = 2
# The last trip's channel runs (``_TileSet.convolve_and_store``), every third summed by the vector engine: at N = 8
# 11.4 -> 9.7 us, N = 20 16.8 -> 14.0 (PERFORMANCE.md, "Decode speed", item 8).
DRAIN_RUNS = 8
DRAIN_SUMMED_ON_VECTOR_EVERY = 3


def _kept_length(state_len: int, width: int, tokens: int, in_row: bool) -> int:
    """The entries of a row the step rewrites: the row's L, or in vLLM's in-row form its first W − 2 + T (vLLM's
    kernel's state length whatever L: ``gdn_ref.conv``; the rest go back as they were, ``_TileSet.rows_as_read``)."""
    return width - 2 + tokens if in_row else state_len


def _drains_in_runs(tiles: _TileSet, tokens: int) -> bool:
    """Whether the last trip runs ``_TileSet.convolve_and_store``: one output (T = 1), summed on the tensor engine."""
    return tokens == 1 and tiles.pe_outputs == 1 and not tiles.pe_channels and tiles.first_output == 0


def _keep_windows(tiles: _TileSet, tokens: int, state_len: int, engine: Any = SCALAR) -> None:
    """The windows to keep, copied by ``engine``: the window after token t is the series inputs from
    ``tiles.loaded`` + t + 1 − L on (loaded window ++ tokens), L = ``state_len`` the entries rewritten
    (``_kept_length``); a longer row's entries past them copied from the row as read (``_TileSet.rows_as_read``)."""
    inputs_by_channel, loaded = _token_last(tiles.inputs), tiles.loaded
    kept_tokens = () if tiles.kept is None else range(tokens) if tiles.kept.shape[1] > 1 else (tokens - 1,)
    for i, t in enumerate(kept_tokens):
        kept = tiles.kept[:, i]
        start = loaded + t + 1 - state_len
        old = max(0, loaded - start)  # entries still from the loaded window
        if old:
            _copy(kept[:, :, 0:old], tiles.windows[:, :, start : start + old], engine)
        new = state_len - old
        _copy(kept[:, :, old:state_len], inputs_by_channel[:, :, t + 1 - new : t + 1], engine)
        if tiles.rows_as_read is not None:
            _copy(kept[:, :, state_len:], tiles.rows_as_read[:, :, state_len:], engine)


def _copy(dst: Any, src: Any, engine: Any) -> None:
    """An exact copy on ``engine`` (the scalar engine's is an ``activation``)."""
    if engine is SCALAR:
        nisa.activation(dst=dst, op=nl.copy, data=src, engine=SCALAR)
    else:
        nisa.tensor_copy(dst=dst, src=src, engine=engine)


def _one_output_products(tiles: _TileSet, taps: Any, shape: tuple[int, int, int], run: slice,
                         from_window: bool) -> None:  # fmt: skip
    """Channels ``run`` of the one output's (T = 1) products on GpSimd: of the W − 1 taps that read the window
    (``from_window``, from ``tiles.first_tap`` on), else of the last tap, which reads the new input."""
    width = shape[2]
    products, first = tiles.products[:, 0, run], tiles.first_tap
    if from_window:
        _multiply_on_gpsimd(
            tiles, products, tiles.windows[:, run, first : first + width - 1], taps[:, run], 0, width - 1
        )
    else:
        _multiply_on_gpsimd(tiles, products, _token_last(tiles.inputs)[:, run, 0:1], taps[:, run], width - 1, width)


def _skip_if_scalar(n: Any) -> dict[str, Any]:
    """A run-time request index past N (a loop's last group) is outside ``x``: its load is skipped."""
    return {} if isinstance(n, int) else {"oob_mode": nisa.oob_mode.skip}


def _pool_view(pool: Any, row: Any) -> Any:
    """Pool row ``row`` (a run-time scalar) as [16, F, L]: partition s holds channels s·F .. s·F + F − 1, each with
    its L inputs (one contiguous run per partition)."""
    _, channels, state_len = pool.view.shape
    per_part = channels // PARTITIONS_PER_REQUEST
    pattern = [[per_part * state_len, PARTITIONS_PER_REQUEST], [state_len, per_part], [1, state_len]]
    return pool.row(row, pattern)


def _shifted_row(pool: Any, start: Any, tokens: int) -> Any:
    """The in-row form's read, [16, F·L − (T − 1)]: partition s's run of the row from element ``start`` = row · C · L
    + o on (a run-time scalar, o <= T − 1), so channel f's slots f·L .. f·L + L − 1 hold its entries o .. L − 1 and
    then the next channel's first o: the window's L − T + 1 entries first. One contiguous run per partition, as the
    other forms' loads (runs of L − T + 1 entries a channel moved 6 bytes a descriptor: 15× slower at N = 64); the
    last partition's run stops T − 1 short of F·L, so it ends inside the row whatever o."""
    _, channels, state_len = pool.view.shape
    run = channels // PARTITIONS_PER_REQUEST * state_len
    pattern = [[run, PARTITIONS_PER_REQUEST], [1, run - (tokens - 1)]]
    return pool.at(start, pattern)


def _input_view(tensor: Any, n: Any, per_part: int | None = None) -> Any:
    """Request ``n``'s [T, C] rows of ``x`` or ``out`` ([N, T, ...], C the product of the trailing dimensions) as
    [C / F, T, F] (partition s: channels s·F .., per token; F = C / 16 unless given, for a part of the channels);
    ``n`` a trace-time int or a run-time scalar."""
    tokens = tensor.shape[1]
    channels = _row_width(tensor) // tokens
    per_part = per_part or channels // PARTITIONS_PER_REQUEST
    pattern = [[per_part, channels // per_part], [channels, tokens], [1, per_part]]
    if isinstance(n, int):
        return tensor.ap(pattern=pattern, offset=n * tokens * channels)
    return tensor.ap(pattern=pattern, offset=0, scalar_offset=n, indirect_dim=0)


def _store_out(out: tuple[Any, ...], result: Any, slot: _Slot) -> None:
    """A request's convolved rows (its 16 partitions of ``result``) into ``out``'s parts, each part the next
    ``C_i / F`` partitions (``split_parts``)."""
    per_part = result.shape[2]
    first = slot.part.start
    for part in out:
        count = _row_width(part) // part.shape[1] // per_part
        nisa.dma_copy(dst=_input_view(part, slot.n, per_part), src=result[first : first + count],
                      **_skip_if_scalar(slot.n))  # fmt: skip
        first += count


def _row_width(tensor: Any) -> int:
    """Elements of one row (dimension 0) of ``tensor``."""
    width = 1
    for size in tensor.shape[1:]:
        width *= size
    return width


def split_parts(channels: int, widths: tuple[int, ...]) -> bool:
    """Whether ``gdn_conv_step`` can write channel parts of these widths (in order, summing to C) as tensors of
    their own: each part whole partitions of a request's 16 (a multiple of C / 16 channels)."""
    per_part = channels // PARTITIONS_PER_REQUEST
    return sum(widths) == channels and all(w % per_part == 0 for w in widths)


def _constants(
    weight: Any, bias: Any, per_part: int, psum_taps: list[tuple[int, Any]] | None = None
) -> tuple[Any, Any]:
    """The taps [128, F, W] and the bias [128, F] (None without one), fp32, on every request slot's partitions.

    Each is read from HBM once, onto one slot's 16 partitions, and copied to the other slots by the tensor engine
    (a 0/1 selection as the stationary: partition p takes partition p mod 16, exact) — reading it once per slot
    would move C·W elements 8 times. ``psum_taps``: a list to which the taps' PSUM banks are appended, kept for the
    vector engine's products (``_multiply_on_vector``).
    """
    replicate = _slot_replicator()
    taps = _replicated(weight, (per_part, weight.shape[1]), replicate, psum_taps)
    return taps, None if bias is None else _replicated(bias, (per_part,), replicate)


def _in_dtype(select: Any, dtype: Any) -> Any:
    """The 0/1 selection in ``dtype``: a matmul's operands share a precision (an fp32 operand pairs only with
    fp32, ISA ``nc_matmul``), and 0/1 is exact in both."""
    if dtype == FP32:
        return select
    narrow = sbuf(tuple(select.shape), dtype)
    nisa.tensor_copy(dst=narrow, src=select)
    return narrow


def _slot_replicator() -> Any:
    """[16, 128] fp32: 1 where partition p of the 128 is slot partition s (p ≡ s mod 16), else 0."""
    offset = sbuf((PARTITIONS_PER_REQUEST, 128), FP32)  # p − s
    nisa.iota(dst=offset, pattern=[[1, 128]], offset=0, channel_multiplier=-1)
    select = sbuf((PARTITIONS_PER_REQUEST, 128), FP32)
    nisa.memset(dst=select, value=0.0)
    for j in range(REQUESTS_PER_GROUP):
        block = select[:, j * PARTITIONS_PER_REQUEST : (j + 1) * PARTITIONS_PER_REQUEST]
        nisa.tensor_scalar(dst=block, data=offset[:, 0:PARTITIONS_PER_REQUEST], op0=nl.equal, operand0=0.0)
    return select


def _replicated(tensor: Any, inner: tuple[int, ...], select: Any, banks: list[tuple[int, Any]] | None = None) -> Any:
    """A per-channel constant ([C] or [C, W] in HBM) as [128, F(, W)] fp32: loaded once onto 16 partitions
    (partition s: channels s·F ..) and spread to the 8 slots by 0/1 matmuls in its own dtype (one PSUM bank of up
    to 512 fp32 columns each; a product with one nonzero term is exact), evacuated as fp32. ``banks``: a list to
    which each bank is appended as (first channel, [128, channels, W]), for readers of the taps in PSUM."""
    size = 1
    for n in inner:
        size *= n
    raw = sbuf((PARTITIONS_PER_REQUEST, size), tensor.dtype)
    # One DMA per bank's columns: a 16-partition transfer takes 2 of the 16 DMA engines (COST_MODEL.md item 5), so
    # the chunks move side by side, and each bank's spread starts when its chunk lands.
    for start in range(0, size, BANK):
        cols = slice(start, min(size, start + BANK))
        src = tensor.ap(pattern=[[size, PARTITIONS_PER_REQUEST], [1, cols.stop - start]], offset=start)
        nisa.dma_copy(dst=raw[:, cols], src=src)
    select = _in_dtype(select, tensor.dtype)
    spread = sbuf((128, *inner), FP32)
    flat = spread.reshape((128, size))
    # Each bank holds whole channels (``BANK // W`` of them), so a bank kept in ``banks`` is [128, channels, W].
    step = BANK // inner[-1] * inner[-1] if len(inner) > 1 else BANK
    for start in range(0, size, step):
        cols = slice(start, min(size, start + step))
        product = matmul(select, raw[:, cols], stationary_onezero=True)
        nisa.activation(dst=flat[:, cols], op=nl.copy, data=product, engine=SCALAR)
        if banks is not None:
            width = inner[-1]
            banks.append((start // width, product.reshape((128, (cols.stop - start) // width, width))))
    return spread


def _convolve(tiles: _TileSet, taps: Any, live: Any, shape: tuple[int, int, int], activation: str | None,
              run: slice | None = None) -> None:  # fmt: skip
    """One group's conv: the windows to keep and the activation (scalar engine), every tap's products (GpSimd; with
    ``multiplied_on_vector`` the last outputs' on the vector engine), their sums with the bias (one reduce, vector
    engine; with ``summed_on_pe`` the first outputs' as PSUM accumulations on the tensor engine) — each engine's
    stream below the group's DMA time where the split allows (PERFORMANCE.md, "Decode speed"). Every output's sum
    is the same fp32 fold, terms in tap order and the bias last, whichever engine adds.

    Token t's tap j reads input ``first + j + t`` of the series window ++ tokens (first: ``tiles.first_tap``, the
    last W − 1 of the loaded window, or its first W − 1 in vLLM's in-row form): the window while that index is
    within the taps' W − 1, the tokens after it; each part is one instruction per token. The window kept after
    token t is the last L of loaded ++ tokens 0 .. t.

    ``run``: only these channels of each partition, the windows not kept (``_TileSet.convolve_and_store`` drains a
    group in runs); each output's channels go to the same engines as in the whole group's conv.
    """
    tokens, state_len, width = shape
    first = tiles.first_tap
    inputs_by_channel = _token_last(tiles.inputs)  # [128, F, T]
    per_part = tiles.inputs.shape[2]
    lo, hi = (0, per_part) if run is None else (run.start, run.stop)
    if run is None:
        # The windows to keep first: the scalar engine copies them while GpSimd forms the products, so the loaded
        # tiles are free for the next group's loads as soon as both have read them.
        _keep_windows(tiles, tokens, state_len)
    for t in range(tiles.first_output, tokens):
        k = t - tiles.first_output
        products = tiles.products[:, k, lo:hi]
        from_window = min(width, max(0, width - 1 - t))
        on_gpsimd = _gpsimd_channels(tiles, k, per_part)
        if from_window:
            at = first + t
            _multiply(tiles, on_gpsimd, products, tiles.windows[:, lo:hi, at : at + from_window], taps, lo,
                      0, from_window)  # fmt: skip
        if from_window < width:
            k0 = from_window + t - (width - 1)
            _multiply(tiles, on_gpsimd, products, inputs_by_channel[:, lo:hi, k0 : t + 1], taps, lo, from_window,
                      width)  # fmt: skip
        on_pe = _pe_channels(tiles, k, per_part)
        if min(hi, on_pe) > lo:
            _sum_on_pe(tiles, tiles.products[:, k], k, live, activation, slice(lo, min(hi, on_pe)))
    # act(live · sum): a padding slot's output is act(0) = 0 (its skipped loads left finite values: zeros, or
    # windows and inputs the host checked), so every request's row of ``out`` is written with no row to look up.
    k = tiles.pe_outputs
    reduced = max(lo, tiles.pe_channels)
    if tiles.pe_channels and reduced < hi:  # output k's other channels
        part = slice(reduced, hi)
        nisa.tensor_reduce(dst=tiles.sums[:, k, part], op=nl.add, data=tiles.products[:, k, part], axis=2)
        nisa.activation(dst=tiles.result[:, k, part], op=_act(activation), data=tiles.sums[:, k, part], scale=live,
                        engine=SCALAR)  # fmt: skip
    k += bool(tiles.pe_channels)
    if k < tiles.sums.shape[1]:
        rest = (slice(None), slice(k, None), slice(lo, hi))
        nisa.tensor_reduce(dst=tiles.sums[rest], op=nl.add, data=tiles.products[rest], axis=3)
        nisa.activation(dst=tiles.result[rest], op=_act(activation), data=tiles.sums[rest], scale=live,
                        engine=SCALAR)  # fmt: skip


def _pe_channels(tiles: _TileSet, k: int, per_part: int) -> int:
    """How many of output k's channels (from the first) the tensor engine sums: all of the first
    ``pe_outputs``, the first ``pe_channels`` of the next, none of the others."""
    if k < tiles.pe_outputs:
        return per_part
    return tiles.pe_channels if k == tiles.pe_outputs else 0


def _gpsimd_channels(tiles: _TileSet, k: int, per_part: int) -> int:
    """How many of output k's channels (from the first) GpSimd multiplies: all before ``vector_from``, the first
    ``gpsimd_channels`` of that output, none after it (the vector engine's)."""
    if k < tiles.vector_from:
        return per_part
    return tiles.gpsimd_channels if k == tiles.vector_from else 0


def _multiply(tiles: _TileSet, on_gpsimd: int, products: Any, data: Any, taps: Any, lo: int, j0: int,
              j1: int) -> None:  # fmt: skip
    """Products of taps j0 .. j1 − 1 with ``data`` (channels lo .. of a partition): those before channel
    ``on_gpsimd`` on GpSimd, the rest on the vector engine. Each product is one fp32 rounding on either engine."""
    hi = lo + data.shape[1]
    cut = min(hi, max(lo, on_gpsimd))
    if cut == hi:
        _multiply_on_gpsimd(tiles, products, data, taps[:, lo:hi], j0, j1)
    elif cut == lo:
        _multiply_on_vector(tiles, products, data, lo, j0, j1)
    else:  # output ``vector_from``, cut at its GpSimd share
        _multiply_on_gpsimd(tiles, products[:, : cut - lo], data[:, : cut - lo], taps[:, lo:cut], j0, j1)
        _multiply_on_vector(tiles, products[:, cut - lo :], data[:, cut - lo :], cut, j0, j1)


def _multiply_on_gpsimd(tiles: _TileSet, products: Any, data: Any, taps: Any, j0: int, j1: int) -> None:
    """Products of taps j0 .. j1 − 1 with ``data`` [128, F, j1 − j0] on GpSimd (the taps in SBUF)."""
    nisa.tensor_tensor(dst=products[:, :, j0:j1], data1=data, data2=taps[:, :, j0:j1], op=nl.multiply, engine=GPSIMD)


def _multiply_on_vector(tiles: _TileSet, products: Any, data: Any, lo: int, j0: int, j1: int) -> None:
    """The same products on the vector engine, the taps read from PSUM: with one operand in PSUM ``tensor_tensor``
    streams one element a cycle, two with both in SBUF unless every operand is 2-byte (COST_MODEL.md item 1); one
    instruction per PSUM bank of taps (``_replicated``) the channels lo .. lo + F' − 1 of ``data`` [128, F',
    j1 − j0] reach. The same fp32 products."""
    hi = lo + data.shape[1]
    for c0, bank in tiles.psum_taps:
        c1 = c0 + bank.shape[1]
        a, b = max(lo, c0), min(hi, c1)
        if a < b:
            nisa.tensor_tensor(dst=products[:, a - lo : b - lo, j0:j1], data1=data[:, a - lo : b - lo],
                               data2=bank[:, a - c0 : b - c0, j0:j1], op=nl.multiply, engine=VECTOR)  # fmt: skip


def _act(activation: str | None) -> Any:
    return nl.copy if activation is None else nl.silu


def _sum_on_pe(tiles: _TileSet, products: Any, k: int, live: Any, activation: str | None, part: slice) -> None:
    """Output k's sum over its W products and the bias as one PSUM accumulation group: each term is the moving of a
    0/1 matmul against the identity (fp32 with the 0/1 hint: 2 PE cycles a column against the vector engine's
    reduce at 1 cycle an element of its slower clock, COST_MODEL.md item 1), added in the reduce's order — term 0
    first, the bias last — so the fp32 sum is the vector engine's bit for bit (each product is exact: one nonzero
    term). The activation reads the bank. ``part``: the channels summed here (the others by the vector engine)."""
    bank = tiles.pe_sums[k % len(tiles.pe_sums)][:, part]
    terms = [products[:, part, j] for j in range(products.shape[2] - (tiles.bias is not None))]
    if tiles.bias is not None:
        terms.append(tiles.bias[:, part])
    for i, term in enumerate(terms):
        matmul(tiles.identity, term, dst=bank, accumulate=i > 0, stationary_onezero=True)
    nisa.activation(dst=tiles.result[:, k, part], op=_act(activation), data=bank, scale=live,
                    engine=SCALAR)  # fmt: skip


def _first_rows(state_indices: Any, n_req: int, groups: int) -> Any:
    """[128, groups · width] int32: slot j of group g's indices on its partitions (−1 past N), loaded once per launch
    from the index tensor, one contiguous run of it per slot (``gdn_conv_step``'s slot map). Issued first in the
    launch: its DMAs share the queues with the groups' loads, which would wait behind them."""
    width = state_indices.size // n_req
    first_rows = sbuf((128, groups * width), nl.int32)
    nisa.memset(dst=first_rows, value=-1)
    for j in range(REQUESTS_PER_GROUP):
        count = min(groups, max(0, n_req - j * groups))
        if count:
            part = slice(j * PARTITIONS_PER_REQUEST, (j + 1) * PARTITIONS_PER_REQUEST)
            src = state_indices.ap(pattern=[[0, PARTITIONS_PER_REQUEST], [1, count * width]], offset=j * groups * width)
            nisa.dma_copy(dst=first_rows[part, 0 : count * width], src=src)
    return first_rows


def _live_mask(first_rows: Any, groups: int) -> Any:
    """[128, groups] fp32: 1 on the partitions of slot j of group g when request j·G + g is live (its first index
    is not −1), else 0 (padding, and requests past N)."""
    width = first_rows.shape[1] // groups
    live = sbuf((128, groups), FP32)
    firsts = first_rows.ap(pattern=[[groups * width, 128], [width, groups]], offset=0)
    nisa.tensor_scalar(dst=live, data=firsts, op0=nl.greater_equal, operand0=0.0)
    return live


def _column(table: Any, g: Any) -> Any:
    """Column ``g`` of an SBUF table as [P, 1]: a static slice, or a run-time ``nl.ds`` start on the free axis."""
    return table[:, g : g + 1] if isinstance(g, int) else table[:, nl.ds(g, 1)]


def _token_last(tile: Any) -> Any:
    """A [P, T, F] tile seen as [P, F, T] (a strided view: the series is channel-major within a partition)."""
    return tile.ap(
        pattern=[[tile.shape[1] * tile.shape[2], tile.shape[0]], [1, tile.shape[2]], [tile.shape[2], tile.shape[1]]],
        offset=0,
    )
