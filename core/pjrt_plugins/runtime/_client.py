"""Client: a PJRT client on one plugin, the owner of everything made from it.

A Client owns its PJRT_Client and every Buffer and Executable made from it: closing the
client releases them first, so no destroy order can crash, and waits for the calls other
threads are making on any of them (see ``_inflight``). Options are validated in Python
before ``PJRT_Client_Create``; a mistyped option never reaches the plugin.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np

from .._timeouts import checked_timeout
from ..errors import BufferViewedError, ClientClosedError, PjrtPluginsError
from ..options import validate_options
from ._args import args_pool, new_args, unpack_text, version_text
from ._buffer import Buffer, delete_buffers
from ._cdef import ffi
from ._compile_options import CompileOptions
from ._devices import Device, Memory
from ._events import EventWait, leave_running
from ._dtypes import pjrt_type_of
from ._executable import Executable, _ExecuteFrame
from ._host_arrays import aligned_copy, host_array
from ._inflight import OwnedHandle, wait_for_calls
from ._client_create import create_pjrt_client
from ._kv import KvCallbacks
from ._library import Library, load_library
from ._pinning import Pinning, pin_lock

logger = logging.getLogger(__name__)
_BUFFER_DESTROY = args_pool("PJRT_Buffer_Destroy_Args")

_ZERO_COPY = 2  # PJRT_HostBufferSemantics_kImmutableZeroCopy
_UNTIL_TRANSFER_COMPLETES = 1  # PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes
_live_clients: weakref.WeakSet[Client] = weakref.WeakSet()
_dims_cache: dict[tuple[int, ...], Any] = {}
#: At interpreter exit, how long a client's close waits for calls still running on other threads.
EXIT_CLOSE_TIMEOUT_S = 10.0


def _attempt(errors: list[Exception], step: Any, *args: Any, **kwargs: Any) -> bool:
    """Run ``step``; on failure record the error in ``errors`` and return False."""
    try:
        step(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - collected and re-raised by the caller
        errors.append(exc)
        return False
    return True


def _dims(shape: tuple[int, ...]) -> Any:
    dims = _dims_cache.get(shape)
    if dims is None:
        dims = ffi.new("int64_t[]", shape)
        if len(_dims_cache) < 4096:
            _dims_cache[shape] = dims
    return dims



class Client:
    """A PJRT client on one plugin library. Use it as a context manager or call close().

    ``options`` are checked against ``schema`` (``{name: type}``) before the C call:
    an unknown name raises ValueError listing the known ones, a wrong type raises
    TypeError. ``kv_store`` (get/try_get/put) is wired to the plugin's KV callbacks.
    ``initialize_timeout`` (seconds, default 60) bounds opening the library,
    ``PJRT_Plugin_Initialize`` and, without a ``kv_store`` (whose own timeouts bound the
    wait for peers), ``PJRT_Client_Create``: past it, :class:`PluginTimeoutError`.

    Thread-safe: any thread may upload, compile, execute and read on one client at once,
    and ``close()`` on one thread waits for the calls running on others (new calls then
    raise :class:`ClientClosedError`).

    ``execute_timeout`` (seconds, or None) bounds every wait for an execution;
    ``stall_timeout`` declares an execution stuck once the process used no CPU for that
    long (meaningful only where devices are host threads: backends set it, the CPU one
    does). Either raises :class:`~pjrt_plugins.ExecutionStuckError`. Each is a finite number
    of seconds above 0, or None; anything else (``nan``, ``"10"``, ``-1``, ``1e308``) is
    refused when it is set, with a ``TypeError`` or ``ValueError`` naming it.
    """

    _execute_timeout: float | None = None
    _stall_timeout: float | None = None

    @property
    def execute_timeout(self) -> float | None:
        """Seconds an execute may wait for its devices (None: as long as they take)."""
        return self._execute_timeout

    @execute_timeout.setter
    def execute_timeout(self, value: float | None) -> None:
        self._execute_timeout = checked_timeout(value, "Client.execute_timeout")

    @property
    def stall_timeout(self) -> float | None:
        """Seconds of a process using no CPU after which a waiting execute is stuck (None: never)."""
        return self._stall_timeout

    @stall_timeout.setter
    def stall_timeout(self, value: float | None) -> None:
        self._stall_timeout = checked_timeout(value, "Client.stall_timeout")

    def __init__(
        self,
        library: Library | str | os.PathLike[str],
        options: Mapping[str, Any] | None = None,
        *,
        schema: Mapping[str, Any] | None = None,
        kv_store: Any = None,
        plugin_name: str | None = None,
        initialize_timeout: float | None = None,
    ) -> None:
        self._closed = True  # until PJRT_Client_Create succeeds; then set first thing by close()
        self._released = True  # until PJRT_Client_Create succeeds; then set once close() has freed it all
        self._ptr = ffi.NULL
        self._calls: list[None] = []  # calls in flight on this client and on what it owns (see _inflight)
        self._handle_calls: list[OwnedHandle] = []  # the buffer or executable of each call on one in flight
        self._running: list[_ExecuteFrame] = []  # frames of the executes in flight, with their arguments
        self._deferred: list[OwnedHandle] = []  # buffers and executables deleted while calls used them
        self._lock = threading.RLock()
        self._pins = 0  # host views (Buffer.host_view) alive on this client's buffers: close() waits for none
        self._kv: KvCallbacks | None = None
        initialize_timeout = checked_timeout(initialize_timeout, "initialize_timeout")
        lib = library if isinstance(library, Library) else load_library(library, initialize_timeout)
        self._lib = lib
        self.plugin_name = plugin_name or lib.name
        if options is not None and not isinstance(options, Mapping):
            raise TypeError(f"client options must be a mapping of name to value, got {type(options).__name__}")
        values = validate_options(dict(options or {}), schema, plugin=f"plugin {self.plugin_name!r}")
        lib.initialize(initialize_timeout)
        self._destroy_buffer_fn = lib.function("PJRT_Buffer_Destroy")  # bound before a client exists to leak
        self._pinnings = lib.pool(Pinning)  # pin structs of the direct reads (Buffer.to_numpy)
        self._ptr, self._kv = create_pjrt_client(lib, values, kv_store, initialize_timeout, self.plugin_name)
        self._closed = self._released = False
        self._live_buffers: dict[int, tuple[Any, Any]] = {}
        self._live_executables: dict[int, tuple[Any, Any]] = {}
        self._pending_host: list[tuple[Any, Any]] = []
        # Executions that may still run in the plugin: a launch until its outcome is known (a token),
        # then a wait given up on (Ctrl-C, stuck) until its events fire. close() waits for none.
        self._unsettled_executions: set[Any] = set()
        self._devices_by_ptr: dict[int, Device] = {}
        self._memories_by_ptr: dict[int, Memory] = {}
        self._devices: list[Device] | None = None
        self._addressable: list[Device] | None = None
        self._platform_name: str | None = None
        self._platform_version: str | None = None
        _live_clients.add(self)
        logger.debug("created a PJRT client on %s", lib.path)

    # -- lifetime --------------------------------------------------------------------

    @property
    def library(self) -> Library:
        return self._lib

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass

    def close(self, timeout: float | None = None) -> None:
        """Release every buffer and executable of this client, then destroy the client.

        New calls on the client and everything it owns raise :class:`ClientClosedError` at
        once; calls already running on other threads are waited for (at most ``timeout``
        seconds: then :class:`TimeoutError`, and a later ``close()`` finishes the job).
        Buffers and executables still referenced elsewhere become unusable. Raises
        :class:`BufferViewedError` (and closes nothing) while host views of its buffers
        (``Buffer.host_view()``) are alive. A handle the plugin fails to destroy does not
        stop the rest: everything is released, then the first error is raised.
        """
        timeout = checked_timeout(timeout, "close(timeout)")
        if self._released:
            return
        with pin_lock:  # no view can be taken once the client is marked closed
            if self._pins:
                raise BufferViewedError(
                    f"cannot close the client on {self.plugin_name!r}: {self._pins} host view(s) of its "
                    "buffers are alive; drop them (and every array made from them) first"
                )
            self._closed = True
        wait_for_calls(self._calls, timeout, f"the client on {self.plugin_name!r}")
        with self._lock:
            if self._released:
                return
            self._released = True
            # Every step runs even when one fails, so one bad handle cannot leak the rest.
            errors: list[Exception] = []
            # An execution given up on (Ctrl-C, stuck), or interrupted before its wait began, may
            # still use buffers and hold the plugin's threads: then nothing waits for the plugin,
            # and what it may still read is kept.
            unsettled = list(self._unsettled_executions)
            settle = not unsettled
            while self._live_buffers:
                try:
                    _, entry = self._live_buffers.popitem()
                except KeyError:  # emptied by a concurrent release
                    break
                _attempt(errors, self._destroy_buffer, entry, None, wait=settle)
            while self._live_executables:
                try:
                    _, entry = self._live_executables.popitem()
                except KeyError:
                    break
                if settle:  # a running execution may still need its executable's code
                    _attempt(errors, self._destroy_executable, entry)
            self._deferred.clear()  # their registry entries were released above
            _attempt(errors, self._drain_pending_host, wait=settle)
            ptr, self._ptr = self._ptr, ffi.NULL
            _live_clients.discard(self)
            if not settle:
                # Destroying the client joins its threads, which a stuck execution never frees.
                logger.warning(
                    "leaving the PJRT client on %r to the operating system: %d execution(s) given up on "
                    "(interrupted or stuck) are still running in it",
                    self.plugin_name,
                    len(unsettled),
                )
                # Launches with no wait to report them: the exit must not run the plugin's destructors either.
                leave_running(sum(1 for entry in unsettled if not isinstance(entry, EventWait)))
            elif _attempt(errors, self._lib.invoke, "PJRT_Client_Destroy", client=ptr) and self._kv is not None:
                self._kv.release()  # only once the plugin can no longer read the values
        if errors:
            for extra in errors[1:]:
                logger.warning("closing the client on %r also failed: %s", self.plugin_name, extra)
            if len(errors) > 1 and hasattr(errors[0], "add_note"):  # Python 3.11 and newer
                errors[0].add_note(f"{len(errors) - 1} more error(s) while closing this client were logged")
            raise errors[0]

    def c_pointer(self) -> Any:
        """The live ``PJRT_Client*`` (a cffi pointer), for raw C API calls through ``self.library.call``.

        Build the args with :func:`pjrt_plugins.runtime.new_args`. The pointer is valid only
        while the client is open; raises :class:`ClientClosedError` once it is closed. Raw
        calls are not counted: do not close the client while one runs on another thread.
        """
        if self._closed:
            raise self._closed_error()
        return self._ptr

    def _closed_error(self) -> ClientClosedError:
        return ClientClosedError(f"this client on {self.plugin_name!r} has been closed")

    def _enter(self) -> Any:
        """Count a call on this client (close() waits for it) and return the PJRT_Client*.

        Raises :class:`ClientClosedError` once the client is closed. Pair with :meth:`_exit`.
        """
        calls = self._calls
        calls.append(None)
        if self._closed:
            calls.pop()
            raise self._closed_error()
        return self._ptr

    def _exit(self) -> None:
        self._calls.pop()

    @contextmanager
    def _call(self) -> Iterator[Any]:
        """``with client._call() as ptr:`` a counted call; read what the plugin returns inside it."""
        ptr = self._enter()
        try:
            yield ptr
        finally:
            self._calls.pop()

    def _invoke(self, function: str, **fields: Any) -> Any:
        """``function(client=..., **fields)`` for results that are plain numbers (read after the call)."""
        with self._call() as ptr:
            return self._lib.invoke(function, client=ptr, **fields)

    def _destroy_buffer(self, entry: tuple[Any, Any], host: Any, wait: bool = False) -> None:
        """Destroy a buffer handle; keep ``host`` until its done-with-host event fires."""
        ptr, event = entry
        try:  # runs in finalizers: a pooled struct (see Pool); Pool.take without its frame
            args = _BUFFER_DESTROY.pop()
        except IndexError:
            args = new_args("PJRT_Buffer_Destroy_Args")
        args.buffer = ptr
        try:
            err = self._destroy_buffer_fn(args)  # every output of an execute ends here: no lookup
            if err:
                raise self._lib.error_to_exception(err, "PJRT_Buffer_Destroy")
            _BUFFER_DESTROY.give(args)
        finally:
            if event is not None and not self._settle_host_event(event, wait, host):
                with self._lock:
                    self._pending_host.append((event, host))

    def _destroy_executable(self, entry: tuple[Any, Any]) -> None:
        """Destroy both handles of an executable, the second even when the first fails."""
        executable, loaded = entry
        try:
            self._lib.invoke("PJRT_Executable_Destroy", executable=executable)
        finally:
            self._lib.invoke("PJRT_LoadedExecutable_Destroy", executable=loaded)

    def _settle_host_event(self, event: Any, wait: bool, host: Any = None) -> bool:
        """Destroy a done-with-host-buffer event that has fired (with ``wait``: once it fires).

        False (event kept) while the plugin may still read the host memory, or cannot say
        whether it does: that memory is then kept until ``close`` awaits the event, never
        freed under the plugin.
        """
        if wait:
            try:
                self._lib.await_event(event, "PJRT_Client_BufferFromHostBuffer", keep_alive=host)
            except PjrtPluginsError as exc:  # the transfer failed; the host memory is free either way
                logger.debug("a host-to-device transfer on %r reported %s", self.plugin_name, str(exc))
            return True
        try:
            ready = self._lib.event_is_ready(event)
        except PjrtPluginsError as exc:
            # str(exc): a record holding the exception would hold its frames, and the host memory in them
            logger.warning("%s; keeping that transfer's host memory until the client closes", str(exc))
            return False
        if ready:
            try:
                self._lib.destroy_event(event)
            except PjrtPluginsError as exc:  # the event fired: the host memory is free either way
                logger.warning("%s", str(exc))
        return ready

    def _drain_pending_host(self, wait: bool = False) -> None:
        """Let go of host memory whose transfers are done (all of it with ``wait``)."""
        with self._lock:
            pending, self._pending_host = self._pending_host, []
        keep = [(event, host) for event, host in pending if not self._settle_host_event(event, wait, host)]
        if keep:
            with self._lock:
                self._pending_host.extend(keep)

    # -- facts -----------------------------------------------------------------------

    @property
    def platform_name(self) -> str:
        if self._platform_name is None:
            with self._call() as ptr:
                args = self._lib.invoke("PJRT_Client_PlatformName", client=ptr)
                self._platform_name = unpack_text(args.platform_name, args.platform_name_size)
        return self._platform_name

    @property
    def platform_version(self) -> str:
        if self._platform_version is None:
            with self._call() as ptr:
                args = self._lib.invoke("PJRT_Client_PlatformVersion", client=ptr)
                self._platform_version = unpack_text(args.platform_version, args.platform_version_size)
        return self._platform_version

    @property
    def process_index(self) -> int:
        return int(self._invoke("PJRT_Client_ProcessIndex").process_index)

    @property
    def devices(self) -> list[Device]:
        """Every device the client sees, addressable or not."""
        if self._devices is None:
            with self._call() as ptr:
                function = "PJRT_Client_Devices"
                args = self._lib.invoke(function, client=ptr)
                count = self._lib.count(args.devices, args.num_devices, function, "devices")
                self._devices = [self._device(args.devices[i], function) for i in range(count)]
        return list(self._devices)

    @property
    def addressable_devices(self) -> list[Device]:
        """The devices this process can run on."""
        if self._addressable is None:
            with self._call() as ptr:
                function = "PJRT_Client_AddressableDevices"
                args = self._lib.invoke(function, client=ptr)
                count = self._lib.count(args.addressable_devices, args.num_addressable_devices, function, "devices")
                self._addressable = [self._device(args.addressable_devices[i], function) for i in range(count)]
        return list(self._addressable)

    @property
    def memories(self) -> list[Memory]:
        with self._call() as ptr:
            function = "PJRT_Client_AddressableMemories"
            args = self._lib.invoke(function, client=ptr)
            count = self._lib.count(args.addressable_memories, args.num_addressable_memories, function, "memories")
            return [self._memory(args.addressable_memories[i], function) for i in range(count)]

    def lookup_device(self, device_id: int) -> Device:
        """The device whose id is ``device_id``; PjrtError if there is none."""
        with self._call() as ptr:
            function = "PJRT_Client_LookupDevice"
            return self._device(self._lib.invoke(function, client=ptr, id=int(device_id)).device, function)

    def lookup_addressable_device(self, local_hardware_id: int) -> Device:
        with self._call() as ptr:
            function = "PJRT_Client_LookupAddressableDevice"
            args = self._lib.invoke(function, client=ptr, local_hardware_id=int(local_hardware_id))
            return self._device(args.addressable_device, function)

    def default_device_assignment(self, num_replicas: int, num_partitions: int = 1) -> list[list[int]]:
        """Device ids as ``[replica][partition]``, the plugin's default placement.

        Raises ValueError when the client has fewer devices than ``num_replicas *
        num_partitions``, and :class:`PjrtPluginsError` when the plugin answers with a
        device id the client does not have.
        """
        for name, value in (("num_replicas", num_replicas), ("num_partitions", num_partitions)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        num_replicas, num_partitions = int(num_replicas), int(num_partitions)
        count = num_replicas * num_partitions
        known = {device.id for device in self.devices}
        if count > len(known):
            raise ValueError(
                f"{num_replicas} replica(s) x {num_partitions} partition(s) need {count} devices, but the client "
                f"on {self.plugin_name!r} has {len(known)}"
            )
        out = ffi.new("int[]", count)
        self._invoke(
            "PJRT_Client_DefaultDeviceAssignment",
            num_replicas=num_replicas,
            num_partitions=num_partitions,
            default_assignment_size=count,
            default_assignment=out,
        )
        flat = list(out)
        unknown = sorted(set(flat) - known)
        if unknown or len(set(flat)) != count:
            raise PjrtPluginsError(
                f"{self.plugin_name!r} answered PJRT_Client_DefaultDeviceAssignment({num_replicas}, {num_partitions}) "
                f"with device ids {flat}, which are not {count} distinct ids of its devices {sorted(known)}: "
                "a bug in the plugin; pass an explicit device assignment instead"
            )
        return [flat[r * num_partitions : (r + 1) * num_partitions] for r in range(num_replicas)]

    def _check_fits(self, options: CompileOptions) -> None:
        """Refuse compile options that need more devices, or other devices, than this client has
        (the CPU plugin runs out of memory or aborts on such requests instead of returning an error)."""
        known = {device.id for device in self.devices}
        needed = options.num_replicas * options.num_partitions
        if needed > len(known):
            raise ValueError(
                f"these compile options need {options.num_replicas} replica(s) x {options.num_partitions} "
                f"partition(s) = {needed} devices, but the client on {self.plugin_name!r} has {len(known)}"
            )
        if options.device_assignment is not None:
            unknown = sorted({d for row in options.device_assignment for d in row} - known)
            if unknown:
                raise ValueError(
                    f"CompileOptions.device_assignment names device ids {unknown} that the client on "
                    f"{self.plugin_name!r} does not have (its devices: {sorted(known)})"
                )

    def _device(self, ptr: Any, function: str) -> Device:
        """The Device of the plugin's handle ``ptr`` (``function``'s answer; NULL is refused)."""
        key = int(ffi.cast("uintptr_t", ptr))
        device = self._devices_by_ptr.get(key)
        if device is None:
            if not key:
                raise self._lib.broken_answer(function, "gave a NULL device")
            device = self._devices_by_ptr.setdefault(key, Device(self, ptr))
        return device

    def _memory(self, ptr: Any, function: str) -> Memory:
        """The Memory of the plugin's handle ``ptr`` (``function``'s answer; NULL is refused)."""
        key = int(ffi.cast("uintptr_t", ptr))
        memory = self._memories_by_ptr.get(key)
        if memory is None:
            if not key:
                raise self._lib.broken_answer(function, "gave a NULL memory")
            memory = self._memories_by_ptr.setdefault(key, Memory(self, ptr))
        return memory

    def _resolve_device(self, device: Device | int | None) -> Device:
        if device is None:
            devices = self.addressable_devices
            if not devices:
                raise PjrtPluginsError(f"the client on {self.plugin_name!r} has no addressable devices")
            return devices[0]
        if isinstance(device, Device):
            if device._client_ref() is not self:
                raise ValueError(f"{device!r} belongs to another client")
            return device
        if isinstance(device, (int, np.integer)) and not isinstance(device, bool):
            return self.lookup_device(int(device))
        raise TypeError(f"device must be a Device, a device id or None, got {type(device).__name__}")

    # -- buffers ---------------------------------------------------------------------

    def delete_buffers(self, buffers: Iterable[Buffer]) -> None:
        """Delete many buffers of this client at once: as ``delete()`` on each, with their handles destroyed
        in one call of the compiled fast path instead of one Python call each.

        Raises :class:`BufferViewedError` (deleting none) while any of them has a host view alive, and
        ``ValueError`` for a buffer of another client; buffers already deleted are skipped.

        Example::

            outputs = exe.execute([[a]])[0]
            client.delete_buffers(outputs)
        """
        delete_buffers(self, buffers)

    def buffer_from_host(
        self, value: Any, device: Device | int | None = None, *, copy: bool | None = None
    ) -> Buffer:
        """Transfer a numpy array, torch CPU tensor or array-like to ``device``.

        ``copy=None`` (default) and ``copy=True``: the buffer gets its own copy, so later
        changes to ``value`` do not reach it. Where the plugin keeps buffers in host memory
        (the CPU plugin) we make that copy with numpy and hand it over without a second
        one; elsewhere the plugin copies while we keep ``value`` alive until it is done.
        ``copy=False``: zero-copy where the plugin allows (the CPU plugin aliases
        64-byte-aligned memory); you promise not to modify ``value`` while the buffer
        lives. Inputs the plugin cannot read as they are (non-contiguous, byte-swapped) are
        always copied first.
        """
        ptr = self._enter()  # a counted call: close() waits for it
        try:
            target = self._resolve_device(device)
            array, usable_as_is = host_array(value)
            host_resident = target._read_plan is not None and target._read_plan.mode == "direct"
            if not usable_as_is or (copy is not False and host_resident):
                array = aligned_copy(array)  # private: nobody else can change it
                zero_copy = True
            else:
                zero_copy = copy is False
            pjrt_type = pjrt_type_of(array.dtype)
            args = new_args("PJRT_Client_BufferFromHostBuffer_Args")
            data = ffi.from_buffer(array)
            args.client = ptr
            args.data = data
            args.type = pjrt_type
            args.dims = _dims(array.shape)
            args.num_dims = array.ndim
            args.host_buffer_semantics = _ZERO_COPY if zero_copy else _UNTIL_TRANSFER_COMPLETES
            args.device = target._ptr
            self._lib.call("PJRT_Client_BufferFromHostBuffer", args)
            if args.buffer == ffi.NULL:
                self._settle_host_event(args.done_with_host_buffer, wait=True, host=(array, data))
                raise self._lib.broken_answer("PJRT_Client_BufferFromHostBuffer", "returned no buffer")
            buffer = Buffer(self, args.buffer, array.shape, array.dtype, target._read_plan)
            if target._read_plan is None:  # a device's default memory and layout never change
                target._read_plan = buffer.read_plan()._replace(order=None)
            event = args.done_with_host_buffer
            if event != ffi.NULL:
                if zero_copy or not self._settle_host_event(event, wait=False):
                    buffer._hold_host((array, data), event)
            if self._pending_host:
                self._drain_pending_host()
            return buffer
        finally:
            self._calls.pop()

    # -- programs --------------------------------------------------------------------

    def compile(
        self,
        program: str | bytes,
        options: CompileOptions | bytes | None = None,
        *,
        format: str = "mlir",
    ) -> Executable:
        """Compile StableHLO (text, MLIR bytecode or a portable artifact) for this client.

        ``options`` is a :class:`CompileOptions`, serialized ``xla.CompileOptionsProto``
        bytes, or None (one replica, one partition). ``format`` is the PJRT program format:
        ``"mlir"`` (the default) or ``"hlo"`` for a serialized HloModuleProto.
        """
        ptr = self._enter()
        try:
            if isinstance(program, str):
                code = program.encode("utf-8")
            elif isinstance(program, (bytes, bytearray, memoryview)):
                code = bytes(program)
            else:
                raise TypeError(f"program must be str or bytes, got {type(program).__name__}")
            if not code:
                raise ValueError("cannot compile an empty program")
            if isinstance(options, CompileOptions):
                self._check_fits(options)
            serialized = _serialized_options(CompileOptions() if options is None else options)
            code_c = ffi.new("char[]", code)
            format_c = ffi.new("char[]", format.encode("ascii"))
            options_c = ffi.new("char[]", serialized)
            prog = new_args("PJRT_Program")
            prog.code = code_c
            prog.code_size = len(code)
            prog.format = format_c
            prog.format_size = len(format)
            args = self._lib.invoke(
                "PJRT_Client_Compile",
                client=ptr,
                program=prog,
                compile_options=options_c,
                compile_options_size=len(serialized),
            )
            if args.executable == ffi.NULL:
                raise self._lib.broken_answer("PJRT_Client_Compile", "returned no executable")
            return Executable(self, args.executable)
        finally:
            self._calls.pop()

    def deserialize_executable(self, data: bytes, options: CompileOptions | bytes | None = None) -> Executable:
        """Load an executable made by :meth:`Executable.serialize` on the same plugin version."""
        ptr = self._enter()
        try:
            blob = bytes(data)
            blob_c = ffi.new("char[]", blob)
            args = new_args("PJRT_Executable_DeserializeAndLoad_Args")
            args.client = ptr
            args.serialized_executable = blob_c
            args.serialized_executable_size = len(blob)
            keep = None
            if options is not None:
                if isinstance(options, CompileOptions):
                    self._check_fits(options)
                if not self._lib.supports_field(
                    "PJRT_Executable_DeserializeAndLoad_Args", "overridden_serialized_compile_options"
                ):
                    raise NotImplementedError(
                        f"{self._lib.name} (PJRT C API {version_text(self._lib.api_version)}) "
                        "cannot override compile options when loading; that needs PJRT C API 0.71"
                    )
                serialized = _serialized_options(options)
                keep = ffi.new("char[]", serialized)
                args.overridden_serialized_compile_options = keep
                args.overridden_serialized_compile_options_size = len(serialized)
            self._lib.call("PJRT_Executable_DeserializeAndLoad", args)
            if args.loaded_executable == ffi.NULL:
                raise self._lib.broken_answer("PJRT_Executable_DeserializeAndLoad", "returned no executable")
            return Executable(self, args.loaded_executable)
        finally:
            self._calls.pop()

    def __repr__(self) -> str:
        try:
            if not self._closed:
                return f"<pjrt Client {self.plugin_name!r} platform={self.platform_name!r} devices={len(self.devices)}>"
        except ClientClosedError:  # closed by another thread meanwhile
            pass
        return f"<pjrt Client {self.plugin_name!r} (closed)>"


def _serialized_options(options: CompileOptions | bytes) -> bytes:
    """The ``xla.CompileOptionsProto`` bytes of a :class:`CompileOptions` or of ready-made bytes."""
    if isinstance(options, CompileOptions):
        return options.serialize()
    if isinstance(options, (bytes, bytearray, memoryview)):
        return bytes(options)
    raise TypeError(
        f"options must be CompileOptions, serialized CompileOptionsProto bytes or None, got {type(options).__name__}"
    )


def _close_all_clients() -> None:
    """At interpreter exit, release clients while the plugins' state is still intact."""
    for client in list(_live_clients):
        try:
            client.close(timeout=EXIT_CLOSE_TIMEOUT_S)
        except (BufferViewedError, TimeoutError) as exc:  # memory still in use: leave it to the OS
            logger.info("not closing a client at exit: %s", exc)
        except Exception:  # noqa: BLE001
            logger.debug("closing a client at exit failed", exc_info=True)


atexit.register(_close_all_clients)
