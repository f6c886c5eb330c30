"""DMA instructions: ``dma_copy``, ``dma_transpose``, ``dma_compute`` (HBM ↔ SBUF, HBM ↔ HBM, SBUF ↔ SBUF)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from nki_cpu import checks, dtypes, operands
from nki_cpu.cost.record import Engine
from nki_cpu.isa import enums as _enums
from nki_cpu.isa._emit import emit
from nki_cpu.isa.enums import NkiInstruction, dge_mode, engine, oob_mode
from nki_cpu.opcodes import Op, require_op
from nki_cpu.tensor import NkiTensor

_DEFAULT_AXES = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}


def _contiguous_run(t: NkiTensor) -> int:
    """Elements of the longest row-major contiguous run of ``t`` (within one partition when on chip)."""
    dims = list(zip(t.shape, t.strides, strict=True))
    if t.buffer.on_chip:
        dims = dims[1:]
    run = 1
    for n, s in reversed(dims):
        if n == 1:
            continue
        if s != run:
            break
        run *= n
    return run


def _dma_attrs(dst: NkiTensor, srcs: Sequence[NkiTensor], transpose: bool, mode: Any) -> dict[str, Any]:
    runs = [_contiguous_run(t) * t.itemsize for t in (dst, *srcs)]
    contiguous = max(1, min(runs))
    if transpose:
        contiguous = min(contiguous, dst.itemsize * 1)
    total = dst.size * dst.itemsize
    return {
        "transpose": transpose,
        "contiguous_bytes": contiguous,
        "descriptors": max(1, total // contiguous),
        "src": srcs[0].buffer.kind,
        "dst": dst.buffer.kind,
        "dge_mode": getattr(mode, "name", str(mode)),
    }


def _sbuf_side(dst: NkiTensor, srcs: Sequence[NkiTensor]) -> NkiTensor:
    for t in (dst, *srcs):
        if t.buffer.kind == "sbuf":
            return t
    return dst


def _emit_dma(
    instr: str, dst: NkiTensor, srcs: Sequence[NkiTensor], transpose: bool, mode: Any, moved: float = 1.0
) -> NkiInstruction:
    """The record of a DMA: sized by its SBUF side (dst if neither is in SBUF), nbytes = bytes written (``moved``:
    the share of rows not skipped by ``oob_mode.skip``)."""
    side = _sbuf_side(dst, srcs)
    return emit(
        instr,
        Engine.DMA,
        dst,
        srcs,
        partitions=side.partitions,
        free_elems=side.free_elems,
        nbytes=round(dst.size * dst.itemsize * moved),
        attrs=_dma_attrs(dst, srcs, transpose, mode),
    )


def _dma_operand(instr: str, name: str, t: Any) -> NkiTensor:
    t = operands.tensor(instr, name, t)
    checks.buffer(instr, name, t, checks.HBM_OR_SBUF)
    checks.partitions(instr, name, t)
    return t


def dma_copy(
    dst: NkiTensor,
    src: NkiTensor,
    priority: int | None = None,
    oob_mode: Any = oob_mode.error,
    dge_mode: Any = dge_mode.unknown,
    engine: Any = engine.unknown,
    name: str | None = None,
) -> NkiInstruction:
    """Copy ``src`` into ``dst`` element by element in row-major order of each view.

    Dimensions:
        Any shapes with equal element counts (e.g. HBM (N,) → SBUF (N,1); HBM (C,g,D) → SBUF (C,g·D)).

    Args:
        dst: HBM or SBUF view (not PSUM), any dtype.
        src: HBM or SBUF view (not PSUM), any dtype.
        priority: QoS hint (no effect).
        oob_mode: indirect out-of-bounds behaviour (indirect views are bounds-checked; errors always raise).
        dge_mode: descriptor generation mode; ``hwdge`` requires equal dtypes.
        engine: queue-trigger hint (no effect).
        name: debug label.

    Returns:
        The instruction handle.

    Notes:
        Equal dtypes copy bits; different dtypes convert through fp32 and round once (RNE).
    """
    instr = "dma_copy"
    dst = _dma_operand(instr, "dst", dst)
    src = _dma_operand(instr, "src", src)
    checks.element_count(instr, dst, src)
    if dge_mode == _enums.dge_mode.hwdge and dst.dtype != src.dtype:
        operands.same_dtype(instr, "src", src, "dst", dst)
    _dynamic_dge(instr, dge_mode, dst=dst, src=src)
    skip = oob_mode == _enums.oob_mode.skip
    if not skip:
        operands.in_bounds(instr, "dst", dst)
        operands.in_bounds(instr, "src", src)
    values = src._read().reshape(-1) if dst.dtype == src.dtype else src._read_f32().reshape(-1)
    rows = _rows_in_bounds(dst, src)  # outside rows left: oob_mode.skip, or the rule relaxed (then skipped too)
    if rows is None:
        if dst.dtype == src.dtype:
            dst.write_raw(values)
        else:
            dst.write(values)
    elif rows.any():
        _write_valid_rows(dst, values, rows)
    moved = 1.0 if rows is None else float(rows.mean())
    return _emit_dma(instr, dst, [src], False, dge_mode, moved)


def _rows_in_bounds(dst: NkiTensor, src: NkiTensor) -> np.ndarray | None:
    """Under ``oob_mode.skip`` (or ``dynamic_out_of_bounds`` relaxed): per transferred row, True where both sides are inside their tensors (None: all
    inside). A scalar or ``nl.ds`` index outside skips the whole transfer; a vector offset skips its rows."""
    rows = np.ones(max(1, (dst if dst._row_offsets is not None else src).shape[0]), dtype=bool)
    outside = False
    for t in (dst, src):
        if t.runtime is None or not t.runtime.any_out_of_bounds:
            continue
        outside = True
        if t.runtime.out_of_bounds:
            rows[:] = False
        elif t.runtime.oob_rows is not None and t.runtime.oob_rows.size == rows.size:
            rows &= ~t.runtime.oob_rows
        else:
            rows[:] = False
    return rows if outside else None


def _write_valid_rows(dst: NkiTensor, values: np.ndarray, rows: np.ndarray) -> None:
    """Write ``values`` (dst's elements, row-major) into the rows of ``dst`` flagged in ``rows`` (index 0)."""
    if dst._row_offsets is not None:
        dst.write_rows(values, rows)
        return
    kept = dst._read().reshape(rows.size, -1)
    new = dtypes.round_to(np.asarray(values), dst.dtype).reshape(rows.size, -1)
    kept[rows] = new[rows]
    dst.write_raw(kept.reshape(-1))


def _dynamic_dge(instr: str, mode: Any, **views: NkiTensor) -> None:
    """A DMA addressed at run time needs descriptors generated on device (rule ``dynamic_dge_mode``): software or
    hardware DGE for a dynamic start, software DGE for a vector-offset gather/scatter (ISA ``dma_copy``,
    v2.29.1-v2.33.0: "When either sw_dge or hw_dge mode is used, the src and dst tensors can have a dynamic start
    address ... When sw_dge is selected, nisa.dma_copy can also perform a gather or scatter operation")."""
    for name, t in views.items():
        if not t.is_indirect():
            continue
        if mode == _enums.dge_mode.none:
            operands.rule(
                "dynamic_dge_mode",
                f"{instr} {name} addressed at run time needs descriptors generated on device, got "
                "dge_mode=none (descriptors written before the launch). Fix: dge_mode=swdge or hwdge (or leave it "
                "unknown)",
            )
        elif t._row_offsets is not None and mode == _enums.dge_mode.hwdge:
            operands.rule(
                "dynamic_dge_mode",
                f"{instr} {name} gathered/scattered through a vector offset needs software DGE, got "
                "dge_mode=hwdge. Fix: dge_mode=swdge (or leave it unknown)",
            )


def dma_transpose(
    dst: NkiTensor,
    src: NkiTensor,
    axes: Sequence[int] | None = None,
    priority: int | None = None,
    dge_mode: Any = dge_mode.unknown,
    oob_mode: Any = oob_mode.error,
    name: str | None = None,
) -> NkiInstruction:
    """``dst = transpose(src, axes)`` through the DMA engines, bit-exact.

    Dimensions:
        2-D (1,0), 3-D (2,1,0), 4-D (3,1,2,0); dst.shape must equal the permuted src.shape.

    Args:
        dst: SBUF view, same dtype as src.
        src: HBM or SBUF view, 2- or 4-byte dtype (any ``dge_mode``; README, known unknown 16).
        axes: the permutation (default per rank as above).
        priority: QoS hint (no effect).
        dge_mode: ``hwdge`` adds the hardware-DGE shape limits (src.shape[0] == 16 for 2-D, ...); a src addressed
            at run time is rejected (rule ``indirect_transpose``).
        oob_mode: indirect out-of-bounds behaviour.
        name: debug label.

    Returns:
        The instruction handle.
    """
    instr = "dma_transpose"
    dst = _dma_operand(instr, "dst", dst)
    src = _dma_operand(instr, "src", src)
    checks.buffer(instr, "dst", dst, checks.SBUF_ONLY)
    operands.same_dtype(instr, "src", src, "dst", dst)
    if src.itemsize not in (2, 4):
        checks.fail(f"{instr} src dtype {dtypes.name(src.dtype)} must be a 2- or 4-byte dtype")
    if src.ndim not in _DEFAULT_AXES:
        checks.fail(f"{instr} src must be 2-D, 3-D or 4-D, got shape {src.shape}")
    axes = tuple(axes) if axes is not None else _DEFAULT_AXES[src.ndim]
    if axes != _DEFAULT_AXES[src.ndim]:
        checks.fail(f"{instr} axes {axes} not supported for a {src.ndim}-D src (supported {_DEFAULT_AXES[src.ndim]})")
    expected = tuple(src.shape[a] for a in axes)
    if dst.shape != expected:
        checks.fail(f"{instr} dst shape {dst.shape} must equal the transposed src shape {expected}")
    if src.is_runtime_addressed():
        _runtime_addressed_transpose(instr, src)
    if dge_mode == _enums.dge_mode.hwdge:
        if src.itemsize != 2:
            checks.fail(f"{instr} hwdge needs a 2-byte dtype, got {dtypes.name(src.dtype)}")
        if src.ndim == 2 and src.shape[0] != 16:
            checks.fail(f"{instr} hwdge 2-D src.shape[0] must be 16, got {src.shape[0]}")
        checks.at_most(instr, "src", "last dim", src.shape[-1], 128)
    dst.write_raw(np.transpose(src._read(), axes))
    return _emit_dma(instr, dst, [src], True, dge_mode)


def _runtime_addressed_transpose(instr: str, src: NkiTensor) -> None:
    """A transpose whose source is addressed at run time (``nl.ds`` with a run-time start, a scalar or vector offset)
    is rejected (rule ``indirect_transpose``). Such a view is indirect (nki.language.ds, v2.33.0); the ISA
    ``dma_transpose`` page documents a direct form (hardware DGE: ``src.shape[0] == 16``) and an indirect form that
    gathers rows through an index tensor in SBUF (software DGE, 2-byte dtypes), not a run-time start address
    ("DMA Direct / Indirect Transpose Constraints", v2.29.1-v2.33.0); AWS's nki-library loads such sources with
    ``dma_copy`` and transposes them on the tensor engine, noting that dma_transpose does not support dynamic access
    (MLP TKG ``_load_transposed_tile``, NKI-415)."""
    operands.rule(
        "indirect_transpose",
        f"{instr} src addressed at run time (nl.ds with a run-time start or a scalar/vector offset) is not a "
        "documented dma_transpose form: load it with dma_copy (dynamic start addresses are documented there) "
        "and transpose it on the tensor engine",
    )


def dma_compute(
    dst: NkiTensor,
    srcs: Sequence[NkiTensor],
    reduce_op: Op,
    scales: Sequence[float] | None = None,
    unique_indices: bool = True,
    oob_mode: Any = oob_mode.error,
    name: str | None = None,
) -> NkiInstruction:
    """``dst = Σ_i srcs[i]·scales[i]`` computed in fp32 by the DMA engines.

    Args:
        dst: HBM or SBUF view.
        srcs: 1..16 HBM/SBUF views with dst's element count.
        reduce_op: ``nl.add`` only.
        scales: per-source factors (1.0 each when omitted).
        unique_indices: must be True (rule ``dma_compute_unique_indices``).
        oob_mode: indirect out-of-bounds behaviour.
        name: debug label.

    Returns:
        The instruction handle.
    """
    instr = "dma_compute"
    dst = _dma_operand(instr, "dst", dst)
    op = require_op(reduce_op, instr, "reduce_op")
    if op.name != "add":
        checks.fail(f"{instr} reduce_op must be nl.add, got {op!r}")
    srcs = [_dma_operand(instr, f"srcs[{i}]", s) for i, s in enumerate(srcs)]
    checks.at_most(instr, "srcs", "count", len(srcs), 16)
    for i, s in enumerate(srcs):
        operands.in_bounds(instr, f"srcs[{i}]", s)
    operands.in_bounds(instr, "dst", dst)
    _static_addresses(instr, dst, srcs)
    if not unique_indices:
        operands.rule(
            "dma_compute_unique_indices",
            f"{instr} unique_indices must be True, got False (ISA dma_compute, v2.29.0-v2.32.0: 'unique_indices must "
            "be True (non-unique indices not yet supported)'). Fix: combine the rows that share an index before "
            "the instruction and pass unique_indices=True",
        )
    _unique_scatter(instr, dst)
    scales = list(scales) if scales is not None else [1.0] * len(srcs)
    acc = np.zeros(dst.size, dtype=np.float32)
    for s, scale in zip(srcs, scales, strict=True):
        checks.element_count(instr, dst, s)
        acc = acc + s._read_f32().reshape(-1) * np.float32(scale)
    dst.write(acc)
    return _emit_dma(instr, dst, srcs, False, "unknown")


def _static_addresses(instr: str, dst: NkiTensor, srcs: Sequence[NkiTensor]) -> None:
    """``dma_compute`` operands have compile-time addresses unless addressed through a vector offset (rule
    ``dma_compute_static_address``): "Both srcs and dst tensors must have compile-time known addresses (unless
    using vector_offset for indirect access)" (ISA ``dma_compute``, v2.29.0-v2.32.0), and its DGE mode without a
    vector offset is None (static descriptors, which cannot hold a run-time address: ISA ``dma_copy``)."""
    for name, t in (("dst", dst), *((f"srcs[{i}]", s) for i, s in enumerate(srcs))):
        if t.runtime_start and t._row_offsets is None:
            operands.rule(
                "dma_compute_static_address",
                f"{instr} {name} must have a compile-time known address, got a view addressed at run time (nl.ds with "
                "a run-time start or a scalar_offset). Fix: dma_copy the window into a fixed tile first (dma_copy "
                "takes run-time addresses), or address rows through a vector_offset",
            )


def _unique_scatter(instr: str, dst: NkiTensor) -> None:
    """A ``dma_compute`` scattering through a vector offset writes each row once (rule ``unique_scatter_indices``):
    the page's ``unique_indices`` describes the indices, and what the DMA writes when two rows meet is not
    documented, so repeated indices are rejected rather than resolved one way here."""
    offsets = dst._row_offsets
    if offsets is not None and np.unique(offsets).size != offsets.size:
        operands.rule(
            "unique_scatter_indices",
            f"{instr} dst scatter indices must be distinct (each row written once), got {offsets.size - np.unique(offsets).size} "
            "repeated. Fix: combine the rows that share an index before the scatter",
        )
