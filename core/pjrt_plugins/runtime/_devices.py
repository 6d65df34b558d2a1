"""Device and Memory: the hardware a client exposes, as the plugin describes it.

The plugin frees these with their client, so every C call on one is a counted call on the
client (:class:`~pjrt_plugins.ClientClosedError` once it is closed); each holds its client
weakly, and the client keeps one object per handle.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from ..errors import ClientClosedError
from . import _memory
from ._args import unpack_text
from ._named_values import decode_named_values

from ._read_plan import ReadPlan

if TYPE_CHECKING:  # pragma: no cover - annotations only: the client is the layer above
    from ._client import Client


class _ClientPart:
    """A device or memory space of a client. The plugin frees these with the client, so every
    C call on one is a counted call on the client (ClientClosedError once it is closed)."""

    def __init__(self, client: Client, ptr: Any) -> None:
        if not ptr:  # the client refuses a plugin's NULL before it gets here; calls on it would crash
            raise ValueError(f"a {type(self).__name__} needs the plugin's handle, got NULL")
        self._client_ref = weakref.ref(client)
        self._lib = client._lib
        self._ptr = ptr

    @property
    def client(self) -> Client:
        return _alive(self._client_ref)

    def _call(self) -> Any:
        """``with self._call():`` a counted call on the client; read what the plugin returns inside it."""
        return _alive(self._client_ref)._call()

    def _invoke(self, function: str, **fields: Any) -> Any:
        """``function(**fields)`` for results that are plain numbers (read after the call)."""
        with self._call():
            return self._lib.invoke(function, **fields)

    def _to_string(self) -> str:
        raise NotImplementedError

    def __str__(self) -> str:
        try:
            return self._to_string()  # the plugin's own text
        except ClientClosedError:  # str() never raises: what we cached is all that is left
            return repr(self)


class Memory(_ClientPart):
    """A memory space (``device``, ``pinned_host``, ...) of a client."""

    def __init__(self, client: Client, ptr: Any) -> None:
        super().__init__(client, ptr)
        self.id = int(self._invoke("PJRT_Memory_Id", memory=ptr).id)
        with self._call():
            args = self._lib.invoke("PJRT_Memory_Kind", memory=ptr)
            self.kind = unpack_text(args.kind, args.kind_size)

    @property
    def kind_id(self) -> int:
        return int(self._invoke("PJRT_Memory_Kind_Id", memory=self._ptr).kind_id)

    @property
    def addressable_by_devices(self) -> list[Device]:
        with self._call():
            function = "PJRT_Memory_AddressableByDevices"
            args = self._lib.invoke(function, memory=self._ptr)
            count = self._lib.count(args.devices, args.num_devices, function, "devices")
            return [self.client._device(args.devices[i], function) for i in range(count)]

    def _to_string(self) -> str:
        with self._call():
            args = self._lib.invoke("PJRT_Memory_ToString", memory=self._ptr)
            return unpack_text(args.to_string, args.to_string_size)

    def __repr__(self) -> str:
        return f"<pjrt Memory id={self.id} kind={self.kind!r}>"


class Device(_ClientPart):
    """One device of a client: id, kind, process index, attributes and memories."""

    def __init__(self, client: Client, ptr: Any) -> None:
        super().__init__(client, ptr)
        lib = self._lib
        with self._call():
            self._description = desc = lib.invoke("PJRT_Device_GetDescription", device=ptr).device_description
            self.id = int(lib.invoke("PJRT_DeviceDescription_Id", device_description=desc).id)
            self.process_index = int(
                lib.invoke("PJRT_DeviceDescription_ProcessIndex", device_description=desc).process_index
            )
            args = lib.invoke("PJRT_DeviceDescription_Kind", device_description=desc)
            self.kind = unpack_text(args.device_kind, args.device_kind_size)
            self.is_addressable = bool(lib.invoke("PJRT_Device_IsAddressable", device=ptr).is_addressable)
        self._attributes: dict[str, Any] | None = None
        self._local_hardware_id: int | None = None
        self._read_plan: ReadPlan | None = None  # how buffers put here are read back (same for all of them)

    @property
    def local_hardware_id(self) -> int:
        """Opaque hardware id (e.g. the CUDA ordinal); -1 if the plugin has none."""
        if self._local_hardware_id is None:
            args = self._invoke("PJRT_Device_LocalHardwareId", device=self._ptr)
            self._local_hardware_id = int(args.local_hardware_id)
        return self._local_hardware_id

    @property
    def attributes(self) -> dict[str, Any]:
        if self._attributes is None:
            with self._call():
                function = "PJRT_DeviceDescription_Attributes"
                args = self._lib.invoke(function, device_description=self._description)
                self._attributes = decode_named_values(args.attributes, args.num_attributes, function)
        return dict(self._attributes)

    @property
    def memories(self) -> list[Memory]:
        with self._call():
            function = "PJRT_Device_AddressableMemories"
            args = self._lib.invoke(function, device=self._ptr)
            count = self._lib.count(args.memories, args.num_memories, function, "memories")
            return [self.client._memory(args.memories[i], function) for i in range(count)]

    @property
    def default_memory(self) -> Memory:
        function = "PJRT_Device_DefaultMemory"
        return self.client._memory(self._invoke(function, device=self._ptr).memory, function)

    def memory_stats(self) -> dict[str, int]:
        """Allocator statistics by JAX's names (``bytes_in_use``, ``peak_bytes_in_use``, ``bytes_limit``, ...)."""
        return _memory.memory_stats(self)  # UnsupportedFunctionError where the plugin has none

    def get_memory_info(self) -> _memory.MemoryInfo:
        """PyTorch/XLA's ``xm.get_memory_info``: ``{"bytes_used", "peak_bytes_used", "bytes_limit"}``."""
        return _memory.memory_info(self)

    @property
    def memory_descriptions(self) -> list[_memory.MemoryDescription]:
        """The memory kinds this device supports (MemoryDescriptions extension), default first."""
        return _memory.memory_descriptions(self)  # UnsupportedExtensionError where the plugin lacks it

    @property
    def debug_string(self) -> str:
        with self._call():
            args = self._lib.invoke("PJRT_DeviceDescription_DebugString", device_description=self._description)
            return unpack_text(args.debug_string, args.debug_string_size)

    def _to_string(self) -> str:
        with self._call():
            args = self._lib.invoke("PJRT_DeviceDescription_ToString", device_description=self._description)
            return unpack_text(args.to_string, args.to_string_size)

    def __repr__(self) -> str:
        return f"<pjrt Device id={self.id} kind={self.kind!r} process_index={self.process_index}>"


def _alive(ref: weakref.ref[Client]) -> Client:
    client = ref()
    if client is None or client._closed:
        raise ClientClosedError("the client this object belongs to has been closed")
    return client

