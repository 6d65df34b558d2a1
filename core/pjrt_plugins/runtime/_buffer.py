"""Buffer: one array on one device, and the conversion of host values into transferable arrays.

A Buffer keeps its client alive and is released exactly once (delete(), the context
manager, garbage collection or client.close()), never while a host view of it is alive nor
while a call on it runs on another thread (see ``_inflight``). Host memory handed to the
plugin stays referenced until the plugin's done-with-host-buffer event fires.
"""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ..errors import BufferViewedError, ClientClosedError, HostViewUnavailableError, PjrtError
from . import _fastpath
from ._cdef import STRUCT_SIZE, ffi
from ._dtypes import is_torch_tensor, numpy_dtype_of, numpy_to_torch, torch_to_numpy
from ._inflight import OwnedHandle, free_deferred
from ._library import args_pool, new_args

if TYPE_CHECKING:  # pragma: no cover
    from ._client import Client, Device, Memory

_layouts: dict[int, tuple[Any, Any]] = {}
_memmove = ffi.memmove
#: ``ffi.from_buffer(array)`` without cffi's Python wrapper, which only fills in these arguments
#: (0.1 us of every small read); the wrapper itself where a cffi build lacks these attributes.
_char_buffer = (
    functools.partial(ffi._backend.from_buffer, ffi.BCharA)
    if hasattr(ffi, "_backend") and hasattr(ffi, "BCharA")
    else ffi.from_buffer
)
_pjrtp_read_pinned = _fastpath.library.pjrtp_read_pinned if _fastpath.library is not None else None

#: Host memory we hand over without a copy is aligned like this (the CPU plugin aliases
#: only 64-byte-aligned memory and copies anything else).
HOST_ALIGNMENT = 64


def host_array(value: Any) -> tuple[np.ndarray, bool]:
    """``(array, usable_as_is)`` for a numpy array, torch CPU tensor or array-like.

    ``usable_as_is`` is False when the plugin cannot read the array's memory directly
    (not C-contiguous, or not native-endian): then it must be copied with :func:`aligned_copy`.
    """
    if isinstance(value, np.ndarray):
        array = value
    elif is_torch_tensor(value):
        array = torch_to_numpy(value)
    else:
        array = np.asarray(value)
        if array.dtype == object:
            raise TypeError(f"cannot transfer a value of type {type(value).__name__} (it is not an array)")
    return array, bool(array.dtype.isnative and array.flags.c_contiguous)


def aligned_empty(nbytes: int) -> np.ndarray:
    """``nbytes`` uninitialized host bytes (uint8) starting on a HOST_ALIGNMENT boundary.

    Plugins alias (read without a copy) only aligned host memory; numpy also asks Linux
    for transparent huge pages on large allocations, which makes first writes faster.
    """
    raw = np.empty(nbytes + HOST_ALIGNMENT, np.uint8)
    offset = (-raw.ctypes.data) % HOST_ALIGNMENT
    return raw[offset : offset + nbytes]


#: Below this size a private copy is not worth aligning (the plugin may copy it again).
_ALIGN_FROM_BYTES = 1 << 16


def aligned_copy(array: np.ndarray) -> np.ndarray:
    """A C-contiguous, native-endian copy of ``array`` (one pass); HOST_ALIGNMENT-aligned if large."""
    dtype = array.dtype if array.dtype.isnative else array.dtype.newbyteorder("=")
    if array.nbytes < _ALIGN_FROM_BYTES:
        return np.array(array, dtype=dtype, order="C", copy=True)
    out = aligned_empty(array.size * dtype.itemsize).view(dtype).reshape(array.shape)
    np.copyto(out, array, casting="equiv")
    return out


#: Row-major buffers in host memory up to this size are copied out in place; larger ones use
#: PJRT_Buffer_ToHostBuffer, which copies with the GIL released.
DIRECT_READ_MAX_BYTES = 1 << 18
_DIRECT_FUNCTIONS = (
    "PJRT_Buffer_IncreaseExternalReferenceCount",
    "PJRT_Buffer_DecreaseExternalReferenceCount",
    "PJRT_Buffer_OpaqueDeviceMemoryDataPointer",
)


#: Taken to count host views (pins) and to delete a buffer or close a client: neither happens
#: while a view is being taken (reentrant: a finalizer may run on a thread that holds it).
_pin_lock = threading.RLock()


class _Pinning:
    """Pins buffers in host memory (an external reference keeps the plugin from moving or reusing
    their bytes), with its own args structs and the library's functions bound once.

    One user at a time: taken from the library's pool (``lib.pool(_Pinning)``).
    """

    __slots__ = ("_lib", "_hold", "_where", "_unhold", "_hold_fn", "_where_fn", "_unhold_fn", "_plan")

    def __init__(self, lib: Any) -> None:
        self._lib = lib
        self._hold = new_args("PJRT_Buffer_IncreaseExternalReferenceCount_Args")
        self._where = new_args("PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args")
        self._unhold = new_args("PJRT_Buffer_DecreaseExternalReferenceCount_Args")
        self._hold_fn = lib.function("PJRT_Buffer_IncreaseExternalReferenceCount")
        self._where_fn = lib.function("PJRT_Buffer_OpaqueDeviceMemoryDataPointer")
        self._unhold_fn = lib.function("PJRT_Buffer_DecreaseExternalReferenceCount")
        # The compiled fast path makes copy() one C call: pin, copy, unpin.
        self._plan = _fastpath.read_plan(
            (self._hold_fn, self._where_fn, self._unhold_fn), (self._hold, self._where, self._unhold)
        )

    def pin(self, ptr: Any) -> Any:
        """Take an external reference on the buffer ``ptr`` (until :meth:`unpin`); returns the
        address of its bytes."""
        hold = self._hold
        hold.buffer = ptr
        err = self._hold_fn(hold)
        if err:
            raise self._lib.error_to_exception(err, "PJRT_Buffer_IncreaseExternalReferenceCount")
        where = self._where
        where.buffer = ptr
        err = self._where_fn(where)
        if err:
            try:
                raise self._lib.error_to_exception(err, "PJRT_Buffer_OpaqueDeviceMemoryDataPointer")
            finally:
                self.unpin(ptr)
        return where.device_memory_ptr

    def unpin(self, ptr: Any) -> None:
        """Drop the external reference :meth:`pin` took."""
        unhold = self._unhold
        unhold.buffer = ptr
        err = self._unhold_fn(unhold)
        if err:
            raise self._lib.error_to_exception(err, "PJRT_Buffer_DecreaseExternalReferenceCount")

    def copy(self, ptr: Any, out: np.ndarray) -> np.ndarray:
        """Copy the bytes of the buffer ``ptr`` into the C-contiguous ``out``, pinned meanwhile."""
        plan = self._plan
        if plan is not None:
            err = _pjrtp_read_pinned(plan, ptr, _char_buffer(out), out.nbytes)
            if err:
                self._raise_read_error(plan, err)
            return out
        address = self.pin(ptr)
        try:
            nbytes = out.nbytes
            if nbytes:
                _memmove(out, address, nbytes)
        finally:
            self.unpin(ptr)
        return out

    def _raise_read_error(self, plan: Any, err: Any) -> None:
        """Raise the error of a failed pjrtp_read_pinned, naming the function that failed."""
        lib = self._lib
        unhold_error, plan.unhold_error = plan.unhold_error, ffi.NULL
        try:
            raise lib.error_to_exception(err, _fastpath.READ_STEPS[plan.failed_step])
        finally:
            if unhold_error:  # the unpin after a failed address query failed too: read and destroy it
                raise lib.error_to_exception(unhold_error, "PJRT_Buffer_DecreaseExternalReferenceCount")


def _pin(lib: Any, ptr: Any) -> Any:
    """Pin a buffer in host memory and return the address of its bytes (see :meth:`_Pinning.pin`).
    Call with ``_pin_lock`` held or within a counted call on the buffer."""
    pool = lib.pool(_Pinning)
    pinning = pool.take()
    address = pinning.pin(ptr)
    pool.give(pinning)
    return address


def _unpin(lib: Any, ptr: Any) -> None:
    """Drop the external reference :func:`_pin` took (finalizers call it: the pool made its
    structs' types known before any pin existed)."""
    pool = lib.pool(_Pinning)
    pinning = pool.take()
    pinning.unpin(ptr)
    pool.give(pinning)


_READY_EVENT = args_pool("PJRT_Buffer_ReadyEvent_Args")


class _HostPin:
    """The pin behind a host view: an external reference (:func:`_pin`) held as long as this object.

    Counted on the buffer and its client: neither is freed while a pin is held (``delete()``
    and ``close()`` raise :class:`BufferViewedError`). Released with the last numpy array over
    the view (the destructor of the view's memory), or by :meth:`release`.
    """

    __slots__ = ("_buffer", "address")

    def __init__(self, buffer: Buffer) -> None:
        self._buffer: Buffer | None = None
        with _pin_lock:
            self.address = _pin(buffer._lib, buffer._handle())
            buffer._pins += 1
            buffer._client._pins += 1
            self._buffer = buffer

    def release(self) -> None:
        """Drop the external reference (once); a buffer whose release waited for it is freed now."""
        with _pin_lock:  # held across the C call: the buffer cannot be freed in between
            buffer, self._buffer = self._buffer, None
            if buffer is None:
                return
            try:
                if buffer._ptr is not None and not buffer._client._closed:
                    _unpin(buffer._lib, buffer._ptr)
            finally:
                buffer._pins -= 1
                buffer._client._pins -= 1
                release_now = buffer._pins == 0 and buffer._release_pending
        if release_now:
            buffer._release()

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass


class ReadPlan(NamedTuple):
    """How to bring a buffer to the host.

    ``mode``: ``"direct"`` (host memory: copy the bytes in place), ``"raw"`` (copy the raw
    device bytes with PJRT_Buffer_CopyRawToHost) or ``"transfer"`` (PJRT_Buffer_ToHostBuffer
    with a row-major host layout). ``order``: the physical axis order (major to minor) when
    the device layout is a permutation of row-major, to undo after a byte copy.
    """

    mode: str
    order: tuple[int, ...] | None = None


_TRANSFER = ReadPlan("transfer")
_DIRECT = ReadPlan("direct")


def _read_plan(lib: Any, ptr: Any, ndim: int) -> ReadPlan:
    """Ask the plugin where the buffer lives and how it is laid out (two cheap queries).

    Needed because a plugin may ignore the host layout asked of ToHostBuffer (the 0.81 CPU
    plugin returns raw bytes for a column-major buffer): a permuted layout is read raw and
    permuted back here. Tiled layouts are left to the plugin's ToHostBuffer.
    """
    if not lib.has_function("PJRT_Buffer_GetMemoryLayout"):
        return _TRANSFER
    try:
        query = lib.invoke("PJRT_Buffer_GetMemoryLayout", buffer=ptr)
        on_cpu = lib.has_function("PJRT_Buffer_IsOnCpu") and bool(
            lib.invoke("PJRT_Buffer_IsOnCpu", buffer=ptr).is_on_cpu
        )
    except PjrtError:  # e.g. UNIMPLEMENTED: trust the plugin's transfer
        return _TRANSFER
    layout = query.layout
    tiled = layout.tiled
    if int(ffi.cast("int", layout.type)) != 0 or tiled.num_tiles != 0 or tiled.minor_to_major_size != ndim:
        return _TRANSFER
    minor_to_major = [int(tiled.minor_to_major[i]) for i in range(ndim)]
    if sorted(minor_to_major) != list(range(ndim)):
        return _TRANSFER
    order = tuple(reversed(minor_to_major))
    permuted = order != tuple(range(ndim))
    if on_cpu and all(lib.has_function(name) for name in _DIRECT_FUNCTIONS):
        return ReadPlan("direct", order) if permuted else _DIRECT
    if permuted and lib.has_function("PJRT_Buffer_CopyRawToHost"):
        return ReadPlan("raw", order)
    return _TRANSFER


def _row_major_layout(ndim: int) -> Any:
    """A shared, read-only PJRT_Buffer_MemoryLayout: dense, dimension 0 most major."""
    entry = _layouts.get(ndim)
    if entry is None:
        minor_to_major = ffi.new("int64_t[]", list(range(ndim - 1, -1, -1)) or [0])
        layout = new_args("PJRT_Buffer_MemoryLayout")
        layout.type = 0  # PJRT_Buffer_MemoryLayout_Type_Tiled
        layout.tiled.struct_size = STRUCT_SIZE["PJRT_Buffer_MemoryLayout_Tiled"]
        layout.tiled.minor_to_major = minor_to_major
        layout.tiled.minor_to_major_size = ndim
        layout.tiled.num_tiles = 0
        entry = _layouts.setdefault(ndim, (layout, minor_to_major))
    return entry[0]


class Buffer(OwnedHandle):
    """An array on a device. Use it as a context manager or call delete() to free it early.

    Thread-safe: a ``delete()`` (or ``client.close()``) while another thread reads, executes
    with or queries this buffer never frees it under that call; the call either completes
    first or fails with ``ValueError`` (deleted) / ``ClientClosedError``.
    """

    __slots__ = ("_lib", "_host", "_shape", "_dtype", "_plan", "_ready", "_pins", "_release_pending", "__weakref__")
    _KIND = "buffer"
    _REGISTRY = "_live_buffers"

    def __init__(
        self,
        client: Client,
        ptr: Any,
        shape: tuple[int, ...] | None = None,
        dtype: np.dtype | None = None,
        plan: ReadPlan | None = None,
        ready: bool = False,
    ) -> None:
        self._client = client
        self._lib = client._lib
        self._ptr = ptr
        self._calls: list = []  # calls in flight on this buffer (see _inflight)
        self._host: Any = None
        self._shape = shape
        self._dtype = dtype
        self._plan = plan  # how to_numpy reads it (None: not asked yet)
        self._ready = ready  # known to be computed (its ready event already awaited)
        self._pins = 0  # live host views: the buffer is not freed while any is held
        self._release_pending = False  # garbage-collected while pinned: the last pin frees it
        # The client's registry owns the handle: whoever pops it (release or client.close) frees it.
        client._live_buffers[id(self)] = (ptr, None)

    # -- lifetime --------------------------------------------------------------------

    def _hold_host(self, host: Any, event: Any) -> None:
        """Keep ``host`` alive until ``event`` (the plugin is done with it) has fired."""
        self._host = host
        self._client._live_buffers[id(self)] = (self._ptr, event)

    def c_pointer(self) -> Any:
        """The live ``PJRT_Buffer*`` (a cffi pointer), for raw C API calls through ``client.library.call``.

        Raises ``ValueError`` once the buffer is deleted and :class:`ClientClosedError` once
        its client is closed; do not keep the pointer past either. Raw calls are not counted
        as calls in flight: do not delete the buffer or close its client while one runs.
        """
        return self._handle()

    def _handle(self) -> Any:
        ptr = self._ptr
        if ptr is None or self._client._closed:
            raise self._gone_error()
        return ptr

    def _invoke(self, function: str, **fields: Any) -> Any:
        """``function(buffer=this buffer, **fields)`` as a counted call; returns its args struct."""
        ptr = self._begin()
        try:
            return self._lib.invoke(function, buffer=ptr, **fields)
        finally:
            self._end()

    def _release(self, *, implicit: bool = False) -> None:
        """Free the handle (once). ``implicit`` (garbage collection): with host views alive, wait for them."""
        if implicit and not self._pins:  # unreferenced: no call uses it, nobody can take a pin now
            self._ptr = None
            self._free_now()
            return
        with _pin_lock:  # no pin can be taken between the check and the buffer being marked deleted
            if self._pins:
                if implicit:
                    self._release_pending = True
                    return
                raise BufferViewedError(
                    f"cannot delete this buffer: {self._pins} host view(s) of it are alive; "
                    "drop them (and every array made from them) first"
                )
            if self._ptr is None:
                return
            self._ptr = None
        self._free_when_unused()

    def _in_use(self) -> bool:
        """A call on this buffer, or an execute reading it as an argument, is in flight."""
        if self._calls:
            return True
        try:
            for frame in list(self._client._running):
                arguments = frame.arguments
                if arguments is not None and any(self is buf for row in arguments for buf in row):
                    return True
        except Exception:  # noqa: BLE001 - odd argument lists: that execute frees it when it ends
            return True
        return False

    def _free_now(self) -> None:
        """:meth:`OwnedHandle._free_now` with the registry and the destroy written out: every output
        of every execute ends here (its garbage collection), where each frame saved counts."""
        client = self._client
        calls = client._calls
        calls.append(None)
        try:
            if not client._closed:
                entry = client._live_buffers.pop(id(self), None)  # atomic: one caller wins
                if entry is not None:
                    host, self._host = self._host, None
                    client._destroy_buffer(entry, host)
        finally:
            calls.pop()

    def delete(self) -> None:
        """Free the device memory (once a call on it running on another thread has ended).

        Later use of this buffer raises ValueError. Raises :class:`BufferViewedError` (and
        frees nothing) while a :meth:`host_view` of it is alive.
        """
        self._release()

    @property
    def is_deleted(self) -> bool:
        """True once deleted here, or when the plugin dropped the data (donated to a program)."""
        if self._ptr is None or self._client._closed:
            return True
        try:
            return bool(self._invoke("PJRT_Buffer_IsDeleted").is_deleted)
        except (ValueError, ClientClosedError):  # deleted or closed meanwhile
            return True

    def __enter__(self) -> Buffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self._release()

    def __del__(self) -> None:
        try:
            if self._ptr is not None:
                if self._pins:
                    self._release(implicit=True)
                else:  # unreferenced and not viewed: no call uses it, nobody can take a pin now
                    self._ptr = None
                    self._free_now()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass

    # -- facts -----------------------------------------------------------------------

    @property
    def client(self) -> Client:
        return self._client

    @property
    def shape(self) -> tuple[int, ...]:
        if self._shape is None:
            ptr = self._begin()
            try:  # the dims belong to the buffer: read them within the call
                args = self._lib.invoke("PJRT_Buffer_Dimensions", buffer=ptr)
                self._shape = tuple(ffi.unpack(args.dims, args.num_dims)) if args.num_dims else ()
            finally:
                self._end()
        return self._shape

    @property
    def dtype(self) -> np.dtype:
        """The numpy dtype (ml_dtypes for bfloat16 and the 8-bit floats)."""
        if self._dtype is None:
            args = self._invoke("PJRT_Buffer_ElementType")
            self._dtype = numpy_dtype_of(int(ffi.cast("int", args.type)))
        return self._dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def device(self) -> Device:
        return self._client._device(self._invoke("PJRT_Buffer_Device").device)

    @property
    def memory(self) -> Memory:
        return self._client._memory(self._invoke("PJRT_Buffer_Memory").memory)

    @property
    def on_device_size(self) -> int:
        """Bytes the buffer occupies on the device (may exceed nbytes: padding, tiling)."""
        args = self._invoke("PJRT_Buffer_OnDeviceSizeInBytes")
        return int(args.on_device_size_in_bytes)

    # -- readiness -------------------------------------------------------------------

    def _ready_event(self, ptr: Any) -> Any:
        args = _READY_EVENT.take()
        args.buffer = ptr
        self._lib.call("PJRT_Buffer_ReadyEvent", args)
        event = args.event
        _READY_EVENT.give(args)
        return event

    @property
    def is_ready(self) -> bool:
        """Whether the data is computed (or failed); never blocks."""
        ptr = self._begin()
        try:
            event = self._ready_event(ptr)
            try:
                return self._lib.event_is_ready(event)
            finally:
                self._lib.destroy_event(event)
        finally:
            self._end()

    def block_until_ready(self) -> Buffer:
        """Wait (GIL released) until the data is computed; raises the computation's error."""
        if not self._ready:
            ptr = self._begin()
            try:
                self._await_ready(ptr)
            finally:
                self._end()
        return self

    def _await_ready(self, ptr: Any) -> None:
        """block_until_ready within a counted call (``ptr`` from :meth:`_begin`)."""
        if not self._ready:
            self._lib.await_event(self._ready_event(ptr), "PJRT_Buffer_ReadyEvent")
            self._ready = True

    # -- to host ---------------------------------------------------------------------

    def read_plan(self) -> ReadPlan:
        """How :meth:`to_numpy` brings this buffer to the host (asked of the plugin once)."""
        if self._plan is None:
            ndim = len(self.shape)
            ptr = self._begin()
            try:
                self._plan = _read_plan(self._lib, ptr, ndim)
            finally:
                self._end()
        return self._plan

    def host_readable(self) -> bool:
        """Whether the plugin keeps this buffer in host memory where we can read it in place
        (copy it directly, or look at it through :meth:`host_view`)."""
        return self.read_plan().mode == "direct"

    def to_numpy(self, out: np.ndarray | None = None) -> np.ndarray:
        """A new numpy array with the buffer's contents (waits for them).

        ``out``: write into this writeable array of the buffer's shape and dtype instead
        (e.g. a region of a larger array; saves a copy) and return it. A strided ``out``
        (say a column block) costs one copy too where the host reads the buffer in place
        (:meth:`host_view`); elsewhere the bytes come through a temporary array.
        """
        client = self._client
        calls = client._calls
        calls.append(None)  # a counted call (OwnedHandle._begin, inlined: the hot path)
        self._calls.append(None)
        try:
            ptr = self._ptr
            if ptr is None or client._closed:
                raise self._gone_error()
            if out is None and self._plan is _DIRECT:  # the hot path: a small row-major buffer in host memory
                shape, dtype = self._shape, self._dtype
                if shape is not None and dtype is not None:
                    out = np.empty(shape, dtype)
                    if out.nbytes <= DIRECT_READ_MAX_BYTES:
                        return self._read_direct(ptr, out)
            return self._to_numpy(ptr, out)
        finally:
            self._calls.pop()
            if client._deferred:
                free_deferred(client._deferred)
            calls.pop()

    def _to_numpy(self, ptr: Any, out: np.ndarray | None) -> np.ndarray:
        """to_numpy within a counted call (``ptr`` from :meth:`_begin`)."""
        if out is None:
            out = np.empty(self.shape, self.dtype)
            contiguous = True
        elif (
            not isinstance(out, np.ndarray)
            or out.shape != self.shape
            or out.dtype != self.dtype
            or not out.flags.writeable
        ):
            raise ValueError(f"out must be a writeable array of shape {self.shape} and dtype {self.dtype}")
        else:
            contiguous = out.flags.c_contiguous
        plan = self._plan or self.read_plan()
        if plan.mode == "direct" and (plan.order is not None or not contiguous):
            np.copyto(out, self.host_view())  # one copy from the buffer's memory (numpy drops the GIL)
            return out
        if not contiguous:
            np.copyto(out, self.to_numpy())
            return out
        if plan.order is not None:  # a permuted device layout: copy the raw bytes, permute here
            return self._read_permuted(ptr, out, plan)
        if plan.mode == "direct" and out.nbytes <= DIRECT_READ_MAX_BYTES:
            return self._read_direct(ptr, out)
        args = new_args("PJRT_Buffer_ToHostBuffer_Args")
        args.src = ptr
        args.host_layout = _row_major_layout(out.ndim)
        args.dst = ffi.from_buffer(out)
        args.dst_size = out.nbytes
        self._lib.call("PJRT_Buffer_ToHostBuffer", args)
        self._lib.await_event(args.event, "PJRT_Buffer_ToHostBuffer", keep_alive=out)
        return out

    def _read_direct(self, ptr: Any, out: np.ndarray) -> np.ndarray:
        """Copy the bytes of a (small) buffer in host memory, pinned while we copy.

        Runs within a counted call, so a concurrent ``delete()`` or ``close()`` frees nothing before it ends.
        """
        if not self._ready:
            self._await_ready(ptr)
        pool = self._client._pinnings
        try:
            pinning = pool.pop()  # Pool.take without its frame: the hot path of a small to_numpy()
        except IndexError:
            pinning = _Pinning(self._lib)
        pinning.copy(ptr, out)
        pool.give(pinning)
        return out

    def host_view(self) -> np.ndarray:
        """A read-only numpy array over the buffer's own memory, without a copy (waits for the data).

        Only for buffers the host can read in place (:meth:`host_readable`: the CPU plugin);
        others raise :class:`~pjrt_plugins.errors.HostViewUnavailableError` (use :meth:`to_numpy`).
        A device layout that permutes the axes gives a strided (transposed) view.

        The view pins the buffer: while it, or any array made from it, is alive, the plugin
        keeps the bytes in place, garbage collection keeps the buffer, and :meth:`delete` or
        ``client.close()`` raise :class:`~pjrt_plugins.errors.BufferViewedError` instead of
        freeing it; so a view never reads freed memory. Dropping the last array unpins it.
        """
        plan = self.read_plan()
        if plan.mode != "direct":
            raise HostViewUnavailableError(
                f"{self._client.plugin_name!r} does not keep this buffer in host memory the host can read in place "
                "(PJRT_Buffer_IsOnCpu, a dense layout and the external-reference functions are needed); "
                "use to_numpy()"
            )
        self.block_until_ready()
        shape, dtype = self.shape, self.dtype
        order = plan.order
        physical = tuple(shape[axis] for axis in order) if order is not None else shape
        nbytes = int(np.prod(physical, dtype=np.int64)) * dtype.itemsize
        if nbytes == 0:
            view = np.empty(physical, dtype)
            view.flags.writeable = False
        else:
            pin = _HostPin(self)
            # The view's memory chain (array -> read-only memoryview -> cffi buffer -> this cdata)
            # holds the pin; when the last array goes, the cdata's destructor releases it.
            anchor = ffi.gc(ffi.cast("char *", pin.address), lambda _cdata: pin.release())
            memory = memoryview(ffi.buffer(anchor, nbytes)).toreadonly()
            view = np.frombuffer(memory, dtype=dtype).reshape(physical)
        if order is not None:
            view = view.transpose(np.argsort(order))
        return view

    def _read_permuted(self, ptr: Any, out: np.ndarray, plan: ReadPlan) -> np.ndarray:
        """Copy the raw device bytes (physical axis order ``plan.order``) and permute them to row-major."""
        order = plan.order or ()
        physical = np.empty([out.shape[axis] for axis in order], out.dtype)
        args = new_args("PJRT_Buffer_CopyRawToHost_Args")
        args.buffer = ptr
        args.dst = ffi.from_buffer(physical)
        args.offset = 0
        args.transfer_size = physical.nbytes
        self._lib.call("PJRT_Buffer_CopyRawToHost", args)
        self._lib.await_event(args.event, "PJRT_Buffer_CopyRawToHost", keep_alive=physical)
        out[...] = physical.transpose(np.argsort(order))
        return out

    def to_torch(self, out: Any = None) -> Any:
        """A new CPU torch tensor with the buffer's contents (imports torch).

        ``out``: write into this CPU tensor of the buffer's shape and dtype instead (e.g. a
        region of a larger tensor, contiguous or strided; see :meth:`to_numpy`) and return it.
        """
        if out is None:
            return numpy_to_torch(self.to_numpy())
        self.to_numpy(out=torch_to_numpy(out))
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        array = self.to_numpy()
        return array if dtype is None else array.astype(dtype, copy=False)

    # -- device to device ------------------------------------------------------------

    def copy_to_device(self, device: Device | int) -> Buffer:
        """A copy of this buffer on another device of the same client."""
        target = self._client._resolve_device(device)
        ptr = self._begin()
        try:
            args = self._lib.invoke("PJRT_Buffer_CopyToDevice", buffer=ptr, dst_device=target._ptr)
            return Buffer(self._client, args.dst_buffer, self._shape, self._dtype)
        finally:
            self._end()

    def __repr__(self) -> str:
        if self._ptr is None or self._client._closed:
            return "<pjrt Buffer (deleted)>"
        try:
            return f"<pjrt Buffer shape={self.shape} dtype={self.dtype} device={self.device.id}>"
        except (PjrtError, ValueError, ClientClosedError):  # e.g. deleted by another thread meanwhile
            return "<pjrt Buffer>"
