"""``NkiTensor``: a strided view over one allocation's bytes, in one of the NKI buffers.

Storage is a flat ``uint8`` numpy array (so ml_dtypes types and ``.view(dtype)`` reinterpretation work the same
way); a tensor is (storage, dtype, shape, strides, offset), strides and offset counted in elements of the view's
dtype, exactly the NKI model of docs/nki-sources.md §2.3. Element ``[i0, ..]`` lives at storage element
``offset + Σ strides[k]·ik``. Every view method returns a new ``NkiTensor`` over the same storage; nothing copies.
"""

from __future__ import annotations

import enum
import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nki_cpu import checks, dtypes, state
from nki_cpu.cost.record import Region
from nki_cpu.scalar import NkiScalar, runtime_value, sources_of

_DATA_FIX = (
    "compute on the data with instructions (nisa.*) and move a value the program needs as an offset or bound "
    "through nisa.scalar_load / nisa.register_load; read results on the host after the launch"
)


_OFFSET_FIX = "keep the run-time value as an NkiScalar and pass it on (nl.ds(i, n), .ap(scalar_offset=i))"


class MemoryRegion(str, enum.Enum):
    """NKI buffers (``nl.sbuf``, ``nl.psum``, ``nl.private_hbm`` = ``nl.hbm``, ``nl.shared_hbm``)."""

    sbuf = "sbuf"
    psum = "psum"
    private_hbm = "private_hbm"
    shared_hbm = "shared_hbm"

    def __str__(self) -> str:
        return self.value

    @property
    def on_chip(self) -> bool:
        """True for SBUF and PSUM (partitioned buffers)."""
        return self in (MemoryRegion.sbuf, MemoryRegion.psum)

    @property
    def kind(self) -> str:
        """The cost-model buffer name: ``"hbm"``, ``"sbuf"`` or ``"psum"``."""
        return self.value if self.on_chip else "hbm"


@dataclass(frozen=True)
class RuntimeIndex:
    """How a view is addressed at run time (``nl.ds`` with a run-time start, ``.ap(scalar_offset= / vector_offset=)``).

    ``sources``: the registers / tiles the index comes from (the instruction using the view reads them, so the cost
    model orders it after their loads). ``dim``: the view dimension the index addresses (None when unknown).
    ``out_of_bounds``: the index lies outside the tensor (the view addresses nothing; an instruction using it fails
    unless its ``oob_mode`` is ``skip``). ``oob_rows``: per gathered row, True where a vector offset is outside.
    """

    sources: tuple[Region, ...] = ()
    dim: int | None = None
    out_of_bounds: bool = False
    oob_rows: np.ndarray | None = field(default=None, compare=False)

    @property
    def any_out_of_bounds(self) -> bool:
        """True when the index (or one gathered row) lies outside the tensor."""
        return self.out_of_bounds or (self.oob_rows is not None and bool(self.oob_rows.any()))


@dataclass(frozen=True)
class DynamicSlice:
    """``nl.ds(start, size)``: the window ``start : start + size`` of one dimension."""

    start: Any  # an int, or a run-time value (NkiScalar, VirtualRegister, 1x1 tensor) read when the view is made
    size: int

    def as_slice(self) -> slice:
        """The equivalent Python slice (a run-time start at its current value: sealed inside a kernel, rule
        ``runtime_scalars``)."""
        if self.is_runtime():
            state.seal("runtime_scalars", "nl.ds(run-time start, n).as_slice()", _OFFSET_FIX)
        start = _scalar_value(self.start)
        return slice(start, start + self.size)

    def is_runtime(self) -> bool:
        """True when the start is a run-time value (not a trace-time int)."""
        return not isinstance(self.start, (int, np.integer))


# Every allocation alive in the process (a compiled loop's trace-only pass restores their bytes: ``nki_cpu.loops``).
_LIVE: weakref.WeakSet[Storage] = weakref.WeakSet()


def live_storages() -> list[Storage]:
    """The allocations alive now (kernel arguments included)."""
    return list(_LIVE)


class Storage:
    """One allocation: raw bytes plus the facts views and records need.

    Args:
        raw: flat ``uint8`` array (the caller's memory for kernel arguments).
        buffer: the buffer the allocation lives in.
        shape: allocation shape; on-chip dim 0 is the partition dim.
        dtype: allocation dtype.
    """

    def __init__(self, raw: np.ndarray, buffer: MemoryRegion, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.id = state.next_storage_id()
        self._raw = raw
        _LIVE.add(self)
        self.buffer = buffer
        self.shape = shape
        self.dtype = dtype
        # Plain attributes for the hot path (the enum properties cost a call each).
        self.on_chip = buffer.on_chip
        self.kind = buffer.kind
        if buffer.on_chip:
            self.partitions = shape[0] if shape else 1
            self.row_bytes = raw.size // max(self.partitions, 1)
        else:
            self.partitions = 1
            self.row_bytes = raw.size
        # nc_matmul(accumulate=None) flags: one byte per 4-byte word ("written by nc_matmul since allocation"),
        # None until the first nc_matmul writes the allocation.
        self.matmul_written: np.ndarray | None = None

    # (launch, buffer, bytes per partition) of an on-chip allocation, set by ``Launch.allocate``.
    release: tuple[Any, str, int] | None = None
    # The kernel argument's name when it wraps a caller's read-only numpy array (set by the launch).
    read_only_argument: str | None = None

    @property
    def raw(self) -> np.ndarray:
        """The allocation's bytes (host code only inside a launch: rule ``device_data``)."""
        state.seal("device_data", "tensor.storage.raw", _DATA_FIX)
        return self._raw

    def check_writable(self) -> None:
        """Raise when this is a caller's read-only array: the write could never reach the caller."""
        if self.read_only_argument is not None:
            raise ValueError(
                f"nki-cpu: the kernel writes kernel argument `{self.read_only_argument}`, but the caller passed a "
                "read-only numpy array, so the update could not reach the caller. Fix: pass a writable array "
                "(e.g. a copy)"
            )

    def __del__(self) -> None:
        release = self.release
        if release is not None:
            release[0].free(release[1], release[2], self.id)

    def written_flags(self) -> np.ndarray:
        """The per-word 'written by nc_matmul since allocation' flags (created on first use)."""
        if self.matmul_written is None:
            self.matmul_written = np.zeros((self._raw.size + 3) // 4, dtype=np.uint8)
        return self.matmul_written


def _norm_dim(dim: int, ndim: int) -> int:
    if not -ndim <= dim < ndim:
        checks.fail(
            f"tensor dim must be in [-{ndim}, {ndim}) for a {ndim}-D tensor, got {dim}", checks.OutOfBoundsError
        )
    return dim % ndim


class NkiTensor:
    """A tensor (or view) in HBM, SBUF or PSUM.

    Dimensions:
        On-chip tensors: dim 0 = partitions (≤128 for instruction operands), the rest = free dims.
        HBM tensors: linear, no partition dim.

    Args:
        storage: the allocation.
        dtype: element dtype of this view.
        shape: view shape.
        strides: per-dim step in elements of ``dtype``.
        offset: start element (in elements of ``dtype``) within the storage.
        name: debug label.

    Notes:
        Read-only from kernels' point of view: data is written only by instructions (``nisa.*``, ``nl.store``).
    """

    def __init__(
        self,
        storage: Storage,
        dtype: np.dtype,
        shape: Sequence[int],
        strides: Sequence[int],
        offset: int,
        name: str = "",
        row_offsets: np.ndarray | None = None,
        runtime_start: bool = False,
        runtime: RuntimeIndex | None = None,
    ) -> None:
        self.storage = storage
        self.dtype = dtype
        self.shape = tuple(int(s) for s in shape)
        self.strides = tuple(int(s) for s in strides)
        self._offset = int(offset)
        self.name = name
        self._row_offsets = row_offsets  # indirect (vector_offset) views: per-index-0 start offsets
        # Addressed from a run-time value (nl.ds with a run-time start, .ap(scalar_offset=) of one): the docs call
        # such a view indirect (nki.language.ds, SDK 2.33); nki-cpu resolves the value now, so it keeps this fact
        # for the instructions whose documented limits depend on it (dma_transpose).
        self.runtime_start = runtime_start
        self.runtime = runtime  # the run-time index of a view addressed at run time (RuntimeIndex), else None
        # A tensor never changes after construction, so its numpy view, region and sizes are computed once.
        self._on_chip: bool = storage.on_chip
        self._view: np.ndarray | None = None
        self._region: Region | None = None
        self._size = math.prod(self.shape)
        self._check_bounds()

    # --- basic attributes -----------------------------------------------------------------------------------------
    @property
    def offset(self) -> int:
        """Start element within the storage. For a view addressed at run time (``nl.ds`` with a run-time start,
        ``.ap(scalar_offset=)`` / ``vector_offset``) it is a run-time value: sealed inside a kernel (rule
        ``runtime_scalars``)."""
        if self.runtime_start or self._row_offsets is not None:
            state.seal("runtime_scalars", "the .offset of a view addressed at run time", _OFFSET_FIX)
        return self._offset

    @property
    def buffer(self) -> MemoryRegion:
        """The buffer holding this tensor."""
        return self.storage.buffer

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of elements."""
        return self._size

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return self.dtype.itemsize

    @property
    def partitions(self) -> int:
        """Partition count of an on-chip view (dim 0); 1 for HBM."""
        return self.shape[0] if self._on_chip and self.shape else 1

    @property
    def free_elems(self) -> int:
        """Elements per partition (on-chip: product of free dims; HBM: all elements)."""
        if self._on_chip:
            return self._size // self.shape[0] if self.shape[0] else math.prod(self.shape[1:])
        return self._size

    def __repr__(self) -> str:
        return (
            f"NkiTensor(shape={self.shape}, dtype={dtypes.name(self.dtype)}, buffer={self.buffer.value}, "
            f"strides={self.strides}, offset={'runtime' if self.is_indirect() else self._offset})"
        )

    def __len__(self) -> int:
        return self.shape[0]

    def __setitem__(self, key: Any, value: Any) -> None:
        checks.fail(
            "tensor item assignment is not an instruction: tensors are written by instructions (nisa.*, nl.store), "
            f"got tensor[{key!r}] = ...",
            checks.KernelTypeError,
        )

    def is_indirect(self) -> bool:
        """True for views addressed at run time: a run-time ``nl.ds`` start, a scalar or a vector offset
        (nki.language.ds, v2.33.0: "With a runtime start ... the resulting view is indirect")."""
        return self.runtime_start or self._row_offsets is not None

    def runtime_reads(self) -> tuple[Region, ...]:
        """The registers / index tiles an instruction using this view reads to form its address."""
        return self.runtime.sources if self.runtime is not None else ()

    def is_runtime_addressed(self) -> bool:
        """True for views whose start or rows come from a run-time value (a scalar or a vector offset)."""
        return self.runtime_start or self._row_offsets is not None

    def get_pattern(self) -> list[list[int]]:
        """``[[stride, count], ...]`` per dim, in shape order."""
        return [[s, n] for s, n in zip(self.strides, self.shape, strict=True)]

    def is_contiguous(self) -> bool:
        """Row-major contiguity (for on-chip tensors the partition dim is ignored)."""
        dims = list(zip(self.shape, self.strides, strict=True))
        if self._on_chip:
            dims = dims[1:]
        expected = 1
        for n, s in reversed(dims):
            if n != 1 and s != expected:
                return False
            expected *= n
        return True

    # --- numpy access ---------------------------------------------------------------------------------------------
    def _whole_allocation(self) -> bool:
        """True when this view is its allocation as allocated: same shape, row-major, from its first element."""
        same = self._offset == 0 and self.dtype == self.storage.dtype and self.shape == tuple(self.storage.shape)
        return same and self.strides == _row_major(self.shape)

    def _storage_elems(self) -> int:
        return self.storage._raw.size // self.itemsize

    def _extent(self) -> tuple[int, int]:
        lo = hi = self._offset
        for n, s in zip(self.shape, self.strides, strict=True):
            if n == 0:
                return self._offset, self._offset - 1
            if s > 0:
                hi += s * (n - 1)
            else:
                lo += s * (n - 1)
        return lo, hi

    def _check_bounds(self) -> None:
        if self._row_offsets is not None or self._size == 0:
            return
        if self.runtime is not None and self.runtime.out_of_bounds:
            return
        lo, hi = self._extent()
        if lo < 0 or hi >= self._storage_elems():
            checks.fail(
                f"view {self.shape} (strides {self.strides}, offset {self._offset}) elements must lie inside its "
                f"allocation of {self._storage_elems()} elements, got [{lo}, {hi}]",
                checks.OutOfBoundsError,
            )

    def _index_array(self) -> np.ndarray:
        """Flat element indices of every element of this view (used for indirect views)."""
        idx = np.full(self.shape, self._offset, dtype=np.int64)
        for k, (n, s) in enumerate(zip(self.shape, self.strides, strict=True)):
            shape = [1] * self.ndim
            shape[k] = n
            if k == 0 and self._row_offsets is not None:
                idx = idx + self._row_offsets.reshape(shape)
            else:
                idx = idx + (np.arange(n, dtype=np.int64) * s).reshape(shape)
        return idx

    def _np(self) -> np.ndarray:
        """A writable numpy view of the elements (a copy for indirect views: use :meth:`write`).

        Notes:
            The view of a direct tensor is built once and cached; callers must not change its shape in place.
        """
        if self._row_offsets is not None:
            flat = self.storage._raw.view(self.dtype)
            return flat[self._index_array()]
        view = self._view
        if view is None:
            isz = self.dtype.itemsize
            view = self._view = np.ndarray(
                self.shape,
                dtype=self.dtype,
                buffer=self.storage._raw,
                offset=self._offset * isz,
                strides=tuple(s * isz for s in self.strides),
            )
        return view

    def _read(self) -> np.ndarray:
        """A copy of the elements at their stored dtype."""
        return np.array(self._np(), copy=True)

    def _read_f32(self) -> np.ndarray:
        """A copy of the elements converted to fp32."""
        return dtypes.to_f32(self._np())

    def _read_pf(self) -> np.ndarray:
        """fp32 copy flattened per partition: ``(P, free_elems)``."""
        return self._read_f32().reshape(self.partitions, -1)

    def _peek_f32(self) -> np.ndarray:
        """The elements as fp32, WITHOUT a copy when they already are fp32 (treat the result as read-only).

        Instructions use it for inputs they only read: results go to fresh arrays and reach ``dst`` through
        :meth:`write`, whose numpy assignment is overlap-safe, so in-place calls still read every input first.
        """
        values = self._np()
        return values if values.dtype == dtypes.float32 else values.astype(np.float32)

    def _lanes(self) -> np.ndarray:
        """The elements at their stored dtype as ``(P, free_elems)`` (a view when the layout allows; read-only use)."""
        return self._np().reshape(self.partitions, -1)

    def _peek_pf(self) -> np.ndarray:
        """:meth:`peek_f32` flattened per partition: ``(P, free_elems)`` (read-only, possibly shared)."""
        return self._peek_f32().reshape(self.partitions, -1)

    # --- device data, as host code sees it -------------------------------------------------------------------------
    # Inside a launch these are sealed from the kernel's Python (rule ``device_data``; ``state.seal``): on Trainium
    # the kernel is traced before any data exists. nki-cpu's instructions read through the underscored forms.
    def np(self) -> np.ndarray:
        """A writable numpy view of the elements (a copy for indirect views); host code only inside a launch."""
        state.seal("device_data", "tile.np()", _DATA_FIX)
        return self._np()

    def read(self) -> np.ndarray:
        """A copy of the elements at their stored dtype; host code only inside a launch."""
        state.seal("device_data", "tile.read()", _DATA_FIX)
        return self._read()

    def read_f32(self) -> np.ndarray:
        """A copy of the elements converted to fp32; host code only inside a launch."""
        state.seal("device_data", "tile.read_f32()", _DATA_FIX)
        return self._read_f32()

    def read_pf(self) -> np.ndarray:
        """fp32 copy flattened per partition, ``(P, free_elems)``; host code only inside a launch."""
        state.seal("device_data", "tile.read_pf()", _DATA_FIX)
        return self._read_pf()

    def peek_f32(self) -> np.ndarray:
        """The elements as fp32 without a copy when they are fp32 (read-only); host code only inside a launch."""
        state.seal("device_data", "tile.peek_f32()", _DATA_FIX)
        return self._peek_f32()

    def peek_pf(self) -> np.ndarray:
        """:meth:`peek_f32` flattened per partition (read-only); host code only inside a launch."""
        state.seal("device_data", "tile.peek_pf()", _DATA_FIX)
        return self._peek_pf()

    def lanes(self) -> np.ndarray:
        """The elements as ``(P, free_elems)`` at their stored dtype (read-only); host code only inside a launch."""
        state.seal("device_data", "tile.lanes()", _DATA_FIX)
        return self._lanes()

    def write(self, values: np.ndarray) -> None:
        """Round ``values`` once into this view's dtype and store them (values reshaped to the view's shape)."""
        if self.storage.read_only_argument is not None:
            self.storage.check_writable()
        values = np.asarray(values)
        if self._row_offsets is None and values.dtype.kind == "f" and self.dtype.kind not in "iu":
            # Float into float (incl. ml_dtypes): one cast straight into the view — the same RNE conversion as
            # ``astype`` (numpy uses one cast function for both) without an intermediate array. Overlap-safe.
            np.copyto(self._np(), values.reshape(self.shape), casting="unsafe")
            return
        rounded = dtypes.round_to(values, self.dtype).reshape(self.shape)
        if self._row_offsets is not None:
            flat = self.storage._raw.view(self.dtype)
            flat[self._index_array()] = rounded
            return
        self._np()[...] = rounded

    def write_rows(self, values: np.ndarray, rows: np.ndarray) -> None:
        """:meth:`write` restricted to the rows (index 0 of this view) where ``rows`` is True: a DMA with
        ``oob_mode.skip`` leaves the others untouched (for a gather, the dst rows whose source row is outside)."""
        values = dtypes.round_to(np.asarray(values), self.dtype).reshape(self.shape)
        flat = self.storage._raw.view(self.dtype)
        flat[self._index_array()[rows]] = values[rows]

    def write_raw(self, values: np.ndarray) -> None:
        """Store values already in this view's dtype (bit-exact copies)."""
        if self.storage.read_only_argument is not None:
            self.storage.check_writable()
        values = np.asarray(values).reshape(self.shape)
        if self._row_offsets is not None:
            self.storage._raw.view(self.dtype)[self._index_array()] = values
            return
        self._np()[...] = values

    def matmul_written(self) -> np.ndarray | None:
        """Per-element 'written by nc_matmul since allocation' flags of this view (None: nothing written yet).

        Notes:
            Flags are kept per 4-byte word of the allocation (an fp32 PSUM element); a 2-byte element counts as
            written when its word was (only fp32 matmul results read the flags).
        """
        if self.storage.matmul_written is None:
            return None
        return self._word_flags(self.storage.matmul_written)

    def mark_matmul_written(self) -> None:
        """Flag every element of this view as written by nc_matmul."""
        flags = self.storage.written_flags()
        if self.itemsize == 4 and self._row_offsets is None:
            self._word_flags(flags)[...] = 1
        else:
            flags[(self._index_array() * self.itemsize) // 4] = 1

    def _word_flags(self, flags: np.ndarray) -> np.ndarray:
        if self.itemsize == 4 and self._row_offsets is None:
            return np.ndarray(self.shape, dtype=np.uint8, buffer=flags, offset=self._offset, strides=self.strides)
        return flags[(self._index_array() * self.itemsize) // 4]

    # --- regions for the cost model -------------------------------------------------------------------------------
    def region(self) -> Region:
        """Bounding box of the bytes this view touches (cost-model dependency tracking; computed once). For a view
        addressed at run time it holds the resolved address: sealed inside a kernel (rule ``runtime_scalars``)."""
        if self.runtime is not None:
            state.seal("runtime_scalars", "the .region() of a view addressed at run time", _OFFSET_FIX)
        region = self._region
        if region is None:
            region = self._region = self._compute_region()
        return region

    def _compute_region(self) -> Region:
        st = self.storage
        kind = st.kind
        if self.runtime is not None and self.runtime.out_of_bounds:
            # Addressed at run time outside its tensor: the transfer is skipped (``oob_mode.skip``) and touches no
            # byte, so it orders nothing; an in-bounds run-time address is resolved like any other.
            return Region(st.id, kind, (0, 0), (0, 0))
        if self.runtime is not None and st.on_chip:
            # An on-chip operand at a run-time offset (on its free axis) may be anywhere in its partitions' rows
            # for all the compiler can tell, so it is ordered against every access to them.
            static = self._static_region()
            return Region(st.id, kind, static.partitions, (0, st.row_bytes))
        return self._static_region()

    def _static_region(self) -> Region:
        isz = self.itemsize
        st = self.storage
        kind = st.kind
        if self._row_offsets is not None:
            idx = self._index_array()
            lo, hi = int(idx.min()), int(idx.max())
        else:
            lo, hi = self._extent()
        if not st.on_chip:
            return Region(st.id, kind, (0, 1), (lo * isz, (hi + 1) * isz))
        row = st.row_bytes
        lo_b, hi_b = lo * isz, (hi + 1) * isz
        p_lo, p_hi = lo_b // row, (hi_b - 1) // row + 1
        if p_hi - p_lo == 1:
            return Region(st.id, kind, (p_lo, p_hi), (lo_b - p_lo * row, hi_b - p_lo * row))
        # Several partitions: bound the in-partition byte range from the free dims.
        f_lo = f_hi = self._offset * isz - (self._offset * isz // row) * row
        if self.ndim and self.strides[0] * isz == row:
            for n, s in zip(self.shape[1:], self.strides[1:], strict=True):
                if s > 0:
                    f_hi += s * isz * (n - 1)
                else:
                    f_lo += s * isz * (n - 1)
            f_hi += isz
            if 0 <= f_lo and f_hi <= row:
                return Region(st.id, kind, (p_lo, p_hi), (f_lo, f_hi))
        return Region(st.id, kind, (p_lo, p_hi), (0, row))

    # --- views ----------------------------------------------------------------------------------------------------
    def _make(
        self,
        shape: Sequence[int],
        strides: Sequence[int],
        offset: int,
        dtype: np.dtype | None = None,
        row_offsets: np.ndarray | None = None,
        runtime_start: bool = False,
        runtime: RuntimeIndex | None = None,
        keeps_dims: bool = False,
    ) -> NkiTensor:
        """A view over the same storage. ``runtime``: a new run-time index; otherwise this view's is inherited,
        with its ``dim`` kept only when ``keeps_dims`` (the new view has this view's dimensions)."""
        if runtime is None and self.runtime is not None:
            runtime = self.runtime if keeps_dims else _replace_dim(self.runtime, None)
        return NkiTensor(
            self.storage,
            self.dtype if dtype is None else dtype,
            shape,
            strides,
            offset,
            self.name,
            row_offsets if row_offsets is not None else self._row_offsets,
            runtime_start or self.runtime_start,
            runtime,
        )

    def __getitem__(self, key: Any) -> NkiTensor:
        if not isinstance(key, tuple):
            key = (key,)
        if any(k is Ellipsis for k in key):
            at = next(i for i, k in enumerate(key) if k is Ellipsis)
            fill = self.ndim - (len(key) - 1)
            key = key[:at] + (slice(None),) * fill + key[at + 1 :]
        if len(key) > self.ndim:
            checks.fail(
                f"index of a {self.ndim}-D tensor of shape {self.shape} takes at most {self.ndim} indices, got {len(key)}",
                checks.OutOfBoundsError,
            )
        key = key + (slice(None),) * (self.ndim - len(key))
        shape: list[int] = []
        strides: list[int] = []
        offset = self._offset
        on_chip = self._on_chip
        last_dropped_stride = 1
        runtime_start = False
        runtime = None
        _check_runtime_key(self, key)
        inherited_dim = self.runtime.dim if self.runtime is not None else None
        for dim, (k, n, s) in enumerate(zip(key, self.shape, self.strides, strict=True)):
            if dim == inherited_dim:
                inherited_dim = len(shape) if isinstance(k, slice) else None
            if isinstance(k, DynamicSlice):
                dynamic = k.is_runtime()
                runtime_start = runtime_start or dynamic
                k = k.as_slice()
                if dynamic:
                    runtime = RuntimeIndex(_index_sources(key[dim].start), len(shape), k.start < 0 or k.stop > n)
                    if runtime.out_of_bounds:
                        k = slice(0, k.stop - k.start)  # addresses nothing: the instruction using it decides
                elif k.start < 0 or k.stop > n:
                    checks.fail(
                        f"nl.ds window must lie inside dim {dim} of size {n}, got [{k.start}, {k.stop})",
                        checks.OutOfBoundsError,
                    )
            if isinstance(k, slice):
                start, stop, step = k.indices(n)
                count = len(range(start, stop, step))
                offset += start * s
                shape.append(count)
                strides.append(s * step)
            elif isinstance(k, (int, np.integer)):
                i = int(k)
                if not -n <= i < n:
                    checks.fail(
                        f"index of dim {dim} must be in [-{n}, {n}) (shape {self.shape}), got {i}",
                        checks.OutOfBoundsError,
                    )
                i %= n
                offset += i * s
                if on_chip and dim == 0:
                    shape.append(1)
                    strides.append(s)
                else:
                    last_dropped_stride = s
            elif isinstance(k, NkiTensor):
                raise NotImplementedError("nki-cpu: tensor-valued (runtime) indices are not supported; use .ap()")
            else:
                checks.fail(f"index must be an int, a slice or nl.ds, got {k!r}", checks.KernelTypeError)
        min_rank = 2 if on_chip else 1
        while len(shape) < min_rank:
            shape.append(1)
            strides.append(last_dropped_stride)
        if runtime is None and self.runtime is not None:
            runtime = _replace_dim(self.runtime, inherited_dim)
        return self._make(shape, strides, offset, runtime_start=runtime_start, runtime=runtime)

    def slice(self, dim: int, start: int, end: int, step: int = 1) -> NkiTensor:
        """View of ``start:end:step`` along ``dim``."""
        dim = _norm_dim(dim, self.ndim)
        key: list[Any] = [slice(None)] * self.ndim
        key[dim] = slice(start, end, step)
        return self[tuple(key)]

    def select(self, dim: int, index: int) -> NkiTensor:
        """Remove ``dim`` by fixing it at ``index`` (static int only)."""
        dim = _norm_dim(dim, self.ndim)
        if isinstance(index, NkiTensor):
            raise NotImplementedError("nki-cpu: dynamic select is not supported")
        n = self.shape[dim]
        if not -n <= index < n:
            checks.fail(f"select index must be in [-{n}, {n}) for dim {dim}, got {index}", checks.OutOfBoundsError)
        index %= n
        shape = self.shape[:dim] + self.shape[dim + 1 :]
        strides = self.strides[:dim] + self.strides[dim + 1 :]
        return self._make(shape, strides, self._offset + index * self.strides[dim])

    def permute(self, dims: Sequence[int]) -> NkiTensor:
        """Reorder dims (on-chip: ``dims[0]`` must be 0)."""
        dims = [_norm_dim(d, self.ndim) for d in dims]
        if sorted(dims) != list(range(self.ndim)):
            checks.fail(f"permute dims must be a permutation of {self.ndim} dims, got {dims}")
        if self._on_chip and dims[0] != 0:
            checks.fail(f"permute dims of an on-chip tensor must keep the partition dim first, got {dims}")
        return self._make([self.shape[d] for d in dims], [self.strides[d] for d in dims], self._offset)

    def broadcast(self, dim: int, size: int) -> NkiTensor:
        """Repeat a size-1 dim ``size`` times with stride 0."""
        dim = _norm_dim(dim, self.ndim)
        if self.shape[dim] != 1:
            checks.fail(f"broadcast dim {dim} must have size 1, got {self.shape[dim]}")
        if self._on_chip and dim == 0:
            checks.fail(f"broadcast dim of an on-chip tensor must not be the partition dim, got {dim}")
        shape = list(self.shape)
        strides = list(self.strides)
        shape[dim] = size
        strides[dim] = 0
        return self._make(shape, strides, self._offset)

    def expand_dim(self, dim: int) -> NkiTensor:
        """Insert a size-1 dim at ``dim``."""
        dim = dim % (self.ndim + 1)
        if self._on_chip and dim == 0:
            checks.fail(f"expand_dim dim of an on-chip tensor must come after the partition dim, got {dim}")
        shape = list(self.shape)
        strides = list(self.strides)
        shape.insert(dim, 1)
        strides.insert(dim, 1)
        return self._make(shape, strides, self._offset)

    def squeeze_dim(self, dim: int) -> NkiTensor:
        """Remove a size-1 dim."""
        dim = _norm_dim(dim, self.ndim)
        if self.shape[dim] != 1:
            checks.fail(f"squeeze_dim dim {dim} must have size 1, got {self.shape[dim]}")
        return self.select(dim, 0)

    def reshape(self, shape: Sequence[int] | int, *more: int) -> NkiTensor:
        """Same elements, new shape, no copy (the layout must allow it; on-chip dim 0 is kept)."""
        if isinstance(shape, (int, np.integer)):
            shape = (int(shape), *more)
        shape = list(shape)
        if shape.count(-1) == 1:
            known = math.prod(d for d in shape if d != -1)
            shape[shape.index(-1)] = self.size // known if known else 0
        if math.prod(shape) != self.size:
            checks.fail(f"reshape shape must hold the {self.size} elements of {self.shape}, got {tuple(shape)}")
        if self._on_chip and shape[0] != self.shape[0]:
            checks.fail(f"reshape dim 0 of an on-chip tensor must stay {self.shape[0]}, got {shape[0]}")
        new_strides = _reshape_strides(self.shape, self.strides, tuple(shape))
        if new_strides is None:
            checks.fail(
                f"reshape shape must be reachable without a copy from {self.shape} (strides {self.strides}; other shapes are "
                f"incompatible with the view layout), got {tuple(shape)}"
            )
        return self._make(shape, new_strides, self._offset)

    def reshape_dim(self, dim: int, shape: Sequence[int]) -> NkiTensor:
        """Split ``dim`` into ``shape`` (one -1 allowed)."""
        dim = _norm_dim(dim, self.ndim)
        shape = list(shape)
        if shape.count(-1) == 1:
            shape[shape.index(-1)] = self.shape[dim] // math.prod(d for d in shape if d != -1)
        return self.reshape(list(self.shape[:dim]) + shape + list(self.shape[dim + 1 :]))

    def flatten_dims(self, start_dim: int, end_dim: int) -> NkiTensor:
        """Merge dims ``start_dim..end_dim`` (inclusive) into one."""
        start_dim = _norm_dim(start_dim, self.ndim)
        end_dim = _norm_dim(end_dim, self.ndim)
        merged = math.prod(self.shape[start_dim : end_dim + 1])
        return self.reshape([*list(self.shape[:start_dim]), merged, *list(self.shape[end_dim + 1 :])])

    def view(self, dtype: Any) -> NkiTensor:
        """Reinterpret the bits as ``dtype``; the last dim is rescaled by the size ratio.

        Notes:
            Refused on a view addressed at run time (rule ``runtime_view_dtype``); relaxed, the new view keeps the
            run-time index's dimension, so re-slicing it is still refused (rule ``indirect_dim_reslice``).
        """
        if self.is_runtime_addressed():
            _runtime_view_dtype(self, "view(dtype)")
        new = dtypes.as_dtype(dtype)
        old_sz, new_sz = self.itemsize, new.itemsize
        if self.strides and self.strides[-1] != 1 and self.shape[-1] != 1:
            checks.fail(f"view(dtype) last dim must be contiguous, got stride {self.strides[-1]}")
        if (self._offset * old_sz) % new_sz:
            checks.fail(f"view(dtype) offset must be aligned to {dtypes.name(new)}, got {self._offset * old_sz} bytes")
        last = self.shape[-1] * old_sz
        if last % new_sz:
            checks.fail(f"view(dtype) last dim must be a multiple of {new_sz} bytes, got {last} bytes")
        strides = []
        for s in self.strides[:-1]:
            if (s * old_sz) % new_sz:
                checks.fail(f"view(dtype) strides must be multiples of {new_sz} bytes, got {s * old_sz} bytes")
            strides.append(s * old_sz // new_sz)
        shape = (*self.shape[:-1], last // new_sz)
        return self._make(shape, [*strides, 1], self._offset * old_sz // new_sz, dtype=new, keeps_dims=True)

    reinterpret_cast = view

    def ap(
        self,
        pattern: Sequence[Sequence[int]],
        offset: int | None = None,
        scalar_offset: Any = None,
        vector_offset: NkiTensor | None = None,
        indirect_dim: int = 0,
        dtype: Any = None,
    ) -> NkiTensor:
        """Access-pattern view: ``[[step, num], ...]`` over the storage, starting at the view offset (+ ``offset``).

        Args:
            pattern: ``[step, num]`` pairs, outermost first; steps count elements of ``dtype`` (or this view's).
            offset: added to this view's start offset (docs/nki-sources.md §2.6, known unknown 2).
            scalar_offset: a 1x1 tensor or int; adds ``value × prod(self.shape[indirect_dim+1:])``.
            vector_offset: (P,1) index tile; row ``i`` starts at ``idx[i] × prod(self.shape[1:])``.
            indirect_dim: dimension whose stride scales ``scalar_offset``.
            dtype: reinterpret the storage as this dtype.

        Returns:
            A view of shape ``[num for step, num in pattern]``.
        """
        new = self.dtype if dtype is None else dtypes.as_dtype(dtype)
        if new != self.dtype and self.is_runtime_addressed():
            _runtime_view_dtype(self, "ap(dtype=)")
        pairs = [(int(p[0]), int(p[1])) for p in pattern]
        base = self._offset
        if new.itemsize != self.itemsize:
            if (base * self.itemsize) % new.itemsize:
                checks.fail(f"ap dtype offset must be aligned to {dtypes.name(new)}, got {base * self.itemsize} bytes")
            base = base * self.itemsize // new.itemsize
        start = base + (int(offset) if offset is not None else 0)
        if self._on_chip and pairs and pairs[0][1] > 1:
            row = self.storage.row_bytes // new.itemsize
            if pairs[0][0] != row:
                checks.fail(
                    f"ap pattern partition step must equal the per-partition element count {row}, got {pairs[0][0]}"
                )
        row_offsets = None
        if (scalar_offset is not None or vector_offset is not None) and not self._whole_allocation():
            _indirect_on_a_view(self)
        runtime_start = scalar_offset is not None and not isinstance(scalar_offset, (int, np.integer))
        _check_runtime_ap(self, scalar_offset if runtime_start else None, vector_offset, indirect_dim)
        shape, strides = [n for _, n in pairs], [s for s, _ in pairs]
        runtime = None
        if scalar_offset is not None:
            moved = start + _scalar_value(scalar_offset) * math.prod(self.shape[indirect_dim + 1 :])
            if runtime_start:
                outside = not _inside(moved, shape, strides, self._storage_elems() * self.itemsize // new.itemsize)
                runtime = RuntimeIndex(_index_sources(scalar_offset), None, outside)
                start = start if outside else moved
            else:
                start = moved
        if vector_offset is not None:
            if indirect_dim != 0:
                checks.fail(f"ap vector_offset indirect_dim must be 0, got {indirect_dim}")
            idx = vector_offset._read().reshape(-1).astype(np.int64)
            if idx.size != pairs[0][1]:
                checks.fail(f"ap vector_offset index count must equal pattern dim 0 ({pairs[0][1]}), got {idx.size}")
            outside = (idx < 0) | (idx >= self.shape[0])
            idx = np.where(outside, 0, idx)  # an outside row addresses nothing: the instruction decides (oob_mode)
            row_offsets = idx * math.prod(self.shape[1:])
            runtime = RuntimeIndex((vector_offset.region(),), 0, False, outside)
        return self._make(
            shape, strides, start, dtype=new, row_offsets=row_offsets, runtime_start=runtime_start, runtime=runtime
        )


def _indirect_on_a_view(view: NkiTensor) -> None:
    """``.ap(scalar_offset= / vector_offset=)`` on a view that is not its whole allocation is rejected (rule
    ``ap_scalar_offset_view``): the pages disagree on what it addresses. The ``NkiTensor.ap`` reference adds
    ``offset`` to the view's own offset and scales the run-time offset by ``prod(self.shape[indirect_dim + 1:])``
    (the view's shape); the "NKI Access Patterns" deep dive interprets pattern and offset against the underlying
    storage, ignoring the view's offset, and counts ``indirect_dim`` in the base tensor (docs/nki-sources.md §2.6).
    On the allocation itself both readings address the same bytes."""
    checks.rule(
        "ap_scalar_offset_view",
        f"ap with a scalar or vector offset on a view (shape {view.shape}, offset {view._offset}) of a "
        f"{view.storage.shape} allocation: the NKI pages disagree on whether indirect_dim and offset count in the "
        "view or in the underlying tensor; call .ap on the tensor itself, with the view's offset written into "
        "offset= and indirect_dim counted in the tensor's dimensions",
        state.current().relaxed,
    )


def _replace_dim(runtime: RuntimeIndex, dim: int | None) -> RuntimeIndex:
    return RuntimeIndex(runtime.sources, dim, runtime.out_of_bounds, runtime.oob_rows)


def _index_sources(value: Any) -> tuple[Region, ...]:
    """What an instruction addressed by ``value`` reads to form its address: a tile's region, a scalar's registers."""
    return (value.region(),) if isinstance(value, NkiTensor) else sources_of(value)


def _inside(start: int, shape: Sequence[int], strides: Sequence[int], elems: int) -> bool:
    lo = hi = start
    for n, s in zip(shape, strides, strict=True):
        if n == 0:
            return True
        if s > 0:
            hi += s * (n - 1)
        else:
            lo += s * (n - 1)
    return 0 <= lo and hi < elems


def _runtime_rule(name: str, message: str) -> None:
    checks.rule(name, message, state.current().relaxed)


def _check_runtime_key(view: NkiTensor, key: tuple[Any, ...]) -> None:
    """The documented limits of run-time indices in ``view[key]`` (README, "What is enforced")."""
    dynamic = [dim for dim, k in enumerate(key) if isinstance(k, DynamicSlice) and k.is_runtime()]
    if view.runtime is not None and view.runtime.dim is not None and view.runtime.dim < len(key):
        k = key[view.runtime.dim]
        if not (isinstance(k, slice) and k == slice(None)):
            _runtime_rule(
                "indirect_dim_reslice",
                f"index dim {view.runtime.dim} of a view addressed at run time must be taken whole (the run-time "
                f"index addresses it), got {k!r}. Fix: fold the slice into the run-time start (nl.ds(i + k, n))",
            )
    if not dynamic:
        return
    if len(dynamic) > 1 or view.is_indirect():
        _runtime_rule(
            "dynamic_index_count",
            f"index of a view has at most one run-time index (nl.ds run-time start, scalar or vector offset), got "
            f"{len(dynamic) + (1 if view.is_indirect() else 0)}. Fix: combine them into one start with NkiScalar "
            "arithmetic (i * stride + j) on a view of the whole tensor",
        )
    for dim in dynamic:
        start = key[dim].start
        if view._on_chip and dim == 0:
            _runtime_rule(
                "dynamic_partition_start",
                "index partition dim of an SBUF/PSUM tensor must have a trace-time start, got a run-time nl.ds "
                "start. Fix: address partitions statically; move the data with dma_copy (its HBM side may be "
                "addressed at run time)",
            )
        if view._on_chip and isinstance(start, NkiScalar) and start.dtype != "int32":
            _runtime_rule(
                "onchip_offset_int32",
                f"index run-time start on an SBUF/PSUM tensor must be nl.int32, got {start.dtype}. Fix: load the "
                "offset from an nl.int32 tile",
            )


def _runtime_view_dtype(view: NkiTensor, method: str) -> None:
    """A dtype reinterpretation of a view addressed at run time is refused (rule ``runtime_view_dtype``):
    ``NkiTensor.view`` lists "Not supported after dynamic / vector select" among its constraints (NL, v2.31.0 and
    v2.32.0), and a run-time ``nl.ds`` start or offset makes a view indirect (``nki.language.ds``, v2.33.0)."""
    _runtime_rule(
        "runtime_view_dtype",
        f"{method} of a view addressed at run time is not supported (NkiTensor.view: 'Not supported after dynamic / "
        "vector select'). Fix: reinterpret the tensor as allocated and address it at run time after, in one "
        ".ap(pattern, dtype=..., scalar_offset=i, indirect_dim=d) on the allocation, or copy the window into a "
        "fixed tile first",
    )


def _check_runtime_ap(view: NkiTensor, scalar_offset: Any, vector_offset: Any, indirect_dim: int = 0) -> None:
    """The documented limits of ``.ap(scalar_offset= / vector_offset=)`` (README, "What is enforced")."""
    if view._on_chip and scalar_offset is not None and indirect_dim == 0:
        _runtime_rule(
            "dynamic_partition_start",
            "ap scalar_offset with indirect_dim=0 on an SBUF/PSUM tensor moves its partition start at run time, "
            "got a run-time scalar_offset. Fix: address partitions statically (a run-time offset on a free dim, "
            "indirect_dim >= 1); move the data with dma_copy, whose HBM side may be addressed at run time",
        )
    count = (scalar_offset is not None) + (vector_offset is not None) + view.is_indirect()
    if count > 1:
        _runtime_rule(
            "dynamic_index_count",
            f"ap run-time offsets must be at most one per view (scalar_offset, vector_offset, a run-time nl.ds "
            f"start), got {count}. Fix: fold the scalar into the index tile, or the indices into one scalar",
        )
    if view._on_chip and isinstance(scalar_offset, NkiScalar) and scalar_offset.dtype != "int32":
        _runtime_rule(
            "onchip_offset_int32",
            f"ap scalar_offset on an SBUF/PSUM tensor must be nl.int32, got {scalar_offset.dtype}. Fix: load the "
            "offset from an nl.int32 tile",
        )
    if vector_offset is None:
        return
    if not isinstance(vector_offset, NkiTensor):
        checks.fail(f"ap vector_offset must be an SBUF index tile, got {type(vector_offset).__name__}")
    if vector_offset.storage.kind != "sbuf" or vector_offset.dtype.kind not in "iu":
        _runtime_rule(
            "vector_offset_form",
            f"ap vector_offset must be an integer index tile in SBUF, got {dtypes.name(vector_offset.dtype)} in "
            f"{vector_offset.storage.kind}. Fix: load the indices into an nl.int32 SBUF tile",
        )
    if view._on_chip:
        _runtime_rule(
            "vector_offset_form",
            f"ap vector_offset must address an HBM tensor (a DMA gather/scatter), got a tensor in "
            f"{view.storage.kind}. Fix: gather from HBM with dma_copy",
        )


def _scalar_value(value: Any) -> int:
    if isinstance(value, NkiTensor):
        return int(value._read().reshape(-1)[0])
    return runtime_value(value)


def _reshape_strides(
    shape: tuple[int, ...], strides: tuple[int, ...], new_shape: tuple[int, ...]
) -> tuple[int, ...] | None:
    """Strides giving ``new_shape`` over the same elements without a copy, or None if impossible.

    Uses numpy's own no-copy reshape rule on a zero-byte stand-in (strides in elements = bytes of int8).
    """
    stand_in = np.lib.stride_tricks.as_strided(np.zeros(1, dtype=np.int8), shape=shape, strides=strides)
    try:
        reshaped = np.reshape(stand_in, new_shape, copy=False)
    except ValueError:
        return None
    return tuple(int(s) for s in reshaped.strides)


def allocate(shape: Sequence[int] | int, dtype: Any, buffer: MemoryRegion, name: str = "") -> NkiTensor:
    """A fresh tensor filled with the simulator's sentinel (NaN for floats, 4 for ints).

    Args:
        shape: tensor shape; on-chip dim 0 = partitions.
        dtype: element dtype.
        buffer: ``nl.sbuf`` / ``nl.psum`` / ``nl.hbm`` / ``nl.shared_hbm`` / ``nl.private_hbm``.
        name: debug label.

    Returns:
        A contiguous ``NkiTensor`` with independent storage.

    Notes:
        On-chip allocations are accounted against the per-partition SBUF/PSUM capacity of the running launch.
    """
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    shape = tuple(int(s) for s in shape)
    dt = dtypes.as_dtype(dtype)
    if type(buffer) is not MemoryRegion:
        buffer = MemoryRegion(buffer)
    nbytes = math.prod(shape) * dt.itemsize
    launch = state.current()
    cursor = -1
    if buffer is MemoryRegion.shared_hbm and launch.active:
        cursor = launch.shared_cursor
        launch.shared_cursor += 1
        if cursor < len(launch.shared_pool):
            shared = launch.shared_pool[cursor]
            if shared.shape == shape and shared.dtype == dt:
                return NkiTensor(shared, dt, shape, _row_major(shape), 0, name)
    raw = np.empty(nbytes, dtype=np.uint8)
    raw.view(dt)[...] = dtypes.fill_value(dt)
    storage = Storage(raw, buffer, shape, dt)
    if buffer is MemoryRegion.shared_hbm and launch.active and cursor == len(launch.shared_pool):
        launch.shared_pool.append(storage)
    if buffer.on_chip:
        if not shape:
            checks.fail(f"ndarray shape of an on-chip tensor must have a partition dim, got {shape}")
        launch.allocate(buffer.value, storage.row_bytes, storage)
    return NkiTensor(storage, dt, shape, _row_major(shape), 0, name)


def wrap_array(array: np.ndarray, buffer: MemoryRegion = MemoryRegion.private_hbm, name: str = "") -> NkiTensor:
    """An HBM tensor over a caller's C-contiguous numpy array, sharing its memory (no copy)."""
    if not array.flags.c_contiguous:
        raise ValueError("wrap_array needs a C-contiguous array")
    dt = dtypes.as_dtype(array.dtype)
    raw = array.reshape(-1).view(np.uint8)
    storage = Storage(raw, buffer, tuple(array.shape), dt)
    return NkiTensor(storage, dt, array.shape, _row_major(array.shape), 0, name)


def _row_major(shape: Sequence[int]) -> tuple[int, ...]:
    strides = []
    acc = 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))
