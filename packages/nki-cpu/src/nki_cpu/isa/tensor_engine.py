"""TensorE instructions: ``nc_matmul`` and ``nc_transpose`` (PE or VectorE path)."""

from __future__ import annotations

import operator
import warnings
from typing import Any

import numpy as np

from nki_cpu import accumulation, checks, dtypes, operands, state
from nki_cpu.cost.record import Engine
from nki_cpu.isa._emit import emit, resolve_engine
from nki_cpu.isa.enums import NkiInstruction, engine, matmul_perf_mode
from nki_cpu.tensor import NkiTensor

_FP32_LIKE = (dtypes.float32,)


def nc_matmul(
    dst: NkiTensor,
    stationary: NkiTensor,
    moving: NkiTensor,
    is_stationary_onezero: bool = False,
    is_moving_onezero: bool = False,
    is_transpose: bool = False,
    accumulate: bool | None = None,
    tile_position: Any = (),
    tile_size: Any = (),
    perf_mode: Any = matmul_perf_mode.none,
    name: str | None = None,
) -> NkiInstruction:
    """``dst (=|+=) stationaryᵀ @ moving`` on the PE array, contraction over the partition dim of both inputs.

    Dimensions:
        K: partitions of stationary and moving (≤128). M: stationary elements per partition (≤128).
        N: moving elements per partition (≤512, one fp32 PSUM bank).

    Args:
        dst: [M, N...] PSUM, fp32 (bf16/fp16 allowed with ``is_transpose``).
        stationary: [K, M...] SBUF, float dtype (may be a stride-0 ``.broadcast`` / ``.ap`` view).
        moving: [K, N...] SBUF, float dtype.
        is_stationary_onezero: speed hint, no numeric effect.
        is_moving_onezero: speed hint, no numeric effect.
        is_transpose: transpose mode: dst = stationaryᵀ bit-exactly (moving must be the [K, K] identity).
        accumulate: False overwrites, True adds, None adds only onto elements an earlier nc_matmul wrote since
            the PSUM tile was allocated (README, known unknown 3).
        tile_position: ``(start_row, start_column)`` of the PE tile this matmul runs on (tiling mode, with
            ``tile_size``); no numeric effect.
        tile_size: ``(row_size, column_size)`` of that tile; the stationary [K, M] must fit (K ≤ row_size,
            M ≤ column_size).
        perf_mode: ``'double_row'``: fp8 inputs [K, 2, M] / [K, 2, N], contraction over K×2.
        name: debug label.

    Returns:
        The instruction handle.

    Notes:
        Operands are multiplied at their stored precision (converted exactly to fp32) and accumulated in fp32.
        Tiling mode (``tile_position`` and ``tile_size`` both set) runs the matmul on a sub-rectangle of the
        128×128 PE array; matmuls on disjoint tiles may run at the same time (ISA ``nc_matmul``, "Tiling mode",
        v2.33.0). The record carries the tile as ``pe_rows`` / ``pe_cols`` for the cost model; the result is the
        same as untiled (README, known unknown 17).
    """
    instr = "nc_matmul"
    stationary = operands.compute_operand(instr, "stationary", stationary, checks.SBUF_ONLY)
    moving = operands.compute_operand(instr, "moving", moving, checks.SBUF_ONLY)
    double_row = perf_mode in (matmul_perf_mode.double_row, "double_row")
    for nm, t in (("stationary", stationary), ("moving", moving)):
        operands.float_dtype(instr, nm, t)
    if (stationary.dtype in _FP32_LIKE) != (moving.dtype in _FP32_LIKE):
        checks.fail(
            f"{instr} moving dtype {dtypes.name(moving.dtype)} cannot be mixed with stationary dtype "
            f"{dtypes.name(stationary.dtype)} (fp32 operands need an fp32 partner)"
        )
    k = stationary.shape[0]
    if moving.shape[0] != k:
        checks.fail(
            f"{instr} moving partition dimension {moving.shape[0]} does not match stationary partition dimension "
            f"{k} (contraction dim)"
        )
    st = stationary._peek_f32().reshape(k, -1)  # fp32 operands are read in place (never written here)
    mv = moving._peek_f32().reshape(k, -1)
    if double_row:
        if stationary.ndim != 3 or stationary.shape[1] != 2 or moving.ndim != 3 or moving.shape[1] != 2:
            checks.fail(
                f"{instr} double_row needs stationary [K,2,M] and moving [K,2,N], got "
                f"{stationary.shape} and {moving.shape}"
            )
        st = st.reshape(k * 2, -1)
        mv = mv.reshape(k * 2, -1)
    m, n = st.shape[1], mv.shape[1]
    checks.at_most(instr, "stationary", "free size", m, checks.GEMM_STATIONARY_FMAX)
    checks.at_most(instr, "moving", "free size", n, checks.GEMM_MOVING_FMAX)
    dst = operands.compute_operand(instr, "dst", dst, checks.PSUM_ONLY)
    if dst.shape[0] != m:
        checks.fail(f"{instr} dst partition dimension {dst.shape[0]} does not match stationary free size {m}")
    if dst.free_elems != n:
        checks.fail(f"{instr} dst elements per partition {dst.free_elems} do not match moving free size {n}")
    pe_tile = pe_tiling(instr, k, m, tile_position, tile_size, double_row)
    operands.psum_bank(instr, "dst", dst)
    if is_transpose:
        if mv.shape != (k, k):
            checks.fail(f"{instr} is_transpose needs a [{k}, {k}] identity as moving, got {moving.shape}")
        if dst.dtype != stationary.dtype and dst.dtype != dtypes.float32:
            checks.fail(
                f"{instr} is_transpose dst dtype {dtypes.name(dst.dtype)} must equal stationary dtype "
                f"{dtypes.name(stationary.dtype)}"
            )
        raw = stationary._np().reshape(k, m).T
        if dst.dtype == stationary.dtype:
            dst.write_raw(raw)
        else:
            dst.write(raw.astype(np.float32))
        track_group(instr, dst, accumulates=False)
        dst.mark_matmul_written()
    else:
        if dst.dtype != dtypes.float32:
            checks.fail(f"{instr} dst dtype {dtypes.name(dst.dtype)} must be float32 in PSUM (Trn2)")
        flags = dst.matmul_written()
        earlier = flags is not None and bool(flags.any())
        track_group(instr, dst, accumulates=bool(accumulate) or (accumulate is None and earlier))
        _accumulate_into(instr, dst, np.matmul(st.T, mv, dtype=np.float32), accumulate)
        dst.mark_matmul_written()
    attrs = {
        "stationary_free": m,
        "moving_free": n,
        "fp32": stationary.dtype == dtypes.float32,
        "is_transpose": bool(is_transpose),
        "onezero": bool(is_stationary_onezero or is_moving_onezero),
        "accumulate": accumulate,
        "double_row": double_row,
        **pe_tile,
    }
    # the PE tiling, recorded only when set (cost reports group instructions by it)
    attrs.update(
        {key: tuple(value) for key, value in (("tile_position", tile_position), ("tile_size", tile_size)) if value}
    )
    return emit(instr, Engine.PE, dst, [stationary, moving], partitions=k, free_elems=n, attrs=attrs)


def pe_tiling(instr: str, k: int, m: int, tile_position: Any, tile_size: Any, double_row: bool) -> dict[str, Any]:
    """Check a tiling-mode request and return the PE tile as record attrs (``{}`` for the whole array).

    The documented rules (ISA ``nki.isa.nc_matmul``, "Tiling mode" and "Tile size", v2.33.0; docs/nki-sources.md
    §3.3): ``tile_position`` and ``tile_size`` must both be set to enable tiling mode; ``start_row`` is a multiple
    of ``row_size`` and the tile stays inside the 128 PE rows, the same for columns; the stationary [K, M] fits
    (K ≤ row_size, M ≤ column_size); ``double_row`` cannot be combined with column tiling. Sizes other than
    32/64/128 are accepted (known unknown 17); the cost model rounds a tile out to the generation's smallest tile.
    """
    if not tile_position and not tile_size:
        return {}
    if not tile_position or not tile_size:
        operands.rule(
            "pe_tiling",
            f"{instr} tile_position {tuple(tile_position)} and tile_size {tuple(tile_size)} must both be set to "
            "enable tiling mode (or both left empty for the whole PE array)",
        )
        return {}
    position, size = _pair(instr, "tile_position", tile_position), _pair(instr, "tile_size", tile_size)
    pe = checks.PMAX
    for axis, start, extent in (("row", position[0], size[0]), ("column", position[1], size[1])):
        if not 0 < extent <= pe:
            operands.rule("pe_tiling", f"{instr} tile_size {axis} size {extent} must be in [1, {pe}]")
        elif start < 0 or start % extent or start + extent > pe:
            operands.rule(
                "pe_tiling",
                f"{instr} tile_position start {axis} {start} must be a multiple of the {axis} size {extent} with "
                f"start + size <= {pe}",
            )
    if k > size[0] or m > size[1]:
        checks.fail(f"{instr} stationary [{k}, {m}] does not fit tile_size {size}")
    if double_row and size[1] < pe:
        operands.rule("pe_tiling", f"{instr} perf_mode double_row cannot be combined with column tiling {size}")
    return {
        "pe_rows": (position[0], min(pe, position[0] + size[0])),
        "pe_cols": (position[1], min(pe, position[1] + size[1])),
    }


def _pair(instr: str, name: str, value: Any) -> tuple[int, int]:
    """A 2-tuple of integers (ints, numpy integers or registers: anything with ``__index__``)."""
    try:
        first, second = value
        return operator.index(first), operator.index(second)
    except (TypeError, ValueError):
        checks.fail(f"{instr} {name} must be a pair of integers, got {value!r}")


def track_group(instr: str, dst: NkiTensor, accumulates: bool) -> None:
    """Count the matmul accumulation groups outstanding after this PE write into ``dst`` (at most 8).

    Raises (rule ``accumulation_groups``) at the matmul that makes a ninth group outstanding (README, known
    unknown 20 for what a group is).
    """
    launch = state.current()
    if launch.accumulation is None:
        launch.accumulation = accumulation.Groups()
    region = dst.region()
    key = (region.storage_id, region.partitions, region.byte_range)
    outstanding = launch.accumulation.matmul(key, dst.storage, len(launch.trace.records), accumulates)
    if outstanding > accumulation.LIMIT:
        operands.rule(
            "accumulation_groups",
            f"{instr} dst outstanding accumulation groups {outstanding} exceeds maximum {accumulation.LIMIT} "
            "(one per PSUM bank; a group runs from its first to its last accumulating nc_matmul into one region)",
        )


def _accumulate_into(instr: str, dst: NkiTensor, product: np.ndarray, accumulate: bool | None) -> None:
    """Write (``accumulate=False``), add (True) or add-where-written (None) an fp32 product into fp32 ``dst``."""
    out = dst._np()
    product = product.reshape(dst.shape)
    if accumulate is False:
        np.copyto(out, product)
        return
    flags = dst.matmul_written()
    written = 0 if flags is None else int(np.count_nonzero(flags))
    if accumulate is None and written == 0:
        np.copyto(out, product)
    elif written == dst.size or accumulate:
        if accumulate and written != dst.size:
            warnings.warn(
                f"{instr}: accumulate=True into PSUM not initialised by an earlier nc_matmul",
                RuntimeWarning,
                stacklevel=3,
            )
        with np.errstate(all="ignore"):
            np.add(out, product, out=out)
    else:
        with np.errstate(all="ignore"):
            np.copyto(out, np.where(flags != 0, out + product, product))


def nc_transpose(
    dst: NkiTensor, data: NkiTensor, engine: Any = engine.unknown, name: str | None = None
) -> NkiInstruction:
    """Partition ↔ free transpose: ``dst[f, p] = data[p, f]`` (free dims of data flattened), bit-exact.

    Dimensions:
        P: data partitions; F: data elements per partition.

    Args:
        dst: [F, P]; PSUM for the PE path, SBUF/PSUM for the VectorE path; dtype must equal data's.
        data: [P, F...]; SBUF for the PE path (P, F ≤ 128), SBUF/PSUM for VectorE (P, F ≤ 32).
        engine: ``nisa.tensor_engine`` / ``nisa.vector_engine``; unknown picks PE when data is in SBUF and dst
            in PSUM, else VectorE.
        name: debug label.

    Returns:
        The instruction handle.
    """
    instr = "nc_transpose"
    dst = operands.compute_operand(instr, "dst", dst)
    data = operands.compute_operand(instr, "data", data)
    default = Engine.PE if data.buffer.kind == "sbuf" and dst.buffer.kind == "psum" else Engine.VECTOR
    eng = resolve_engine(instr, engine, default, (Engine.PE, Engine.VECTOR))
    p, f = data.shape[0], data.free_elems
    operands.same_dtype(instr, "data", data, "dst", dst)
    if eng is Engine.PE:
        checks.buffer(instr, "data", data, checks.SBUF_ONLY)
        checks.buffer(instr, "dst", dst, checks.PSUM_ONLY)
        checks.at_most(instr, "data", "free size", f, checks.PMAX)
        operands.psum_bank(instr, "dst", dst)
    else:
        checks.at_most(instr, "data", "partition dimension", p, checks.VECTOR_TRANSPOSE_MAX)
        checks.at_most(instr, "data", "free size", f, checks.VECTOR_TRANSPOSE_MAX)
    if dst.shape[0] != f or dst.free_elems != p:
        checks.fail(f"{instr} dst shape {dst.shape} must be [{f}, {p}] for data shape {data.shape}")
    dst.write_raw(data._np().reshape(p, f).T)  # overlap-safe numpy assignment
    if eng is Engine.PE:
        track_group(instr, dst, accumulates=False)
        attrs = {"stationary_free": f, "moving_free": p, "fp32": data.dtype == dtypes.float32, "is_transpose": True}
        return emit(instr, eng, dst, [data], partitions=p, free_elems=p, attrs=attrs)
    return emit(
        instr,
        eng,
        dst,
        [data],
        attrs={"op": "transpose", "psum_input": data.buffer.kind == "psum", "unit_stride": True},
    )
