"""Checks of buffers: every dtype round-trips bit-exact (and the plugin reports its shape, type and
device), shapes from scalars to 1 MiB, every device, lifecycles and device-to-device copies.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import PjrtError
from ..runtime import new_args
from ..runtime._cdef import ffi
from ..runtime._dtypes import NUMPY_BY_PJRT, PJRT_BY_NUMPY, PJRT_TYPE_NAMES
from . import _checks_capi  # noqa: F401 - the client checks these require are declared first
from ._context import Context
from ._framework import Check, Fail, Skip, Unsupported, add_check, check


def sample_array(dtype: np.dtype[Any], shape: tuple[int, ...] = (2, 3)) -> np.ndarray[Any, Any]:
    """Distinct, exactly representable values of ``dtype`` (booleans alternate; unsigned ints stay >= 0)."""
    count = int(np.prod(shape, dtype=np.int64))
    base = np.arange(count, dtype=np.float64)
    values: np.ndarray[Any, Any]
    if dtype == np.dtype(bool):
        values = base % 3 != 1
    elif dtype.kind == "u":
        values = (base * 3 + 1).astype(dtype)
    elif dtype.kind == "i":
        values = ((base - count // 2) * 3).astype(dtype)
    elif dtype.kind == "c":
        values = ((base - 2.5) + 1j * (base / 2)).astype(dtype)
    else:
        values = ((base - 2.5) * 0.5).astype(dtype)
    return values.reshape(shape)


def _same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


def _plugin_view(buffer: Any) -> tuple[tuple[int, ...], int]:
    """(dimensions, element type) as the plugin reports them (the runtime caches what it uploaded)."""
    library = buffer.client.library
    dims = new_args("PJRT_Buffer_Dimensions_Args")
    dims.buffer = buffer.c_pointer()
    library.call("PJRT_Buffer_Dimensions", dims)
    kind = new_args("PJRT_Buffer_ElementType_Args")
    kind.buffer = buffer.c_pointer()
    library.call("PJRT_Buffer_ElementType", kind)
    shape = tuple(ffi.unpack(dims.dims, dims.num_dims)) if dims.num_dims else ()
    return shape, int(ffi.cast("int", kind.type))


def _round_trip(ctx: Context, host: np.ndarray, device: Any = None) -> str:
    """Upload ``host``, check what the plugin reports, read it back bit for bit."""
    client = ctx.client
    device = device if device is not None else client.addressable_devices[0]
    try:
        buffer = client.buffer_from_host(host, device)
    except PjrtError as exc:
        if exc.code_name in ("INVALID_ARGUMENT", "UNIMPLEMENTED"):
            raise Unsupported(f"the plugin does not take {host.dtype} buffers: {exc.code_name}: {exc.message}") from None
        raise
    try:
        shape, element_type = _plugin_view(buffer)
        if shape != host.shape:
            raise Fail(f"PJRT_Buffer_Dimensions gives {shape}, the upload was {host.shape}")
        expected = PJRT_BY_NUMPY[np.dtype(host.dtype)]
        if element_type != expected:
            raise Fail(
                f"PJRT_Buffer_ElementType gives {PJRT_TYPE_NAMES.get(element_type, element_type)}, "
                f"the upload was {PJRT_TYPE_NAMES[expected]}"
            )
        if buffer.device.id != device.id:
            raise Fail(f"PJRT_Buffer_Device gives device {buffer.device.id}, the upload went to {device.id}")
        size = buffer.on_device_size
        back = buffer.to_numpy()
    finally:
        buffer.delete()
    if not _same_bytes(back, host):
        raise Fail(f"read back {back!r}, uploaded {host!r}")
    return f"{host.dtype}{list(host.shape)} round trip bit-exact ({size} bytes on device)"


def _add_dtype_checks() -> None:
    for dtype in NUMPY_BY_PJRT.values():

        def round_trip(ctx: Context, dtype: np.dtype = dtype) -> str:
            return _round_trip(ctx, sample_array(dtype))

        add_check(Check(f"buffers.{dtype.name}", f"{dtype.name} buffers round-trip bit-exact", round_trip,
                        requires=("client.devices",)))


_add_dtype_checks()


@check("buffers.shapes", "scalars, empty, 3-d, strided and 1 MiB arrays round-trip", requires=("buffers.float32",))
def check_buffer_shapes(ctx: Context) -> str:
    rng = np.random.default_rng(0)
    cases: dict[str, np.ndarray[Any, Any]] = {
        "scalar": np.array(7.5, dtype=np.float32),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "3-d": np.arange(24, dtype=np.int32).reshape(2, 3, 4),
        "strided": np.arange(48, dtype=np.float64).reshape(6, 8)[::2, ::-3],
        "1 MiB": rng.standard_normal(1 << 18).astype(np.float32),
    }
    for label, host in cases.items():
        try:
            _round_trip(ctx, host)
        except Fail as failure:
            raise Fail(f"{label}: {failure.reason}") from None
    return ", ".join(cases)


@check("buffers.every_device", "each addressable device holds its own data", requires=("buffers.float32",))
def check_buffers_every_device(ctx: Context) -> str:
    client = ctx.client
    devices = client.addressable_devices
    hosts = [np.arange(4, dtype=np.float32) + 100 * i for i in range(len(devices))]
    buffers = [client.buffer_from_host(h, d) for h, d in zip(hosts, devices)]
    try:
        for buffer, host, device in zip(buffers, hosts, devices):
            if buffer.device.id != device.id:
                raise Fail(f"a buffer uploaded to device {device.id} reports device {buffer.device.id}")
            back = buffer.to_numpy()
            if not _same_bytes(back, host):
                raise Fail(f"device {device.id} returned {back}, expected {host}")
    finally:
        for buffer in buffers:
            buffer.delete()
    return f"{len(devices)} device{'s' if len(devices) != 1 else ''}"


@check("buffers.lifecycle", "ready events; a deleted buffer reports so and refuses reads",
       requires=("buffers.float32",))
def check_buffers_lifecycle(ctx: Context) -> str:
    client = ctx.client
    buffer = client.buffer_from_host(np.arange(4, dtype=np.float32))
    try:
        buffer.block_until_ready()
        if not buffer.is_ready:
            raise Fail("after awaiting its ready event the buffer reports it is not ready")
        if buffer.is_deleted:
            raise Fail("a live buffer reports it is deleted")
        args = new_args("PJRT_Buffer_Delete_Args")
        args.buffer = buffer.c_pointer()
        client.library.call("PJRT_Buffer_Delete", args)
        if not buffer.is_deleted:
            raise Fail("after PJRT_Buffer_Delete, PJRT_Buffer_IsDeleted still says false")
        try:
            data = buffer.to_numpy()
        except PjrtError as exc:
            return f"reading a deleted buffer: {exc.code_name}: {exc.message}"
        raise Fail(f"reading a deleted buffer succeeded and returned {data!r}; it must be an error")
    finally:
        buffer.delete()


@check("buffers.copy_to_device", "PJRT_Buffer_CopyToDevice moves data between devices",
       requires=("buffers.every_device",))
def check_copy_to_device(ctx: Context) -> str:
    client = ctx.client
    if not client.library.has_function("PJRT_Buffer_CopyToDevice"):
        raise Unsupported("PJRT_Buffer_CopyToDevice is not provided")
    devices = client.addressable_devices
    if len(devices) < 2:
        raise Skip(one_device_reason(ctx))
    host = np.arange(6, dtype=np.int32)
    source = client.buffer_from_host(host, devices[0])
    try:
        copy = source.copy_to_device(devices[-1])
        try:
            if copy.device.id != devices[-1].id or not _same_bytes(copy.to_numpy(), host):
                raise Fail(f"the copy is on device {copy.device.id} and holds {copy.to_numpy()}")
        finally:
            copy.delete()
    finally:
        source.delete()
    return f"device {devices[0].id} -> device {devices[-1].id}"


def one_device_reason(ctx: Context) -> str:
    """Why a check that needs several devices is skipped on a client with one."""
    hint = " with -o KEY=VALUE (the plugin's device-count option)" if ctx.has_python else ""
    return f"only 1 addressable device; this check needs at least 2. Create the client with more{hint}"
