"""Buffer: one array on one device, its facts, its readiness and its way to the host.

A Buffer keeps its client alive and is released exactly once (delete(), the context
manager, garbage collection or client.close()), never while a host view of it is alive nor
while a call on it runs on another thread (see ``_inflight``). Host memory handed to the
plugin stays referenced until the plugin's done-with-host-buffer event fires.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import BufferViewedError, ClientClosedError, HostViewUnavailableError, PjrtError
from ._args import args_pool, new_args
from . import _fastpath
from ._cdef import ffi
from ._devices import Device, Memory
from ._dtypes import numpy_dtype_of, numpy_to_torch, torch_to_numpy
from ._inflight import OwnedHandle, free_deferred
from ._pinning import Pinning, pin, pin_lock, unpin
from ._read_plan import DIRECT, DIRECT_READ_MAX_BYTES, ReadPlan, ask_read_plan, row_major_layout

if TYPE_CHECKING:  # pragma: no cover - annotations only: the client is the layer above
    from ._client import Client

logger = logging.getLogger(__name__)
_READY_EVENT = args_pool("PJRT_Buffer_ReadyEvent_Args")
_BUFFER_DESTROY = args_pool("PJRT_Buffer_Destroy_Args")  # the pool Client._destroy_buffer takes from
_HANDLE_ARRAYS: list[tuple[Any, Any, int]] = []  # arrays for _destroy_handles: pop() to take, append() to give back
_KEPT_ARRAY_CAPACITY = 1 << 16
_pjrtp_destroy_buffers = _fastpath.library.pjrtp_destroy_buffers if _fastpath.library is not None else None


class _HostPin:
    """The pin behind a host view: an external reference (:func:`pin`) held as long as this object.

    Counted on the buffer and its client: neither is freed while a pin is held (``delete()``
    and ``close()`` raise :class:`BufferViewedError`). Released with the last numpy array over
    the view (the destructor of the view's memory), or by :meth:`release`.
    """

    __slots__ = ("_buffer", "address")

    def __init__(self, buffer: Buffer, nbytes: int) -> None:
        self._buffer: Buffer | None = None
        with pin_lock:
            self.address = pin(buffer._lib, buffer._handle(), nbytes)
            buffer._pins += 1
            buffer._client._pins += 1
            self._buffer = buffer

    def release(self) -> None:
        """Drop the external reference (once); a buffer whose release waited for it is freed now."""
        with pin_lock:  # held across the C call: the buffer cannot be freed in between
            buffer, self._buffer = self._buffer, None
            if buffer is None:
                return
            try:
                if buffer._ptr is not None and not buffer._client._closed:
                    unpin(buffer._lib, buffer._ptr)
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
        with pin_lock:  # no pin can be taken between the check and the buffer being marked deleted
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
        client = self._client
        if self in client._handle_calls:  # identity: buffers do not define equality
            return True
        try:
            for frame in list(client._running):
                arguments = frame.arguments
                if arguments is not None and any(self is buf for row in arguments for buf in row):
                    return True
        except Exception:  # noqa: BLE001 - odd argument lists: that execute frees it when it ends
            return True
        return False

    def _free_now(self) -> None:
        """:meth:`OwnedHandle._free_now` with the registry and the destroy written out: every output
        of every execute ends here (its garbage collection), where each frame saved counts
        (``benchmarks/runtime_buffers.py``: 0.1 us of about 1.1 us per buffer)."""
        client = self._client
        calls = client._calls
        calls.append(None)
        try:
            if not client._closed:
                entry = client._live_buffers.pop(id(self), None)  # atomic: one caller wins
                if entry is None:
                    return
                if entry[1] is not None or self._host is not None:  # host memory to let go of
                    host, self._host = self._host, None
                    client._destroy_buffer(entry, host)
                    return
                try:  # an execute's output: Client._destroy_buffer written out, one frame less
                    args = _BUFFER_DESTROY.pop()
                except IndexError:
                    args = new_args("PJRT_Buffer_Destroy_Args")
                args.buffer = entry[0]
                err = client._destroy_buffer_fn(args)
                if err:
                    raise self._lib.error_to_exception(err, "PJRT_Buffer_Destroy")
                _BUFFER_DESTROY.append(args)
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
                rank = self._lib.count(args.dims, args.num_dims, "PJRT_Buffer_Dimensions", "dimensions")
                self._shape = tuple(ffi.unpack(args.dims, rank)) if rank else ()
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
        return self._client._device(self._invoke("PJRT_Buffer_Device").device, "PJRT_Buffer_Device")

    @property
    def memory(self) -> Memory:
        return self._client._memory(self._invoke("PJRT_Buffer_Memory").memory, "PJRT_Buffer_Memory")

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
        if event == ffi.NULL:  # asking a plugin about a NULL event would crash it
            raise self._lib.broken_answer("PJRT_Buffer_ReadyEvent", "returned no event")
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
                self._plan = ask_read_plan(self._lib, ptr, ndim)
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
        handle_calls = client._handle_calls
        handle_calls.append(self)
        try:
            ptr = self._ptr
            if ptr is None or client._closed:
                raise self._gone_error()
            if out is None and self._plan is DIRECT:  # the hot path: a small row-major buffer in host memory
                shape, dtype = self._shape, self._dtype
                if shape is not None and dtype is not None:
                    out = np.empty(shape, dtype)
                    if out.nbytes <= DIRECT_READ_MAX_BYTES:
                        return self._read_direct(ptr, out)
            return self._to_numpy(ptr, out)
        finally:
            handle_calls.remove(self)
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
        args.host_layout = row_major_layout(out.ndim)
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
            pinning = Pinning(self._lib)
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
            pin = _HostPin(self, nbytes)
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
            if args.dst_buffer == ffi.NULL:
                raise self._lib.broken_answer("PJRT_Buffer_CopyToDevice", "returned no buffer")
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


def delete_buffers(client: Client, buffers: Iterable[Buffer]) -> None:
    """``delete()`` on each of ``buffers`` (all of ``client``), their handles destroyed in one C call.

    The same guarantees as :meth:`Buffer.delete`, checked for all before any is touched: a buffer that is not
    ``client``'s raises ``ValueError`` and one with a live host view :class:`BufferViewedError`, deleting
    none. One already deleted is skipped; one a call on another thread still uses is freed when that call
    ends; each handle is destroyed exactly once, and a failing destroy does not keep the others alive (the
    first failure is raised after all were tried). Why: freeing the ~1,000 old values of a training step one
    finalizer at a time costs about 1 us of Python each (``benchmarks/runtime_buffers.py``).
    """
    batch = list(buffers)
    _check_buffers_of(client, batch, "delete_buffers", "one client")
    with pin_lock:  # no pin can be taken between the check and the buffers being marked deleted
        viewed = sum(1 for buf in batch if buf._pins)
        if viewed:
            raise BufferViewedError(
                f"cannot delete these buffers: {viewed} of them have host views alive; "
                "drop the views (and every array made from them) first"
            )
        gone = []
        for buf in batch:
            if buf._ptr is not None:
                buf._ptr = None
                gone.append(buf)
    if not gone:
        return
    calls = client._calls
    calls.append(None)  # counted: close() waits for these frees, or they see it closed and free nothing
    try:
        if client._closed:  # close() frees every handle of its registry
            return
        running = client._running
        handle_calls = client._handle_calls
        registry = client._live_buffers
        handles = []
        first: PjrtError | None = None
        for buf in gone:
            if (running or handle_calls) and buf._in_use():
                buf._free_when_unused()  # freed by the last call using it
                continue
            entry = registry.pop(id(buf), None)  # atomic: one caller wins
            if entry is None:
                continue
            if entry[1] is not None or buf._host is not None:  # host memory to let go of: one at a time
                host, buf._host = buf._host, None
                try:
                    client._destroy_buffer(entry, host)
                except PjrtError as exc:  # destroyed all the same: go on with the others
                    first = first or exc
                continue
            handles.append(entry[0])
        error = _destroy_handles(client, handles)
        first = first or error
    finally:
        calls.pop()
    if first is not None:
        raise first


def _check_buffers_of(client: Client, buffers: list[Buffer], taker: str, whose: str) -> None:
    """Raise ``TypeError`` for an item of ``buffers`` that is not a Buffer and ``ValueError`` for one of another
    client than ``client`` (what ``taker`` takes: buffers of ``whose``)."""
    for buf in buffers:
        if type(buf) is not Buffer and not isinstance(buf, Buffer):
            raise TypeError(f"{taker} takes Buffers, got a {type(buf).__name__}")
        if buf._client is not client:
            raise ValueError(f"{taker} takes buffers of {whose}: this buffer belongs to another")


def recycling_pools(client: Client, recycle: Sequence[Sequence[Buffer]], num_devices: int) -> list[list[Buffer]]:
    """``recycle`` (buffers an execute's caller gives up, one list per device) checked before anything runs.

    Raises ``TypeError`` for what is not a Buffer, ``ValueError`` for a buffer of another client or a wrong
    number of lists, and :class:`BufferViewedError` for one with a host view alive (nothing is run or freed).
    Returns each device's list, to be taken from with ``pop()``.
    """
    if len(recycle) != num_devices:
        raise ValueError(f"recycle needs one list of buffers per device ({num_devices}), got {len(recycle)}")
    pools = []
    seen: set[int] = set()
    for row in recycle:
        pool = list(row)
        _check_buffers_of(client, pool, "recycle", "the executable's client")
        if any(buf._pins for buf in pool):
            raise BufferViewedError("cannot recycle a buffer whose host view is alive; drop the view first")
        seen.update(map(id, pool))
        pools.append(pool)
    if len(seen) != sum(map(len, pools)):  # reused twice, one object would wrap two outputs
        raise ValueError("recycle lists a buffer more than once")
    return pools


def rewrap(buf: Buffer, ptr: Any, shape: Any, dtype: Any, plan: Any, ready: bool, old: list[Any]) -> bool:
    """Make ``buf`` (given up by its owner, see :func:`recycling_pools`) the wrapper of output handle ``ptr``.

    Its own handle goes to ``old``, to be destroyed by the caller (:func:`free_recycled`). Returns False, changing
    nothing, for a buffer that cannot be reused as it is (deleted already, holding host memory, or viewed): the
    caller deletes it the ordinary way. Why: an output's Python object costs about 1 us to make and to free,
    and a replayed training step makes one per output per device (about 1,250).
    """
    registry = buf._client._live_buffers
    entry = registry.get(id(buf))
    if entry is None or entry[1] is not None or buf._host is not None or buf._pins or buf._ptr is None:
        return False
    old.append(entry[0])
    registry[id(buf)] = (ptr, None)
    buf._ptr = ptr
    buf._shape = shape
    buf._dtype = dtype
    buf._plan = plan
    buf._ready = ready
    return True


def free_recycled(client: Client, old: list[Any], rest: list[Buffer]) -> None:
    """Destroy the handles :func:`rewrap` took over (``old``) and delete the given-up buffers that were not
    reused (``rest``). A failure is logged, not raised: the execute's outputs are good, and the caller had
    given these buffers up."""
    error = _destroy_handles(client, old)
    if error is not None:
        logger.warning("freeing the recycled buffers' old handles failed: %s", error)
    if rest:
        try:
            delete_buffers(client, rest)
        except (PjrtError, BufferViewedError) as exc:  # viewed ones are freed with their last view
            logger.warning("deleting the given-up buffers failed: %s", exc)


def _handle_arrays(count: int) -> tuple[Any, Any, int]:
    """``(PJRT_Buffer*[], PJRT_Error*[], capacity)`` for ``count`` handles, from ``_HANDLE_ARRAYS`` when one is large
    enough (give it back with ``append``). Why: a training step frees about 1,250 buffers, and two new arrays a step
    (zeroed by calloc) cost about 0.4 ms in a heap the plugin's buffers have fragmented."""
    try:
        arrays = _HANDLE_ARRAYS.pop()
    except IndexError:
        arrays = None
    if arrays is None or arrays[2] < count:
        capacity = max(64, 1 << (count - 1).bit_length())
        arrays = (ffi.new("PJRT_Buffer*[]", capacity), ffi.new("PJRT_Error*[]", capacity), capacity)
    return arrays


def _destroy_handles(client: Client, handles: list[Any]) -> PjrtError | None:
    """``PJRT_Buffer_Destroy`` on every handle (owned by the caller, taken out of the registry); returns the
    first failure (None: all succeeded), after trying them all."""
    if not handles:
        return None
    lib = client._lib
    try:
        args = _BUFFER_DESTROY.pop()
    except IndexError:
        args = new_args("PJRT_Buffer_Destroy_Args")
    first: PjrtError | None = None
    plan = _fastpath.destroy_plan(client._destroy_buffer_fn, args)
    if plan is not None:
        assert _pjrtp_destroy_buffers is not None  # a plan is only made with the library
        count = len(handles)
        arrays = _handle_arrays(count)
        array, errors = arrays[0], arrays[1]
        array[0:count] = handles
        failed = _pjrtp_destroy_buffers(plan, array, count, errors)
        if failed == _fastpath.INVALID_ARGUMENTS:  # a plan built wrongly: nothing destroyed, so do it here
            plan = None
        elif failed:
            for err in errors[0:count]:
                if err:
                    exc = lib.error_to_exception(err, "PJRT_Buffer_Destroy")  # destroys the error
                    first = first or exc
        if arrays[2] <= _KEPT_ARRAY_CAPACITY:  # a rare huge batch does not keep its arrays
            _HANDLE_ARRAYS.append(arrays)
    if plan is None:
        for ptr in handles:
            args.buffer = ptr
            err = client._destroy_buffer_fn(args)
            if err:
                exc = lib.error_to_exception(err, "PJRT_Buffer_Destroy")
                first = first or exc
    _BUFFER_DESTROY.append(args)
    return first
