"""Executable: a compiled program loaded on a client; its facts, serialization and execution.

Execution takes one argument list per device and returns one output list per device. By
default it waits for every device-complete event and raises the first execution error;
outputs of a failed execution are released, never leaked. The wait can be interrupted
with Ctrl-C and is bounded by the client's ``execute_timeout`` and ``stall_timeout``
(``_events``); every execution gets its own ``launch_id``, as JAX gives it.
"""

from __future__ import annotations

import itertools
import logging
import threading
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ..errors import ClientClosedError, ExecutionStuckError, PjrtError, UnsupportedFunctionError
from . import _fastpath
from ._args import MAX_TEXT_BYTES, new_args, unpack_text
from ._buffer import Buffer, free_recycled, recycling_pools, rewrap
from ._cdef import ffi
from ._devices import Device
from ._dtypes import numpy_dtype_of, numpy_dtype_of_xla_primitive
from ._events import EventWait, ReadyEvents, WaitExpired
from ._inflight import OwnedHandle, free_deferred
from ._named_values import decode_named_values
from ._proto import length_delimited_fields, varint_fields

if TYPE_CHECKING:  # pragma: no cover - annotations only: the client is the layer above
    from ._client import Client

logger = logging.getLogger(__name__)
_UNIMPLEMENTED = 12
_UNKNOWN: Any = object()
# HloModuleProto.host_program_shape = 4; ProgramShapeProto.parameters = 1;
# ShapeProto.element_type = 2, ShapeProto.dimensions = 3 (xla/service/hlo.proto, xla_data.proto).
_HLO_MODULE_PROGRAM_SHAPE = 4
_PROGRAM_SHAPE_PARAMETERS = 1
_SHAPE_ELEMENT_TYPE = 2
_SHAPE_DIMENSIONS = 3
_LAUNCH_IDS = 2**31  # PJRT_ExecuteOptions.launch_id is a C int
_EXECUTE = "PJRT_LoadedExecutable_Execute"
_launch_ids_lock = threading.Lock()
_pjrtp_execute: Any = _fastpath.library.pjrtp_execute if _fastpath.library is not None else None


def _parameters_from_hlo_module(module: bytes) -> list[tuple[tuple[int, ...], np.dtype]] | None:
    """``[(shape, dtype)]`` of the entry parameters of a serialized HloModuleProto, or None."""
    shapes = length_delimited_fields(module, _HLO_MODULE_PROGRAM_SHAPE)
    if len(shapes) != 1:
        return None
    params = []
    for shape in length_delimited_fields(shapes[0], _PROGRAM_SHAPE_PARAMETERS):
        kinds = varint_fields(shape, _SHAPE_ELEMENT_TYPE)
        dtype = numpy_dtype_of_xla_primitive(kinds[0]) if len(kinds) == 1 else None
        if dtype is None:
            return None
        params.append((tuple(varint_fields(shape, _SHAPE_DIMENSIONS)), dtype))
    return params


class _ExecuteFrame:
    """Preallocated C arrays and args for one (devices, arguments) execute shape; reused.

    A frame is taken from its pool (``pool``) for one execute and put back after it, so an
    execute running on another thread never fills the same C memory.
    """

    __slots__ = (
        "args", "options", "inner_args", "inner_outputs", "events", "ready_events", "waits", "on_device",
        "arguments", "num_args", "params", "template", "pool", "execute_fn", "_keep", "plan",
    )

    def __init__(
        self,
        lib: Any,
        loaded: Any,
        num_devices: int,
        num_args: int,
        num_outputs: int,
        params: Any,
        pool: list[_ExecuteFrame],
        launch_ids: Any,
    ) -> None:
        self.inner_args = [ffi.new("PJRT_Buffer*[]", max(1, num_args)) for _ in range(num_devices)]
        self.inner_outputs = [ffi.new("PJRT_Buffer*[]", max(1, num_outputs)) for _ in range(num_devices)]
        argument_lists = ffi.new("PJRT_Buffer**[]", self.inner_args)
        output_lists = ffi.new("PJRT_Buffer**[]", self.inner_outputs)
        self.events = ffi.new("PJRT_Event*[]", num_devices)
        self.ready_events = ReadyEvents(lib, num_devices)
        self.arguments: Any = None  # the argument lists of the execute using this frame (see _inflight)
        self.num_args = num_args
        self.on_device = False  # execute_device is set
        self.params = params  # [(shape, dtype)] each argument list must match, or None
        self.template: Any = None  # the executable's output template once complete (see _output_template)
        self.pool = pool
        self.execute_fn = lib.function(_EXECUTE)
        self.options = options = new_args("PJRT_ExecuteOptions")
        args = new_args("PJRT_LoadedExecutable_Execute_Args")
        args.executable = loaded
        args.device_complete_events = self.events
        self.waits = True
        args.options = options
        args.argument_lists = argument_lists
        args.num_devices = num_devices
        args.num_args = num_args
        args.output_lists = output_lists
        self.args = args
        self._keep = (argument_lists, output_lists, options)
        # The compiled fast path runs the execute and finishes ready events in one C call (None without it).
        self.plan = _fastpath.execute_plan(self.execute_fn, args, self.ready_events.plan, launch_ids)


class Executable(OwnedHandle):
    """A loaded executable. Use it as a context manager or call delete() to free it early.

    Thread-safe: several threads may execute it at once, and a ``delete()`` (or
    ``client.close()``) never frees it under an execute or query running on another thread.
    """

    _KIND = "executable"
    _REGISTRY = "_live_executables"

    def __init__(self, client: Client, loaded: Any) -> None:
        self._client = client
        self._lib = lib = client._lib
        self._ptr = loaded  # the PJRT_LoadedExecutable; None once deleted
        self._exe: Any = None  # its PJRT_Executable, used within counted calls only
        try:
            self._exe = lib.invoke("PJRT_LoadedExecutable_GetExecutable", loaded_executable=loaded).executable
            if self._exe == ffi.NULL:
                raise lib.broken_answer("PJRT_LoadedExecutable_GetExecutable", "returned no executable")
        except BaseException:
            lib.invoke("PJRT_LoadedExecutable_Destroy", executable=loaded)
            raise
        # The client's registry owns both handles: whoever pops them (delete or close) frees them.
        client._live_executables[id(self)] = (self._exe, loaded)
        self._frames: dict[tuple[int, int], list[_ExecuteFrame]] = {}
        outputs = lib.invoke("PJRT_Executable_NumOutputs", executable=self._exe).num_outputs
        #: Outputs per device (checked: a count no program has is refused before anything is sized by it).
        self.num_outputs = lib.count(self._exe, outputs, "PJRT_Executable_NumOutputs", "outputs")
        self._addressable: list[Device] | None = None
        self._facts: dict[str, Any] = {}
        self._launch_ids: Any = None  # itertools.count, started on the first execute

    # -- lifetime --------------------------------------------------------------------

    def _release(self) -> None:
        self._frames = {}
        self._forget()

    def _destroy(self, entry: tuple[Any, Any]) -> None:
        self._client._destroy_executable(entry)

    def delete(self) -> None:
        """Free the executable (once executes running on other threads have ended); later use raises ValueError."""
        self._release()

    @property
    def is_deleted(self) -> bool:
        return self._ptr is None or self._client._closed

    def __enter__(self) -> Executable:
        return self

    def __exit__(self, *exc: object) -> None:
        self._release()

    def __del__(self) -> None:
        try:
            if self._ptr is not None:
                self._release()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass

    # -- facts -----------------------------------------------------------------------

    @property
    def client(self) -> Client:
        return self._client

    def _invoke(self, function: str) -> Any:
        """``function`` called on this PJRT_Executable; returns its args struct (plain numbers only:
        what the plugin points to must be read within ``with self._call():``)."""
        with self._call():
            return self._lib.invoke(function, executable=self._exe)

    def _size_fact(self, function: str, field: str) -> int:
        if field not in self._facts:
            self._facts[field] = int(getattr(self._invoke(function), field))
        return cast(int, self._facts[field])

    @property
    def name(self) -> str:
        if "name" not in self._facts:
            with self._call():
                args = self._lib.invoke("PJRT_Executable_Name", executable=self._exe)
                self._facts["name"] = unpack_text(args.executable_name, args.executable_name_size)
        return cast(str, self._facts["name"])

    @property
    def num_replicas(self) -> int:
        return self._size_fact("PJRT_Executable_NumReplicas", "num_replicas")

    @property
    def num_partitions(self) -> int:
        return self._size_fact("PJRT_Executable_NumPartitions", "num_partitions")

    @property
    def generated_code_size(self) -> int:
        return self._size_fact("PJRT_Executable_SizeOfGeneratedCodeInBytes", "size_in_bytes")

    @property
    def output_shapes(self) -> list[tuple[int, ...]]:
        """The shape of each output (per device)."""
        if "output_shapes" not in self._facts:
            with self._call():
                function = "PJRT_Executable_OutputDimensions"
                args = self._lib.invoke(function, executable=self._exe)
                ranks = [int(r) for r in args.dim_sizes[0 : self._lib.count(args.dim_sizes, args.num_outputs, function, "outputs")]]
                self._lib.count(args.dims, sum(ranks), function, "dimensions")  # all of them at one address
                shapes, start = [], 0
                for rank in ranks:
                    shapes.append(tuple(int(args.dims[start + j]) for j in range(rank)))
                    start += rank
            self._facts["output_shapes"] = shapes
        return list(self._facts["output_shapes"])

    @property
    def output_dtypes(self) -> list[np.dtype]:
        """The numpy dtype of each output (per device)."""
        if "output_dtypes" not in self._facts:
            with self._call():
                function = "PJRT_Executable_OutputElementTypes"
                args = self._lib.invoke(function, executable=self._exe)
                count = self._lib.count(args.output_types, args.num_output_types, function, "output types")
                self._facts["output_dtypes"] = [numpy_dtype_of(int(ffi.cast("int", args.output_types[i]))) for i in range(count)]
        return list(self._facts["output_dtypes"])

    @property
    def parameters(self) -> list[tuple[tuple[int, ...], np.dtype]] | None:
        """``[(shape, dtype)]`` each device's arguments must have, or None if unknown.

        Read once from the optimized program; execute() checks arguments against it, so a
        buffer of the wrong dtype or shape raises instead of being reinterpreted.
        """
        params = self._facts.get("parameters", _UNKNOWN)
        if params is _UNKNOWN:
            params = None
            try:
                params = _parameters_from_hlo_module(self.optimized_hlo_module())
            except (PjrtError, UnsupportedFunctionError, NotImplementedError, ValueError, IndexError) as exc:
                logger.debug("parameter shapes of %r are unknown: %s", self, exc)
            self._facts["parameters"] = params
        return None if params is None else list(params)

    @property
    def output_memory_kinds(self) -> list[str]:
        with self._call():
            function = "PJRT_Executable_OutputMemoryKinds"
            args = self._lib.invoke(function, executable=self._exe)
            count = self._lib.count(args.memory_kinds, args.num_outputs, function, "memory kinds")
            self._lib.count(args.memory_kind_sizes, count, function, "memory kind sizes")
            return [unpack_text(args.memory_kinds[i], args.memory_kind_sizes[i]) for i in range(count)]

    @property
    def fingerprint(self) -> str | None:
        """The plugin's fingerprint of this executable, or None where it offers none."""
        if "fingerprint" not in self._facts:
            value = None
            try:
                with self._call():
                    args = self._lib.invoke("PJRT_Executable_Fingerprint", executable=self._exe)
                    if args.executable_fingerprint != ffi.NULL:
                        value = unpack_text(args.executable_fingerprint, args.executable_fingerprint_size)
            except UnsupportedFunctionError:
                value = None
            except PjrtError as exc:
                if exc.code != _UNIMPLEMENTED:
                    raise
            self._facts["fingerprint"] = value
        return cast("str | None", self._facts["fingerprint"])

    def cost_analysis(self) -> dict[str, Any]:
        """The plugin's cost properties (flops, bytes accessed, ...), possibly empty."""
        with self._call():
            args = self._lib.invoke("PJRT_Executable_GetCostAnalysis", executable=self._exe)
            return decode_named_values(args.properties, args.num_properties, "PJRT_Executable_GetCostAnalysis")

    @property
    def addressable_devices(self) -> list[Device]:
        """The devices this executable runs on, in the order execute() takes argument lists."""
        if self._addressable is None:
            with self._call() as loaded:
                function = "PJRT_LoadedExecutable_AddressableDevices"
                args = self._lib.invoke(function, executable=loaded)
                count = self._lib.count(args.addressable_devices, args.num_addressable_devices, function, "devices")
                self._addressable = [self._client._device(args.addressable_devices[i], function) for i in range(count)]
        return list(self._addressable)

    def optimized_program(self) -> tuple[str, bytes]:
        """``(format, code)`` of the optimized program, e.g. ``"hlo_with_config"`` and its bytes."""
        program = new_args("PJRT_Program")
        with self._call():
            args = self._lib.invoke("PJRT_Executable_OptimizedProgram", executable=self._exe, program=program)
            code = ffi.new("char[]", max(1, int(program.code_size)))  # the second call fills it
            program.code = code
            self._lib.call("PJRT_Executable_OptimizedProgram", args)
            return unpack_text(program.format, program.format_size), ffi.unpack(code, program.code_size)

    def optimized_hlo_module(self) -> bytes:
        """The optimized program as a serialized ``xla.HloModuleProto`` (e.g. for jaxlib's ``HloModule``).

        Unwraps the ``hlo_with_config`` form plugins return; raises NotImplementedError
        when the plugin returns its optimized program in another format.
        """
        fmt, code = self.optimized_program()
        if fmt == "hlo_with_config":  # HloModuleProtoWithConfig: field 1 is the HloModuleProto
            modules = length_delimited_fields(code, 1)
            if not modules:
                raise ValueError("the plugin's hlo_with_config program has no HLO module")
            return modules[0]
        if fmt != "hlo":
            raise NotImplementedError(f"the plugin returned its optimized program as {fmt!r}, not 'hlo'")
        return code

    def optimized_hlo_text(self) -> str:
        """The optimized HLO as text (needs jaxlib to print the HloModuleProto)."""
        code = self.optimized_hlo_module()
        try:
            from jaxlib import xla_client
        except ImportError:
            raise NotImplementedError("printing optimized HLO needs jaxlib (pip install jaxlib)") from None
        return str(xla_client.XlaComputation(code).as_hlo_text())

    def serialize(self) -> bytes:
        """Plugin-specific bytes for :meth:`Client.deserialize_executable` (same plugin build)."""
        with self._call():
            args = self._lib.invoke("PJRT_Executable_Serialize", executable=self._exe)
            try:
                size = args.serialized_bytes_size
                if size and (args.serialized_bytes == ffi.NULL or size > MAX_TEXT_BYTES):
                    raise self._lib.broken_answer("PJRT_Executable_Serialize", f"gave {size} bytes at {args.serialized_bytes}")
                return bytes(ffi.unpack(args.serialized_bytes, size)) if size else b""
            finally:
                if args.serialized_executable_deleter != ffi.NULL:
                    args.serialized_executable_deleter(args.serialized_executable)

    # -- execution -------------------------------------------------------------------

    def execute(
        self,
        args_per_device: Sequence[Sequence[Buffer]],
        *,
        device: Device | int | None = None,
        wait: bool = True,
        recycle: Sequence[Sequence[Buffer]] | None = None,
    ) -> list[list[Buffer]]:
        """Run on each device with its own argument list; returns ``outputs[device][i]``.

        ``args_per_device[d]`` are the arguments for ``addressable_devices[d]``. With
        ``device`` set, a single argument list runs on that device (where the plugin
        allows). ``wait=True`` waits for the device-complete events and raises an
        execution error as PjrtError; with ``wait=False`` errors surface when the outputs
        are read.

        ``recycle[d]``: buffers of device ``d`` the caller gives up, typically arguments the
        program was compiled to donate. This call deletes them, and their Python objects may
        come back as outputs of the same device, so the caller must keep no other reference
        to them. Why: a training step makes and frees an output object for each value on each
        device, about 1 us each. Needs ``wait=True``.
        """
        # A counted call (see _inflight): delete() or close() elsewhere waits for it. _begin() and
        # _end() written out: a frame costs about 0.1 us, and this is the dispatch hot path.
        client = self._client
        client_calls = client._calls
        client_calls.append(None)
        handle_calls = client._handle_calls
        handle_calls.append(self)
        try:
            loaded = self._ptr
            if loaded is None or client._closed:
                raise self._gone_error()
            try:
                frame = self._frames[len(args_per_device), len(args_per_device[0])].pop()
            except (TypeError, IndexError, KeyError):  # a first execute of this shape, all in use, or bad lists
                frame = self._new_frame(loaded, args_per_device)
            frame.arguments = args_per_device
            running = client._running
            running.append(frame)  # before the arguments' handles are read: their delete() now waits too
            try:
                return self._execute(frame, args_per_device, device, wait, recycle)
            finally:
                running.remove(frame)
                frame.arguments = None
                frame.pool.append(frame)
        finally:
            handle_calls.remove(self)
            if client._deferred:
                free_deferred(client._deferred)
            client_calls.pop()

    def _new_frame(self, loaded: Any, args_per_device: Sequence[Sequence[Buffer]]) -> _ExecuteFrame:
        """A frame for the shape of ``args_per_device`` (checked here: the frame pools skip the check)."""
        if isinstance(args_per_device, Buffer) or (
            len(args_per_device) and isinstance(args_per_device[0], Buffer)
        ):
            raise TypeError(
                "execute() takes one argument list per device, e.g. exe.execute([[a, b]]) for one device"
            )
        num_devices = len(args_per_device)
        if num_devices == 0:
            raise ValueError("execute() needs at least one argument list (one per device)")
        num_args = len(args_per_device[0])
        params = self._checked_parameters(num_args)  # raises for a wrong count: no frame is made for it
        launch_ids = self._launch_ids or self._start_launch_ids()
        pool = self._frames.setdefault((num_devices, num_args), [])
        return _ExecuteFrame(self._lib, loaded, num_devices, num_args, self.num_outputs, params, pool, launch_ids)

    def _output_template(self, frame: _ExecuteFrame) -> list[tuple[Any, Any, Any]]:
        """``[(shape, dtype, read plan)]`` given to each new output buffer (None: ask later); kept
        by ``frame`` once complete."""
        template = self._facts.get("output_template")
        if template is None:
            try:
                shapes: list[Any] = self.output_shapes
                dtypes: list[Any] = self.output_dtypes
            except (PjrtError, UnsupportedFunctionError, NotImplementedError):
                shapes = dtypes = [None] * self.num_outputs
            if len(shapes) != self.num_outputs or len(dtypes) != self.num_outputs:
                shapes = dtypes = [None] * self.num_outputs
            plans = self._facts.get("output_plans") or [None] * self.num_outputs
            template = list(zip(shapes, dtypes, plans))
            if "output_plans" in self._facts:  # complete: cache it
                self._facts["output_template"] = template
        if "output_plans" in self._facts:
            frame.template = template
        return template

    def _checked_parameters(self, num_args: int) -> list[tuple[tuple[int, ...], np.dtype]] | None:
        params = self._facts.get("parameters", _UNKNOWN)
        if params is _UNKNOWN:
            params = self.parameters
        if params is not None and len(params) != num_args:
            raise ValueError(f"this program takes {len(params)} argument(s) per device, got {num_args}")
        return cast("list[tuple[tuple[int, ...], np.dtype[Any]]] | None", params)

    def _execute(
        self, frame: _ExecuteFrame, args_per_device: Sequence[Sequence[Buffer]], device: Device | int | None, wait: bool,
        recycle: Sequence[Sequence[Buffer]] | None,
    ) -> list[list[Buffer]]:
        """The execute using ``frame``: its arguments checked and set, the call, the outputs, the wait."""
        client = self._client
        params = frame.params
        num_args = frame.num_args
        # Facts are asked before the call: a delete() meanwhile cannot fail them.
        template = frame.template or self._output_template(frame)
        for d, (arg_list, inner) in enumerate(zip(args_per_device, frame.inner_args)):
            if len(arg_list) != num_args:
                raise ValueError(
                    f"every device needs the same number of arguments: device 0 has {num_args}, "
                    f"device {d} has {len(arg_list)}"
                )
            for i, buf in enumerate(arg_list):
                if type(buf) is not Buffer and not isinstance(buf, Buffer):
                    raise TypeError(f"argument {i} for device {d} is a {type(buf).__name__}, not a Buffer")
                ptr = buf._ptr
                if ptr is None or buf._client is not client:
                    raise ValueError(
                        f"argument {i} for device {d} "
                        + ("has been deleted" if ptr is None else "belongs to another client")
                    )
                if params is not None:
                    shape, dtype = params[i]
                    known = buf._dtype  # a dtype is falsy (no fields): compare, never `or`
                    if buf._shape != shape or (known is not dtype and known != dtype):
                        _check_argument(buf, shape, dtype, i, d)  # facts not asked yet, or a mismatch
                inner[i] = ptr
        pools = None
        if recycle is not None:
            if not wait:
                raise ValueError("recycle needs wait=True: the given-up buffers are freed when the execution ends")
            pools = recycling_pools(client, recycle, len(args_per_device))
        args = frame.args
        if frame.waits is not wait:
            args.device_complete_events = frame.events if wait else ffi.NULL
            frame.waits = wait
        if device is not None:
            if len(args_per_device) != 1:
                raise ValueError("execute(device=...) takes exactly one argument list")
            args.execute_device = client._resolve_device(device)._ptr
            frame.on_device = True
        elif frame.on_device:
            args.execute_device = ffi.NULL
            frame.on_device = False
        # Unsettled from before the launch until its outcome is known: a Ctrl-C that lands
        # between the plugin's return and the wait leaves the token, and close() then does not
        # wait for the plugin's threads, which still run the execution (see Client.close).
        unsettled = client._unsettled_executions
        token = object()
        unsettled.add(token)
        plan = frame.plan
        if plan is not None:
            status = _pjrtp_execute(plan)  # the launch id, and the events when they are ready already
            if status == _fastpath.EXECUTE_FAILED:
                unsettled.discard(token)
                raise self._lib.error_to_exception(plan.execute_error, _EXECUTE)
            if status == _fastpath.INVALID_ARGUMENTS:  # a frame the runtime built wrongly: nothing ran
                unsettled.discard(token)
                raise RuntimeError("pjrtp_execute refused the execute frame's plan; nothing ran (a bug in pjrt_plugins)")
        else:
            frame.options.launch_id = next(self._launch_ids) % _LAUNCH_IDS
            status = _fastpath.RUNNING  # nothing waited for yet
            err = frame.execute_fn(args)
            if err:
                unsettled.discard(token)
                raise self._lib.error_to_exception(err, _EXECUTE)
        if not (wait and status):  # finished, or not waited for here (the outputs' own events follow it)
            unsettled.discard(token)
        # With a call on another thread in flight, a given-up buffer might be its argument: delete, not reuse.
        reuse = pools is not None and len(client._running) == 1 and len(client._handle_calls) == 1
        old: list[Any] = []  # the handles of reused buffers, destroyed below
        rest: list[Buffer] = []  # given-up buffers not reused, deleted below
        try:
            outputs: list[list[Buffer]] = []
            complete = True
            for d, inner in enumerate(frame.inner_outputs):
                pool = pools[d] if reuse and pools is not None else None
                row: list[Buffer] = []
                for i, (shape, dtype, read) in enumerate(template):
                    ptr = inner[i]
                    if not ptr:  # a plugin that reports success without an output: never wrapped, never freed
                        complete = False
                        continue
                    reused: Buffer | None = None
                    while pool:
                        candidate = pool.pop()
                        if rewrap(candidate, ptr, shape, dtype, read, wait, old):
                            reused = candidate
                            break
                        rest.append(candidate)
                    row.append(reused if reused is not None else Buffer(client, ptr, shape, dtype, read, wait))
                outputs.append(row)
            if old:  # while the program runs: a destroyed handle's memory stays until the execution is done with it
                free_recycled(client, old, [])
                old = []
            if not complete:
                self._refuse_missing_outputs(frame, status, outputs, device, wait, token)
            if wait and status:  # not finished by the fast path, or finished with errors
                errors = self._execute_errors(frame, status, outputs, device, token)
                if any(errors):
                    _release(outputs)
                    raise next(error for error in errors if error is not None)
        finally:
            if pools is not None:  # the given-up buffers are freed whatever happened after the launch
                for pool in pools:
                    rest += pool
                free_recycled(client, old, rest)
        if frame.template is None and outputs:
            self._learn_output_plans(frame, outputs[0])
        return outputs

    def _refuse_missing_outputs(
        self, frame: _ExecuteFrame, status: int, outputs: list[list[Buffer]], device: Device | int | None, wait: bool,
        token: object,
    ) -> None:
        """Raise for an execute that reported success but left outputs NULL, once its events are
        finished (a device's own error, if one failed, is the more useful report); the outputs it
        did return are released."""
        d, i = next((d, i) for d, inner in enumerate(frame.inner_outputs) for i in range(self.num_outputs) if not inner[i])
        try:
            errors = self._execute_errors(frame, status, outputs, device, token) if wait and status else []
        finally:
            _release(outputs)
        raise next((error for error in errors if error is not None), None) or self._lib.broken_answer(
            _EXECUTE, f"returned no output {i} for device {d} (NULL) of {len(frame.inner_outputs)} device(s)"
        )

    def _execute_errors(
        self, frame: _ExecuteFrame, status: int, outputs: list[list[Buffer]], device: Device | int | None,
        token: object,
    ) -> list[PjrtError | None]:
        """Each device's execution error (None: it succeeded), waiting for what is still running;
        ``status`` says what the fast path did (``RUNNING`` also when there is none). The launch's
        ``token`` leaves the client's unsettled executions once the outcome is known."""
        events = frame.events  # one per device, as many as rows of outputs
        ready = frame.ready_events
        try:
            if frame.plan is None:  # the Python path: ask now
                errors = ready.errors(events, _EXECUTE)
            else:  # pjrtp_execute asked already
                errors = ready.outcome(status, len(outputs), _EXECUTE)
        except BaseException:
            _release(outputs)
            raise  # the token stays: whether the execution finished is not known
        if errors is None:  # not done yet: wait, bounded and interruptible
            return self._await_devices(list(events), outputs, device, token)
        self._client._unsettled_executions.discard(token)
        return errors

    def _learn_output_plans(self, frame: _ExecuteFrame, outputs: list[Buffer]) -> None:
        """Ask how each output is read once (an output's memory and layout never change)."""
        if "output_plans" not in self._facts:
            try:
                self._facts["output_plans"] = [buf.read_plan() for buf in outputs]
            except ClientClosedError:  # closed by another thread, which waits for this call: ask next time
                pass

    def _start_launch_ids(self) -> Any:
        """The ``launch_id`` numbering of this executable: one new id per execution, as JAX numbers them.

        It names the run in the plugin's collective rendezvous keys (``RunId``); starting
        from the executable's fingerprint keeps the numbering the same in every process
        that runs the same programs in the same order.
        """
        fingerprint = self.fingerprint
        start = zlib.crc32(fingerprint.encode()) if fingerprint else 0
        with _launch_ids_lock:  # executes starting at once on several threads share one numbering
            if self._launch_ids is None:
                # The fast path counts in C (atomically); otherwise an itertools.count (atomic under the GIL).
                fast = _fastpath.library is not None
                self._launch_ids = _fastpath.launch_id_counter(start) if fast else itertools.count(start)
            return self._launch_ids

    def _await_devices(
        self, events: list[Any], outputs: list[list[Buffer]], device: Device | int | None, token: object
    ) -> list[PjrtError | None]:
        """Wait for the device-complete ``events``; returns their errors.

        Interrupted (Ctrl-C) or past the client's bounds, the execution stays in the plugin,
        which cannot cancel it: the outputs are released, and the wait takes the launch's
        ``token``'s place among the client's unsettled executions, so that ``close()`` does not
        block on the plugin's threads while it is pending.
        """
        client = self._client
        unsettled = client._unsettled_executions
        waiter = EventWait(self._lib, events, _EXECUTE)
        try:
            errors = waiter.wait(client.execute_timeout, client.stall_timeout)
        except BaseException as exc:
            _release(outputs)
            if not waiter.complete:
                unsettled.add(waiter)
                waiter.when_complete(lambda: unsettled.discard(waiter))
            unsettled.discard(token)
            if isinstance(exc, WaitExpired):
                raise self._stuck_error(exc, waiter.pending, len(outputs), device) from None
            raise
        unsettled.discard(token)
        return errors

    def _stuck_error(
        self, expired: WaitExpired, pending: list[int], num_devices: int, device: Device | int | None
    ) -> ExecutionStuckError:
        client = self._client
        try:
            name = self.name
            if device is not None:
                ids = [client._resolve_device(device).id]
            else:
                ids = [self.addressable_devices[d].id for d in pending]
        except Exception:  # noqa: BLE001 - the error must be raised even if the plugin cannot answer now
            name, ids = "(unnamed)", list(pending)
        if expired.reason == "stalled":
            why = (
                f"the process used no CPU for the last {client.stall_timeout:g} s, so the devices' "
                "threads are all blocked inside the plugin (for example a collective waiting for a "
                "device whose work cannot start)"
            )
        else:
            why = f"it passed the client's execute_timeout of {client.execute_timeout:g} s"
        return ExecutionStuckError(
            f"program {name!r} did not complete on device(s) {ids} of {num_devices} after "
            f"{expired.waited:.1f} s: {why}. The plugin cannot cancel an execution: its outputs were "
            "released and the client will not be destroyed by close() while it is pending. Save "
            "what you need and restart the process; see 'Stuck executions' in the user guide.",
            program=name,
            devices=ids,
            waited=expired.waited,
            reason=expired.reason,
        )

    def __repr__(self) -> str:
        if self.is_deleted:
            return "<pjrt Executable (deleted)>"
        return f"<pjrt Executable {self.name!r} outputs={self.num_outputs}>"


def _check_argument(buf: Buffer, shape: tuple[int, ...], dtype: np.dtype, i: int, d: int) -> None:
    """Raise TypeError unless argument ``i`` for device ``d`` has the ``shape`` and ``dtype`` the program expects."""
    if buf.shape != shape or buf.dtype != dtype:
        raise TypeError(
            f"argument {i} for device {d} is {buf.dtype}{list(buf.shape)}, but the program "
            f"expects {dtype}{list(shape)} there"
        )


def _release(outputs: list[list[Buffer]]) -> None:
    for row in outputs:
        for buf in row:
            buf._release()
