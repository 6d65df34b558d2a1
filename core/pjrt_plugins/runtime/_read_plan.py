"""How a buffer is brought to the host: read in place, copied raw and permuted, or transferred.

Asked of the plugin once per buffer (where it lives, how it is laid out); a device's buffers
all share one answer, which the client remembers.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..errors import PjrtError
from ._args import new_args
from ._cdef import STRUCT_SIZE, ffi
from ._library import Library

_layouts: dict[int, tuple[Any, Any]] = {}

#: Row-major buffers in host memory up to this size are copied out in place; larger ones use
#: PJRT_Buffer_ToHostBuffer, which copies with the GIL released.
DIRECT_READ_MAX_BYTES = 1 << 18
DIRECT_FUNCTIONS = (
    "PJRT_Buffer_IncreaseExternalReferenceCount",
    "PJRT_Buffer_DecreaseExternalReferenceCount",
    "PJRT_Buffer_OpaqueDeviceMemoryDataPointer",
)


class ReadPlan(NamedTuple):
    """How to bring a buffer to the host.

    ``mode``: ``"direct"`` (host memory: copy the bytes in place), ``"raw"`` (copy the raw
    device bytes with PJRT_Buffer_CopyRawToHost) or ``"transfer"`` (PJRT_Buffer_ToHostBuffer
    with a row-major host layout). ``order``: the physical axis order (major to minor) when
    the device layout is a permutation of row-major, to undo after a byte copy.
    """

    mode: str
    order: tuple[int, ...] | None = None


TRANSFER = ReadPlan("transfer")
#: The plan of a row-major buffer in host memory (the one ``Buffer.to_numpy``'s hot path checks for).
DIRECT = ReadPlan("direct")


def ask_read_plan(lib: Library, ptr: Any, ndim: int) -> ReadPlan:
    """Ask the plugin where the buffer lives and how it is laid out (two cheap queries).

    Needed because a plugin may ignore the host layout asked of ToHostBuffer (the 0.81 CPU
    plugin returns raw bytes for a column-major buffer): a permuted layout is read raw and
    permuted back here. Tiled layouts are left to the plugin's ToHostBuffer.
    """
    if not lib.has_function("PJRT_Buffer_GetMemoryLayout"):
        return TRANSFER
    try:
        query = lib.invoke("PJRT_Buffer_GetMemoryLayout", buffer=ptr)
        on_cpu = lib.has_function("PJRT_Buffer_IsOnCpu") and bool(
            lib.invoke("PJRT_Buffer_IsOnCpu", buffer=ptr).is_on_cpu
        )
    except PjrtError:  # e.g. UNIMPLEMENTED: trust the plugin's transfer
        return TRANSFER
    layout = query.layout
    tiled = layout.tiled
    if int(ffi.cast("int", layout.type)) != 0 or tiled.num_tiles != 0 or tiled.minor_to_major_size != ndim:
        return TRANSFER
    minor_to_major = [int(tiled.minor_to_major[i]) for i in range(ndim)]
    if sorted(minor_to_major) != list(range(ndim)):
        return TRANSFER
    order = tuple(reversed(minor_to_major))
    permuted = order != tuple(range(ndim))
    if on_cpu and all(lib.has_function(name) for name in DIRECT_FUNCTIONS):
        return ReadPlan("direct", order) if permuted else DIRECT
    if permuted and lib.has_function("PJRT_Buffer_CopyRawToHost"):
        return ReadPlan("raw", order)
    return TRANSFER


def row_major_layout(ndim: int) -> Any:
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

