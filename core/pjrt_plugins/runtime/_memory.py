"""A device's memory: allocator statistics (``PJRT_Device_MemoryStats``) and the memory kinds it supports.

Both are optional in PJRT. Where the plugin leaves the function out or answers it with
UNIMPLEMENTED, or lacks the MemoryDescriptions extension, the query raises
:class:`~pjrt_plugins.UnsupportedFunctionError` / :class:`~pjrt_plugins.UnsupportedExtensionError`
saying that this plugin does not provide it; it never guesses numbers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, TypedDict

from ..errors import PjrtError, UnsupportedExtensionError, UnsupportedFunctionError
from ._cdef import ffi
from ._cdef import field_end as _field_end
from ._args import new_args, unpack_text

if TYPE_CHECKING:  # pragma: no cover
    from ._devices import Device

_UNIMPLEMENTED = 12  # absl::StatusCode::kUnimplemented
#: Statistics a plugin may report besides ``bytes_in_use`` (each has an ``_is_set`` flag).
OPTIONAL_STATS = (
    "peak_bytes_in_use",
    "num_allocs",
    "largest_alloc_size",
    "bytes_limit",
    "bytes_reserved",
    "peak_bytes_reserved",
    "bytes_reservable_limit",
    "largest_free_block_bytes",
    "pool_bytes",
    "peak_pool_bytes",
    "peak_allocated_bytes",
)


class MemoryInfo(TypedDict):
    """PyTorch/XLA's ``xm.get_memory_info`` result: bytes; ``None`` where the plugin does not report it."""

    bytes_used: int
    peak_bytes_used: int | None
    bytes_limit: int | None


class MemoryDescription(NamedTuple):
    """A kind of memory a device supports (MemoryDescriptions extension): ``device``, ``pinned_host``, ..."""

    kind: str
    kind_id: int
    is_default: bool


def memory_stats(device: Device) -> dict[str, int]:
    """Every allocator statistic the plugin reports for ``device``, by JAX's names (``bytes_in_use`` always)."""
    lib = device._lib
    name = "PJRT_Device_MemoryStats"
    try:
        function = ffi.cast("PJRT_Device_MemoryStats_Fn*", lib.function(name))
    except UnsupportedFunctionError as missing:
        raise _not_provided(device, "device memory statistics", str(missing), name) from None
    args = new_args("PJRT_Device_MemoryStats_Args")
    args.device = device._ptr
    with device._call():
        error = function(args)
        if error:
            exc = lib.error_to_exception(error, name)
            if exc.code == _UNIMPLEMENTED:
                raise _not_provided(device, "device memory statistics", f"{name} answered UNIMPLEMENTED: {exc.message}", name) from exc
            raise exc
        stats = {"bytes_in_use": int(args.bytes_in_use)}
        stats.update({stat: int(getattr(args, stat)) for stat in OPTIONAL_STATS if getattr(args, f"{stat}_is_set")})
    return stats


def memory_info(device: Device) -> MemoryInfo:
    """``{"bytes_used", "peak_bytes_used", "bytes_limit"}`` of ``device``, as PyTorch/XLA's ``xm.get_memory_info``."""
    stats = memory_stats(device)
    return MemoryInfo(
        bytes_used=stats["bytes_in_use"],
        peak_bytes_used=stats.get("peak_bytes_in_use"),
        bytes_limit=stats.get("bytes_limit"),
    )


def memory_descriptions(device: Device) -> list[MemoryDescription]:
    """The kinds of memory ``device`` supports (also those no client made addressable), default first.

    From the plugin's MemoryDescriptions extension; a plugin may have it and describe none
    (the XLA CPU plugin): then the list is empty.
    """
    lib = device._lib
    extension = _memory_descriptions_extension(device)
    args = new_args("PJRT_DeviceDescription_MemoryDescriptions_Args")
    args.device_description = device._description
    kinds: list[MemoryDescription] = []
    with device._call():
        lib_error = extension.PJRT_DeviceDescription_MemoryDescriptions(args)
        if lib_error:
            raise lib.error_to_exception(lib_error, "PJRT_DeviceDescription_MemoryDescriptions")
        count = int(args.num_memory_descriptions)
        if count and args.memory_descriptions == ffi.NULL:
            raise PjrtError(13, f"{count} memory descriptions reported, but no array of them",
                            function="PJRT_DeviceDescription_MemoryDescriptions",
                            hint=f"a bug in {lib.name}")
        default = int(args.default_memory_index)  # (size_t)-1: no default
        for index in range(count):
            kind_args = new_args("PJRT_MemoryDescription_Kind_Args")
            kind_args.memory_description = args.memory_descriptions[index]
            kind_error = extension.PJRT_MemoryDescription_Kind(kind_args)
            if kind_error:
                raise lib.error_to_exception(kind_error, "PJRT_MemoryDescription_Kind")
            kinds.append(MemoryDescription(unpack_text(kind_args.kind, kind_args.kind_size), int(kind_args.kind_id),
                                           index == default))
    return sorted(kinds, key=lambda description: not description.is_default)


def _memory_descriptions_extension(device: Device) -> Any:
    lib = device._lib
    node = lib.find_extension("MemoryDescriptions")
    what = "memory descriptions (the MemoryDescriptions extension)"
    if node is None:
        raise _no_extension(device, what, "MemoryDescriptions", "it has no such extension")
    extension = ffi.cast("PJRT_MemoryDescriptions_Extension*", node)
    needed = _field_end("PJRT_MemoryDescriptions_Extension", "PJRT_MemoryDescription_Kind")
    if int(extension.struct_size) < needed:
        raise _no_extension(device, what, "MemoryDescriptions",
                            f"its extension has {int(extension.struct_size)} bytes, fewer than the {needed} it needs")
    if extension.PJRT_DeviceDescription_MemoryDescriptions == ffi.NULL or extension.PJRT_MemoryDescription_Kind == ffi.NULL:
        raise _no_extension(device, what, "MemoryDescriptions", "its extension leaves a function unset (NULL)")
    return extension


def _plugin_name(device: Device) -> str:
    client = device._client_ref()
    return client.plugin_name if client is not None else device._lib.name


def _not_provided(device: Device, what: str, reason: str, function: str) -> UnsupportedFunctionError:
    error = UnsupportedFunctionError(f"plugin {_plugin_name(device)!r} does not provide {what}: {reason}")
    error.function = function
    return error


def _no_extension(device: Device, what: str, extension: str, reason: str) -> UnsupportedExtensionError:
    error = UnsupportedExtensionError(
        f"plugin {_plugin_name(device)!r} ({device._lib.name}) does not provide {what}: {reason}"
    )
    error.extension = extension
    return error
