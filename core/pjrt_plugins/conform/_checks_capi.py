"""Checks of the PJRT C API library: ABI and version, initialize and attributes, client, devices,
memories, error reporting. Buffers (``_checks_buffers``) and programs (``_checks_programs``)
follow them.

Everything goes through :mod:`pjrt_plugins.runtime`; only the struct-size probes
build args structs by hand, with the runtime's own declarations.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ..errors import ApiVersionError, PjrtError, PluginInitializeTimeoutError, PluginUnavailableError
from ..runtime import _cdef
from ..runtime._cdef import API_SLOTS, HEADER_MINOR, MIN_SUPPORTED_MINOR, STRUCT_SIZE, ffi
from ._context import Context
from ._framework import Fail, Skip, Unsupported, check

#: Functions without which pjrt-plugins cannot create a client, list devices or move a buffer.
REQUIRED_FUNCTIONS = (
    "PJRT_Error_Destroy",
    "PJRT_Error_Message",
    "PJRT_Error_GetCode",
    "PJRT_Plugin_Initialize",
    "PJRT_Event_Destroy",
    "PJRT_Event_IsReady",
    "PJRT_Event_Error",
    "PJRT_Event_Await",
    "PJRT_Client_Create",
    "PJRT_Client_Destroy",
    "PJRT_Client_PlatformName",
    "PJRT_Client_ProcessIndex",
    "PJRT_Client_PlatformVersion",
    "PJRT_Client_Devices",
    "PJRT_Client_AddressableDevices",
    "PJRT_Client_LookupDevice",
    "PJRT_Client_BufferFromHostBuffer",
    "PJRT_DeviceDescription_Id",
    "PJRT_DeviceDescription_ProcessIndex",
    "PJRT_DeviceDescription_Kind",
    "PJRT_DeviceDescription_ToString",
    "PJRT_Device_GetDescription",
    "PJRT_Device_IsAddressable",
    "PJRT_Device_LocalHardwareId",
    "PJRT_Buffer_Destroy",
    "PJRT_Buffer_ElementType",
    "PJRT_Buffer_Dimensions",
    "PJRT_Buffer_OnDeviceSizeInBytes",
    "PJRT_Buffer_Device",
    "PJRT_Buffer_Delete",
    "PJRT_Buffer_IsDeleted",
    "PJRT_Buffer_ToHostBuffer",
    "PJRT_Buffer_ReadyEvent",
)

#: Optional capabilities, named for the report when a plugin offers none of their functions.
OPTIONAL_GROUPS = {
    "memories": ("PJRT_Client_AddressableMemories", "PJRT_Device_DefaultMemory", "PJRT_Memory_Kind"),
    "compile and execute": ("PJRT_Client_Compile", "PJRT_LoadedExecutable_Execute"),
    "executable serialization": ("PJRT_Executable_Serialize", "PJRT_Executable_DeserializeAndLoad"),
    "device-to-device copies": ("PJRT_Buffer_CopyToDevice",),
    "default device assignment": ("PJRT_Client_DefaultDeviceAssignment",),
}


def _lib_warnings(action: Any) -> tuple[Any, list[str]]:
    """Run ``action()`` and collect the warnings the runtime's library module logs meanwhile."""
    messages: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    runtime_logger = logging.getLogger("pjrt_plugins.runtime._library")
    handler = Collect(logging.WARNING)
    runtime_logger.addHandler(handler)
    try:
        return action(), messages
    finally:
        runtime_logger.removeHandler(handler)


# -- ABI and version --------------------------------------------------------------------------


@check("abi.load", "the library opens and exports GetPjrtApi", requires=("python.load",), essential=True)
def check_abi_load(ctx: Context) -> str:
    try:
        path = ctx.library_path
    except PluginUnavailableError as exc:
        raise Skip(f"no library to check: {exc}") from None
    try:
        library = ctx.library
    except ApiVersionError:
        return f"opened {path}; GetPjrtApi answered (its version is checked next)"
    return f"opened {path}; GetPjrtApi returned a {library.api_struct_size}-byte PJRT_Api"


@check("abi.version", "the PJRT C API version is one pjrt-plugins speaks", requires=("abi.load",), essential=True)
def check_abi_version(ctx: Context) -> str:
    try:
        library = ctx.library
    except ApiVersionError as exc:
        raise Fail(str(exc)) from None
    major, minor = library.api_version
    supported = f"pjrt-plugins speaks 0.{MIN_SUPPORTED_MINOR} to 0.{HEADER_MINOR}"
    if minor > HEADER_MINOR:
        return f"PJRT C API {major}.{minor}: newer than the 0.{HEADER_MINOR} layout; newer functions are not used ({supported})"
    return f"PJRT C API {major}.{minor} ({supported})"


@check("abi.struct_sizes", "PJRT_Api and its version struct are as large as the version claims",
       requires=("abi.version",), essential=True)
def check_abi_struct_sizes(ctx: Context) -> str:
    library = ctx.library
    minor = min(library.api_version[1], _cdef.HEADER_MINOR)
    known = [s for s in _cdef.API_SLOTS if s.added <= minor and s.name not in _cdef.ADDED_BY_AT_LATEST]
    last = max(known, key=lambda s: _cdef.slot_end(s.name))
    needed = _cdef.slot_end(last.name)
    size = library.api_struct_size
    if size < needed:
        raise Fail(
            f"PJRT_Api.struct_size is {size} bytes, but a PJRT C API 0.{library.api_version[1]} table holds at "
            f"least {needed} (through {last.name}); set struct_size to PJRT_Api_STRUCT_SIZE of the header you "
            "build against"
        )
    version_size = library.api_version_struct_size
    expected_version = _cdef.STRUCT_SIZE["PJRT_Api_Version"]
    if version_size < expected_version:
        raise Fail(
            f"PJRT_Api.pjrt_api_version.struct_size is {version_size}, expected at least {expected_version} "
            "(PJRT_Api_Version_STRUCT_SIZE)"
        )
    slots = (size - _cdef.SLOT_BASE_OFFSET) // _cdef.POINTER_SIZE
    return f"PJRT_Api is {size} bytes ({slots} function slots; 0.{library.api_version[1]} needs >= {needed}); version struct {version_size} bytes"


@check("abi.functions", "the functions every client needs are present (slots gated by struct_size, non-NULL)",
       requires=("abi.version",), essential=True)
def check_abi_functions(ctx: Context) -> str:
    library = ctx.library
    missing = [name for name in REQUIRED_FUNCTIONS if not library.has_function(name)]
    if missing:
        raise Fail(
            f"missing {len(missing)} required function{'s' if len(missing) != 1 else ''}: {', '.join(missing)}. "
            "pjrt-plugins needs them to create a client, list devices and move buffers"
        )
    provided = sum(library.has_function(slot.name) for slot in API_SLOTS)
    absent = [group for group, names in OPTIONAL_GROUPS.items() if not all(library.has_function(n) for n in names)]
    tail = f"; not offered: {', '.join(absent)}" if absent else ""
    return f"{provided} of {len(API_SLOTS)} known functions present, all {len(REQUIRED_FUNCTIONS)} required ones{tail}"


@check("abi.extensions", "the extension chain is well formed", requires=("abi.version",))
def check_abi_extensions(ctx: Context) -> str:
    extensions, problems = _lib_warnings(lambda: ctx.library.extensions)
    if problems:
        raise Fail("; ".join(problems))
    if not extensions:
        return "no extensions"
    return ", ".join(f"{name} ({kind})" for kind, name in extensions)


# -- initialize and attributes ----------------------------------------------------------------


@check("plugin.initialize", "PJRT_Plugin_Initialize returns in time", requires=("abi.functions", "python.preflight"),
       essential=True)
def check_initialize(ctx: Context) -> str:
    started = time.monotonic()
    try:
        ctx.initialize()
    except PluginInitializeTimeoutError as exc:
        raise Fail(str(exc)) from None
    except PluginUnavailableError as exc:
        raise Skip(f"the plugin's preflight refuses to initialize here (not a defect): {exc}") from None
    return f"initialized in {time.monotonic() - started:.2f} s"


@check("plugin.attributes", "PJRT_Plugin_Attributes lists well-typed attributes", requires=("plugin.initialize",))
def check_attributes(ctx: Context) -> str:
    library = ctx.library
    if not library.has_function("PJRT_Plugin_Attributes"):
        raise Unsupported("PJRT_Plugin_Attributes is not provided")
    attributes = library.attributes
    bad = [k for k, v in attributes.items() if not isinstance(k, str) or not isinstance(v, (str, int, float, bool, tuple))]
    if bad:
        raise Fail(f"attributes with unusable names or values: {bad}")
    shown = ", ".join(f"{k}={v!r}" for k, v in sorted(attributes.items())[:6])
    more = f", +{len(attributes) - 6} more" if len(attributes) > 6 else ""
    return f"{len(attributes)} attributes: {shown}{more}" if attributes else "no attributes"


# -- client, devices, memories ----------------------------------------------------------------


@check("client.create", "PJRT_Client_Create makes a client", requires=("plugin.initialize", "python.create_options"),
       essential=True)
def check_client_create(ctx: Context) -> str:
    started = time.monotonic()
    try:
        client = ctx.client
    except PluginInitializeTimeoutError as exc:
        raise Fail(str(exc)) from None
    except PluginUnavailableError as exc:
        raise Skip(f"the plugin refuses to create a client here (not a defect): {exc}") from None
    except PjrtError as exc:
        library_says = f"the library says {exc.code_name}: {exc.message}"
        reason = ctx.plugin.unavailable_reason() if ctx.has_python else None
        if reason:
            raise Skip(f"the plugin reports it cannot run here: {reason} ({library_says})") from None
        if not ctx.has_python and exc.code_name in ("FAILED_PRECONDITION", "UNAVAILABLE", "NOT_FOUND"):
            raise Skip(f"no usable device here: {library_says}") from None
        raise
    except (TypeError, ValueError) as exc:
        raise Fail(f"the create options are refused: {exc}") from None
    devices = client.devices
    return (
        f"platform {client.platform_name!r}, {len(devices)} device{'s' if len(devices) != 1 else ''} "
        f"({len(client.addressable_devices)} addressable), in {time.monotonic() - started:.2f} s"
    )


@check("client.platform", "platform name, version and process index", requires=("client.create",), essential=True)
def check_client_platform(ctx: Context) -> str:
    client = ctx.client
    name, version, index = client.platform_name, client.platform_version, client.process_index
    if not isinstance(name, str) or not name:
        raise Fail(f"PJRT_Client_PlatformName gave {name!r}; it must be a non-empty name such as 'cpu'")
    if not isinstance(index, int) or index < 0:
        raise Fail(f"PJRT_Client_ProcessIndex gave {index!r}")
    return f"{name} {version!r}, process {index}"


@check("client.devices", "devices: unique ids, kinds, addressability, lookup by id", requires=("client.create",),
       essential=True)
def check_client_devices(ctx: Context) -> str:
    client = ctx.client
    devices, addressable = client.devices, client.addressable_devices
    if not addressable:
        raise Fail("the client has no addressable devices: nothing can be placed on it")
    ids = [d.id for d in devices]
    if len(set(ids)) != len(ids):
        raise Fail(f"device ids repeat: {ids}")
    missing = [d.id for d in addressable if d.id not in set(ids)]
    if missing:
        raise Fail(f"addressable devices {missing} are not among the client's devices {ids}")
    addressable_ids = {d.id for d in addressable}
    problems = []
    for device in devices:
        if not isinstance(device.kind, str) or not device.kind:
            problems.append(f"device {device.id} has kind {device.kind!r}")
        if device.is_addressable != (device.id in addressable_ids):
            problems.append(f"device {device.id}: IsAddressable={device.is_addressable} disagrees with the addressable list")
        if not str(device):
            problems.append(f"device {device.id}: ToString is empty")
        if client.lookup_device(device.id).id != device.id:
            problems.append(f"LookupDevice({device.id}) found another device")
    for device in addressable:
        if not isinstance(device.local_hardware_id, int):
            problems.append(f"device {device.id}: local hardware id {device.local_hardware_id!r}")
        if device.process_index != client.process_index:
            problems.append(
                f"addressable device {device.id} belongs to process {device.process_index}, not {client.process_index}"
            )
    if problems:
        raise Fail("; ".join(problems))
    kinds = sorted({d.kind for d in devices})
    return f"{len(devices)} devices (ids {_id_list(ids)}), kind {', '.join(repr(k) for k in kinds)}"


def _id_list(ids: list[int]) -> str:
    return ", ".join(map(str, ids)) if len(ids) <= 8 else f"{ids[0]}..{ids[-1]}"


@check("client.memories", "memories: each device's default memory is addressable by it", requires=("client.devices",))
def check_client_memories(ctx: Context) -> str:
    library = ctx.library
    if not library.has_function("PJRT_Client_AddressableMemories"):
        raise Unsupported("PJRT_Client_AddressableMemories is not provided")
    client = ctx.client
    memories = client.memories
    problems = []
    for device in client.addressable_devices:
        default = device.default_memory
        if default not in device.memories:
            problems.append(f"device {device.id}: its default memory {default} is not among its memories")
        if default not in memories:
            problems.append(f"device {device.id}: its default memory {default} is not among the client's memories")
        if device not in default.addressable_by_devices:
            problems.append(f"memory {default} does not list device {device.id}, whose default memory it is")
        if not default.kind:
            problems.append(f"memory {default} has an empty kind")
    if problems:
        raise Fail("; ".join(problems))
    kinds = sorted({m.kind for m in memories})
    return f"{len(memories)} memories, kinds {', '.join(kinds)}"


@check("client.default_assignment", "PJRT_Client_DefaultDeviceAssignment places replicas on real devices",
       requires=("client.devices",))
def check_default_assignment(ctx: Context) -> str:
    client = ctx.client
    if not client.library.has_function("PJRT_Client_DefaultDeviceAssignment"):
        raise Unsupported("PJRT_Client_DefaultDeviceAssignment is not provided")
    count = len(client.addressable_devices)
    assignment = client.default_device_assignment(count, 1)
    flat = [d for row in assignment for d in row]
    ids = {d.id for d in client.devices}
    if len(flat) != count or not set(flat) <= ids or len(set(flat)) != len(flat):
        raise Fail(f"default assignment for {count} replicas is {assignment}; device ids are {sorted(ids)}")
    return f"{count} replica{'s' if count != 1 else ''} -> devices {flat}"


# -- error reporting --------------------------------------------------------------------------


@check("errors.lookup", "a bad device id is an error with a code and a message, not a crash",
       requires=("client.devices",))
def check_errors_lookup(ctx: Context) -> str:
    client = ctx.client
    bogus = max(d.id for d in client.devices) + 100_000
    try:
        device = client.lookup_device(bogus)
    except PjrtError as exc:
        if not 1 <= exc.code <= 16:
            raise Fail(f"the error has code {exc.code}, not an absl status code 1..16") from None
        if not exc.message.strip():
            raise Fail(f"the error ({exc.code_name}) has an empty message") from None
        return f"{exc.code_name}: {exc.message}"
    raise Fail(f"PJRT_Client_LookupDevice({bogus}) returned {device}, though no device has that id")


def _platform_name_args(ctx: Context, size: int) -> tuple[Any, Any]:
    real = STRUCT_SIZE["PJRT_Client_PlatformName_Args"]
    raw = ffi.new("char[]", max(size, real))
    args = ffi.cast("PJRT_Client_PlatformName_Args*", raw)
    args.struct_size = size
    args.client = ctx.client.c_pointer()
    return raw, args


@check("errors.struct_size", "an args struct smaller than the plugin's is refused, not read past its end",
       requires=("client.platform",))
def check_errors_struct_size(ctx: Context) -> str:
    _, args = _platform_name_args(ctx, 8)
    try:
        ctx.client.library.call("PJRT_Client_PlatformName", args)
    except PjrtError as exc:
        return f"{exc.code_name}: {exc.message}"
    raise Fail(
        "PJRT_Client_PlatformName accepted an 8-byte args struct: the plugin does not check struct_size, so a "
        "caller built against an older header makes it read and write past the struct. Check "
        "args->struct_size against the header's *_STRUCT_SIZE first"
    )


@check("errors.newer_caller", "an args struct larger than the plugin's (a newer caller) is accepted",
       requires=("client.platform",))
def check_errors_newer_caller(ctx: Context) -> str:
    size = STRUCT_SIZE["PJRT_Client_PlatformName_Args"] + 64
    keep, args = _platform_name_args(ctx, size)
    try:
        ctx.client.library.call("PJRT_Client_PlatformName", args)
    except PjrtError as exc:
        raise Fail(
            f"a {size}-byte PJRT_Client_PlatformName_Args was refused ({exc.code_name}: {exc.message}); accept "
            "struct_size >= your own, since newer callers append fields"
        ) from None
    name = ffi.unpack(args.platform_name, args.platform_name_size).decode("utf-8", "replace")
    if name != ctx.client.platform_name:
        raise Fail(f"with a larger struct the platform name came back as {name!r}, not {ctx.client.platform_name!r}")
    del keep
    return f"a {size}-byte args struct works"
