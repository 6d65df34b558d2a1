"""Pinning a buffer in host memory: an external reference keeps the plugin from moving or reusing
its bytes while the host reads them in place.

The small reads of ``Buffer.to_numpy`` copy through a pin (one call into the compiled fast
path where it is loaded), and ``Buffer.host_view`` holds one as long as its arrays live.
:data:`pin_lock` orders taking a view against deleting a buffer or closing a client.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import numpy as np

from . import _fastpath
from ._args import new_args
from ..errors import PjrtError
from ._cdef import ffi
from ._library import Library

_memmove = ffi.memmove
#: ``ffi.from_buffer(array)`` without cffi's Python wrapper, which only fills in these arguments
#: (0.1 us of every small read); the wrapper itself where a cffi build lacks these attributes.
_char_buffer = (
    functools.partial(ffi._backend.from_buffer, ffi.BCharA)
    if hasattr(ffi, "_backend") and hasattr(ffi, "BCharA")
    else ffi.from_buffer
)
_pjrtp_read_pinned: Any = _fastpath.library.pjrtp_read_pinned if _fastpath.library is not None else None

#: Taken to count host views (pins) and to delete a buffer or close a client: neither happens
#: while a view is being taken (reentrant: a finalizer may run on a thread that holds it).
pin_lock = threading.RLock()


class Pinning:
    """Pins buffers in host memory (an external reference keeps the plugin from moving or reusing
    their bytes), with its own args structs and the library's functions bound once.

    One user at a time: taken from the library's pool (``lib.pool(Pinning)``).
    """

    __slots__ = ("_lib", "_hold", "_where", "_unhold", "_hold_fn", "_where_fn", "_unhold_fn", "_plan")

    def __init__(self, lib: Library) -> None:
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

    def pin(self, ptr: Any, nbytes: int) -> Any:
        """Take an external reference on the buffer ``ptr`` (until :meth:`unpin`); returns the
        address of its ``nbytes`` bytes (never NULL when there are some: that is refused)."""
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
        address = where.device_memory_ptr
        if nbytes and address == ffi.NULL:
            try:
                raise self._no_data(nbytes)
            finally:
                self.unpin(ptr)
        return address

    def _no_data(self, nbytes: int) -> PjrtError:
        return self._lib.broken_answer(
            "PJRT_Buffer_OpaqueDeviceMemoryDataPointer", f"gave NULL as the address of the buffer's {nbytes} bytes"
        )

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
                self._raise_read_error(plan, err, out.nbytes)
            return out
        nbytes = out.nbytes
        address = self.pin(ptr, nbytes)
        try:
            if nbytes:
                _memmove(out, address, nbytes)
        finally:
            self.unpin(ptr)
        return out

    def _raise_read_error(self, plan: Any, err: Any, nbytes: int) -> None:
        """Raise the error of a failed pjrtp_read_pinned, naming the function that failed."""
        lib = self._lib
        step = plan.failed_step
        if step == _fastpath.STEP_INVALID:  # err is the fast path's marker, no plugin error
            raise RuntimeError("pjrtp_read_pinned refused its plan or buffer (a bug in pjrt_plugins)")
        unhold_error, plan.unhold_error = plan.unhold_error, ffi.NULL
        try:
            if step == _fastpath.STEP_NO_DATA:  # the same marker: the plugin gave NULL for the bytes
                raise self._no_data(nbytes)
            raise lib.error_to_exception(err, _fastpath.READ_STEPS[step])
        finally:
            if unhold_error:  # the unpin after a failed address query failed too: read and destroy it
                raise lib.error_to_exception(unhold_error, "PJRT_Buffer_DecreaseExternalReferenceCount")


def pin(lib: Library, ptr: Any, nbytes: int) -> Any:
    """Pin a buffer of ``nbytes`` in host memory and return the address of its bytes (see
    :meth:`Pinning.pin`). Call with :data:`pin_lock` held or within a counted call on the buffer."""
    pool = lib.pool(Pinning)
    pinning = pool.take()
    address = pinning.pin(ptr, nbytes)
    pool.give(pinning)
    return address


def unpin(lib: Library, ptr: Any) -> None:
    """Drop the external reference :func:`pin` took (finalizers call it: the pool made its
    structs' types known before any pin existed)."""
    pool = lib.pool(Pinning)
    pinning = pool.take()
    pinning.unpin(ptr)
    pool.give(pinning)


